"""Triton kernels for the decoder's pointwise ops, interchangeable with `blocks.EAGER_OPS`.

`FUSED_OPS` has the eager ops' signatures. Each call inside a kernel's contract (float32/float16/bfloat16,
supported shapes and layouts, a CUDA tensor, or a CPU tensor under TRITON_INTERPRET=1) launches the kernel;
any other call runs the eager reference, so a call never fails or differs just because it is unusual.

Importing this package imports no Triton: a kernel module is imported on the first call that can launch
it, because `triton.jit` picks compiled or interpreted from TRITON_INTERPRET when the kernel is defined.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import torch

from .. import blocks
from ._common import LAUNCHES, device_problem

__all__ = ["FUSED_OPS", "launch_counts"]


def launch_counts() -> dict[str, int]:
    """Kernel launches since import, per kernel: 'rms_norm', 'scale_add_rms_norm', 'qk_rms_norm_rope',
    'silu_mul', 'tf32x3_linear' (its operand splits)."""
    return dict(LAUNCHES)


def _call(name: str, reference, *args, launcher: str | None = None):
    # The device test comes first so a call that cannot launch never imports (and so defines) a kernel.
    if device_problem([a for a in args if isinstance(a, torch.Tensor)]) is None:
        kernel = importlib.import_module(f"{__name__}.{name}")
        if kernel.unsupported(*args) is None:
            return getattr(kernel, launcher or name)(*args)
    return reference(*args)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    return _call("rms_norm", blocks.rms_norm, x, weight, eps, out_dtype)


def _scale_add_rms_norm(
    residual: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor | None, eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _call("scale_add_rms_norm", blocks.scale_add_rms_norm, residual, y, scale, weight, eps, out_dtype)


def _qk_rms_norm_rope(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _call("qk_rms_norm_rope", blocks.qk_rms_norm_rope, qkv, cos, sin, num_heads, eps)


def _silu_mul(h: torch.Tensor) -> torch.Tensor:
    return _call("silu_mul", blocks.silu_mul, h)


def _linear_fp32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _call("tf32x3_linear", blocks.linear_fp32, x, weight, bias, launcher="linear_fp32")


FUSED_OPS = SimpleNamespace(
    rms_norm=_rms_norm, scale_add_rms_norm=_scale_add_rms_norm, qk_rms_norm_rope=_qk_rms_norm_rope,
    silu_mul=_silu_mul, linear_fp32=_linear_fp32,
)
