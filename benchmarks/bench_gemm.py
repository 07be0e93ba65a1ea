"""The fused path's GEMM backends, cuBLAS vs quack (gemm="quack": w1 and its gate as one GEMM), on the H200.

    PYTHONPATH=. python benchmarks/bench_gemm.py [--repeats 3] [--rounds 4] [--clip-rounds 1]

Needs quack-kernels and NVIDIA's CuTe DSL (the `hopper` extra). In one process: quack's import and first
build; w1 + gate alone at a unit's 28 tiles (M = 50316); one 1344x768 unit through both decoders (the same
weights, shared), alternating, `rounds` x `repeats` timings each, with SM clock and power; errors against an
fp32 eager decode of the same weights (and the fp16 eager decode's, for scale); the 10 s clip streamed
through both. A table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CLIP_SHAPE, UNIT_SHAPE, random_latents, random_released_decoder, randomize_, run_info, timed  # noqa: E402
from gpu_clocks import ClockSampler  # noqa: E402

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, fused  # noqa: E402


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def sharing_weights(model: H3VideoDecoder, **changes) -> H3VideoDecoder:
    """A second decoder over the same weight tensors, with run settings changed."""
    with torch.device("meta"):
        other = H3VideoDecoder(model.config, dataclasses.replace(model.runtime, **changes))
    other.load_state_dict(model.state_dict(), assign=True)
    return other.eval().requires_grad_(False)


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (out - ref).abs()
    return diff.max().item(), diff.mean().item()


def stream_seconds(model: H3VideoDecoder, z: torch.Tensor) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for chunk in model.decode_stream(z):
        del chunk
    torch.cuda.synchronize()
    return time.perf_counter() - start


def w1_alone(cuda: torch.device) -> tuple[float, dict]:
    """quack's first build, then w1 + gate at M = 28 tiles x 1797 tokens: cuBLAS + the Triton gate against
    quack, median of 10, twice each, alternating."""
    from minimax_h3_vae.fused.linear_silu_mul import linear_silu_mul
    from minimax_h3_vae.fused.silu_mul import silu_mul

    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(28 * 1797, 2048, device=cuda, generator=g).half()
    w = (0.02 * torch.randn(16384, 2048, device=cuda, generator=g)).half()
    b = (0.02 * torch.randn(16384, device=cuda, generator=g)).half()
    start = time.perf_counter()
    linear_silu_mul(x[:2], w, b)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - start
    op_ms = {"cublas": [], "quack": []}
    for _ in range(2):
        op_ms["cublas"].append(round(timed(lambda: silu_mul(F.linear(x, w, b)), 10).ms, 3))
        op_ms["quack"].append(round(timed(lambda: linear_silu_mul(x, w, b), 10).ms, 3))
    return build_s, op_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clip-rounds", type=int, default=1)
    args = parser.parse_args()
    cuda = torch.device("cuda")
    import_start = time.perf_counter()
    from minimax_h3_vae.fused import linear_silu_mul as quack_op

    quack_op._quack_gemm_act()
    import_s = time.perf_counter() - import_start
    import cutlass
    import quack

    run_info(commit(), quack=quack.__version__, cutlass_dsl=getattr(cutlass, "__version__", "?"))

    build_s, op_ms = w1_alone(cuda)

    # The unit: the same weights in fp32 (the reference), fp16 cuBLAS-fused and fp16 quack-fused.
    with cuda:
        fp32 = H3VideoDecoder(H3DecoderConfig())
    randomize_(fp32.named_parameters(), torch.Generator(device=cuda).manual_seed(0), only=("",))
    fp32.eval().requires_grad_(False).configure(fused=False)
    z = random_latents(UNIT_SHAPE, seed=1)
    reference = fp32.decode(z)
    del fp32
    torch.cuda.empty_cache()
    cublas = random_released_decoder(cuda).configure(fused=True)
    quacked = sharing_weights(cublas, gemm="quack")
    assert not fused.uses_quack(cublas.ops()) and fused.uses_quack(quacked.ops())
    eager16 = cublas.decode(z, fused=False)
    timings = {"cublas": [], "quack": []}
    outs, peaks, clocks = {}, {}, {"cublas": [], "quack": []}
    for _ in range(args.rounds):
        for name, model in (("cublas", cublas), ("quack", quacked)):
            t = timed(lambda model=model: model.decode(z), args.repeats)
            timings[name].append(t.ms)
            outs[name], peaks[name] = t.out, t.peak_bytes
            clocks[name].append(t.clocks)
    clip = random_latents(CLIP_SHAPE, seed=2)
    clip_s = {"cublas": [], "quack": []}
    for _ in range(args.clip_rounds):
        for name, model in (("cublas", cublas), ("quack", quacked)):
            with ClockSampler() as sampler:
                clip_s[name].append(stream_seconds(model, clip))
            clocks[name].append(sampler.summary)

    print("\nw1 + gate at M = 50316 (median of 10, twice):")
    print(f"  cublas F.linear + silu_mul: {op_ms['cublas']} ms; quack: {op_ms['quack']} ms")
    print(f"quack import {import_s:.1f} s, first build {build_s:.2f} s")
    print("\n| gemm | ms per unit (median of rounds) | rounds | 10 s clip s | peak GiB | max abs | mean abs | clocks |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for name in ("cublas", "quack"):
        unit_ms = statistics.median(timings[name])
        err = errors(outs[name], reference)
        clk = [c for c in clocks[name] if c]
        clk_text = ", ".join(f"{c.get('median_sm_mhz', '?')} MHz/{c.get('median_power_w', '?')} W" for c in clk)
        runs, clip_runs = [round(v, 1) for v in timings[name]], [round(v, 2) for v in clip_s[name]]
        print(
            f"| {name} | {unit_ms:.1f} | {runs} | {clip_runs} | {peaks[name] / 2**30:.2f} | "
            f"{err[0]:.2e} | {err[1]:.2e} | {clk_text} |"
        )
    e16 = errors(eager16, reference)
    ratio = statistics.median(timings["quack"]) / statistics.median(timings["cublas"])
    print(f"fp16 eager vs fp32: max {e16[0]:.2e} mean {e16[1]:.2e}; quack / cublas per unit: {ratio:.3f}")
    print(f"quack vs cublas fused: max {errors(outs['quack'], outs['cublas'])[0]:.2e}")


if __name__ == "__main__":
    main()
