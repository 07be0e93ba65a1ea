"""Probe (device only, not part of the suite): FlashAttention 4's Hopper forward (flash-attn-4, CuTe DSL) against
cuDNN's SDPA at the decoder's attention shape, alone and inside a whole fused decode.

    PYTHONPATH=. python benchmarks/attention_probe.py [--rounds 3] [--repeats 3] [--tiles]

The decoder's attention: 28 tiles x 1797 tokens, 32 heads of 64, fp16, no mask; q, k, v are strided views of the
projection's (B, S, H, 3, D) output (gemm="quack"). Alone: each backend's error against float64 attention over
two tiles, then both timed alternately (median of 10, three times). In a decode: the package with gemm="quack"
as it is (cuDNN) against the same decoder with the block's SDPA call swapped for flash-attn-4 (this script
patches `blocks.sdpa`; the package does not do this), alternating, with SM clock and power; errors against an fp32
eager decode of the same weights. A table last. --tiles instead times flash-attn-4's tile configs alone
(through its internal `_flash_attn_fwd`, which takes them), against its default and cuDNN.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import commit, errors, sharing_weights  # noqa: E402
from common import UNIT_SHAPE, fp32_reference, random_latents, random_released_decoder, run_info, timed  # noqa: E402

from minimax_h3_vae import blocks, sdpa  # noqa: E402
from minimax_h3_vae.fused import _quack  # noqa: E402

B, S, H, D = 28, 1797, 32, 64


def cudnn_sdpa(q, k, v):
    """q, k, v: (B, H, S, D) -> (B, H, S, D), cuDNN only."""
    return sdpa.attention(q, k, v, ("CUDNN_ATTENTION",))


def fa4_sdpa(q, k, v):
    """The same contract through flash-attn-4 (which takes and returns (B, S, H, D))."""
    from flash_attn.cute.interface import flash_attn_func

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)


def attention_alone(cuda):
    g = torch.Generator(device=cuda).manual_seed(0)
    qkv = torch.randn(B, S, H, 3, D, device=cuda, generator=g)
    # q and k as the QK RMSNorm leaves them (unit RMS per head, norm weights 1 +- 0.1), v as a projection's output.
    qk = qkv[..., :2, :]
    qkv[..., :2, :] = qk * torch.rsqrt(qk.square().mean(-1, keepdim=True)) * (1 + 0.1 * torch.randn(D, device=cuda))
    qkv = qkv.half()
    q, k, v = qkv.transpose(1, 2).unbind(3)  # (B, H, S, D) strided views, as the projection's op returns them
    q2, k2, v2 = (t[:2].double() for t in (q, k, v))
    ref = torch.softmax(q2 @ k2.transpose(-1, -2) / D**0.5, -1) @ v2
    table = {}
    start = time.perf_counter()
    fa4_sdpa(q, k, v)
    torch.cuda.synchronize()
    table["fa4 first call s"] = round(time.perf_counter() - start, 2)
    for name, fn in (("cudnn", cudnn_sdpa), ("fa4", fa4_sdpa)):
        out = fn(q, k, v)
        diff = (out[:2].double() - ref).abs()
        table[f"{name} err max/mean"] = (f"{diff.max().item():.2e}", f"{diff.mean().item():.2e}")
        table[f"{name} out stride"] = tuple(out.stride())
    ms = {"cudnn": [], "fa4": []}
    clocks = {"cudnn": [], "fa4": []}
    for _ in range(3):
        for name, fn in (("cudnn", cudnn_sdpa), ("fa4", fa4_sdpa)):
            t = timed(lambda fn=fn: fn(q, k, v), 10)
            ms[name].append(round(t.ms, 3))
            clocks[name].append(t.clocks.get("median_sm_mhz"))
    flops = 4 * B * H * S * S * D
    for name in ms:
        best = min(ms[name])
        table[f"{name} ms (3 x median of 10)"] = ms[name]
        table[f"{name} TFLOP/s at best"] = round(flops / best / 1e9, 1)
        table[f"{name} MHz"] = clocks[name]
    return table


# (tile_m, tile_n, mma_pv_is_rs, intra_wg_overlap); the first is flash-attn-4's default for D = 64 on SM90.
TILES = [
    (192, 128, True, True),
    (128, 128, True, True),
    (192, 192, True, True),
    (128, 192, True, True),
    (192, 128, False, True),
    (128, 256, True, True),
    (192, 160, True, True),
    (256, 128, True, True),
    (192, 112, True, True),
]


def tile_sweep(cuda):
    from flash_attn.cute.interface import _flash_attn_fwd

    g = torch.Generator(device=cuda).manual_seed(0)
    qkv = torch.randn(B, S, H, 3, D, device=cuda, generator=g).half()
    q, k, v = qkv.unbind(3)  # (B, S, H, D) strided views, as flash-attn-4 takes them
    default = None
    print("| tile (m, n, pv in registers, overlap) | ms, 3 x median of 10 | same bits as the default | MHz |")
    print("| --- | --- | --- | --- |")
    for tile in TILES:
        m, n, rs, overlap = tile

        def call(m=m, n=n, rs=rs, overlap=overlap):
            return _flash_attn_fwd(q, k, v, tile_mn=(m, n), mma_pv_is_rs=rs, intra_wg_overlap=overlap)[0]

        try:
            out = call()
        except Exception as error:  # a tile the kernel does not build
            print(f"| {tile} | {type(error).__name__}: {str(error)[:80]} | | |", flush=True)
            continue
        default = out if default is None else default
        runs = [timed(call, 10) for _ in range(3)]
        same = "yes" if torch.equal(out, default) else f"no ({(out - default).abs().max().item():.1e})"
        ms = [round(t.ms, 3) for t in runs]
        print(f"| {tile} | {ms} | {same} | {runs[-1].clocks.get('median_sm_mhz')} |", flush=True)
    t = timed(lambda: cudnn_sdpa(*(x.transpose(1, 2) for x in (q, k, v))), 10)
    print(f"| cuDNN | {t.ms:.3f} | - | {t.clocks.get('median_sm_mhz')} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiles", action="store_true")
    args = parser.parse_args()
    cuda = torch.device("cuda")
    _quack.load()
    if args.tiles:
        tile_sweep(cuda)
        return
    start = time.perf_counter()
    import flash_attn.cute.interface  # noqa: F401

    import_s = time.perf_counter() - start
    import cutlass
    import quack

    run_info(commit(), quack=quack.__version__, cutlass_dsl=getattr(cutlass, "__version__", "?"))
    alone = attention_alone(cuda)
    for key, value in alone.items():
        print(f"  {key}: {value}", flush=True)

    z = random_latents(UNIT_SHAPE, seed=1)
    reference = fp32_reference(z)
    model = sharing_weights(random_released_decoder(cuda).configure(fused=True), gemm="quack")

    ours = blocks.sdpa
    with_fa4 = types.SimpleNamespace(attention=lambda q, k, v, backends: fa4_sdpa(q, k, v))

    def decode_with(attention):
        blocks.sdpa = attention
        try:
            return model.decode(z)
        finally:
            blocks.sdpa = ours

    variants = {"quack + cudnn": ours, "quack + fa4": with_fa4}
    timings = {name: [] for name in variants}
    outs, peaks, clocks = {}, {}, {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, functional in variants.items():
            t = timed(lambda functional=functional: decode_with(functional), args.repeats)
            timings[name].append(t.ms)
            outs[name], peaks[name] = t.out, t.peak_bytes
            clocks[name].append(t.clocks)

    print(f"\nflash-attn-4 import {import_s:.1f} s (after quack's)")
    print("| variant | ms per unit (median of rounds) | rounds | peak GiB | max abs | mean abs | clocks |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    for name in variants:
        err = errors(outs[name], reference)
        clk = ", ".join(f"{c.get('median_sm_mhz')} MHz/{c.get('median_power_w')} W" for c in clocks[name] if c)
        print(
            f"| {name} | {statistics.median(timings[name]):.1f} | {[round(v, 1) for v in timings[name]]} | "
            f"{peaks[name] / 2**30:.2f} | {err[0]:.2e} | {err[1]:.2e} | {clk} |"
        )
    ratio = statistics.median(timings["quack + fa4"]) / statistics.median(timings["quack + cudnn"])
    apart = errors(outs["quack + fa4"], outs["quack + cudnn"])[0]
    print(f"fa4 / cudnn per unit: {ratio:.3f}; fa4 vs cudnn decode: max {apart:.2e}")


if __name__ == "__main__":
    main()
