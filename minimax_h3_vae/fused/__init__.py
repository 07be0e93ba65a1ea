"""The kernels of both decoders, chosen from one registry (registry.py): Triton kernels for the video decoder's
pointwise ops and its float32 output projection; (gemm="quack") quack's GEMMs for w1 with the gate and for the
attention's projection with the QK norm and RoPE, in their epilogues, and for the output projection over split
fp16 operands; (attention="fa4") FlashAttention 4's Hopper kernel for the attention; for the audio decoder, the
anti-aliased activation's Triton kernel.

Two steps, each once per model, the same for both decoders:

    kernels = choose_kernels(config, device, dtype, fused, gemm, attention)   # at resolve: a `Kernels` record
    kernels = choose_audio_kernels(config, device, fused)                     # the audio decoder's `AudioKernels`
    ops = ops_for(kernels, launches)                                          # the ops the model calls

The chooser takes, for each op, the first of its registry lines that the run's options ask for and that can
run with the model's shapes and layouts on that device and dtype (the kernel module's `model_call`, asked of
its own `unsupported`), else the eager op (blocks.py, audio/model.py), with one warning naming each kernel left
out and why. `ops_for` wires the record's choices; the ops have the eager signatures, and a launcher still
checks its contract on every call and raises ValueError outside it, never a silent fallback. Every launcher
counts its launches into the model's `launches` (a `launch_counts()` view); a kernel module's `new_state()`
(the qkv GEMM's rotation tables, fp16x3's split of the proj_out weight) is made once per model's ops.

Importing this package imports no Triton: a kernel module is imported when the chooser first checks it,
because `triton.jit` picks compiled or interpreted from TRITON_INTERPRET when the kernel is defined (read here,
when the kernels are chosen, and never per launch: a launcher asks its kernel how it was built).
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import ClassVar

import torch
import torch.nn.functional as F

from .. import blocks
from ..audio import model as audio_model
from ..config import H3DecoderConfig
from . import registry
from ._common import placement_problem
from .quack_common import HOPPER, INSTALL
from .quack_common import installed as quack_installed
from .quack_common import load as load_quack

__all__ = [
    "EAGER_KERNELS",
    "FA4_KERNELS",
    "FUSED_OPS",
    "HOPPER",
    "INSTALL",
    "LAUNCH_NAMES",
    "QUACK_KERNELS",
    "AudioKernels",
    "Kernels",
    "choose_audio_kernels",
    "choose_kernels",
    "interpreting",
    "kernel_module",
    "launch_counts",
    "load_quack",
    "ops_for",
    "qkv_rows",
    "quack_installed",
    "quack_ops",
    "select_ops",
    "uses_fa4",
    "uses_quack",
    "warm_up",
]


@dataclass(frozen=True)
class Kernels:
    """What runs each op of the video decoder's blocks, decided once (`choose_kernels`); frozen.

    Each field is an op of `blocks.EAGER_OPS`; its value names the registry line that runs it (registry.py,
    listed in docs/kernels.md: e.g. rms_norm="triton", linear_silu_mul="quack" or "cublas+triton",
    linear_fp32="tf32x3"), or its eager op: "eager", and for the attention "sdpa" (torch's SDPA, with the run's
    attention_backends).
    """

    eager_ops: ClassVar[SimpleNamespace] = blocks.EAGER_OPS

    rms_norm: str = "eager"
    scale_add_rms_norm: str = "eager"
    qk_rms_norm_rope: str = "eager"
    silu_mul: str = "eager"
    linear_silu_mul: str = "eager"
    linear_qk_rms_norm_rope: str = "eager"
    attention: str = "sdpa"
    linear_fp32: str = "eager"


@dataclass(frozen=True)
class AudioKernels:
    """What runs each op of the audio decoder (`audio_model.EAGER_OPS`), decided once (`choose_audio_kernels`);
    frozen. Values as in `Kernels`: a registry line's name, or "eager"."""

    eager_ops: ClassVar[SimpleNamespace] = audio_model.EAGER_OPS

    anti_aliased_snake_beta: str = "eager"


EAGER_KERNELS = Kernels()

# Every kernel's launch count, by its module's name (a model's `launch_counts()`).
LAUNCH_NAMES = registry.MODULES
# The modules of gemm="quack" and attention="fa4" (the `hopper` extra).
QUACK_KERNELS = tuple(k.module for k in registry.KERNELS if k.option == ("gemm", "quack"))
FA4_KERNELS = tuple(k.module for k in registry.KERNELS if k.option == ("attention", "fa4"))
# The video decoder's ops that every fused run takes a kernel for wherever one runs (the attention is SDPA on
# both paths, unless fa4).
FUSED_OPS = tuple(
    op
    for op in registry.OPS
    if op in {f.name for f in fields(Kernels)} and any(k.option is None for k in registry.candidates(op))
)
# What runs when none of an op's kernels can (the warning says so): for an op with a line `after` another,
# torch's linear and that op; the attention, SDPA; any other op, the eager one.
EAGER_INSTEAD = "the eager op runs instead"
INSTEAD = {
    **{k.op: f"torch's linear and the {k.after} op run instead" for k in registry.KERNELS if k.after},
    "attention": "torch's SDPA runs instead",
}


