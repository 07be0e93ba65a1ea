"""The command's wall clock, process start to exit, with --verbose's breakdown by phase.

    PYTHONPATH=. python benchmarks/bench_command.py [--work /tmp/command] [--runs 2] [--outputs mp4 ...]
        [--flags "--gemm quack --attention fa4"] [--before DIR] [--pycache DIR]

A 10.125 s clip with sound at the released sizes: video latents (24, 72, 48, 84) and audio latents (2, 32, 405),
normalised, random (so the frames are noise: x264's worst case). The video VAE is written once as ComfyUI's fp16
file (random weights, benchmarks/common.py), the audio VAE as a diffusers-layout folder (bench_audio.py's random
weights), both read back from the page cache. Each output (.safetensors, .mp4 with AAC, .wav, or those named by
--outputs) is written `--runs` times in a fresh process with the default settings and --flags; the table gives each
run's wall clock and phases. JSON to $OUT/command.json when OUT is set.

--before DIR: a folder holding another tree's package (`git archive REV minimax_h3_vae | tar -x -C DIR`), run
alternately with this one in the same session, each output's sha256 printed (a change that should not touch the
bits shows the same hashes). The command then runs from a folder outside both trees (`python -m` puts its working
folder first on sys.path).

--pycache DIR: the runs write and reuse their bytecode there (PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE unset),
filled by one import before the first run. pip compiles an install's bytecode; a machine whose Python is told to
write none, with packages installed without it, compiles torch's sources again in every process (`import torch`
3.0-4.9 s instead of 1.5-1.7 s on the H200 machine, benchmarks/LOG.md 2026-12-04-bytecode).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_audio import released_vae  # noqa: E402
from common import random_released_decoder  # noqa: E402

from minimax_h3_vae import save_latents  # noqa: E402

VIDEO_LATENTS = (24, 72, 48, 84)
AUDIO_LATENTS = (2, 32, 405)


def inputs(work: Path) -> tuple[Path, Path, Path]:
    """(latents file, video VAE file, audio VAE folder), written once."""
    from safetensors.torch import save_file

    video = work / "minimax_h3_video_vae_fp16.safetensors"
    if not video.exists():
        model = random_released_decoder(torch.device("cuda"))
        state = {k: (v.half() if v.ndim >= 2 else v.float()).contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(video))
        del model, state
        torch.cuda.empty_cache()
    audio = work / "audio_vae"
    if not (audio / "config.json").exists():
        released_vae("cpu").save_pretrained(str(audio))
    latents = work / "clip.safetensors"
    if not latents.exists():
        generator = torch.Generator().manual_seed(0)
        z = torch.randn(VIDEO_LATENTS, generator=generator)
        save_latents(latents, z, fps=24, audio_latents=torch.randn(AUDIO_LATENTS, generator=generator))
    for path in (video, *audio.iterdir(), latents):
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    return latents, video, audio


def environment(pycache: Path | None) -> dict:
    """The runs' environment: this one, with --pycache's bytecode folder."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def with_tree(env, tree: Path | None) -> dict:
    """`env` with the package of `tree`, when given, first on PYTHONPATH."""
    env = dict(env)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def command(
    latents: Path, video: Path, audio: Path, out: Path, flags: list[str], tree: Path | None = None, env=None
) -> dict:
    """One run of the command in its own process (the package of `tree` when given) in `env`: wall clock, exit
    code, the phases of its `time:` line."""
    args = [str(latents), str(out), "--model", str(video), "--audio-model", str(audio), "--verbose", *flags]
    env, cwd = with_tree(os.environ if env is None else env, tree), None if tree is None else out.parent
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "minimax_h3_vae.command", *args], capture_output=True, text=True, env=env, cwd=cwd
    )
    wall = time.perf_counter() - start
    line = next((x for x in reversed(result.stderr.splitlines()) if x.startswith("time: ")), "")
    phases = {name.strip(): float(s) for name, s in re.findall(r"([a-z -]+?) (\d+\.\d+) s", line.split(";")[0][6:])}
    if result.returncode != 0:
        print(result.stderr[-3000:], flush=True)
    return {"wall_s": round(wall, 2), "code": result.returncode, "phases": phases}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/command"))
    parser.add_argument("--runs", type=int, default=2)
    outputs = ["safetensors", "mp4", "wav"]
    parser.add_argument("--outputs", nargs="+", default=outputs, choices=outputs)
    parser.add_argument("--flags", default="", help="the command's flags for each run: '--gemm quack --attention fa4'")
    parser.add_argument("--before", type=Path, help="a folder holding another tree's package, run alternately")
    parser.add_argument("--pycache", type=Path, help="the runs' bytecode folder (PYTHONPYCACHEPREFIX), as pip has it")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    latents, video, audio = inputs(args.work)
    trees = {"": None}
    if args.before is not None:
        trees = {"before ": args.before.resolve(), "after ": Path(__file__).resolve().parents[1]}
    env = environment(args.pycache)
    if args.pycache is not None:  # the bytecode of what the command imports, written once
        warm = "import torch, triton, imageio_ffmpeg, safetensors, tqdm, minimax_h3_vae.command.main"
        for tree in trees.values():
            subprocess.run([sys.executable, "-c", warm], env=with_tree(env, tree), check=True)
    results = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "flags": args.flags, "runs": {}}
    results["pycache"] = args.pycache is not None
    for suffix in args.outputs:
        for attempt in range(1, args.runs + 1):
            for name, tree in trees.items():
                out = args.work / f"out.{suffix}"
                row = command(latents, video, audio, out, args.flags.split(), tree, env)
                if tree is not None and row["code"] == 0:
                    row["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()[:16]
                results["runs"][f"{name}{suffix} {attempt}"] = row
                print(f"{name}{suffix} run {attempt}: {row}", flush=True)
                out.unlink(missing_ok=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "command.json").write_text(json.dumps(results, indent=2))
    names = list(dict.fromkeys(name for row in results["runs"].values() for name in row["phases"]))
    print(f"\n{'run':24} {'wall s':>7} " + " ".join(f"{name:>11}" for name in names) + "  sha256")
    for key, row in results["runs"].items():
        cells = " ".join(f"{row['phases'].get(name, float('nan')):11.2f}" for name in names)
        print(f"{key:24} {row['wall_s']:7.2f} {cells}  {row.get('sha256', '')}")


if __name__ == "__main__":
    main()
