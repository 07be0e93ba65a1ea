"""Contract checks and launch bookkeeping shared by the fused ops. Imports no Triton.

Whether `triton.jit` builds a compiled or an interpreted kernel is decided when the kernel is defined, from
TRITON_INTERPRET. The kernel modules are therefore imported only once the ops are chosen (`fused.choose_kernels`),
and this module (which the package imports eagerly) stays free of Triton. After that a launcher asks the kernel
how it was built (`_triton_utils.built_for_interpreter`), never the environment.
"""

from __future__ import annotations

from numbers import Real

import torch

COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# CUDA caps grid axes 1 and 2 at 65535 programs.
MAX_GRID_YZ = 65535
# The row kernels hold a whole row in one block; wider rows would spill registers.
MAX_ROW_WIDTH = 8192


def count_launch(launches: dict[str, int] | None, name: str) -> None:
    """One launch of kernel `name` into `launches` (a model's counts, bound into its ops; None: not counted)."""
    if launches is not None:
        launches[name] = launches.get(name, 0) + 1


def zeros(device: torch.device, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Zeros for a kernel module's `model_call` (arguments laid out as the decoder passes them)."""
    return torch.zeros(*shape, dtype=dtype, device=device)


def linear_fp32_call(config, device: torch.device) -> tuple:
    """proj_out's call as the decoder makes it (two tokens of one tile), for both proj_out kernels."""
    c = config
    return (zeros(device, 1, 2, c.dim), zeros(device, c.patch_dim, c.dim), zeros(device, c.patch_dim))


def device_problem(tensors, kernel_interpreted: bool) -> str | None:
    """Why a kernel (built for Triton's CPU interpreter: `kernel_interpreted`) cannot run on these tensors'
    device, or None. CUDA always works (an interpreted kernel copies CUDA tensors through the host); the CPU
    needs a kernel built for the interpreter."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"all tensors must be on one device, got {sorted(str(d) for d in devices)}"
    return placement_problem(devices.pop(), kernel_interpreted)


def placement_problem(device: torch.device, interpreted: bool) -> str | None:
    """Why the Triton kernels cannot run on `device` when they are (to be) built for the interpreter
    (`interpreted`), or None."""
    if device.type == "cuda" or (device.type == "cpu" and interpreted):
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
