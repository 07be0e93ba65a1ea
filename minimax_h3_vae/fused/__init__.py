"""Triton kernels for the decoder's pointwise ops and its float32 output projection; (gemm="quack") quack's
GEMMs for w1 with the gate and for the attention's projection with the QK norm and RoPE, in their epilogues,
and for the output projection over split fp16 operands; (attention="fa4") FlashAttention 4's Hopper kernel
for the attention. For the audio decoder, the anti-aliased activation's kernel (`select_audio_ops`).

`select_ops(config, device, dtype, gemm, attention)` builds a model's ops once: for each op, the kernel's launcher when
the kernel can run on that device and dtype with the model's shapes and layouts, else the eager op from
`blocks.py`, with one warning naming each kernel left out and why. The ops have the eager signatures; a
launcher still checks its contract on every call and raises ValueError outside it, never a silent fallback.

Importing this package imports no Triton: a kernel module is imported when `select_ops` first checks it,
because `triton.jit` picks compiled or interpreted from TRITON_INTERPRET when the kernel is defined.
"""

from __future__ import annotations

import importlib
import warnings
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .. import blocks
from ..audio import model as audio_model
from ..config import H3DecoderConfig
from ._common import LAUNCHES, device_problem

__all__ = ["FUSED_OPS", "launch_counts", "select_audio_ops", "select_ops", "uses_fa4", "uses_quack", "warm_up"]

# op name (the eager op's name in blocks.EAGER_OPS) -> the module of its kernel.
KERNELS = {
    "rms_norm": "rms_norm",
    "scale_add_rms_norm": "scale_add_rms_norm",
    "qk_rms_norm_rope": "qk_rms_norm_rope",
    "silu_mul": "silu_mul",
    "linear_fp32": "tf32x3_linear",
}
# gemm="quack": the ops whose GEMM quack runs -> their modules. Where one cannot run, w1's and the projection's
# op are torch's (cuBLAS) linear followed by the kernel (or eager op) named in AFTER_CUBLAS, and proj_out is
# the kernel of KERNELS.
QUACK_KERNELS = {
    "linear_silu_mul": "linear_silu_mul",
    "linear_qk_rms_norm_rope": "linear_qk_rms_norm_rope",
    "linear_fp32": "fp16x3_linear",
}
AFTER_CUBLAS = {"linear_silu_mul": "silu_mul", "linear_qk_rms_norm_rope": "qk_rms_norm_rope"}
# attention="fa4": the attention op -> its module (else SDPA, the eager op).
FA4_KERNELS = {"attention": "flash_attention"}
# What runs when none of an op's kernels can (the warning says so); any other op: the eager one.
EAGER_INSTEAD = "the eager op runs instead"
INSTEAD = {
    **{name: f"torch's linear and the {then} op run instead" for name, then in AFTER_CUBLAS.items()},
    "attention": "torch's SDPA runs instead",
}
# The ops the fused path runs as kernels wherever they can (the attention is SDPA on both paths, unless fa4).
FUSED_OPS = (*KERNELS, *AFTER_CUBLAS)


def launch_counts() -> dict[str, int]:
    """Kernel launches since import, per kernel (its module's name): 'rms_norm', 'scale_add_rms_norm',
    'qk_rms_norm_rope', 'silu_mul', 'tf32x3_linear', quack's 'linear_silu_mul', 'linear_qk_rms_norm_rope' and
    'fp16x3_linear', flash-attn-4's 'flash_attention', and the audio decoder's 'anti_aliased_snake_beta'."""
    return dict(LAUNCHES)


def _model_calls(
    config: H3DecoderConfig, device: torch.device, dtype: torch.dtype, gemm: str, attention: str
) -> dict[str, tuple]:
    """Arguments shaped and laid out as the decoder passes them to each op that has a kernel of its own (two
    tokens of one tile), zeros."""
    c = config

    def zeros(*shape, dtype=torch.float32):
        return torch.zeros(*shape, dtype=dtype, device=device)

    calls = {
        "rms_norm": (zeros(1, 2, c.dim), zeros(c.dim), c.norm_eps, dtype),
        "scale_add_rms_norm": (
            zeros(1, 2, c.dim),
            zeros(1, 2, c.dim, dtype=dtype),
            zeros(c.dim),
            zeros(c.dim),
            c.norm_eps,
            dtype,
        ),
        "qk_rms_norm_rope": (
            zeros(1, 2, 3 * c.dim, dtype=dtype),
            zeros(2, c.rope_dim),
            zeros(2, c.rope_dim),
            c.num_heads,
            c.norm_eps,
        ),
        "silu_mul": (zeros(1, 2, 2 * c.ffn_dim, dtype=dtype),),
        "linear_fp32": (zeros(1, 2, c.dim), zeros(c.patch_dim, c.dim), zeros(c.patch_dim)),
    }
    if gemm == "quack":  # full weights (w1's is 134 MB at the released size): only where quack's GEMMs are built
        w1, qkv = (2 * c.ffn_dim, c.dim), (3 * c.dim, c.dim)
        x = zeros(1, 2, c.dim, dtype=dtype)
        calls["linear_silu_mul"] = (x, zeros(*w1, dtype=dtype), zeros(w1[0], dtype=dtype))
        # A rotary table as rope builds them (NeoX halves equal), which the launcher checks.
        calls["linear_qk_rms_norm_rope"] = (
            x,
            zeros(*qkv, dtype=dtype),
            zeros(qkv[0], dtype=dtype),
            zeros(2, c.rope_dim),
            zeros(2, c.rope_dim),
            c.num_heads,
            c.norm_eps,
        )
    if attention == "fa4":  # q, k, v as strided views of the projection's (B, S, H, 3, D) output
        qkv = zeros(1, 2, c.num_heads, 3, c.head_dim, dtype=dtype).transpose(1, 2)
        calls["attention"] = tuple(qkv.unbind(3))
    return calls


