"""The block's softmax attention through one of torch's SDPA backends, chosen per call.

`torch.nn.attention.sdpa_kernel` chooses backends by setting switches of the whole process: every thread and
every library in it sees them while the context is open, and two contexts that overlap can leave them changed.
Here nothing process-wide is written. Each call takes its own list of backends (names of
`torch.nn.attention.SDPBackend`, most preferred first) and runs the first one that can run its inputs, through
the aten op that `F.scaled_dot_product_attention` itself calls for that backend, with the same arguments: the
same values, bit for bit, as F.scaled_dot_product_attention restricted to that backend.

A backend can run when
- it exists on the device: on the CPU torch has FLASH_ATTENTION (its CPU flash kernel, what
  F.scaled_dot_product_attention picks there by default) and MATH; on CUDA all four;
- the process has not switched it off (`torch.backends.cuda.enable_*_sdp(False)`: read here, never written);
- it takes these inputs: on CUDA torch's own checks (`torch.backends.cuda.can_use_*`: GPU, dtype, head dim,
  layout); on the CPU the conditions of torch's CPU flash kernel, for this call (no mask, no dropout).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Most preferred first: cuDNN is the fastest on Hopper for S = 1797, D = 64
# (benchmarks/LOG.md#2026-11-29-power-limit).
BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
DEVICE_BACKENDS = {"cpu": ("FLASH_ATTENTION", "MATH"), "cuda": BACKENDS}
CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Flash attention on CUDA runs head dims padded to a multiple of this (as F.scaled_dot_product_attention pads).
FLASH_HEAD_ALIGN = 8


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backends: tuple[str, ...] = BACKENDS) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v, no mask, by the first of `backends` that can run these inputs.

    q, k, v: (B, H, S, D), one dtype, one device (strided views are fine). Returns (B, H, S, D) of that dtype.
    ValueError, with each backend's reason, when none of them can run.
    """
    reasons = []
    for name in backends:
        why = problem(name, q, k, v)
        if why is None:
            return _RUN[name](q, k, v)
        reasons.append(f"{name}: {why}")
    raise ValueError(
        f"no attention backend of {tuple(backends)} can run q, k, v of shape {tuple(q.shape)}, {q.dtype}, "
        f"on {q.device} ({'; '.join(reasons)})"
    )


def problem(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why backend `name` cannot run attention(q, k, v) here, or None."""
    device = q.device.type
    if name not in DEVICE_BACKENDS.get(device, ()):
        return f"not a backend on {device}"
    if not _enabled(name):
        return "switched off in this process (torch.backends.cuda)"
    if name == "MATH":
        return None
    if device == "cuda":
        return None if _CUDA_CHECKS[name](_params(q, k, v)) else "torch's check refuses these inputs on this GPU"
    return _cpu_flash_problem(q, k, v)


def runnable(backends: tuple[str, ...], device: torch.device, dtype: torch.dtype, head_dim: int) -> tuple[str, ...]:
    """Those of `backends` that can run a decoder's attention (head dim `head_dim`, `dtype`) on `device`."""
    q = torch.zeros(1, 1, 2, head_dim, device=device, dtype=dtype)
    return tuple(name for name in backends if problem(name, q, q, q) is None)


def _enabled(name: str) -> bool:
    switches = torch.backends.cuda
    return {
        "CUDNN_ATTENTION": switches.cudnn_sdp_enabled,
        "FLASH_ATTENTION": switches.flash_sdp_enabled,
        "EFFICIENT_ATTENTION": switches.mem_efficient_sdp_enabled,
        "MATH": switches.math_sdp_enabled,
    }[name]()


def _cpu_flash_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """torch's conditions for its CPU flash kernel (sdp_utils_cpp: use_flash_attention_cpp) without a mask or
    dropout: dense 4-D inputs of one supported dtype, one batch and head count, one head dim, non-empty
    sequences, contiguous head dims."""
    tensors = (q, k, v)
    if any(t.is_nested for t in tensors) or any(t.dim() != 4 for t in tensors):
        return "needs dense 4-D (B, H, S, D) inputs"
    if q.dtype not in CPU_FLASH_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"needs one of {[str(d) for d in CPU_FLASH_DTYPES]}"
    if len({t.shape[0] for t in tensors}) != 1 or len({t.shape[1] for t in tensors}) != 1:
        return "needs one batch size and one head count"
    if len({t.shape[-1] for t in tensors}) != 1:
        return "needs one head dim for q, k and v"
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return "needs non-empty sequences"
    if any(t.stride(-1) != 1 for t in tensors):
        return "needs contiguous head dims"
    return None


def _params(q, k, v):
    try:
        return torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, False)
    except TypeError:  # torch < 2.5: no enable_gqa
        return torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False)


_CUDA_CHECKS = {
    "CUDNN_ATTENTION": lambda params: torch.backends.cuda.can_use_cudnn_attention(params),
    "FLASH_ATTENTION": lambda params: torch.backends.cuda.can_use_flash_attention(params),
    "EFFICIENT_ATTENTION": lambda params: torch.backends.cuda.can_use_efficient_attention(params),
}


# ---- each backend's op, called as F.scaled_dot_product_attention calls it (no mask, no dropout, no grad) ----


def _cudnn(q, k, v):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)[0]


def _flash(q, k, v):
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
    head_dim = q.shape[-1]
    pad = -head_dim % FLASH_HEAD_ALIGN
    if not pad:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]
    # The kernel takes head dims in multiples of 8: zero-padded, with the scale of the true head dim, cut after.
    q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, scale=1.0 / math.sqrt(head_dim))[0]
    return out[..., :head_dim]


def _efficient(q, k, v):
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0]


def _math(q, k, v):
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0]


_RUN = {"CUDNN_ATTENTION": _cudnn, "FLASH_ATTENTION": _flash, "EFFICIENT_ATTENTION": _efficient, "MATH": _math}