def interpreting() -> bool:
    """Whether TRITON_INTERPRET asks for Triton's CPU interpreter (read when the kernels are chosen)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _lines(kernels) -> dict[str, registry.Kernel]:
    """op -> the registry line `kernels` (a `Kernels` or `AudioKernels`) chose for it; ops left eager are absent.
    A name that is neither an op's eager one nor one of its lines is a ValueError."""
    lines = {}
    for field in fields(kernels):
        name = getattr(kernels, field.name)
        if name == field.default:
            continue
        line = registry.find(field.name, name)
        if line is None:
            raise ValueError(f"{field.name}: no kernel {name!r} in the registry (fused/registry.py)")
        lines[field.name] = line
    return lines


def quack_ops(kernels: Kernels) -> tuple[str, ...]:
    """The ops of `kernels` whose GEMM runs on quack, in the registry's order."""
    return tuple(op for op, line in _lines(kernels).items() if line.option == ("gemm", "quack"))


def uses_quack(kernels: Kernels) -> bool:
    """Whether any GEMM of `kernels` runs on quack."""
    return bool(quack_ops(kernels))


def uses_fa4(kernels: Kernels) -> bool:
    """Whether the attention of `kernels` runs on flash-attn-4."""
    return any(line.option == ("attention", "fa4") for line in _lines(kernels).values())


def kernel_module(module: str):
    """The kernel module of fused/ named `module` (a registry line's), imported (a Triton kernel is defined then:
    see the package docstring)."""
    if module not in registry.MODULES:
        raise ValueError(f"no kernel module {module!r} in the registry (fused/registry.py)")
    return importlib.import_module(f"{__name__}.{module}")


def launch_counts(launches: dict[str, int]) -> dict[str, int]:
    """A model's `launches` as its `launch_counts()`: every kernel of the registry, by its module's name, 0 for
    those that never launched."""
    return {name: launches.get(name, 0) for name in LAUNCH_NAMES}


def _choose(
    record: type, config, device: torch.device, dtype: torch.dtype, options: dict[str, str], exact: bool = False
):
    """The chooser of both decoders: for each op of `record`, the first of its registry lines that `options`
    ask for (a line without an option: always; with `exact`, only the lines that give the eager op's bits) and
    that can run for a model of `config` on `device` with `dtype` (a line `after` another op: where that op got
    a kernel), else its eager one; one warning names each kernel left out and why. Returns a `record`."""
    device = torch.device(device)
    defaults = {f.name: f.default for f in fields(record)}
    # The device test comes first so that a kernel that cannot launch here is never defined.
    problem = placement_problem(device, interpreting())
    chosen, left_out = {}, {}  # (why, instead) -> the kernels left out
    for op in (op for op in registry.OPS if op in defaults):  # the order of the warning's clauses
        tried = []
        for line in registry.candidates(op):
            if line.option is not None and options.get(line.option[0]) != line.option[1]:
                continue
            if exact and not line.exact:
                continue
            if line.after is not None:
                if chosen.get(line.after, defaults[line.after]) != defaults[line.after]:
                    chosen[op] = line.name
                    break
                continue
            imported = None if problem else kernel_module(line.module)
            why = problem or imported.unsupported(*imported.model_call(config, device, dtype))
            if why is None:
                chosen[op] = line.name
                break
            tried.append((line.module, why))
        line = registry.find(op, chosen.get(op, defaults[op]))
        instead = f"the {line.module} kernel runs instead" if line and line.module else None
        for module, why in tried:
            left_out.setdefault((why, instead or INSTEAD.get(op, EAGER_INSTEAD)), []).append(module)
    if left_out:  # one clause per reason: on the CPU all five kernels share one
        clauses = []
        for (why, instead), modules in left_out.items():
            plural = instead == EAGER_INSTEAD and len(modules) > 1
            clauses.append(f"{', '.join(modules)} ({why}; {'their eager ops run instead' if plural else instead})")
        warnings.warn(
            f"fused path on {device} with {dtype}: running without the kernel(s) {'; '.join(clauses)}",
            stacklevel=4,
        )
    return record(**chosen)


