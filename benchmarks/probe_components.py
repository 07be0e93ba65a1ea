"""Component timings at the released size on one GPU: where a temporal unit's time could still be saved.

    PYTHONPATH=. python benchmarks/probe_components.py [--sections swiglu,gemm,attention,clocks,core,gaps]

One temporal unit at 1344x768 is 28 tiles x 1797 tokens = 50316 rows through 36 blocks. This times, in one
process, each block GEMM shape under cuBLAS (several call forms), the fused linear+SiLU-gate Triton GEMM
(several tile configs) against cuBLAS + the silu_mul kernel, a plain Triton GEMM with the same schedule
(with and without a residual epilogue) for the other shapes, attention under each SDPA backend and q/k/v
layout, the SM clock and board power under sustained load, the blocks reduced to their GEMMs and attention
(with and without the pointwise kernels), and the idle gaps between kernels in one fused decode. CUDA
events, warm-up, median of repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_clocks import ClockSampler  # noqa: E402

TOKENS, TILES, DIM, HEADS, HEAD_DIM, FFN = 1797, 28, 2048, 32, 64, 8192
ROWS = TOKENS * TILES
SHAPES = {"qkv": (3 * DIM, DIM), "out": (DIM, DIM), "w1": (2 * FFN, DIM), "w2": (DIM, FFN)}


def bench(fn, repeats: int = 10) -> float:
    """Median ms of `fn` over `repeats` CUDA-event-timed calls after two warm-ups."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def tflops(n: int, k: int, ms: float) -> float:
    return 2 * ROWS * n * k / ms / 1e9


def attempt(measure) -> dict:
    """`measure()`'s row, or {"error": its first line} when it raises (a tile config the compiler rejects, a
    backend that refuses a layout): reported in the table, not fatal to the run."""
    try:
        return measure()
    except Exception as error:
        return {"error": str(error).splitlines()[0][:200]}


def multiprocessors() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def _grouped_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row, column) offsets of output tile number `tile`, walked GROUP_M row-tiles at a time so that a group's
    weight tiles stay in L2 while its x tiles stream past."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    return (first_m + (tile % per_group) % group_rows) * BLOCK_M, ((tile % per_group) // group_rows) * BLOCK_N


@triton.jit
def _gate(gate, value, bias_ptr, cols, F):
    """silu(gate) * value from the float32 accumulators of w1's gate and value columns `cols`, rounded like the
    eager path: the Linear's output (bias added) to fp16, then silu, then the product."""
    gate = (gate + tl.load(bias_ptr + cols).to(tl.float32)[None, :]).to(tl.float16).to(tl.float32)
    value = (value + tl.load(bias_ptr + F + cols).to(tl.float32)[None, :]).to(tl.float16).to(tl.float32)
    activated = tl.div_rn(gate, 1.0 + libdevice.exp(-gate)).to(tl.float16).to(tl.float32)
    return (activated * value).to(tl.float16)


@triton.jit
def _linear_kernel(x_desc, w_desc, out_desc, bias_ptr, res_ptr, scale_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   PROGRAMS: tl.constexpr, STAGES: tl.constexpr, RESIDUAL: tl.constexpr,
                   WARP_SPECIALIZE: tl.constexpr):
    """out = x @ w.T + bias (rounded to fp16); with RESIDUAL, res += out * scale in fp32 (res: (M, N) fp32)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        off_m, off_n = _grouped_tile(tile, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            acc = tl.dot(x_desc.load([off_m, k]), w_desc.load([off_n, k]).T, acc)
        cols = off_n + tl.arange(0, BLOCK_N)
        acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        y = acc.to(tl.float16)
        if RESIDUAL:
            rows = off_m + tl.arange(0, BLOCK_M)
            ptrs = res_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = (rows < M)[:, None]
            res = tl.load(ptrs, mask=mask, other=0.0)
            scale = tl.load(scale_ptr + cols)
            tl.store(ptrs, res + y.to(tl.float32) * scale[None, :], mask=mask)
        else:
            out_desc.store([off_m, off_n], y)


def triton_linear(x, w, b, cfg, residual=None, scale=None):
    bm, bn, bk, group, stages, warps, ws = cfg
    m, k = x.shape
    n = w.shape[0]
    programs = multiprocessors()
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    if residual is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        out_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    else:  # the epilogue writes the fp32 residual through pointers; out_desc is a placeholder
        out, out_desc = residual, x_desc
    _linear_kernel[(programs,)](
        x_desc, TensorDescriptor.from_tensor(w, [bn, bk]), out_desc, b,
        residual if residual is not None else b, scale if scale is not None else b, m, n, k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, PROGRAMS=programs, STAGES=stages,
        RESIDUAL=residual is not None, WARP_SPECIALIZE=ws, num_warps=warps)
    return out


@triton.jit
def _linear_silu_mul_kernel(x_desc, gate_desc, value_desc, out_desc, bias_ptr, M, F, K,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, STAGES: tl.constexpr,
                            WARP_SPECIALIZE: tl.constexpr):
    """silu_mul(x @ w1.T + b1) with w1's gate and value rows in two accumulators sharing each x tile, so the
    (M, 2F) intermediate never reaches memory."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(F, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        off_m, off_n = _grouped_tile(tile, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        value = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            x = x_desc.load([off_m, k])
            gate = tl.dot(x, gate_desc.load([off_n, k]).T, gate)
            value = tl.dot(x, value_desc.load([off_n, k]).T, value)
        out_desc.store([off_m, off_n], _gate(gate, value, bias_ptr, off_n + tl.arange(0, BLOCK_N), F))


