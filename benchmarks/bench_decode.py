"""One GPU run: accuracy and speed of the released-size decoder, ours against diffusers, in one process.

    PYTHONPATH=. python benchmarks/bench_decode.py --commit $(git rev-parse --short HEAD) [--repeats 5]

Builds the released architecture (36 blocks, width 2048) with random weights (N(0, 0.02) matrices, norm
weights 1 +- 0.1, layer scales N(0, 0.1): never zeros) in diffusers' AutoencoderKLMiniMaxH3, copies the
same weights into our decoder, and decodes one temporal unit at 1344x768 (7 latent frames, 28 tiles):

- the reference: our eager decode in fp32 with TF32 off (and diffusers fp32 beside it, as a parity check);
- errors against it (max / mean abs, model space) of diffusers fp16 autocast, our eager fp16 recipe,
  our fused fp16 recipe, and the fp16 noise floor (two eager fp16 decodes differing only in attention
  backend);
- ms per temporal unit (CUDA events, warm-up, median), peak GPU memory above the resident weights;
- a 10 s clip (72 latent frames) streamed to uint8 frames, with the default tile batch and with 1 tile per
  call: wall time and peak GPU memory, weights included.
Prints a table last and writes everything as JSON to $OUT/bench.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    CLIP_SHAPE,
    UNIT_SHAPE,
    ours_from,
    random_latents,
    random_released_vae,
    run_info,
    timed,
)
from gpu_clocks import ClockSampler  # noqa: E402

from minimax_h3_vae import H3VideoDecoder  # noqa: E402
from minimax_h3_vae.runtime import ATTENTION_BACKENDS  # noqa: E402


def stream_clip(model: H3VideoDecoder, tile_batch: int | None) -> dict:
    """Decode a 10 s 1344x768 clip through decode_stream to uint8 frames on the CPU; wall time and peak memory
    (weights included: the process holds only this fp16 model now)."""
    from minimax_h3_vae import to_uint8_frames

    z = torch.randn(CLIP_SHAPE, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    model.configure(tile_batch=tile_batch)
    model.configure(fused=_fused_available())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with ClockSampler() as clocks:
        start = time.perf_counter()
        frames = sum(to_uint8_frames(chunk).cpu().shape[0] for chunk in model.decode_stream(z))
        seconds = time.perf_counter() - start
    model.configure(tile_batch=None)
    row = {
        "frames": frames,
        "seconds": seconds,
        "ms_per_unit": 1000 * seconds / 14,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        **clocks.summary,
    }
    print("clip, tile_batch", tile_batch, row, flush=True)
    return row


def write_comfyui_checkpoint(model: H3VideoDecoder, path: Path) -> None:
    """The random weights as a ComfyUI-layout single file (original names, fp16 matrices), for the CLI."""
    from safetensors.torch import save_file

    tensors = {k: (v.half() if v.ndim >= 2 else v.float()).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, str(path))


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (out.float() - ref.float()).abs()
    return {"max_abs": diff.max().item(), "mean_abs": diff.mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-diffusers-timing", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one decode")
    parser.add_argument("--write-checkpoint", help="also write the random weights as a ComfyUI fp16 file here")
    args = parser.parse_args()

    info = run_info(args.commit, shape=list(UNIT_SHAPE))

    vae = random_released_vae(seed=0)
    z = random_latents(UNIT_SHAPE, seed=1)

    fp32 = ours_from(vae)
    reference = fp32.decode(z)
    with torch.no_grad():
        diffusers_fp32 = vae.decode(z).sample
    info["results"]["diffusers fp32 vs ours fp32"] = errors(diffusers_fp32, reference)
    print("reference std", reference.std().item(), "parity", info["results"]["diffusers fp32 vs ours fp32"], flush=True)
    del diffusers_fp32

    fp16 = ours_from(vae, "fp16")
    del fp32
    torch.cuda.empty_cache()
    rows = {}

    def diffusers_autocast():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return vae.decode(z).sample

    def ours(fused: bool):
        def run():
            fp16.configure(fused=fused)
            return fp16.decode(z)

        return run

    variants = [("diffusers fp16 autocast", diffusers_autocast), ("ours eager fp16", ours(False))]
    if _fused_available():
        variants.append(("ours fused fp16", ours(True)))
    outputs = {}
    for name, fn in variants:
        repeats = 1 if (name.startswith("diffusers") and args.skip_diffusers_timing) else args.repeats
        t = timed(fn, repeats)
        outputs[name] = t.out
        rows[name] = {
            "ms_per_unit": t.ms,
            "peak_gib_above_weights": t.peak_bytes / 2**30,
            **errors(t.out, reference),
            **t.clocks,
        }
        print(name, rows[name], flush=True)

    from torch.nn.attention import SDPBackend

    floor = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):

        def eager_with_backend(backend=backend):
            fp16.configure(attention_backends=(backend.name,))
            fp16.configure(fused=False)
            return fp16.decode(z)

        t = timed(eager_with_backend, args.repeats)
        floor[backend.name] = t.out
        rows[f"ours eager fp16 {backend.name.lower()}"] = {
            "ms_per_unit": t.ms,
            "peak_gib_above_weights": t.peak_bytes / 2**30,
            **errors(floor[backend.name], reference),
            **t.clocks,
        }
        print(backend.name, rows[f"ours eager fp16 {backend.name.lower()}"], flush=True)
    fp16.configure(attention_backends=ATTENTION_BACKENDS)
    names = list(floor)
    info["results"]["noise floor (eager fp16, attention backends)"] = {
        f"{a} vs {b}": errors(floor[a], floor[b]) for i, a in enumerate(names) for b in names[i + 1 :]
    }
    if "ours fused fp16" in outputs:
        info["results"]["fused vs eager fp16"] = errors(outputs["ours fused fp16"], outputs["ours eager fp16"])
        info["results"]["fused launch counts"] = fp16.launch_counts()
    info["results"]["variants"] = rows

    vae = outputs = floor = reference = None  # free the GPU memory before the clip
    torch.cuda.empty_cache()
    info["results"]["10 s clip (72 latent frames, 243 frames), streaming, fused fp16"] = {
        str(batch): stream_clip(fp16, batch) for batch in (None, 1)
    }
    if args.write_checkpoint:
        write_comfyui_checkpoint(fp16, Path(args.write_checkpoint))

    if args.profile:
        fp16.configure(fused=_fused_available())
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fp16.decode(z)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60)
        print(table)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "profile.txt").write_text(table)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info["results"], indent=1))
    print_bounds(info["results"])
    base = rows["diffusers fp16 autocast"]["ms_per_unit"]
    print(
        f"\n{'variant':28} {'ms/unit':>9} {'speedup':>8} {'peak GiB':>9} {'max abs':>9} {'mean abs':>9} "
        f"{'SM MHz':>7} {'watts':>6}"
    )
    for name, row in rows.items():
        print(
            f"{name:28} {row['ms_per_unit']:9.1f} {base / row['ms_per_unit']:7.2f}x "
            f"{row['peak_gib_above_weights']:9.2f} {row['max_abs']:9.2e} {row['mean_abs']:9.2e} "
            f"{row.get('median_sm_mhz', float('nan')):7.0f} {row.get('median_power_w', float('nan')):6.0f}"
        )


def print_bounds(results: dict) -> None:
    """The accuracy bounds of the issues, checked on this run's numbers."""
    rows = results["variants"]
    eager, theirs = rows["ours eager fp16"], rows["diffusers fp16 autocast"]
    checks = [
        (
            "eager fp16 error <= diffusers fp16 autocast error (max, mean)",
            eager["max_abs"] <= theirs["max_abs"] and eager["mean_abs"] <= theirs["mean_abs"],
        )
    ]
    if "ours fused fp16" in rows:
        fused = rows["ours fused fp16"]
        floor = results["noise floor (eager fp16, attention backends)"]["FLASH_ATTENTION vs CUDNN_ATTENTION"]
        checks += [
            (
                "fused fp16 error <= 1.1 x eager fp16 error (max, mean)",
                fused["max_abs"] <= 1.1 * eager["max_abs"] and fused["mean_abs"] <= 1.1 * eager["mean_abs"],
            ),
            (
                f"fused vs eager max abs {results['fused vs eager fp16']['max_abs']:.2e} <= noise floor "
                f"{floor['max_abs']:.2e} (eager cuDNN vs flash)",
                results["fused vs eager fp16"]["max_abs"] <= floor["max_abs"],
            ),
        ]
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")


def _fused_available() -> bool:
    try:
        from minimax_h3_vae import fused  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
