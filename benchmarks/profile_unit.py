"""Where one fused unit's kernel time goes (device only): the CUDA kernels of one 1344x768 decode, after two
warm-ups, by total time.

    PYTHONPATH=. python benchmarks/profile_unit.py [--gemm quack] [--attention fa4] [--rows 25]
    PYTHONPATH=. python benchmarks/profile_unit.py --exact [--rows 25]

Random released-size weights (common.py), fp16 recipe, fused; the gemm and attention options as given. --exact:
the fused default (cuBLAS, SDPA) and `exact=True` over the same weights, each profiled the same way, and the
kernels side by side with the difference (where exact's extra time per unit goes).
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
    parser.add_argument("--exact", action="store_true", help="the default against exact=True, side by side")
    args = parser.parse_args()
    if args.exact:
        args.gemm, args.attention = "cublas", "sdpa"
    run_info(commit(), gemm=args.gemm, attention=args.attention, exact=args.exact)
    cuda = torch.device("cuda")
    base = random_released_decoder(cuda).configure(fused=True)
    decoder = sharing_weights(base, gemm=args.gemm, attention=args.attention)
    z = random_latents(UNIT_SHAPE, seed=1)
    times = {}
    for name in ("default", "exact") if args.exact else ("",):
        if name == "exact":
            decoder.configure(exact=True)  # the same weights, the exact kernels chosen as at load
        kernels = decoder.runtime.kernels
        gemm = "quack" if fused.uses_quack(kernels) else "cublas"
        attention = "fa4" if fused.uses_fa4(kernels) else "sdpa"
        print(f"runs{' ' + name if name else ''}: gemm {gemm}, attention {attention}, exact {decoder.runtime.exact}")
        times[name] = kernel_times(decoder, z)
    if not args.exact:
        events = times[""]
        total = sum(ms for ms, _ in events.values())
        print(f"\nkernel time {total:.1f} ms\n\n| kernel | ms | calls |\n| --- | ---: | ---: |")
        for key, (ms, calls) in sorted(events.items(), key=lambda kv: -kv[1][0])[: args.rows]:
            print(f"| {key[:90]} | {ms:.1f} | {calls} |")
        return
    default, exact = times["default"], times["exact"]
    totals = {name: sum(ms for ms, _ in events.values()) for name, events in times.items()}
    print(f"\nkernel time: default {totals['default']:.1f} ms, exact {totals['exact']:.1f} ms\n")
    print("| kernel | default ms | exact ms | exact - default | calls (default / exact) |")
    print("| --- | ---: | ---: | ---: | --- |")
    keys = set(default) | set(exact)
    gap = {key: exact.get(key, (0.0, 0))[0] - default.get(key, (0.0, 0))[0] for key in keys}
    for key in sorted(keys, key=lambda k: -abs(gap[k]))[: args.rows]:
        (d, dc), (e, ec) = default.get(key, (0.0, 0)), exact.get(key, (0.0, 0))
        print(f"| {key[:90]} | {d:.1f} | {e:.1f} | {gap[key]:+.1f} | {dc} / {ec} |")


def kernel_times(decoder, z: torch.Tensor) -> dict[str, tuple[float, int]]:
    """CUDA kernel name -> (ms, calls) of one decode of `z`, after two warm-ups."""
    for _ in range(2):
        decoder.decode(z)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        decoder.decode(z)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {e.key: (e.self_device_time_total / 1e3, e.count) for e in events}


if __name__ == "__main__":
    main()
