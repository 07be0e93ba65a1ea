"""Bits against grouping on the GPU: which ops give a tile other bits when it shares a call with other tiles,
whether whole decodes do, and what the batch-invariant decode costs against an older tree.

    PYTHONPATH=. python benchmarks/bench_invariance.py --base OLD_TREE [--json out.json] [--device cpu]

1. Each op alone at the released shapes (random inputs, torch's default flags): one call over the first n
   tiles, for n = 2..28, against the 28 tiles one call each; prints the n whose rows differ.
2. Whole decodes (released size, random weights, fp16 recipe, one 1344x768 unit of 28 tiles): the output
   of each tile batch against tile batch 1, for this tree and for OLD_TREE.
3. ms per unit, this tree against OLD_TREE in the same process, alternating (fused, eager, offload="blocks"),
   with SM clock and board power; each path's error against this tree's fp32 eager decode (TF32 off).

OLD_TREE is a checkout holding an older `minimax_h3_vae/`; it is imported under another name, so both trees
run side by side (the package imports itself only relatively). `--device cpu` runs the same steps at a toy size
(2 blocks, width 128, 4 tiles; the fused kernels need TRITON_INTERPRET=1), to try the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import UNIT_SHAPE, randomize_  # noqa: E402
from gpu_clocks import ClockSampler  # noqa: E402

import minimax_h3_vae as new  # noqa: E402
from minimax_h3_vae import blocks  # noqa: E402
from minimax_h3_vae.blocks import attention_backends  # noqa: E402
from minimax_h3_vae.frames import to_uint8_frames  # noqa: E402
from minimax_h3_vae.rope import rotary_table, token_positions  # noqa: E402
from minimax_h3_vae.runtime import ATTENTION_BACKENDS  # noqa: E402

GRID = (7, 16, 16)  # one tile's latents
TOKENS = GRID[0] * GRID[1] * GRID[2]
# Set by main: the device, the config, the unit's latent shape and its tile count.
DEVICE, CONFIG, UNIT, TILES = torch.device("cuda"), new.H3DecoderConfig(), UNIT_SHAPE, 28


def import_tree(tree: Path, name: str):
    """The package in `tree`/minimax_h3_vae, imported as `name`."""
    folder = Path(tempfile.mkdtemp())
    shutil.copytree(tree / "minimax_h3_vae", folder / name)
    sys.path.insert(0, str(folder))
    return importlib.import_module(name)


def rows_differ(fn, *inputs) -> list[int]:
    """The n in 2..28 for which fn over the first n tiles (dim 0 of each input) differs from fn tile by tile."""

    def flat(out):
        return list(out) if isinstance(out, tuple) else [out]

    single = [flat(fn(*(x[i : i + 1].clone() for x in inputs))) for i in range(TILES)]
    differ = []
    for n in range(2, TILES + 1):
        got = flat(fn(*(x[:n].clone() for x in inputs)))
        if any(not torch.equal(g, torch.cat([s[j] for s in single[:n]])) for j, g in enumerate(got)):
            differ.append(n)
    return differ


def op_table(c) -> dict[str, list[int]]:
    g = torch.Generator(DEVICE).manual_seed(0)

    def randn(*shape, dtype=torch.float32, scale=1.0):
        return (scale * torch.randn(*shape, device=DEVICE, generator=g)).to(dtype)

    seq, d, f = TOKENS + c.num_register_tokens + 1, c.dim, c.ffn_dim
    z = randn(TILES, c.latent_channels, *GRID)
    conv_w, conv_b = randn(24, 24, 1, 1, 1, scale=0.2), randn(24)
    emb_w, emb_b = randn(d, 24, scale=0.2), randn(d)
    residual = randn(TILES, seq, d)
    norm_w = 1 + randn(d, scale=0.1)
    shapes = {"qkv": (d, 3 * d), "to_out": (d, d), "w1": (d, 2 * f), "w2": (f, d)}
    table = {
        "post_quant_conv as F.conv3d (cuDNN)": rows_differ(lambda x: F.conv3d(x, conv_w, conv_b), z),
        "x_embedder F.linear on (N, S, 24) transposed view": rows_differ(
            lambda x: F.linear(x.flatten(2).transpose(1, 2), emb_w, emb_b), z
        ),
    }
    for dtype in (torch.float16, torch.float32):
        for name, (k, n) in shapes.items():
            x, w, b = randn(TILES, seq, k, dtype=dtype), randn(n, k, dtype=dtype, scale=0.02), randn(n, dtype=dtype)
            table[f"F.linear {name} {dtype}"] = rows_differ(lambda x, w=w, b=b: F.linear(x, w, b), x)
            del x
    head_x, head_w, head_b = randn(TILES, TOKENS, d), randn(c.patch_dim, d, scale=0.02), randn(c.patch_dim)
    table["proj_out F.linear fp32 (one call)"] = rows_differ(lambda x: F.linear(x, head_w, head_b), head_x)
    table["norm_out F.layer_norm"] = rows_differ(lambda r: F.layer_norm(r[:, :TOKENS], (d,), norm_w, norm_w), residual)
    table["rms_norm eager"] = rows_differ(lambda r: blocks.rms_norm(r, norm_w, 1e-5, torch.float16), residual)
    qkv = randn(TILES, seq, 3 * d, dtype=torch.float16)
    rotary = rotary_table(token_positions(*GRID, c.num_register_tokens + 1, DEVICE), c.rope_dim, c.rope_theta)
    ops = {"eager": blocks.qk_rms_norm_rope}
    if DEVICE.type == "cuda":  # the Triton kernels
        from minimax_h3_vae.fused import qk_rms_norm_rope, rms_norm, scale_add_rms_norm, silu_mul, tf32x3_linear

        ops["triton"] = qk_rms_norm_rope.qk_rms_norm_rope
        linear = tf32x3_linear.linear_fp32
        table["proj_out tf32x3_linear"] = rows_differ(lambda x: linear(x, head_w, head_b), head_x)
        table["rms_norm triton"] = rows_differ(lambda r: rms_norm.rms_norm(r, norm_w, 1e-5, torch.float16), residual)
        y = randn(TILES, seq, d, dtype=torch.float16)
        table["scale_add_rms_norm triton"] = rows_differ(
            lambda r, y: scale_add_rms_norm.scale_add_rms_norm(r, y, norm_w, norm_w, 1e-5, torch.float16), residual, y
        )
        table["silu_mul triton"] = rows_differ(silu_mul.silu_mul, randn(TILES, seq, 2 * f, dtype=torch.float16))
    for label, op in ops.items():
        table[f"qk_rms_norm_rope {label}"] = rows_differ(
            lambda t, op=op: op(t, rotary.cos, rotary.sin, c.num_heads, 1e-5), qkv
        )
    for dtype in (torch.float16, torch.float32):
        q, k, v = (randn(TILES, seq, c.num_heads, c.head_dim, dtype=dtype).transpose(1, 2) for _ in range(3))
        with attention_backends(ATTENTION_BACKENDS):
            table[f"SDPA {dtype}"] = rows_differ(F.scaled_dot_product_attention, q, k, v)
    return table


def in_memory(package):
    """The package's in-memory checkpoint door, wherever its version keeps it (checkpoints/, or loading.py)."""
    for module in ("checkpoints", "loading"):
        try:
            return importlib.import_module(f"{package.__name__}.{module}").checkpoint_in_memory
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no checkpoint_in_memory in {package.__name__}")


