"""Where one fused unit's kernel time goes (device only): the CUDA kernels of one 1344x768 decode, after two
warm-ups, by total time.

    PYTHONPATH=. python benchmarks/profile_unit.py [--gemm quack] [--attention fa4] [--rows 25]

Random released-size weights (common.py), fp16 recipe, fused; the gemm and attention options as given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import commit, sharing_weights  # noqa: E402
from common import UNIT_SHAPE, random_latents, random_released_decoder, run_info  # noqa: E402

from minimax_h3_vae import fused  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemm", default="quack")
    parser.add_argument("--attention", default="fa4")
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    run_info(commit(), gemm=args.gemm, attention=args.attention)
    cuda = torch.device("cuda")
    base = random_released_decoder(cuda).configure(fused=True)
    decoder = sharing_weights(base, gemm=args.gemm, attention=args.attention)
    kernels = decoder.runtime.kernels
    gemm = "quack" if fused.uses_quack(kernels) else "cublas"
    attention = "fa4" if fused.uses_fa4(kernels) else "sdpa"
    print(f"runs: gemm {gemm}, attention {attention}")
    z = random_latents(UNIT_SHAPE, seed=1)
    for _ in range(2):
        decoder.decode(z)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        decoder.decode(z)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in events) / 1e3
    print(f"\nkernel time {total:.1f} ms\n\n| kernel | ms | calls |\n| --- | ---: | ---: |")
    for e in events[: args.rows]:
        print(f"| {e.key[:90]} | {e.self_device_time_total / 1e3:.1f} | {e.count} |")


if __name__ == "__main__":
    main()
