"""The fused path's GEMM backends on the H200: cuBLAS vs quack (gemm="quack": w1 and its gate as one GEMM, the
attention's projection with its QK norm and RoPE as another, proj_out over split fp16 operands as a third),
quack without the projection's GEMM ("quack w1"), and quack with FlashAttention 4's kernel for the attention
(attention="fa4").

    PYTHONPATH=. python benchmarks/bench_gemm.py [--repeats 3] [--rounds 4] [--clip-rounds 1]

Needs quack-kernels, flash-attn-4 and NVIDIA's CuTe DSL (the `hopper` extra). In one process: quack's import
and first builds; each fused GEMM alone at a unit's 28 tiles (M = 50316); one 1344x768 unit through the four
decoders (the same weights, shared), alternating, `rounds` x `repeats` timings each, with SM clock and power; errors
against an fp32 eager decode of the same weights (and the fp16 eager decode's, for scale); the 10 s clip streamed
through cuBLAS, quack and quack + fa4. A table last.
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

from common import (  # noqa: E402
    CLIP_SHAPE,
    UNIT_SHAPE,
    fp32_reference,
    random_latents,
    random_released_decoder,
    run_info,
    timed,
)
from gpu_clocks import ClockSampler  # noqa: E402

from minimax_h3_vae import H3VideoDecoder, fused  # noqa: E402


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def sharing_weights(model: H3VideoDecoder, kernels: dict | None = None, **changes) -> H3VideoDecoder:
    """A second decoder over the same weight tensors, with run settings changed: the kernels chosen again for
    them (`fused.choose_kernels`), then `kernels` (op -> kernel, `fused.Kernels`' fields) set by hand."""
    r = dataclasses.replace(model.runtime, **changes)
    chosen = fused.choose_kernels(model.config, r.device, r.dtype, r.fused, r.gemm, r.attention)
    runtime = dataclasses.replace(r, kernels=dataclasses.replace(chosen, **(kernels or {})))
    with torch.device("meta"):
        other = H3VideoDecoder(model.config, runtime)
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


def ops_alone(cuda: torch.device) -> tuple[dict, dict]:
    """quack's first builds, then each fused GEMM alone at M = 28 tiles x 1797 tokens against cuBLAS + the Triton
    op after it: w1 + gate, and the attention's projection + QK norm + RoPE. Median of 10, twice, alternating."""
    from minimax_h3_vae.fused.linear_qk_rms_norm_rope import linear_qk_rms_norm_rope
    from minimax_h3_vae.fused.linear_silu_mul import linear_silu_mul
    from minimax_h3_vae.fused.qk_rms_norm_rope import qk_rms_norm_rope
    from minimax_h3_vae.fused.silu_mul import silu_mul
    from minimax_h3_vae.rope import rotary_table, token_positions

    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(28, 1797, 2048, device=cuda, generator=g).half()
    w1 = (0.02 * torch.randn(16384, 2048, device=cuda, generator=g)).half()
    b1 = (0.02 * torch.randn(16384, device=cuda, generator=g)).half()
    wq = (0.02 * torch.randn(6144, 2048, device=cuda, generator=g)).half()
    bq = (0.02 * torch.randn(6144, device=cuda, generator=g)).half()
    table = rotary_table(token_positions(7, 16, 16, 5, device=cuda), 48, 100.0)
    rope = (table.cos, table.sin, 32, 1e-5)
    pairs = {
        "w1 + gate": (lambda: silu_mul(F.linear(x, w1, b1)), lambda: linear_silu_mul(x, w1, b1)),
        "qkv + norm + rope": (
            lambda: qk_rms_norm_rope(F.linear(x, wq, bq), *rope),
            lambda: linear_qk_rms_norm_rope(x, wq, bq, *rope),
        ),
    }
    build_s = {}
    for name, (_, quack_call) in pairs.items():
        start = time.perf_counter()
        quack_call()
        torch.cuda.synchronize()
        build_s[name] = round(time.perf_counter() - start, 2)
    op_ms = {name: {"cublas": [], "quack": []} for name in pairs}
    for _ in range(2):
        for name, (cublas_call, quack_call) in pairs.items():
            op_ms[name]["cublas"].append(round(timed(cublas_call, 10).ms, 3))
            op_ms[name]["quack"].append(round(timed(quack_call, 10).ms, 3))
    return build_s, op_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clip-rounds", type=int, default=1)
    args = parser.parse_args()
    cuda = torch.device("cuda")
    import_start = time.perf_counter()
    fused.load_quack()
    import_s = time.perf_counter() - import_start
    import cutlass
    import quack

    run_info(commit(), quack=quack.__version__, cutlass_dsl=getattr(cutlass, "__version__", "?"))

    build_s, op_ms = ops_alone(cuda)

    # The unit: the same weights in fp32 (the reference), fp16 cuBLAS-fused, fp16 with quack for w1 only (the
    # attention's projection on cuBLAS + the Triton QK norm), and fp16 with both quack GEMMs.
    z = random_latents(UNIT_SHAPE, seed=1)
    reference = fp32_reference(z)
    cublas = random_released_decoder(cuda).configure(fused=True)
    w1_only = sharing_weights(cublas, {"linear_qk_rms_norm_rope": "cublas+triton"}, gemm="quack")
    models = {"cublas": cublas, "quack w1": w1_only, "quack": sharing_weights(cublas, gemm="quack")}
    models["quack + fa4"] = sharing_weights(cublas, gemm="quack", attention="fa4")
    assert not fused.uses_quack(cublas.runtime.kernels) and fused.uses_quack(models["quack"].runtime.kernels)
    assert fused.uses_fa4(models["quack + fa4"].runtime.kernels)
    assert not fused.uses_fa4(models["quack"].runtime.kernels)
    eager16 = cublas.decode(z, fused=False)
    timings = {name: [] for name in models}
    outs, peaks, clocks = {}, {}, {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            t = timed(lambda model=model: model.decode(z), args.repeats)
            timings[name].append(t.ms)
            outs[name], peaks[name] = t.out, t.peak_bytes
            clocks[name].append(t.clocks)
    clip = random_latents(CLIP_SHAPE, seed=2)
    clip_s = {name: [] for name in models}
    for _ in range(args.clip_rounds):
        for name in ("cublas", "quack", "quack + fa4"):
            with ClockSampler() as sampler:
                clip_s[name].append(stream_seconds(models[name], clip))
            clocks[name].append(sampler.summary)

    print("\nEach fused GEMM alone at M = 50316 (median of 10, twice), cuBLAS + the Triton op vs quack:")
    for name, ms in op_ms.items():
        print(f"  {name}: cublas {ms['cublas']} ms; quack {ms['quack']} ms")
    print(f"quack import {import_s:.1f} s, first builds {build_s} s")
    print("\n| gemm | ms per unit (median of rounds) | rounds | 10 s clip s | peak GiB | max abs | mean abs | clocks |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for name in models:
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
    base = statistics.median(timings["cublas"])
    ratios = {name: round(statistics.median(timings[name]) / base, 3) for name in models}
    print(f"fp16 eager vs fp32: max {e16[0]:.2e} mean {e16[1]:.2e}; per unit against cublas: {ratios}")
    for name in ("quack w1", "quack", "quack + fa4"):
        print(f"{name} vs cublas fused: max {errors(outs[name], outs['cublas'])[0]:.2e}")


if __name__ == "__main__":
    main()