def fields(config) -> dict:
    return {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}


def released(package):
    """`package`'s decoder of CONFIG, random weights (common.randomize_, seed 0), fp32 on DEVICE."""
    with DEVICE:
        model = package.H3VideoDecoder(package.H3DecoderConfig(**fields(CONFIG)))
    randomize_(model.named_parameters(), torch.Generator(DEVICE).manual_seed(0), only=("",))
    return model.eval().requires_grad_(False)


def grouping(model, z, tile_batches, **options) -> dict:
    expected = model.decode(z, tile_batch=1, **options)
    differ = {}
    for n in tile_batches:
        out = model.decode(z, tile_batch=n, **options)
        if not torch.equal(out, expected):
            differ[n] = (out - expected).abs().max().item()
    return {"tested": list(tile_batches), "differ (max abs)": differ}


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def alternate(variants: dict, rounds: int, per_round: int) -> dict:
    """Median ms of each variant's call, the variants taking turns; clocks over the whole run."""
    times = {name: [] for name in variants}
    for fn in variants.values():
        fn()
    synchronize()
    with ClockSampler() as clocks:
        for _ in range(rounds):
            for name, fn in variants.items():
                for _ in range(per_round):
                    start = time.perf_counter()
                    fn()
                    synchronize()
                    times[name].append(1000 * (time.perf_counter() - start))
    return {**{name: round(statistics.median(t), 1) for name, t in times.items()}, "clocks": clocks.summary}


def error(out, reference) -> dict:
    """Against the fp32 decode: max, mean and RMS abs error (model space), and the share of uint8 values
    that differ (frames.to_uint8_frames)."""
    diff = (out - reference).abs()
    levels = (to_uint8_frames(out) != to_uint8_frames(reference)).float().mean().item()
    rms = diff.square().mean().sqrt().item()
    return {"max": diff.max().item(), "mean": diff.mean().item(), "rms": rms, "uint8 off": levels}


