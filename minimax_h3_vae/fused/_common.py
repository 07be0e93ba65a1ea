"""Contract checks and launch bookkeeping shared by the fused ops. Imports no Triton.

Whether `triton.jit` builds a compiled or an interpreted kernel is decided when the kernel is defined, from
TRITON_INTERPRET. The kernel modules are therefore imported only when a call is about to launch, and this
module (which the package imports eagerly) stays free of Triton.
"""

from __future__ import annotations

import os
from numbers import Real

import torch

COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# CUDA caps grid axes 1 and 2 at 65535 programs.
MAX_GRID_YZ = 65535
# The row kernels hold a whole row in one block; wider rows would spill registers.
MAX_ROW_WIDTH = 8192

LAUNCHES = {
    "rms_norm": 0,
    "scale_add_rms_norm": 0,
    "qk_rms_norm_rope": 0,
    "silu_mul": 0,
    "tf32x3_linear": 0,
    "fp16x3_linear": 0,
    "linear_silu_mul": 0,
    "linear_qk_rms_norm_rope": 0,
    "flash_attention": 0,
    "anti_aliased_snake_beta": 0,
}


def count_launch(name: str) -> None:
    LAUNCHES[name] += 1


def interpreting() -> bool:
    """Whether TRITON_INTERPRET asks for Triton's CPU interpreter, read now (not at import)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def device_problem(tensors, kernel_interpreted: bool = True) -> str | None:
    """Why the kernels cannot run on these tensors' device, or None.

    CUDA always works (an interpreted kernel copies CUDA tensors through the host). The CPU needs the
    interpreter both now and when the kernel was defined.
    """
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"all tensors must be on one device, got {sorted(str(d) for d in devices)}"
    device = devices.pop()
    if device.type == "cuda" or (device.type == "cpu" and interpreting() and kernel_interpreted):
        return None
    return (
        f"tensors on {device} need a CUDA device, or the CPU with TRITON_INTERPRET=1 set before the "
        f"kernels were first used"
    )


def grad_problem(tensors) -> str | None:
    """The kernels have no backward: refuse calls that autograd would need to differentiate."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "inputs require grad and the kernels have no backward"
    return None


def dtype_problem(name: str, dtype, allowed=COMPUTE_DTYPES) -> str | None:
    if dtype not in allowed:
        return f"{name} dtype must be one of {[str(d) for d in allowed]}, got {dtype}"
    return None


def is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def as_rows(t: torch.Tensor) -> torch.Tensor | None:
    """(..., C) -> an (N, C) view with a contiguous last dim and one row stride, or None if there is none.

    A view, never a copy, so that in-place kernels write into `t` itself.
    """
    if t.dim() == 0 or t.stride(-1) != 1:
        return None
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def linear_fp32_problem(x, weight, bias) -> str | None:
    """What keeps `(x, weight, bias)` from being a float32 Linear both proj_out kernels take (types, dtype,
    shapes, a contiguous last dim with one row stride for x, the bias's shape), or None. Device and
    alignment are each kernel's own checks."""
    tensors = [t for t in (x, weight, bias) if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "x, weight and bias must be tensors"
    if any(t.dtype != torch.float32 for t in tensors):
        return "x, weight and bias must be float32"
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return f"shapes {tuple(x.shape)} and {tuple(weight.shape)} do not make a Linear"
    if as_rows(x) is None or weight.stride(-1) != 1:
        return "x and weight must have a contiguous last dim, and x's leading dims must flatten into one row stride"
    if bias is not None and (bias.shape != (weight.shape[0],) or not bias.is_contiguous()):
        return f"bias must be contiguous with shape ({weight.shape[0]},), got {tuple(bias.shape)}"
    return None


def row_vector_problem(name: str, t, length: int) -> str | None:
    """A per-channel parameter: float32, shape (length,), contiguous."""
    if not isinstance(t, torch.Tensor):
        return f"{name} must be a tensor, got {type(t).__name__}"
    if t.dtype != torch.float32:
        return f"{name} must be float32, got {t.dtype}"
    if t.shape != (length,) or not t.is_contiguous():
        return f"{name} must be contiguous with shape ({length},), got {tuple(t.shape)}"
    return None