def choose_kernels(
    config: H3DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    fused: bool = True,
    gemm: str = "cublas",
    attention: str = "sdpa",
    exact: bool = False,
) -> Kernels:
    """The kernel of each op for a video model of `config` on `device` with block linears in `dtype`: each
    kernel that can run there, else the eager op (and one warning naming those kernels and why);
    `EAGER_KERNELS` when not `fused`. gemm: "quack" takes quack's GEMMs for w1 and its gate, for the attention's
    projection with its QK norm and RoPE, and for proj_out (fp16x3) where they run (this imports quack);
    "cublas" torch's linear followed by the gate's and the norm's kernels, and proj_out as tf32x3. attention:
    "fa4" takes flash-attn-4's kernel where it runs (this imports it and quack); "sdpa" torch's SDPA. exact:
    only the kernels that give the eager ops' bits (the registry's `exact` lines), every other op eager: the
    release's bits."""
    if not fused:
        return EAGER_KERNELS
    return _choose(Kernels, config, device, dtype, {"gemm": gemm, "attention": attention}, exact)


def choose_audio_kernels(config, device: torch.device, fused: bool = True) -> AudioKernels:
    """The kernel of each op for an audio model of `config` (an `H3AudioDecoderConfig`) on `device`, which runs
    in float32, chosen as `choose_kernels` chooses (the same registry, the same warning); all eager when not
    `fused`."""
    if not fused:
        return AudioKernels()
    return _choose(AudioKernels, config, device, torch.float32, {})


def _launcher(line: registry.Kernel, launches: dict[str, int], **state):
    """The launcher of registry line `line`, counting into `launches` (and given the model's `state`)."""
    module = kernel_module(line.module)
    state = {**(module.new_state() if hasattr(module, "new_state") else {}), **state}
    return functools.partial(getattr(module, line.op), launches=launches, **state)


def _after_linear(then):
    """torch's (cuBLAS) linear followed by `then` (the eager signature of blocks.linear_silu_mul and
    blocks.linear_qk_rms_norm_rope)."""

    def linear_then(x, weight, bias, *args):
        return then(F.linear(x, weight, bias), *args)

    return linear_then


def _stores_rows(line: registry.Kernel | None) -> bool:
    """Whether the kernel of `line` takes w_qkv in a row order of its own (its module's `stored_rows`)."""
    return line is not None and line.module is not None and hasattr(kernel_module(line.module), "stored_rows")


def ops_for(kernels, launches: dict[str, int] | None = None, qkv_rows: torch.Tensor | None = None) -> SimpleNamespace:
    """The ops that run `kernels` (a `Kernels` or `AudioKernels`; the eager ops, `blocks.EAGER_OPS` or
    `audio_model.EAGER_OPS`, for a record left all eager), their launches counted into `launches` (the model's
    counts). Each call makes new ops with state of their own (`new_state`): a model keeps its ops (one set per
    record). qkv_rows: the row order the model stores w_qkv in (`qkv_rows(...)` at its load), None for the
    release's: a projection kernel with `stored_rows` then takes the weight as stored, and any other projection
    op is given the release's rows back."""
    eager = kernels.eager_ops
    if kernels == type(kernels)() and qkv_rows is None:
        return eager
    launches = {} if launches is None else launches
    lines = _lines(kernels)
    ops = {}
    for field in fields(kernels):
        line = lines.get(field.name)
        if line is None:
            ops[field.name] = getattr(eager, field.name)
        elif line.module is not None:
            state = {"ordered": qkv_rows is not None} if _stores_rows(line) else {}
            ops[field.name] = _launcher(line, launches, **state)
    for op, line in lines.items():  # after the ops they follow
        if line.after is not None:
            ops[op] = _after_linear(ops[line.after])
    ops = {field.name: ops[field.name] for field in fields(kernels)}
    if qkv_rows is not None and not _stores_rows(lines.get("linear_qk_rms_norm_rope")):
        ops["linear_qk_rms_norm_rope"] = _in_release_order(ops["linear_qk_rms_norm_rope"], qkv_rows)
    return SimpleNamespace(**ops)


def qkv_rows(kernels: Kernels, config: H3DecoderConfig) -> torch.Tensor | None:
    """The order, in release rows, in which a model running `kernels` stores w_qkv and its bias: its projection
    kernel's (`stored_rows`, e.g. the quack projection's `kernel_rows`), so that its GEMM takes the weight as
    stored and nothing is gathered per call; None (the release's order) for every other projection kernel."""
    line = _lines(kernels).get("linear_qk_rms_norm_rope")
    if not _stores_rows(line):
        return None
    return kernel_module(line.module).stored_rows(config)  # imports no quack


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


def warm_up(ops: SimpleNamespace, kernels, config, device: torch.device, dtype) -> None:
    """Call each kernel of `ops` (made by `ops_for(kernels)`) once on two zero tokens laid out as the decoder
    passes them. A process's first Triton launch sets up Triton itself (its driver module, the launchers, the
    cached kernels: about 0.5 s on an H200), and quack's and flash-attn-4's first call of each kernel builds it
    (about 2-3 s each); done in a thread beside the weight load, it is off the first decode's path."""
    device = torch.device(device)
    for op, line in _lines(kernels).items():
        if line.module is not None:
            getattr(ops, op)(*kernel_module(line.module).model_call(config, device, dtype))
