"""The block's attention through FlashAttention 4's Hopper forward kernel (flash-attn-4, a CuTe-DSL kernel).

Why: the decoder's attention (32 heads of 64, 1797 tokens per tile, no mask) is ~17% of a fused decode. On the
H200, at 28 tiles, cuDNN's SDPA took 2.18-2.19 ms per call and flash-attn-4's SM90 forward 1.90 (390 vs 339
TFLOP/s), and a whole unit with gemm="quack" went from 505.3 to 488.9 ms (benchmarks/LOG.md#2026-12-01-fa4).

Numerics: the same algorithm class as SDPA's flash and cuDNN backends: scores and the online softmax in
float32, the probabilities rounded to the input dtype before the second matmul, the output rounded once.
It reads q, k and v in place (strided views of the projection's output are fine) and writes (B, S, H, D)
contiguous, the layout the block reshapes to (B, S, H * D) without a copy.

flash-attn-4 imports quack and the CuTe DSL (8-17 s in a fresh process) and builds its kernel on the first
call of a shape class (~2 s); the decoder does both at load (the import when its kernels are chosen,
`fused.choose_kernels`; the build beside the weight load, `fused.warm_up`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import math

import torch

from . import quack_common
from ._common import count_launch, grad_problem, zeros

__all__ = ["model_call", "attention", "attention_reference", "import_problem", "installed", "unsupported"]

# The distribution that ships `flash_attn.cute` (its Hopper forward), and the head dims used with it here.
DISTRIBUTION = "flash-attn-4"
HEAD_DIMS = range(8, 257, 8)


def installed() -> bool:
    """Whether flash-attn-4 and what it imports (quack-kernels, the CuTe DSL) are installed; imports nothing."""
    try:
        importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return quack_common.installed()


@functools.cache
def _flash_attn_func():
    quack_common.load()  # quack's import, with the logger fingerprint its compile cache needs (quack_common.load)
    return importlib.import_module("flash_attn.cute.interface").flash_attn_func


@functools.cache
def import_problem() -> str | None:
    """Why flash-attn-4 cannot be used here, or None once it is imported. Decided once per process: every launch
    asks, and looking for the install reads the installed distributions (~110 us)."""
    missing = "flash-attn-4, quack-kernels and nvidia-cutlass-dsl are not all installed"
    return quack_common.judge_import("flash-attn-4", installed(), missing, _flash_attn_func)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v in float64 (the oracle the kernel is tested against). (B, H, S, D) each."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros, two tokens): for `unsupported` and the warm-up."""
    c = config  # q, k, v as strided views of the projection's (B, S, H, 3, D) output
    qkv = zeros(device, 1, 2, c.num_heads, 3, c.head_dim, dtype=dtype).transpose(1, 2)
    return tuple(qkv.unbind(3))


def unsupported(q, k, v) -> str | None:
    """Why `attention(q, k, v)` cannot run, or None. Checks the contract before anything is imported."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "q, k and v must be tensors"
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        return f"q, k and v must share one (B, H, S, D) shape, got {[tuple(t.shape) for t in (q, k, v)]}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"the head dim must be a multiple of 8 in 8..256, got {q.shape[-1]}"
    if any(t.dtype != q.dtype for t in (k, v)) or q.dtype not in quack_common.DTYPES:
        got = sorted({str(t.dtype) for t in (q, k, v)})
        return f"q, k and v must share one of {[str(d) for d in quack_common.DTYPES]}, got {got}"
    if any(t.device.type != "cuda" or t.device != q.device for t in (q, k, v)):
        return "q, k and v must be on one CUDA device"
    if torch.cuda.get_device_capability(q.device) != quack_common.HOPPER:
        return f"flash-attn-4's Hopper kernel is used on compute capability 9.0 only; {q.device} is not one"
    # The kernel loads rows with TMA: a contiguous head dim, 16-byte aligned strides and start.
    for name, t in zip("qkv", (q, k, v)):
        if t.stride(-1) != 1 or any(s % 8 for s in t.stride()[:-1]) or t.data_ptr() % 16:
            return f"{name} must have a contiguous head dim and 16-byte aligned strides, got strides {t.stride()}"
    return grad_problem([q, k, v]) or import_problem()


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, launches: dict[str, int] | None = None
) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v)` (no mask, scale 1/sqrt(D)) by flash-attn-4's Hopper kernel.

    q, k, v: (B, H, S, D) float16/bfloat16 on one Hopper GPU, head dim contiguous, strides 16-byte aligned
    (views of a larger tensor are read in place). Returns (B, H, S, D) of the input dtype: a view of a new
    (B, S, H, D)-contiguous tensor. Raises ValueError outside this contract.
    """
    problem = unsupported(q, k, v)
    if problem:
        raise ValueError(f"attention: {problem}")
    if not q.numel():
        return torch.empty_like(q)
    out, _ = _flash_attn_func()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    count_launch(launches, "flash_attention")
    return out.transpose(1, 2)
