"""Every kernel of both decoders, one line each: which op it runs, its name in the decoder's record of
choices (`fused.Kernels`, `fused.AudioKernels`), the module of this package that holds it, and the run
option that asks for it. Imports nothing but the standard library.

An op's lines, in the order written, are its candidates, the preferred first: the chooser (`fused.choose_kernels`,
`fused.choose_audio_kernels`) takes the first that the run's options ask for and that can run with the model's
shapes on its device and dtype, else the op's eager one (blocks.py, audio/model.py), with one warning naming each
kernel left out and why. The launches, the warm-up, the tests (tests/test_kernel_registry.py) and the table in
docs/kernels.md are all read from here.

A kernel module (`module`) holds the kernel and, named after the op it runs (`<op>` below):
- `unsupported(*args)`: why a call with the op's eager arguments is outside the kernel's contract, or None;
- `<op>`, the launcher: the eager signature plus keyword-only `launches` (the model's counts, into which it
  counts one launch under the module's name) and any state of `new_state()`; it checks `unsupported` and raises
  ValueError outside its contract, never falls back;
- `<op>_reference`: the torch function the kernel is tested against (the eager op itself where the kernel keeps
  its roundings, else what the kernel computes, rounded once);
- `model_call(config, device, dtype)`: the op's arguments as the decoder passes them (zeros), asked of
  `unsupported` when the kernel is chosen and launched once at load.
Optionally `new_state()`, a fresh dict of what one model's launcher keeps (bound in as keywords), and for the
projection `stored_rows(config)`, the row order in which a model on this kernel stores w_qkv (its launcher then
takes `ordered`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """One way to run `op`. name: its value in the decoder's record. module: the module of fused/ that holds it
    (None for `after`). option: (run option, value) that asks for it, e.g. ("gemm", "quack"); None: every fused
    run. after: torch's linear followed by this other op, as that op was chosen (chosen when it got a kernel).
    exact: the kernel gives the eager op's bits on every input (the same float32 operations in the same order:
    the release's bits), so an `exact` run may take it; the other lines are within the dtype's rounding of it."""

    op: str
    name: str
    module: str | None = None
    option: tuple[str, str] | None = None
    after: str | None = None
    exact: bool = False


KERNELS = (
    Kernel("rms_norm", "triton", "rms_norm"),
    Kernel("rms_norm", "triton-exact", "rms_norm_exact", exact=True),
    Kernel("scale_add_rms_norm", "triton", "scale_add_rms_norm"),
    Kernel("scale_add_rms_norm", "triton-exact", "scale_add_rms_norm_exact", exact=True),
    Kernel("qk_rms_norm_rope", "triton", "qk_rms_norm_rope"),
    Kernel("qk_rms_norm_rope", "triton-exact", "qk_rms_norm_rope_exact", exact=True),
    Kernel("silu_mul", "triton", "silu_mul", exact=True),
    Kernel("linear_fp32", "fp16x3", "fp16x3_linear", option=("gemm", "quack")),
    Kernel("linear_fp32", "tf32x3", "tf32x3_linear"),
    Kernel("linear_silu_mul", "quack", "linear_silu_mul", option=("gemm", "quack")),
    Kernel("linear_silu_mul", "quack-exact", "linear_silu_mul_exact", option=("gemm", "quack"), exact=True),
    Kernel("linear_silu_mul", "cublas+triton", after="silu_mul", exact=True),
    Kernel("linear_qk_rms_norm_rope", "quack", "linear_qk_rms_norm_rope", option=("gemm", "quack")),
    Kernel("linear_qk_rms_norm_rope", "cublas+triton", after="qk_rms_norm_rope", exact=True),
    Kernel("attention", "fa4", "flash_attention", option=("attention", "fa4")),
    Kernel("anti_aliased_snake_beta", "triton", "anti_aliased_snake_beta"),
)

# The ops with kernels, in the order of their first line (the order of the chooser's warning), and the modules,
# in the order of their lines (the order of a decoder's `launch_counts()`).
OPS = tuple(dict.fromkeys(kernel.op for kernel in KERNELS))
MODULES = tuple(kernel.module for kernel in KERNELS if kernel.module)


def candidates(op: str) -> tuple[Kernel, ...]:
    """The lines of `op`, the preferred first."""
    return tuple(kernel for kernel in KERNELS if kernel.op == op)


def find(op: str, name: str) -> Kernel | None:
    """The line of `op` named `name`, or None where `op` has none of that name."""
    return next((kernel for kernel in KERNELS if kernel.op == op and kernel.name == name), None)
