"""Triton kernels for the decoder's pointwise ops and its float32 output projection; (gemm="quack") quack's
GEMMs for w1 with the gate and for the attention's projection with the QK norm and RoPE, in their epilogues,
and for the output projection over split fp16 operands; (attention="fa4") FlashAttention 4's Hopper kernel
for the attention. For the audio decoder, the anti-aliased activation's kernel (`select_audio_ops`).

Two steps, each once per model:

    kernels = choose_kernels(config, device, dtype, fused, gemm, attention)   # at resolve: a `Kernels` record
    ops = ops_for(kernels, launches)                                          # the ops the blocks call

`choose_kernels` takes, for each op, the first of its kernels that can run with the model's shapes and
layouts on that device and dtype (each kernel module's `model_call`, asked of its own `unsupported`), else
the eager op from `blocks.py`, with one warning naming each kernel left out and why. `ops_for` wires the
record's choices explicitly; the ops have the eager signatures, and a launcher still checks its contract on
every call and raises ValueError outside it, never a silent fallback. Every launcher counts its launches into
the model's `launches` (a `launch_counts()` view); the qkv GEMM keeps its rotation tables, and fp16x3 its
split of the proj_out weight, in the model's ops (`STATE`).

Importing this package imports no Triton: a kernel module is imported when `choose_kernels` first checks it,
because `triton.jit` picks compiled or interpreted from TRITON_INTERPRET when the kernel is defined (read here,
in `choose_kernels`, and never per launch: a launcher asks its kernel how it was built).
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from dataclasses import dataclass, fields
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .. import blocks
from ..audio import model as audio_model
from ..config import H3DecoderConfig
from ._common import LAUNCH_NAMES, placement_problem
from .quack_common import HOPPER, INSTALL
from .quack_common import installed as quack_installed
from .quack_common import load as load_quack

__all__ = [
    "EAGER_KERNELS",
    "FUSED_OPS",
    "HOPPER",
    "INSTALL",
    "LAUNCH_NAMES",
    "Kernels",
    "choose_kernels",
    "interpreting",
    "load_quack",
    "ops_for",
    "qkv_rows",
    "quack_installed",
    "select_audio_ops",
    "select_ops",
    "uses_fa4",
    "uses_quack",
    "warm_up",
]


@dataclass(frozen=True)
class Kernels:
    """What runs each op of the video decoder's blocks, decided once (`choose_kernels`); frozen.

    rms_norm, scale_add_rms_norm, qk_rms_norm_rope, silu_mul: "triton" (the module of that name) or "eager".
    linear_silu_mul, linear_qk_rms_norm_rope: "quack" (one GEMM with the work in its epilogue), "cublas+triton"
    (torch's linear, then the silu_mul / qk_rms_norm_rope kernel) or "eager". attention: "fa4" (flash-attn-4)
    or "sdpa" (torch's, with the run's attention_backends). linear_fp32 (proj_out): "fp16x3" (quack, split fp16
    operands), "tf32x3" (Triton) or "eager".
    """

    rms_norm: str = "eager"
    scale_add_rms_norm: str = "eager"
    qk_rms_norm_rope: str = "eager"
    silu_mul: str = "eager"
    linear_silu_mul: str = "eager"
    linear_qk_rms_norm_rope: str = "eager"
    attention: str = "sdpa"
    linear_fp32: str = "eager"


EAGER_KERNELS = Kernels()

# The Triton kernels of the fused path: op -> its module.
TRITON = {
    "rms_norm": "rms_norm",
    "scale_add_rms_norm": "scale_add_rms_norm",
    "qk_rms_norm_rope": "qk_rms_norm_rope",
    "silu_mul": "silu_mul",
}
# Each kernel an op may run, by its name in `Kernels` -> its module (the launcher has the op's name).
MODULES = {
    **{(name, "triton"): module for name, module in TRITON.items()},
    ("linear_fp32", "tf32x3"): "tf32x3_linear",
    ("linear_fp32", "fp16x3"): "fp16x3_linear",
    ("linear_silu_mul", "quack"): "linear_silu_mul",
    ("linear_qk_rms_norm_rope", "quack"): "linear_qk_rms_norm_rope",
    ("attention", "fa4"): "flash_attention",
}
# The state a model's launcher keeps, made fresh for each model's ops: the qkv GEMM's rotation tables, and
# fp16x3's split of the proj_out weight (made once, not per call).
STATE = {
    ("linear_qk_rms_norm_rope", "quack"): lambda: {"tables": {}},
    ("linear_fp32", "fp16x3"): lambda: {"weights": {}},
}
# w1's and the projection's op where quack's GEMM does not run: torch's (cuBLAS) linear followed by this op.
AFTER_CUBLAS = {"linear_silu_mul": "silu_mul", "linear_qk_rms_norm_rope": "qk_rms_norm_rope"}
# The modules of gemm="quack" and attention="fa4" (the `hopper` extra).
QUACK_KERNELS = ("linear_silu_mul", "linear_qk_rms_norm_rope", "fp16x3_linear")
FA4_KERNELS = ("flash_attention",)
# What runs when none of an op's kernels can (the warning says so); any other op: the eager one.
EAGER_INSTEAD = "the eager op runs instead"
INSTEAD = {
    **{name: f"torch's linear and the {then} op run instead" for name, then in AFTER_CUBLAS.items()},
    "attention": "torch's SDPA runs instead",
}
# The ops the fused path runs as kernels wherever they can (the attention is SDPA on both paths, unless fa4).
FUSED_OPS = (*TRITON, "linear_fp32", *AFTER_CUBLAS)


def interpreting() -> bool:
    """Whether TRITON_INTERPRET asks for Triton's CPU interpreter (read when the kernels are chosen)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def uses_quack(kernels: Kernels) -> bool:
    """Whether any GEMM of `kernels` runs on quack."""
    return "quack" in (kernels.linear_silu_mul, kernels.linear_qk_rms_norm_rope) or kernels.linear_fp32 == "fp16x3"


def uses_fa4(kernels: Kernels) -> bool:
    """Whether the attention of `kernels` runs on flash-attn-4."""
    return kernels.attention == "fa4"


def _candidates(name: str, gemm: str, attention: str) -> list[str]:
    """The kernels (names in `Kernels`) that may run op `name`, the preferred first."""
    wanted = {
        "linear_fp32": [*(["fp16x3"] if gemm == "quack" else []), "tf32x3"],
        "linear_silu_mul": ["quack"] if gemm == "quack" else [],
        "linear_qk_rms_norm_rope": ["quack"] if gemm == "quack" else [],
        "attention": ["fa4"] if attention == "fa4" else [],
    }
    return wanted.get(name, ["triton"])


def choose_kernels(
    config: H3DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    fused: bool = True,
    gemm: str = "cublas",
    attention: str = "sdpa",
) -> Kernels:
    """The kernel of each op for a model of `config` on `device` with block linears in `dtype`: each kernel
    that can run there, else the eager op (and one warning naming those kernels and why); `EAGER_KERNELS`
    when not `fused`. gemm: "quack" takes quack's GEMMs for w1 and its gate, for the attention's projection
    with its QK norm and RoPE, and for proj_out (fp16x3) where they run (this imports quack); "cublas" torch's
    linear followed by the gate's and the norm's kernels, and proj_out as tf32x3. attention: "fa4" takes
    flash-attn-4's kernel where it runs (this imports it and quack); "sdpa" torch's SDPA."""
    if not fused:
        return EAGER_KERNELS
    device = torch.device(device)
    # The device test comes first so that a kernel that cannot launch here is never defined.
    problem = placement_problem(device, interpreting())
    chosen, left_out = {}, {}  # (why, instead) -> the kernels left out
    for name in (*FUSED_OPS, "attention"):  # the order of the warning's clauses
        tried = []
        for kernel in _candidates(name, gemm, attention):
            module = MODULES[name, kernel]
            imported = None if problem else importlib.import_module(f"{__name__}.{module}")
            why = problem or imported.unsupported(*imported.model_call(config, device, dtype))
            if why is None:
                chosen[name] = kernel
                break
            tried.append((module, why))
        if name in AFTER_CUBLAS and name not in chosen:
            chosen[name] = "cublas+triton" if chosen.get(AFTER_CUBLAS[name]) == "triton" else "eager"
        kernel = chosen.get(name)
        instead = f"the {MODULES[name, kernel]} kernel runs instead" if (name, kernel) in MODULES else None
        for module, why in tried:
            left_out.setdefault((why, instead or INSTEAD.get(name, EAGER_INSTEAD)), []).append(module)
    if left_out:  # one clause per reason: on the CPU all five kernels share one
        clauses = []
        for (why, instead), modules in left_out.items():
            plural = instead == EAGER_INSTEAD and len(modules) > 1
            clauses.append(f"{', '.join(modules)} ({why}; {'their eager ops run instead' if plural else instead})")
        warnings.warn(
            f"fused path on {device} with {dtype}: running without the kernel(s) {'; '.join(clauses)}",
            stacklevel=3,
        )
    return Kernels(**chosen)


def _launcher(name: str, kernel: str, launches: dict[str, int], **state):
    """Op `name`'s launcher of `kernel`, counting into `launches` (and given the model's `state`)."""
    module = importlib.import_module(f"{__name__}.{MODULES[name, kernel]}")
    return functools.partial(getattr(module, name), launches=launches, **state)


def _after_cublas(then):
    """torch's (cuBLAS) linear followed by `then` (the eager signature of blocks.linear_silu_mul and
    blocks.linear_qk_rms_norm_rope)."""

    def linear_then(x, weight, bias, *args):
        return then(F.linear(x, weight, bias), *args)

    return linear_then


def ops_for(
    kernels: Kernels, launches: dict[str, int] | None = None, qkv_rows: torch.Tensor | None = None
) -> SimpleNamespace:
    """The ops that run `kernels` (the eager ops, `blocks.EAGER_OPS`, for `EAGER_KERNELS`), their launches
    counted into `launches` (the model's counts). Each call makes new ops with a rotation-table cache of their
    own: a model keeps its ops (one set per `Kernels`). qkv_rows: the row order the model stores w_qkv in
    (`qkv_rows(...)` at its load), None for the release's: the quack projection then takes the weight as
    stored, and any other projection op is given the release's rows back."""
    if kernels == EAGER_KERNELS and qkv_rows is None:
        return blocks.EAGER_OPS
    launches = {} if launches is None else launches
    ops = {}
    for field in fields(Kernels):
        name, kernel = field.name, getattr(kernels, field.name)
        if kernel == "cublas+triton":
            ops[name] = _after_cublas(ops[AFTER_CUBLAS[name]])
        elif (name, kernel) in MODULES:
            state = STATE.get((name, kernel), dict)()
            if (name, kernel) == ("linear_qk_rms_norm_rope", "quack"):
                state["ordered"] = qkv_rows is not None
            ops[name] = _launcher(name, kernel, launches, **state)
        else:
            ops[name] = getattr(blocks.EAGER_OPS, name)
    if qkv_rows is not None and kernels.linear_qk_rms_norm_rope != "quack":
        ops["linear_qk_rms_norm_rope"] = _in_release_order(ops["linear_qk_rms_norm_rope"], qkv_rows)
    return SimpleNamespace(**ops)


def qkv_rows(kernels: Kernels, config: H3DecoderConfig) -> torch.Tensor | None:
    """The order, in release rows, in which a model running `kernels` stores w_qkv and its bias: the quack
    projection's (`linear_qk_rms_norm_rope.kernel_rows`), so that its GEMM takes the weight as stored and
    nothing is gathered per call; None (the release's order) for every other projection kernel."""
    if kernels.linear_qk_rms_norm_rope != "quack":
        return None
    from .linear_qk_rms_norm_rope import kernel_rows  # imports no quack

    return kernel_rows(config.num_heads, config.head_dim, config.rope_dim)


def _in_release_order(op, rows: torch.Tensor):
    """`op` (the projection's, which takes w_qkv in the release's row order) for a model that stores w_qkv in
    `rows` order: the release's rows are gathered back per call. Only a decoder loaded for the quack
    projection and then run without it (`configure(fused=False)`) takes this path."""
    inverse = torch.argsort(rows)
    on_device = {}

    def release_order(x, weight, bias, *args):
        if weight.device not in on_device:  # copied to each device once, not per call
            on_device[weight.device] = inverse.to(weight.device)
        index = on_device[weight.device]
        return op(x, weight.index_select(0, index), None if bias is None else bias.index_select(0, index), *args)

    return release_order


def select_ops(
    config: H3DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    gemm: str = "cublas",
    attention: str = "sdpa",
    launches: dict[str, int] | None = None,
) -> SimpleNamespace:
    """`ops_for(choose_kernels(config, device, dtype, True, gemm, attention), launches)`: the fused ops of a
    model, for a caller that holds no decoder (the decoder keeps its `runtime.kernels` and its ops)."""
    return ops_for(choose_kernels(config, device, dtype, True, gemm, attention), launches)


def warm_up(ops: SimpleNamespace, kernels: Kernels, config: H3DecoderConfig, device: torch.device, dtype) -> None:
    """Call each kernel of `ops` (made by `ops_for(kernels)`) once on two zero tokens laid out as the decoder
    passes them. A process's first Triton launch sets up Triton itself (its driver module, the launchers, the
    cached kernels: about 0.5 s on an H200), and quack's and flash-attn-4's first call of each kernel builds it
    (about 2-3 s each); done in a thread beside the weight load, it is off the first decode's path."""
    device = torch.device(device)
    for field in fields(Kernels):
        name, kernel = field.name, getattr(kernels, field.name)
        if (name, kernel) in MODULES:
            module = importlib.import_module(f"{__name__}.{MODULES[name, kernel]}")
            getattr(ops, name)(*module.model_call(config, device, dtype))


def select_audio_ops(device: torch.device, launches: dict[str, int] | None = None) -> SimpleNamespace:
    """The audio decoder's ops on `device`: the anti-aliased activation's kernel where it can run (float32
    activations laid out as the decoder holds them), counting into `launches`, else the eager op, with one
    warning naming the kernel and why."""
    device = torch.device(device)
    channels = 2
    args = (
        torch.zeros(1, channels, 16, device=device),
        torch.zeros(1, channels, 1, device=device),
        torch.zeros(1, channels, 1, device=device),
        torch.zeros(1, 1, audio_model.FILTER_TAPS, device=device),
        torch.zeros(1, 1, audio_model.FILTER_TAPS, device=device),
    )
    # The device test comes first so that a kernel that cannot launch here is never defined.
    problem = placement_problem(device, interpreting())
    kernel = None if problem else importlib.import_module(f"{__name__}.anti_aliased_snake_beta")
    why = problem or kernel.unsupported(*args)
    if why is None:
        launcher = functools.partial(kernel.anti_aliased_snake_beta, launches={} if launches is None else launches)
        return SimpleNamespace(anti_aliased_snake_beta=launcher)
    warnings.warn(
        f"fused path on {device}: running without the kernel(s) anti_aliased_snake_beta ({why}; the eager op runs "
        "instead)",
        stacklevel=3,
    )
    return audio_model.EAGER_OPS
