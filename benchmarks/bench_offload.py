"""GPU memory against time for offload none / blocks / capped, checkpoint load time, and the CLI's wall clock.

    PYTHONPATH=. python benchmarks/bench_offload.py [--work /tmp/offload]

Released architecture, random weights (benchmarks/common.py), fp16 recipe, fused. Writes the weights once as a
ComfyUI fp16 file (4.85 GB) and reads it back from the page cache for every load. Rows:
- load: `from_pretrained` of that file, resident (straight to the GPU) and blocks (pinned host memory);
- the 10 s 1344x768 clip (72 latent frames) through `decode_stream`, frames to uint8 on the host as the CLI
  does: resident with the default tile batch; blocks (automatic tile batch); blocks under max_gpu_memory = 4
  GiB with torch.cuda.set_per_process_memory_fraction enforcing it; the uncapped blocks run again with the
  capped run's tile batch (its output must be bitwise equal); peak allocated memory, weights included;
- one unit, resident vs blocks at the same tile batch: bitwise equal;
- a 512x512 clip (few tiles per window: transfer-bound): blocks / resident;
- the CLI, same clip, to .safetensors and .mp4: wall time from process start to exit (twice: the first run
  may compile Triton kernels), against load + streamed decode measured here; and what starting Python and
  importing torch cost by themselves (any command pays it), median of 3.
Prints a table last; JSON to $OUT/offload.json when OUT is set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CLIP_SHAPE, UNIT_SHAPE, random_latents, random_released_decoder  # noqa: E402
from gpu_clocks import ClockSampler  # noqa: E402

from minimax_h3_vae import H3VideoDecoder, to_uint8_frames  # noqa: E402

GIB = 2**30


def stream(model: H3VideoDecoder, z: torch.Tensor) -> dict:
    """The CLI's loop without the writer: decode_stream, uint8 on the GPU, to the host. Wall time, peak
    allocated (everything this process holds on the GPU: the model alone), the tiles per decoder call, a
    hash of the float output."""
    sizes = set()
    post_quant = model.post_quant  # once per decoder call, and once per part of a layer-major decode
    model.post_quant = lambda z: sizes.add(z.shape[0]) or post_quant(z)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    digest = torch.zeros((), dtype=torch.int64, device="cuda")
    frames = 0
    with ClockSampler() as clocks:
        start = time.perf_counter()
        for chunk in model.decode_stream(z):
            digest = digest * 1000003 + bit_hash(chunk)
            frames += to_uint8_frames(chunk).cpu().shape[0]
        seconds = time.perf_counter() - start
    del model.post_quant
    return {
        "seconds": round(seconds, 3),
        "frames": frames,
        "peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
        "tile_batch": max(sizes),
        "hash": f"{digest.item() & (2**64 - 1):016x}",
        **clocks.summary,
    }


def bit_hash(x: torch.Tensor) -> torch.Tensor:
    """A hash of the float32 bits of a (B, C, F, H, W) chunk, on the GPU one (H, W) plane at a time (no copy
    of the chunk, little memory): any changed bit changes it, with overwhelming probability."""
    total = torch.zeros((), dtype=torch.int64, device=x.device)
    index = None
    for position, plane in enumerate(
        x.reshape(-1, *x.shape[-2:])
        if x.is_contiguous()
        else (x[b, c, f] for b in range(x.shape[0]) for c in range(x.shape[1]) for f in range(x.shape[2]))
    ):
        bits = plane.contiguous().view(-1).view(torch.int32).to(torch.int64)
        if index is None:
            index = torch.arange(bits.numel(), device=x.device, dtype=torch.int64) * 2654435761 + 97531
        total += (bits * (index + position * 1000003)).sum()  # int64 arithmetic wraps: a hash, not a sum
    return total


def load(path: Path, **options) -> tuple[H3VideoDecoder, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    model = H3VideoDecoder.from_pretrained(path, device="cuda", dtype="fp16", fused=True, **options)
    torch.cuda.synchronize()
    return model, time.perf_counter() - start


def release() -> None:
    """Return the memory of models the caller has dropped, so the next peak counts one model only."""
    gc.collect()
    torch.cuda.empty_cache()


def cli(args: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "minimax_h3_vae.command", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(result.stderr.strip().splitlines()[-1], flush=True)
    if result.returncode:
        raise RuntimeError(result.stderr[-2000:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/offload"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict = {"card": torch.cuda.get_device_name(), "torch": torch.__version__}
    checkpoint = args.work / "minimax_h3_video_vae_fp16.safetensors"
    if not checkpoint.exists():
        from safetensors.torch import save_file

        model = random_released_decoder(torch.device("cuda"))
        save_file(
            {k: (v.half() if v.ndim >= 2 else v.float()).contiguous().cpu() for k, v in model.state_dict().items()},
            str(checkpoint),
        )
        del model
        release()
    subprocess.run(["cat", str(checkpoint)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    clip = random_latents(CLIP_SHAPE, seed=2)
    unit = random_latents(UNIT_SHAPE, seed=1)

    resident, results["load resident s"] = load(checkpoint, offload="none")
    del resident
    release()
    resident, results["load resident again s"] = load(checkpoint, offload="none")
    resident.decode(unit)  # compile the kernels, warm the allocator
    results["resident clip"] = stream(resident, clip)
    resident.configure(tile_batch=4)
    unit_resident = resident.decode(unit).cpu()
    small = random_latents((1, 24, 72, 32, 32), seed=3)
    resident.configure(tile_batch=None)
    resident.decode(small[:, :, :7])
    results["resident 512 clip"] = stream(resident, small)
    del resident
    release()

    streamed, results["load blocks s"] = load(checkpoint, offload="blocks")
    streamed.decode(unit)
    results["blocks clip"] = stream(streamed, clip)
    streamed.configure(tile_batch=4)
    results["blocks vs resident, one unit, tile batch 4, bitwise"] = bool(
        torch.equal(streamed.decode(unit).cpu(), unit_resident)
    )
    del unit_resident
    streamed.configure(tile_batch=None)
    results["blocks 512 clip"] = stream(streamed, small)
    del streamed
    release()

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * GIB / total)
    capped, _ = load(checkpoint, offload="auto", max_gpu_memory=4)
    results["capped offload chosen"] = capped.runtime.offload
    try:
        capped.decode(unit[:, :, :3])
        results["capped clip"] = stream(capped, clip)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    del capped
    release()
    again, _ = load(checkpoint, offload="blocks", tile_batch=results["capped clip"]["tile_batch"])
    results["blocks clip, capped run's tile batch"] = stream(again, clip)
    del again
    release()

    from safetensors.torch import save_file

    save_file({"latents": clip[0].cpu().contiguous()}, str(args.work / "clip.safetensors"))
    starts = {"python + import torch s": "import torch", "+ CUDA init s": "import torch; torch.cuda.init()"}
    for name, code in starts.items():
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            runs.append(time.perf_counter() - start)
        results[name] = round(statistics.median(runs), 2)
    for suffix in ("safetensors", "mp4"):
        for attempt in (1, 2):
            results[f"cli {suffix} wall s (run {attempt})"] = round(
                cli(
                    [
                        str(args.work / "clip.safetensors"),
                        str(args.work / f"out.{suffix}"),
                        "--model",
                        str(checkpoint),
                        "--raw-latents",
                    ]
                ),
                2,
            )

    print(json.dumps(results, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "offload.json").write_text(json.dumps(results, indent=2))
    base = results["resident clip"]
    print(f"\n{'variant':40} {'s':>7} {'ratio':>6} {'peak GiB':>9} {'tile batch':>10} {'hash':>17}")
    for name in (
        "resident clip",
        "blocks clip",
        "capped clip",
        "blocks clip, capped run's tile batch",
        "resident 512 clip",
        "blocks 512 clip",
    ):
        row = results.get(name)
        if row:
            ref = results["resident 512 clip"] if "512" in name else base
            print(
                f"{name:40} {row['seconds']:7.2f} {row['seconds'] / ref['seconds']:6.3f} {row['peak_gib']:9.2f} "
                f"{str(row.get('tile_batch')):>10} {row['hash']:>17}"
            )
    print("load s: resident", round(results["load resident again s"], 2), "blocks", round(results["load blocks s"], 2))
    inside = results["load resident again s"] + base["seconds"]
    for key in [k for k in results if k.startswith("cli")]:
        print(f"{key}: {results[key]} (x{results[key] / inside:.2f} of load + streamed decode {inside:.2f} s)")
    floor = results["python + import torch s"] + inside
    print(
        f"python + import torch {results['python + import torch s']} s, with CUDA init {results['+ CUDA init s']} s; "
        f"any command's floor, import + load + decode: {floor:.2f} s (x{floor / inside:.2f})"
    )


if __name__ == "__main__":
    main()
