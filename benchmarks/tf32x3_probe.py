"""Probe (device only, not part of the suite): tile configs for the fused path's float32 proj_out
(fused/tf32x3_linear.py), which a profile of a quack + fa4 decode put at 11.3 ms per unit.

    PYTHONPATH=. python benchmarks/tf32x3_probe.py

Launches the package's own kernel with each config at proj_out's shape (M = 28 tiles x 1797 tokens, 2048 ->
3072, float32): CUDA-event median of 10, the error against the float64 product, and whether the bits equal
the shipped config's. cuBLAS float32 (TF32 off) and TF32 for scale. A table last.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import commit  # noqa: E402
from common import run_info, timed  # noqa: E402

from minimax_h3_vae.fused import tf32x3_linear as op  # noqa: E402

M, N, K = 28 * 1797, 3072, 2048
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages); the first is the shipped one.
CONFIGS = [
    (op._BLOCK_M, op._BLOCK_N, op._BLOCK_K, op._GROUP_M, 8, 3),
    (128, 128, 32, 8, 4, 3),
    (128, 128, 32, 8, 8, 4),
    (128, 256, 32, 8, 8, 3),
    (256, 128, 32, 8, 8, 3),
    (128, 128, 64, 8, 8, 3),
    (128, 256, 16, 8, 8, 4),
    (128, 128, 16, 8, 8, 5),
    (64, 256, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
]


def launch(x, w, b, config):
    bm, bn, bk, gm, warps, stages = config
    out = torch.empty(M, N, device=x.device)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    op._linear_tf32x3_kernel[grid](
        x, w, b, out, M, N, K, x.stride(0), w.stride(0), HAS_BIAS=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=gm, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def main() -> None:
    run_info(commit())
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g)
    w = 0.02 * torch.randn(N, K, device="cuda", generator=g)
    b = 0.02 * torch.randn(N, device="cuda", generator=g)
    ref = (x[:4096].double() @ w.double().T + b.double()).float()
    scale = ref.abs().max().item()
    rows = []
    shipped = None
    for config in CONFIGS:
        try:
            out = launch(x, w, b, config)
        except Exception as error:  # a config that does not fit (shared memory, registers)
            rows.append((config, None, None, f"{type(error).__name__}"))
            continue
        shipped = out if shipped is None else shipped
        err = (out[:4096] - ref).abs().max().item() / scale
        t = timed(lambda config=config: launch(x, w, b, config), 10)
        rows.append((config, t.ms, err, "yes" if torch.equal(out, shipped) else "no"))
        print(rows[-1], t.clocks.get("median_sm_mhz"), flush=True)
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        out = torch.nn.functional.linear(x, w, b)
        err = (out[:4096] - ref).abs().max().item() / scale
        t = timed(lambda: torch.nn.functional.linear(x, w, b), 10)
        rows.append((f"cuBLAS {'TF32' if tf32 else 'float32'}", t.ms, err, "-"))
    torch.backends.cuda.matmul.allow_tf32 = False
    print("\n| config (BM, BN, BK, GROUP_M, warps, stages) | ms | max err / max abs | same bits as shipped |")
    print("| --- | ---: | ---: | --- |")
    for config, ms, err, same in rows:
        ms_text = "-" if ms is None else f"{ms:.3f}"
        err_text = "-" if err is None else f"{err:.2e}"
        print(f"| {config} | {ms_text} | {err_text} | {same} |")


if __name__ == "__main__":
    main()
