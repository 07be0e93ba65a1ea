"""The audio decode of a 10 s clip on the CPU: the old style against the new, in one run, interleaved.

    PYTHONPATH=. python benchmarks/bench_audio_cpu.py --commit $(git rev-parse --short HEAD) [--repeats 3]
        [--latents 405] [--threads 2]

Released size (audio/config.py's defaults: dec_in_proj 32 -> 2048, BigVGAN 2048 -> 1024, 7 upsamplers, 21 AMP
blocks, 64.9 M parameters), random weights (seed 0: convs N(0, 1 / fan-in), conv_post x 0.05, biases N(0,
0.01), SnakeBeta's alpha and beta N(0, 0.25): the waveform spreads over (-1, 1); values do not change the
cost), the filters `kaiser_sinc_filter()`. Latents: normalised (2, 32, --latents), seed 1; 405 = 10.125 s.

Variants, each decode in a fresh child process (libgomp reads GOMP_SPINCOUNT when torch loads it), the
variants interleaved in every round, --threads torch threads:
- old: the activation as whole tensors (`anti_aliased_snake_beta_reference`, what ran before), libgomp's
  default spin-wait (the environment as given, without GOMP_SPINCOUNT / OMP_WAIT_POLICY);
- old, spin 10k: the same with GOMP_SPINCOUNT=10000;
- new (API): the eager op (`anti_aliased_snake_beta`, in pieces on the CPU), default spin: what a Python
  caller gets;
- new (command): the eager op with GOMP_SPINCOUNT=10000: what `minimax-h3-decode` runs (command/console.py).
Each child builds the model, decodes one latent as a warm-up, then times one decode (wall clock). Printed:
per variant the median and every time, the load average at the start of each, the ratio to old, and the
sha256 of the waveform's float32 bytes (all variants must agree). Also the hashes of the example checkpoint's
audio decode (examples/tiny_h3_vae, examples/latents.safetensors) with the old and the new activation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "old": ("reference", None),
    "old, spin 10k": ("reference", "10000"),
    "new (API)": ("eager", None),
    "new (command)": ("eager", "10000"),
}


def digest(samples) -> str:
    return hashlib.sha256(samples.contiguous().numpy().tobytes()).hexdigest()[:16]


def released_decoder(seed: int = 0):
    """H3AudioDecoder at the released size on the CPU, random weights as the module docstring says."""
    import torch

    from minimax_h3_vae import H3AudioDecoder, H3AudioDecoderConfig
    from minimax_h3_vae.audio.model import kaiser_sinc_filter

    decoder = H3AudioDecoder(H3AudioDecoderConfig(), fused=False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith((".alpha", ".beta")):
                param.copy_(0.5 * noise)
            elif param.ndim > 1:
                param.copy_(noise / param[0].numel() ** 0.5 * (0.05 if "conv_post" in name else 1.0))
            else:
                param.copy_(0.1 * noise)
        for buffer in decoder.buffers():
            buffer.copy_(kaiser_sinc_filter())
    return decoder.eval()


def child(op: str, latents: int, threads: int) -> None:
    """One variant in this process: warm-up, one timed decode; prints a JSON line."""
    from types import SimpleNamespace

    import torch

    from minimax_h3_vae.audio import model

    torch.set_num_threads(threads)
    decoder = released_decoder()
    function = model.anti_aliased_snake_beta_reference if op == "reference" else model.anti_aliased_snake_beta
    ops = SimpleNamespace(anti_aliased_snake_beta=function)
    z = torch.randn(2, 32, latents, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        decoder(decoder.denormalize(z[..., :1]), ops)
        start = time.perf_counter()
        samples = decoder(decoder.denormalize(z), ops).squeeze(1)
        seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "sha256": digest(samples), "shape": list(samples.shape)}))


def example_hashes() -> dict[str, str]:
    """The example checkpoint's audio decode with the old and the new activation (this process, as set up)."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file

    from minimax_h3_vae import H3AudioDecoder
    from minimax_h3_vae.audio import model

    decoder = H3AudioDecoder.from_pretrained(REPO / "examples" / "tiny_h3_vae", device="cpu", fused=False)
    audio = load_file(str(REPO / "examples" / "latents.safetensors"))["audio_latents"]
    hashes = {}
    for name, function in (("old", model.anti_aliased_snake_beta_reference), ("new", model.anti_aliased_snake_beta)):
        with torch.inference_mode():
            z = decoder.denormalize(audio)
            hashes[name] = digest(decoder(z, SimpleNamespace(anti_aliased_snake_beta=function)).squeeze(1))
    hashes["decode()"] = digest(decoder.decode(audio))
    return hashes


def run_child(variant: str, latents: int, threads: int) -> dict:
    op, spin = VARIANTS[variant]
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if spin is not None:
        env["GOMP_SPINCOUNT"] = spin
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    load = os.getloadavg()[0]
    command = [sys.executable, __file__, "--child", op, "--latents", str(latents), "--threads", str(threads)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "load": load}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latents", type=int, default=405)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=("reference", "eager"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.latents, args.threads)
        return

    import torch

    print(
        f"commit {args.commit}; torch {torch.__version__}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; {args.threads} threads; audio latents (2, 32, {args.latents}); "
        f"load average at start {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs = {variant: [] for variant in VARIANTS}
    for round_ in range(args.repeats):
        for variant in VARIANTS:
            runs[variant].append(run_child(variant, args.latents, args.threads))
            last = runs[variant][-1]
            print(f"  round {round_ + 1} {variant}: {last['seconds']:.2f} s (load {last['load']:.2f})", flush=True)
    old = statistics.median(run["seconds"] for run in runs["old"])
    print("\n| variant | median s | runs (s) | load at start | x faster than old | sha256 |")
    print("| --- | ---: | --- | --- | ---: | --- |")
    for variant, results in runs.items():
        median = statistics.median(run["seconds"] for run in results)
        times = ", ".join(f"{run['seconds']:.2f}" for run in results)
        loads = ", ".join(f"{run['load']:.1f}" for run in results)
        hashes = sorted({run["sha256"] for run in results})
        print(f"| {variant} | {median:.2f} | {times} | {loads} | {old / median:.2f} | {', '.join(hashes)} |")
    all_hashes = {run["sha256"] for results in runs.values() for run in results}
    print(f"\nwaveform {runs['old'][0]['shape']}: {'one hash' if len(all_hashes) == 1 else 'HASHES DIFFER'}")
    torch.set_num_threads(args.threads)
    print(f"example checkpoint's audio (2, 32, 65): {example_hashes()}")


if __name__ == "__main__":
    main()