def triton_linear_silu_mul(x, w, b, cfg):
    bm, bn, bk, group, stages, warps, ws = cfg
    m, k = x.shape
    f = w.shape[0] // 2
    out = torch.empty(m, f, dtype=x.dtype, device=x.device)
    programs = multiprocessors()
    _linear_silu_mul_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w[:f], [bn, bk]),
        TensorDescriptor.from_tensor(w[f:], [bn, bk]), TensorDescriptor.from_tensor(out, [bm, bn]), b, m, f, k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, PROGRAMS=programs, STAGES=stages,
        WARP_SPECIALIZE=ws, num_warps=warps)
    return out


@triton.jit
def _linear_silu_mul_1dot_kernel(x_desc, w_desc, out_desc, bias_ptr, M, F, K,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, STAGES: tl.constexpr):
    """As `_linear_silu_mul_kernel`, but w1 is seen as (2, F, K): one (2, BLOCK_N, BLOCK_K) load holds the
    gate and value rows of a column block, and one (BLOCK_M, 2 * BLOCK_N) product computes both."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(F, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        off_m, off_n = _grouped_tile(tile, tiles_m, tiles_n, GROUP_M, BLOCK_M, BLOCK_N)
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            w = w_desc.load([0, off_n, k]).reshape(2 * BLOCK_N, BLOCK_K)
            acc = tl.dot(x_desc.load([off_m, k]), w.T, acc)
        gate, value = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
        out_desc.store([off_m, off_n], _gate(gate, value, bias_ptr, off_n + tl.arange(0, BLOCK_N), F))


def triton_linear_silu_mul_1dot(x, w, b, cfg):
    bm, bn, bk, group, stages, warps = cfg
    m, k = x.shape
    f = w.shape[0] // 2
    out = torch.empty(m, f, dtype=x.dtype, device=x.device)
    programs = multiprocessors()
    _linear_silu_mul_1dot_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w.view(2, f, k), [2, bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), b, m, f, k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, PROGRAMS=programs, STAGES=stages, num_warps=warps)
    return out


def section_gemm(report: dict) -> None:
    from minimax_h3_vae.fused.rms_norm import rms_norm
    from minimax_h3_vae.fused.scale_add_rms_norm import scale_add_rms_norm

    rows = {}
    for name, (n, k) in SHAPES.items():
        x = torch.randn(TILES, TOKENS, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
        b = torch.randn(n, device="cuda", dtype=torch.float16) * 0.02
        wt = w.t().contiguous()
        x2 = x.view(-1, k)
        variants = {
            "F.linear+bias (current)": lambda: F.linear(x, w, b),
            "F.linear no bias": lambda: F.linear(x, w),
            "addmm NN (w.T stored)": lambda: torch.addmm(b, x2, wt),
            "mm NN no bias": lambda: torch.mm(x2, wt),
        }
        for cfg in [(128, 256, 64, 8, 3, 8, False), (128, 256, 64, 8, 4, 8, False), (128, 128, 64, 8, 4, 4, False),
                    (128, 256, 64, 8, 3, 8, True), (128, 128, 64, 8, 4, 8, True)]:
            variants[f"triton {cfg}"] = (lambda cfg=cfg: triton_linear(x2, w, b, cfg))
        for label, fn in variants.items():
            def measure(fn=fn):
                ms = bench(fn)
                return {"ms": ms, "tflops": tflops(n, k, ms)}
            rows[f"{name} {label}"] = attempt(measure)
            print(name, label, rows[f"{name} {label}"], flush=True)
        ref = F.linear(x, w, b).view(-1, n)
        got = triton_linear(x2, w, b, (128, 256, 64, 8, 3, 8, False))
        rows[f"{name} triton vs cuBLAS max abs"] = (got.float() - ref.float()).abs().max().item()
        if name in ("out", "w2"):
            residual = torch.randn(ROWS, n, device="cuda")
            scale = torch.randn(n, device="cuda") * 0.1
            norm = torch.ones(n, device="cuda")

            def cublas_then_add():
                return scale_add_rms_norm(residual.view(TILES, TOKENS, n), F.linear(x, w, b), scale, norm, 1e-5,
                                          torch.float16)

            def fused_epilogue():
                triton_linear(x2, w, b, (128, 256, 64, 8, 3, 8, False), residual=residual, scale=scale)
                return rms_norm(residual, norm, 1e-5, torch.float16)

            for label, fn in (("cuBLAS + scale_add_rms_norm", cublas_then_add),
                              ("triton residual epilogue + rms_norm", fused_epilogue)):
                rows[f"{name} {label}"] = attempt(lambda fn=fn: {"ms": bench(fn)})
                print(name, label, rows[f"{name} {label}"], flush=True)
    report["gemm"] = rows


def section_swiglu(report: dict) -> None:
    from minimax_h3_vae.fused.silu_mul import silu_mul

    rows = {}
    n, k = SHAPES["w1"]
    x = torch.randn(ROWS, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.float16) * 0.02
    ref = silu_mul(F.linear(x, w, b))
    h = x.float() @ w.float().t() + b.float()
    exact = F.silu(h[:, :FFN]) * h[:, FFN:]
    del h
    rows["cuBLAS + silu_mul kernel"] = {"ms": bench(lambda: silu_mul(F.linear(x, w, b))),
                                        "max_abs_vs_fp32": (ref.float() - exact).abs().max().item()}
    rows["cuBLAS only"] = {"ms": bench(lambda: F.linear(x, w, b))}
    print(rows, flush=True)
    two_dots = [(128, 128, 64, 8, 3, 8, False), (128, 128, 64, 8, 4, 8, False), (128, 128, 64, 16, 3, 8, False),
                (128, 64, 64, 8, 4, 4, False), (64, 128, 64, 8, 4, 4, False), (128, 128, 64, 8, 3, 8, True),
                (128, 128, 64, 8, 4, 8, True), (128, 64, 64, 8, 4, 8, True)]
    one_dot = [(128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8), (128, 64, 64, 8, 4, 8), (128, 128, 64, 8, 2, 8)]
    runs = [("triton", triton_linear_silu_mul, cfg) for cfg in two_dots]
    runs += [("triton one dot", triton_linear_silu_mul_1dot, cfg) for cfg in one_dot]
    for label, kernel, cfg in runs:
        def measure(kernel=kernel, cfg=cfg):
            got = kernel(x, w, b, cfg)
            return {"ms": bench(lambda: kernel(x, w, b, cfg)),
                    "max_abs_vs_fp32": (got.float() - exact).abs().max().item(),
                    "max_abs_vs_cublas_path": (got.float() - ref.float()).abs().max().item()}
        rows[f"{label} {cfg}"] = attempt(measure)
        print(label, cfg, rows[f"{label} {cfg}"], flush=True)
    report["swiglu"] = rows


def section_attention(report: dict) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from minimax_h3_vae.fused.qk_rms_norm_rope import qk_rms_norm_rope
    from minimax_h3_vae.rope import rotary_table, token_positions

    rows = {}
    flop = 4 * TILES * HEADS * TOKENS * TOKENS * HEAD_DIM
    qkv = torch.randn(TILES, TOKENS, 3 * DIM, device="cuda", dtype=torch.float16)
    positions = token_positions(7, 16, 16, 5, "cuda")
    table = rotary_table(positions, 48, 100.0)
    q, k, v = qk_rms_norm_rope(qkv, table.cos, table.sin, HEADS, 1e-5)
    layouts = {
        "ours (q,k BSHD, v strided in qkv)": (q, k, v),
        "q,k BSHD, v BSHD copy": (q, k, v.transpose(1, 2).contiguous().transpose(1, 2)),
        "all BHSD contiguous": (q.contiguous(), k.contiguous(), v.contiguous()),
    }
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        for label, (qq, kk, vv) in layouts.items():
            def measure(qq=qq, kk=kk, vv=vv):
                ms = bench(lambda: F.scaled_dot_product_attention(qq, kk, vv))
                return {"ms": ms, "tflops": flop / ms / 1e9}
            with sdpa_kernel([backend]):
                row = attempt(measure)
            rows[f"{backend.name} {label}"] = row
            print(backend.name, label, row, flush=True)
    from minimax_h3_vae.fused import qk_rms_norm_rope as qk_module
    default_tile = qk_module._TILE
    for tile in (1024, 2048, 4096, 8192):
        qk_module._TILE = tile
        rows[f"qk_rms_norm_rope kernel, tile {tile}"] = {
            "ms": bench(lambda: qk_rms_norm_rope(qkv, table.cos, table.sin, HEADS, 1e-5))}
    qk_module._TILE = default_tile
    o = torch.randn(TILES, TOKENS, DIM, device="cuda", dtype=torch.float16)
    rows["nan_to_num_ in place"] = {"ms": bench(lambda: o.nan_to_num_(nan=0.0, posinf=float("inf"),
                                                                     neginf=float("-inf")))}
    report["attention"] = rows


def random_model():
    from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = H3VideoDecoder(H3DecoderConfig(fused=True))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
                param.copy_(1.0 + 0.1 * (2 * torch.rand_like(param) - 1))
            else:
                param.normal_(0.0, 0.1 if name.endswith(("scale1", "scale2")) else 0.02)
    return model.to_release_fp16().eval().requires_grad_(False)


def section_clocks(report: dict) -> None:
    """SM clock and power under a sustained GEMM loop and under back-to-back decodes."""
    model = random_model()
    z = torch.randn(1, 24, 7, 48, 84, device="cuda")
    n, k = SHAPES["w1"]
    x = torch.randn(ROWS, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    rows = {}
    for label, fn, count in (("w1 GEMM loop", lambda: F.linear(x, w), 600), ("decode loop", lambda: model.decode(z), 6)):
        fn()
        torch.cuda.synchronize()
        with ClockSampler() as sampler:
            start = time.perf_counter()
            for _ in range(count):
                fn()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        rows[label] = {"ms_per_call": 1000 * seconds / count, **sampler.summary}
        print(label, rows[label], flush=True)
    host = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.decode(z)
        host.append(1000 * (time.perf_counter() - start))
        torch.cuda.synchronize()
    rows["host ms to return from decode (no sync after)"] = host
    report["clocks"] = rows


def section_core(report: dict) -> None:
    """The decoder's 36 blocks reduced to their GEMMs and attention (28 tiles, cuDNN), then with the silu_mul
    and scale_add_rms_norm kernels added back: the floor of this structure under the card's power limit."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from minimax_h3_vae.fused.scale_add_rms_norm import scale_add_rms_norm
    from minimax_h3_vae.fused.silu_mul import silu_mul

    torch.manual_seed(0)
    blocks = []
    for _ in range(36):
        blocks.append({name: (torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02,
                              torch.randn(n, device="cuda", dtype=torch.float16) * 0.02)
                       for name, (n, k) in SHAPES.items()})
    scale = torch.randn(DIM, device="cuda") * 0.1
    norm = torch.ones(DIM, device="cuda")
    x = torch.randn(ROWS, DIM, device="cuda", dtype=torch.float16)

    def run(pointwise: bool, gate=None):
        h, residual = x, x.float()
        for block in blocks:
            qkv = torch.addmm(block["qkv"][1], h, block["qkv"][0].t())
            q, k, v = qkv.view(TILES, TOKENS, HEADS, 3, HEAD_DIM).transpose(1, 2).unbind(3)
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(ROWS, DIM)
            y = torch.addmm(block["out"][1], o, block["out"][0].t())
            if pointwise:
                residual, y = scale_add_rms_norm(residual, y, scale, norm, 1e-5, torch.float16)
            if gate is not None:
                a = gate(y, *block["w1"])
            else:
                g = torch.addmm(block["w1"][1], y, block["w1"][0].t())
                a = silu_mul(g) if pointwise else g[:, :FFN]
            h = torch.addmm(block["w2"][1], a, block["w2"][0].t())
            if pointwise:
                residual, h = scale_add_rms_norm(residual, h, scale, norm, 1e-5, torch.float16)
        return h

    rows = {}
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        variants = (
            ("GEMMs + attention", False, None),
            ("+ silu_mul + scale_add_rms_norm kernels", True, None),
            ("same, w1 + silu_mul as one Triton GEMM (two dots)", True,
             lambda y, w, b: triton_linear_silu_mul(y, w, b, (128, 128, 64, 8, 3, 8, False))),
            ("same, w1 + silu_mul as one Triton GEMM (one dot)", True,
             lambda y, w, b: triton_linear_silu_mul_1dot(y, w, b, (128, 128, 64, 8, 3, 8))),
            ("+ silu_mul + scale_add_rms_norm kernels (again)", True, None),
        )
        for label, pointwise, gate in variants:
            def measure(pointwise=pointwise, gate=gate):
                with ClockSampler() as sampler:
                    ms = bench(lambda: run(pointwise, gate), repeats=5)
                return {"ms": ms, **sampler.summary}
            rows[label] = attempt(measure)
            print(label, rows[label], flush=True)
    report["core"] = rows


