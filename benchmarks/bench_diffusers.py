"""One GPU run: the decode step of diffusers' MiniMax-H3 pipeline, stock VAE against `swap_decoder`.

    PYTHONPATH=. python benchmarks/bench_diffusers.py --commit $(git rev-parse --short HEAD) [--repeats 5] [--short]

Released architecture, random weights (benchmarks/common.py). Times `vae.decode(z, return_dict=False)[0]` on
denormalised latents, the call `MiniMaxH3VideoDecodeStep` makes, for:
- stock bf16: the VAE as `pipe.load_components(dtype=torch.bfloat16)` leaves it (its `_keep_in_fp32_modules`
  in fp32, every other parameter bf16);
- stock fp16 autocast: fp32 weights under `torch.autocast("cuda", torch.float16)`;
- swapped, fp32-loaded: `swap_decoder` on the fp32 VAE (default recipe: fp16 block linears, fused on CUDA);
- swapped, bf16-loaded: `swap_decoder` after the bf16 load: same recipe, but on bf16-rounded weights.
One temporal unit at 1344x768 (UNIT_SHAPE) and the 10 s clip (CLIP_SHAPE; with --short only stock bf16 and
the swapped fp32-loaded VAE). Per variant: ms per unit (CUDA events, median), peak GPU memory above the
resident weights, max / mean abs error (model space) against an fp32 decode with TF32 off. Prints a table
last; writes JSON to $OUT/bench_diffusers.json when OUT is set.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CLIP_SHAPE, UNIT_SHAPE, random_latents, random_released_vae, run_info, timed  # noqa: E402

from minimax_h3_vae.diffusers import decoder_of, swap_decoder  # noqa: E402

UNITS = {"unit": (UNIT_SHAPE, 1), "clip": (CLIP_SHAPE, 14)}  # latents shape, temporal units in it


def as_pipeline_loads(vae, dtype: torch.dtype):
    """In place, the dtypes `from_pretrained(torch_dtype=dtype)` gives: a parameter stays fp32 when a
    component of its module path is one of `_keep_in_fp32_modules` (so `post_quant_conv` is cast, `quant_conv`
    not)."""
    keep = set(vae._keep_in_fp32_modules)
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if not keep & set(name.split(".")):
                param.data = param.data.to(dtype)
    return vae


def decode_step(vae, z: torch.Tensor, autocast: bool) -> torch.Tensor:
    """The call MiniMaxH3VideoDecodeStep makes, on denormalised latents (B, 24, T, h, w)."""
    with torch.no_grad(), torch.autocast("cuda", torch.float16, enabled=autocast):
        return vae.decode(z, return_dict=False)[0]


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (out.float() - ref).abs()
    return {"max_abs": diff.max().item(), "mean_abs": diff.mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--short", action="store_true", help="clip: stock bf16 and swapped fp32-loaded only")
    args = parser.parse_args()
    import diffusers

    info = run_info(args.commit, diffusers=diffusers.__version__)

    fp32 = random_released_vae(seed=0)
    bf16 = as_pipeline_loads(random_released_vae(seed=0), torch.bfloat16)
    swapped_fp32 = swap_decoder(random_released_vae(seed=0))
    swapped_bf16 = swap_decoder(as_pipeline_loads(random_released_vae(seed=0), torch.bfloat16))

    for name, vae in {"fp32-loaded": swapped_fp32, "bf16-loaded": swapped_bf16}.items():
        stock_bytes = sum(p.numel() * p.element_size() for p in vae.decoder.parameters())
        ours = decoder_of(vae).device_bytes()
        info[f"swapped {name}: GiB held"] = {"diffusers' decoder": stock_bytes / 2**30, "ours": ours / 2**30}
        print(f"swapped, {name}: diffusers' decoder {stock_bytes / 2**30:.2f} GiB + ours {ours / 2**30:.2f} GiB")

    variants = {  # name: (VAE, fp16 autocast)
        "stock bf16": (bf16, False),
        "stock fp16 autocast": (fp32, True),
        "swapped, fp32-loaded": (swapped_fp32, False),
        "swapped, bf16-loaded": (swapped_bf16, False),
    }
    rows = {}
    for size, (shape, units) in UNITS.items():
        z = random_latents(shape, seed=1)
        with torch.no_grad():
            reference = fp32.decode(z, return_dict=False)[0]  # diffusers fp32, TF32 off: the accuracy reference
        for name, (vae, autocast) in variants.items():
            if size == "clip" and args.short and name not in ("stock bf16", "swapped, fp32-loaded"):
                continue
            t = timed(functools.partial(decode_step, vae, z, autocast), args.repeats if size == "unit" else 1)
            rows[f"{size}: {name}"] = {
                "ms_per_unit": t.ms / units,
                "peak_gib_above_weights": t.peak_bytes / 2**30,
                **errors(t.out, reference),
                **t.clocks,
            }
            del t
            print(size, name, rows[f"{size}: {name}"], flush=True)
        del reference
        torch.cuda.empty_cache()
    info["results"] = rows
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_diffusers.json").write_text(json.dumps(info, indent=2))
    base = {size: rows[f"{size}: stock bf16"]["ms_per_unit"] for size in UNITS}
    print(f"\n{'variant':34} {'ms/unit':>9} {'speedup':>8} {'peak GiB':>9} {'max abs':>9} {'mean abs':>9}")
    for name, row in rows.items():
        speedup = base[name.split(":")[0]] / row["ms_per_unit"]
        print(
            f"{name:34} {row['ms_per_unit']:9.1f} {speedup:7.2f}x {row['peak_gib_above_weights']:9.2f} "
            f"{row['max_abs']:9.2e} {row['mean_abs']:9.2e}"
        )


if __name__ == "__main__":
    main()
