"""Probe (device only, not part of the suite): proj_out on the fused path, tf32x3_linear (Triton, three TF32
products per tile) against fp16x3_linear (quack, one fp16 GEMM over operands split into two fp16 parts), alone and
inside a whole quack + fa4 decode; and where fp16x3's error comes from.

    PYTHONPATH=. python benchmarks/proj_out_probe.py [--rounds 3] [--repeats 3]

Alone, at proj_out's shape (28 tiles x 1797 tokens, 2048 -> 3072, float32; x as a LayerNorm leaves it): the
split kernel against its torch reference (bits), each op's error against the float64 product, whether a tile's
rows alone give the same bits as inside the batch, then the ops timed alternately (median of 10, three times)
with cuBLAS float32 and TF32 for scale; GEMMs of exactly known fp16 products (quack and cuBLAS, float32 out) for
the tensor cores' accumulation. In a decode: cuBLAS fused, quack + fa4 as shipped (fp16x3), and quack + fa4 with
tf32x3 for proj_out (this script swaps the op in the decoder's ops), alternating; errors against an fp32 eager
decode of the same weights. A table last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import commit, errors, sharing_weights  # noqa: E402
from common import UNIT_SHAPE, fp32_reference, random_latents, random_released_decoder, run_info, timed  # noqa: E402

from minimax_h3_vae import fused  # noqa: E402
from minimax_h3_vae.fused import _quack  # noqa: E402

M, N, K = 28 * 1797, 3072, 2048


def alone(cuda) -> dict:
    from minimax_h3_vae.fused import fp16x3_linear, tf32x3_linear

    g = torch.Generator(device=cuda).manual_seed(0)
    h = torch.randn(M, K, device=cuda, generator=g) * (1 + torch.rand(K, device=cuda, generator=g))
    x = F.layer_norm(h, (K,), 1 + 0.1 * torch.randn(K, device=cuda, generator=g), 0.02 * torch.randn(K, device=cuda))
    w = 0.02 * torch.randn(N, K, device=cuda, generator=g)
    b = 0.02 * torch.randn(N, device=cuda, generator=g)
    result = {}
    for name, t, lo in (("x", x, 2), ("w", w, 1)):
        got, want = fp16x3_linear.split_rows(t, lo), fp16x3_linear.split_rows_reference(t, lo)
        result[f"split {name} bits equal"] = all(torch.equal(a, b) for a, b in zip(got, want))
    start = time.perf_counter()
    fp16x3_linear.linear_fp32(x, w, b)
    torch.cuda.synchronize()
    result["fp16x3 first call s"] = round(time.perf_counter() - start, 2)
    ref = torch.addmm(b.double(), x.double(), w.double().T)
    scale = ref.abs().max().item()
    ops = {
        "tf32x3 (Triton)": lambda: tf32x3_linear.linear_fp32(x, w, b),
        "fp16x3 (quack)": lambda: fp16x3_linear.linear_fp32(x, w, b),
        "cuBLAS float32": lambda: F.linear(x, w, b),
    }
    before = fused.launch_counts()["fp16x3_linear"]
    for name, op in ops.items():
        diff = (op().double() - ref).abs()
        result[f"{name} err max/scale, mean"] = (f"{diff.max().item() / scale:.2e}", f"{diff.mean().item():.2e}")
    result["fp16x3 launched"] = fused.launch_counts()["fp16x3_linear"] - before
    once = torch.addmm(b.double(), x.half().double(), w.half().double().T)
    result["fp16-rounded operands err max/scale, mean"] = (
        f"{(once - ref).abs().max().item() / scale:.2e}",
        f"{(once - ref).abs().mean().item():.2e}",
    )
    whole = fp16x3_linear.linear_fp32(x, w, b)
    tile = fp16x3_linear.linear_fp32(x[:1797], w, b)
    result["fp16x3 one tile alone = in batch (bits)"] = torch.equal(tile, whole[:1797])
    ops["fp16x3: split x only"] = lambda: fp16x3_linear.split_rows(x, 2)
    ms = {name: [] for name in ops}
    for _ in range(3):
        for name, op in ops.items():
            ms[name].append(round(timed(op, 10).ms, 3))
    torch.backends.cuda.matmul.allow_tf32 = True
    ms["cuBLAS TF32 (one pass)"] = [round(timed(lambda: F.linear(x, w, b), 10).ms, 3)]
    torch.backends.cuda.matmul.allow_tf32 = False
    result["ms"] = ms
    return result


def accumulation(cuda) -> dict:
    """Where fp16x3's error comes from: GEMMs of fp16 operands whose float64 product is exact (products of fp16
    values are exact in float64, and the sums lose ~2^-53), through quack and cuBLAS with float32 output, against
    cuBLAS float32 (TF32 off) on the same values. Max abs error / max abs value, and mean abs / mean abs value."""
    from quack.gemm_interface import gemm

    result = {}
    g = torch.Generator(device=cuda).manual_seed(3)
    for depth in (2048, 6144):
        a = (torch.randn(4096, depth, device=cuda, generator=g) * 2**12).half()
        b = (torch.randn(N, depth, device=cuda, generator=g) * 2**12).half()
        exact = a.double() @ b.double().T
        outs = {
            "quack fp16 -> fp32": gemm(a, b.T, out_dtype=torch.float32, tuned=False),
            "cuBLAS fp16 -> fp32": torch.mm(a, b.T, out_dtype=torch.float32),
            "cuBLAS float32 FFMA": a.float() @ b.float().T,
        }
        for name, out in outs.items():
            diff = (out.double() - exact).abs()
            result[f"K={depth} {name}"] = (
                f"{(diff.max() / exact.abs().max()).item():.2e}",
                f"{(diff.mean() / exact.abs().mean()).item():.2e}",
                f"signed mean {((out.double() - exact).mean() / exact.abs().mean()).item():+.1e}",
            )
    return result


def in_decode(cuda, rounds: int, repeats: int) -> dict:
    from minimax_h3_vae.fused import tf32x3_linear

    z = random_latents(UNIT_SHAPE, seed=1)
    reference = fp32_reference(z)
    cublas = random_released_decoder(cuda).configure(fused=True)
    models = {
        "cublas": cublas,
        "quack + fa4 (tf32x3)": sharing_weights(cublas, gemm="quack", attention="fa4"),
        "quack + fa4 (fp16x3)": sharing_weights(cublas, gemm="quack", attention="fa4"),
    }
    models["quack + fa4 (tf32x3)"].ops().linear_fp32 = tf32x3_linear.linear_fp32
    timings = {name: [] for name in models}
    outs, peaks, clocks = {}, {}, {name: [] for name in models}
    before = fused.launch_counts()["fp16x3_linear"]
    for _ in range(rounds):
        for name, model in models.items():
            t = timed(lambda model=model: model.decode(z), repeats)
            timings[name].append(round(t.ms, 1))
            outs[name], peaks[name] = t.out, t.peak_bytes
            clocks[name].append(f"{t.clocks.get('median_sm_mhz', '?')} MHz/{t.clocks.get('median_power_w', '?')} W")
    launched = fused.launch_counts()["fp16x3_linear"] - before
    base = statistics.median(timings["cublas"])
    rows = []
    for name in models:
        err = errors(outs[name], reference)
        unit = statistics.median(timings[name])
        rows.append((name, unit, timings[name], unit / base, peaks[name] / 2**30, err, clocks[name]))
    a, b = outs["quack + fa4 (tf32x3)"], outs["quack + fa4 (fp16x3)"]
    return {"rows": rows, "fp16x3 launches": launched, "tf32x3 vs fp16x3 decode max abs": errors(a, b)[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cuda = torch.device("cuda")
    start = time.perf_counter()
    _quack.load()
    import quack

    run_info(commit(), quack=quack.__version__, quack_import_s=round(time.perf_counter() - start, 1))
    result = {**alone(cuda), **accumulation(cuda)}
    for key, value in result.items():
        print(f"{key}: {value}", flush=True)
    decode = in_decode(cuda, args.rounds, args.repeats)
    print(f"\nfp16x3 launches in the decodes: {decode['fp16x3 launches']}")
    print(f"quack + fa4, tf32x3 vs fp16x3: max abs {decode['tf32x3 vs fp16x3 decode max abs']:.2e}")
    print("\n| fused fp16 | ms per unit | rounds | vs cublas | peak GiB | max abs err | mean abs err | clocks |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for name, unit, runs, ratio, peak, err, clk in decode["rows"]:
        print(f"| {name} | {unit:.1f} | {runs} | {ratio:.3f} | {peak:.2f} | {err[0]:.2e} | {err[1]:.2e} | {clk} |")


if __name__ == "__main__":
    main()