def section_gaps(report: dict) -> None:
    """Idle time between kernels in one fused decode of one unit, and what the host did meanwhile."""
    model = random_model()
    z = torch.randn(1, 24, 7, 48, 84, device="cuda")
    wall = bench(lambda: model.decode(z), repeats=5)
    events_ms = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with torch.profiler.record_function("decode_call"):
                model.decode(z)
            end.record()
            torch.cuda.synchronize()
            events_ms.append(start.elapsed_time(end))
    path = Path("/tmp/trace.json")
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    busy = sum(e["dur"] for e in kernels)
    gaps = []
    for before, after in zip(kernels, kernels[1:]):
        gap = after["ts"] - (before["ts"] + before["dur"])
        if gap > 0:
            gaps.append((gap, before["name"][:60], after["name"][:60]))
    gaps.sort(reverse=True)
    runtime = {}
    for e in events:
        if e.get("cat") == "cuda_runtime":
            entry = runtime.setdefault(e["name"], [0, 0.0])
            entry[0] += 1
            entry[1] += e["dur"]
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    calls = sorted((e for e in events if e.get("name") == "decode_call" and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    per_call = []
    bounds = [c["ts"] for c in calls] + [float("inf")]
    for call, stop in zip(calls, bounds[1:]):
        inside = [e for e in kernels if call["ts"] <= e["ts"] < stop]
        first, last = inside[0], max(inside, key=lambda e: e["ts"] + e["dur"])
        per_call.append({"kernels": len(inside), "host_call_ms": call["dur"] / 1e3,
                         "first_kernel_after_call_start_ms": (first["ts"] - call["ts"]) / 1e3,
                         "kernel_span_ms": (last["ts"] + last["dur"] - first["ts"]) / 1e3,
                         "kernel_busy_ms": sum(e["dur"] for e in inside) / 1e3})
    by_name = {}
    for e in kernels:
        entry = by_name.setdefault(e["name"][:90], [0, 0.0])
        entry[0] += 1
        entry[1] += e["dur"]
    report["gaps_by_kernel_ms_per_decode"] = {k: [v[0] // 2, round(v[1] / 2e3, 2)] for k, v in
                                              sorted(by_name.items(), key=lambda kv: -kv[1][1])[:16]}
    report["gaps"] = {
        "event_ms_profiled": events_ms, "per_call": per_call,
        "wall_ms_median": wall, "kernel_span_ms": span / 1e3, "kernel_busy_ms": busy / 1e3,
        "gap_total_ms": sum(g for g, *_ in gaps) / 1e3, "kernels": len(kernels),
        "largest_gaps_us": [[round(g, 1), a, b] for g, a, b in gaps[:15]],
        "cuda_runtime_ms": {k: [v[0], round(v[1] / 1e3, 2)] for k, v in
                            sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]},
    }
    print(json.dumps(report["gaps"], indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sections", default="swiglu,gemm,attention,clocks,core,gaps")
    args = parser.parse_args()
    report = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(report, flush=True)
    for section in args.sections.split(","):
        try:
            globals()[f"section_{section}"](report)
        except Exception:  # one broken section must not cost the others' device time
            import traceback
            traceback.print_exc()
        torch.cuda.empty_cache()
    text = json.dumps(report, indent=1)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "probe.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