def warm_up(
    ops: SimpleNamespace,
    config: H3DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    gemm: str = "cublas",
    attention: str = "sdpa",
) -> None:
    """Call each kernel of `ops` once on two zero tokens laid out as the decoder passes them. A process's
    first Triton launch sets up Triton itself (its driver module, the launchers, the cached kernels: about
    0.5 s on an H200), and quack's and flash-attn-4's first call of each kernel builds it (about 2-3 s each);
    done here, in a thread beside the weight load, it is off the first decode's path."""
    for name, args in _model_calls(config, torch.device(device), dtype, gemm, attention).items():
        getattr(ops, name)(*args)


def uses_quack(ops: SimpleNamespace) -> bool:
    """Whether `ops` (from select_ops) run any GEMM on quack."""
    return _runs_any(ops, QUACK_KERNELS)


def uses_fa4(ops: SimpleNamespace) -> bool:
    """Whether `ops` (from select_ops) run the attention on flash-attn-4."""
    return _runs_any(ops, FA4_KERNELS)


def _runs_any(ops: SimpleNamespace, kernels: dict[str, str]) -> bool:
    """Whether any op named in `kernels` (op -> module) is that module's launcher."""
    return any(getattr(getattr(ops, name), "__module__", None) == f"{__name__}.{m}" for name, m in kernels.items())


def _candidates(name: str, gemm: str, attention: str) -> list[str]:
    """The modules whose kernel may run op `name`, the preferred first."""
    chosen = [QUACK_KERNELS if gemm == "quack" else {}, FA4_KERNELS if attention == "fa4" else {}, KERNELS]
    return [table[name] for table in chosen if name in table]


def _after_cublas(name: str, then):
    """The eager op `name` (blocks.linear_silu_mul or blocks.linear_qk_rms_norm_rope) with `then` after torch's
    (cuBLAS) linear in place of the eager op it calls."""

    def linear_then(x, weight, bias, *args):
        return then(F.linear(x, weight, bias), *args)

    return linear_then


def select_ops(
    config: H3DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    gemm: str = "cublas",
    attention: str = "sdpa",
) -> SimpleNamespace:
    """The decoder's ops for a model of `config` on `device` with block linears in `dtype`: each kernel that
    can run there, else the eager op (and one warning naming those kernels and why). gemm: "quack" takes
    quack's GEMMs for w1 and its gate, for the attention's projection with its QK norm and RoPE, and for
    proj_out (fp16x3_linear) where they run (this imports quack); "cublas" torch's linear followed by the gate's
    and the norm's kernels, and proj_out as tf32x3_linear.
    attention: "fa4" takes flash-attn-4's kernel where it runs (this imports it and quack); "sdpa" torch's
    SDPA (the eager op)."""
    ops, left_out = {"attention": blocks.EAGER_OPS.attention}, {}  # (why, instead) -> the kernels left out
    for name, args in _model_calls(config, torch.device(device), dtype, gemm, attention).items():
        # The device test comes first so that a kernel that cannot launch here is never defined.
        problem = device_problem([a for a in args if isinstance(a, torch.Tensor)])
        tried, chosen = [], None
        for module in _candidates(name, gemm, attention):
            kernel = None if problem else importlib.import_module(f"{__name__}.{module}")
            why = problem or kernel.unsupported(*args)
            if why is None:
                chosen, ops[name] = module, getattr(kernel, name)
                break
            tried.append((module, why))
        instead = f"the {chosen} kernel runs instead" if chosen else INSTEAD.get(name, EAGER_INSTEAD)
        for module, why in tried:
            left_out.setdefault((why, instead), []).append(module)
        if chosen is None and name not in AFTER_CUBLAS:
            ops[name] = getattr(blocks.EAGER_OPS, name)
    for name, then in AFTER_CUBLAS.items():
        if name not in ops:
            eager = getattr(blocks.EAGER_OPS, then) is ops[then]
            ops[name] = getattr(blocks.EAGER_OPS, name) if eager else _after_cublas(name, ops[then])
    if left_out:  # one clause per reason: on the CPU all five kernels share one
        clauses = []
        for (why, instead), modules in left_out.items():
            plural = instead == EAGER_INSTEAD and len(modules) > 1
            clauses.append(f"{', '.join(modules)} ({why}; {'their eager ops run instead' if plural else instead})")
        reasons = "; ".join(clauses)
        warnings.warn(
            f"fused path on {device} with {dtype}: running without the kernel(s) {reasons}",
            stacklevel=3,
        )
    return SimpleNamespace(**ops)


def select_audio_ops(device: torch.device) -> SimpleNamespace:
    """The audio decoder's ops on `device`: the anti-aliased activation's kernel where it can run (float32
    activations laid out as the decoder holds them), else the eager op, with one warning naming the kernel and
    why."""
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
    problem = device_problem(args)
    kernel = None if problem else importlib.import_module(f"{__name__}.anti_aliased_snake_beta")
    why = problem or kernel.unsupported(*args)
    if why is None:
        return SimpleNamespace(anti_aliased_snake_beta=kernel.anti_aliased_snake_beta)
    warnings.warn(
        f"fused path on {device}: running without the kernel(s) anti_aliased_snake_beta ({why}; the eager op runs "
        "instead)",
        stacklevel=3,
    )
    return audio_model.EAGER_OPS