STEPS = ("ops", "grouping", "errors", "timing", "blocks")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {STEPS}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="latent seeds of the error step")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the blocks step")
    args = parser.parse_args()
    steps = set(args.steps.split(","))
    import triton

    global DEVICE, CONFIG, UNIT, TILES
    if args.device == "cpu":
        DEVICE, CONFIG, UNIT, TILES = torch.device("cpu"), new.H3DecoderConfig(num_layers=2, num_heads=2), None, 4
        UNIT = (1, 24, 7, 28, 28)
    old = import_tree(args.base, "h3_base")
    card = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu"
    info = {"commit": args.commit, "card": card, "torch": torch.__version__, "triton": triton.__version__}
    info.update(cudnn=torch.backends.cudnn.version(), cuda=torch.version.cuda)
    print(json.dumps(info), flush=True)
    results = {"info": info}
    if "ops" in steps:
        results["ops"] = op_table(CONFIG)
        for name, differ in results["ops"].items():
            print(f"{name:52} {'invariant' if not differ else 'differs at n = ' + str(differ)}", flush=True)

    def latents(seed):
        return torch.randn(UNIT, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(seed))

    z = latents(args.seeds[0])
    models = {"old": released(old), "new": released(new)}
    # fp32 eager decodes of this tree, TF32 off (torch's default for matmuls), one per seed
    references = {seed: models["new"].configure(fused=False).decode(latents(seed)) for seed in args.seeds}
    reference = references[args.seeds[0]]
    if "errors" in steps:
        results["fp32 old vs new"] = error(models["old"].configure(fused=False).decode(z), reference)
    state = {k: v.cpu() for k, v in models["new"].state_dict().items()} if "blocks" in steps else None
    for model in models.values():
        model.to_release_fp16()
    if "grouping" in steps:
        results["grouping"] = {
            "new fused": grouping(models["new"].configure(fused=True), z, range(2, TILES + 1)),
            "old fused": grouping(models["old"].configure(fused=True), z, (3, 4, 7, 14, 28)),
            "new eager": grouping(models["new"].configure(fused=False), z, (3, 4, 7, 14, 28)),
            "old eager": grouping(models["old"].configure(fused=False), z, (3, 4, 7, 14, 28)),
        }
        print(json.dumps(results["grouping"]), flush=True)
    results["error vs fp32"], results["ms per unit"] = {}, {}
    if "errors" in steps:
        for seed in args.seeds:
            for name, model in models.items():
                for is_fused in (True, False):
                    out = model.decode(latents(seed), fused=is_fused)
                    label = f"{name} {'fused' if is_fused else 'eager'} seed {seed}"
                    results["error vs fp32"][label] = error(out, references[seed])
    if "timing" in steps:
        results["ms per unit"]["fused"] = alternate(
            {k: lambda m=m: m.decode(z, fused=True) for k, m in models.items()}, 4, 2
        )
        results["ms per unit"]["eager"] = alternate(
            {k: lambda m=m: m.decode(z, fused=False) for k, m in models.items()}, 3, 2
        )
    del models
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    if "blocks" in steps:
        streamed = {}
        for name, package in (("old", old), ("new", new)):
            config = package.H3DecoderConfig(**fields(CONFIG))
            checkpoint = in_memory(package)(state, config, "original", "random weights")
            streamed[name] = package.H3VideoDecoder.from_checkpoint(
                checkpoint, device=DEVICE, dtype="fp16", fused=True, offload="blocks", gemm="cublas", attention="sdpa"
            )
        for name, model in streamed.items():
            results["error vs fp32"][f"{name} blocks seed {args.seeds[0]}"] = error(model.decode(z), reference)
        variants = {k: lambda m=m: m.decode(z) for k, m in streamed.items()}
        results["ms per unit"]["blocks"] = alternate(variants, args.rounds, 2)
    print(json.dumps(results, indent=1), flush=True)
    print(f"{'path':8} {'old ms':>8} {'new ms':>8} {'new/old':>8}  clocks", flush=True)
    for path, row in results["ms per unit"].items():
        print(f"{path:8} {row['old']:8.1f} {row['new']:8.1f} {row['new'] / row['old']:8.4f}  {row['clocks']}")
    print(f"{'error vs fp32':22} {'max':>10} {'mean':>10} {'rms':>10} {'uint8 off':>10}")
    for name, row in results["error vs fp32"].items():
        print(f"{name:22} {row['max']:10.3e} {row['mean']:10.3e} {row['rms']:10.3e} {row['uint8 off']:10.3%}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
