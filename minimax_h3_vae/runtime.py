"""Run options: what a user asks for at any door, checked and converted in this one place.

`H3DecoderConfig` (config.py) is frozen and describes the checkpoint. How this process runs it is chosen by
the user as `DecodeOptions` (the same fields and units at every door: `from_pretrained`, the command,
`swap_decoder`, the ComfyUI nodes) and resolved here, once, into a `Runtime`: the frozen run settings a
decoder holds and every decode reads. A per-call change (`decode(z, tile_batch=...)`) resolves into a new
`Runtime` for that call alone; nothing a call does changes what another call sees.

    options = DecodeOptions(device="cuda", max_gpu_memory=8)   # plain data, checked: types, ranges, names
    runtime = resolve(options, config)                          # decided: the machine, bytes, offload, kernels
    runtime = resolve_call(runtime, config, tile_batch=4)       # one call's settings, by the same functions

`resolve` is the one place that looks at the machine and the environment (MINIMAX_H3_VAE_FUSED, and through
`fused.choose_kernels` TRITON_INTERPRET and whether quack and flash-attn-4 import): a `Runtime` leaves nothing
open, down to the kernel of each op (`Runtime.kernels`), and nothing reads the environment after it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass

import torch

from . import fused, memory, sdpa
from .config import H3DecoderConfig
from .fused import EAGER_KERNELS, Kernels
from .text import nearest
from .tiling import RELEASE_TILING, Tiling

# SDPA backends in order of preference (names of torch.nn.attention.SDPBackend; sdpa.py runs them per call).
ATTENTION_BACKENDS = sdpa.BACKENDS
OFFLOAD_MODES = ("none", "blocks")
# The block GEMMs of the fused fp16 path: cuBLAS (through torch), or quack's CuTe-DSL GEMMs with the work
# between them in their epilogues (fused/linear_silu_mul.py, fused/linear_qk_rms_norm_rope.py; Hopper only,
# the `hopper` extra).
GEMM_BACKENDS = ("cublas", "quack")
# The fused path's attention: torch's SDPA (with ATTENTION_BACKENDS), or FlashAttention 4's Hopper kernel
# (fused/flash_attention.py; Hopper only, the `hopper` extra).
ATTENTION_KERNELS = ("sdpa", "fa4")
FUSED_ENV = "MINIMAX_H3_VAE_FUSED"
GIB = 2**30
# The largest GPU memory budget taken, in GiB: far above any card, small enough that bytes stay exact.
MAX_GPU_MEMORY_GIB = 2**20
# The options a decode call may change; the others place the weights and are fixed at load.
CALL_OPTIONS = ("fused", "exact", "tile_batch", "tiling", "output_rank", "attention_backends")


@dataclass(frozen=True)
class Runtime:
    """The run settings a decoder holds, resolved (see the module docstring); frozen. `Runtime()` is the
    eager float32 run on the CPU.

    device: where the decoder runs. dtype: the block linears' compute dtype (torch.float16 for the release's fp16
    recipe, else torch.float32). fused: the Triton kernels of `minimax_h3_vae.fused`. tile_batch: tiles per decoder
    call (None: as many as fit). tiling: the spatial tile geometry. output_rank: under torch.distributed, the one
    rank that receives the video (None: every rank). attention_backends: SDPA backend names, most preferred first.
    offload: "none" (every weight on the device) or "blocks" (block linears in host memory, streamed, layer-major).
    max_gpu_memory: bytes the decoder may hold on the GPU, weights included (None: what is free). gemm: the fused
    path's block GEMMs, "cublas" or "quack" (GEMM_BACKENDS; the eager path always runs torch's). attention: the
    fused path's attention, "sdpa" or "fa4" (ATTENTION_KERNELS; the eager path always runs SDPA). kernels: what runs
    each op (`fused.Kernels`), chosen from all of the above by `fused.choose_kernels`. exact: the fused path
    takes only the kernels that give the eager ops' bits, which are the release's (the eager path always is).
    """

    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32
    fused: bool = False
    exact: bool = False
    tile_batch: int | None = None
    tiling: Tiling = RELEASE_TILING
    output_rank: int | None = None
    attention_backends: tuple[str, ...] = ATTENTION_BACKENDS
    offload: str = "none"
    max_gpu_memory: int | None = None
    gemm: str = "cublas"
    attention: str = "sdpa"
    kernels: Kernels = EAGER_KERNELS


@dataclass(frozen=True)
class DecodeOptions:
    """What a user asks for, in the user's units, the same at every door: plain data. Each field's type,
    range or name is checked when the object is made (no machine is probed, no environment read);
    `resolve` decides the rest against the machine and the checkpoint.

    device: "cpu", "cuda", "cuda:N" (None: CUDA when available). dtype: "fp32" / torch.float32 or "fp16" /
    torch.float16, the release's recipe (None: fp16 on CUDA, else fp32). fused: True / False (None: the
    MINIMAX_H3_VAE_FUSED variable, else on for CUDA when Triton imports). tile_batch: tiles per decoder call
    (None: as many as fit). offload: "auto", "none" or "blocks". max_gpu_memory: GiB the decoder may hold on
    the GPU, weights included (None: what is free). tiling: a `Tiling` (None: the release's 256 / 64 px).
    output_rank: the one rank that receives the video under torch.distributed (None: every rank).
    attention_backends: SDPA backend names, most preferred first (None: ATTENTION_BACKENDS). gemm: "auto",
    "cublas" or "quack", the fused fp16 path's block GEMMs (`resolve_gemm`; auto: quack where it runs).
    attention: "auto", "sdpa" or "fa4", the fused fp16 path's attention (`resolve_attention`; auto: fa4 where
    it runs and exact is off). exact: True / False, whether the output is bit for bit the release's decode (fp32:
    its float32 decode; fp16: its eager decode under fp16 autocast) on the fused path too, which then runs only
    the kernels that keep every rounding (SDPA, not flash-attn-4; of quack's GEMMs only w1's, whose epilogue
    rounds as the release does); the eager path always is. None: on where it costs nothing (`resolve_exact`).
    """

    device: str | torch.device | None = None
    dtype: torch.dtype | str | None = None
    fused: bool | None = None
    exact: bool | None = None
    tile_batch: int | None = None
    offload: str = "auto"
    max_gpu_memory: float | None = None
    tiling: Tiling | None = None
    output_rank: int | None = None
    attention_backends: tuple[str, ...] | str | None = None
    gemm: str = "auto"
    attention: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "device", _check_device(self.device))
        object.__setattr__(self, "dtype", _check_dtype(self.dtype))
        for name in ("fused", "exact", "tile_batch", "tiling", "output_rank", "attention_backends"):
            object.__setattr__(self, name, _CHECKS[name](getattr(self, name)))
        if self.offload not in ("auto", *OFFLOAD_MODES):
            raise ValueError(f"offload must be 'auto', 'none' or 'blocks', got {self.offload!r}")
        _check_gib(self.max_gpu_memory)
        _check_choice("gemm", self.gemm, GEMM_BACKENDS)
        _check_choice("attention", self.attention, ATTENTION_KERNELS)

    def replace(self, **changes) -> DecodeOptions:
        return dataclasses.replace(self, **changes)


def check_machine(options: DecodeOptions, head_dim: int = 64) -> tuple[torch.device, torch.dtype, bool, str, bool, str]:
    """What of `options` this machine decides, needing no checkpoint: (device, dtype, fused, gemm, exact,
    attention), each its `resolve_*` function's answer; ValueError for what cannot run here (a door calls it
    before it opens a checkpoint, so that such an error comes first). `head_dim`: the attention's (64 in every
    release), for whether `attention_backends` run here."""
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype, device)
    use_fused = resolve_fused(options.fused, device)
    if options.attention_backends is not None:
        check_backends_run(options.attention_backends, device, dtype, head_dim)
    gemm = resolve_gemm(options.gemm, device, dtype, use_fused)
    exact = resolve_exact(options.exact, gemm, options.attention)
    return device, dtype, use_fused, gemm, exact, resolve_attention(options.attention, device, dtype, use_fused, exact)


def resolve(options: DecodeOptions, config: H3DecoderConfig, default_tiling: Tiling = RELEASE_TILING) -> Runtime:
    """The run settings of `options` for a checkpoint of `config`: the machine's part (`check_machine`), GiB
    -> bytes, the tiling (else the checkpoint's `default_tiling`) checked against the patch size, offload="auto"
    decided by the memory plan (memory.choose_offload) from the checkpoint's sizes and the device's free
    memory, and the kernel of each op (`fused.choose_kernels`, with one warning naming any kernel left out)."""
    device, dtype, use_fused, gemm, exact, attention = check_machine(options, config.head_dim)
    cap = None if options.max_gpu_memory is None else int(options.max_gpu_memory * GIB)
    tiling = (options.tiling or default_tiling).check(config)
    offload = options.offload
    if offload == "auto":
        offload = memory.choose_offload(config, dtype, device, tiling, cap)
    return Runtime(
        device=device,
        dtype=dtype,
        fused=use_fused,
        exact=exact,
        tile_batch=options.tile_batch,
        tiling=tiling,
        output_rank=options.output_rank,
        attention_backends=options.attention_backends or ATTENTION_BACKENDS,
        offload=offload,
        max_gpu_memory=cap,
        gemm=gemm,
        attention=attention,
        kernels=fused.choose_kernels(config, device, dtype, use_fused, gemm, attention, exact),
    )


def resolve_call(runtime: Runtime, config: H3DecoderConfig, **changes) -> Runtime:
    """`runtime` with changes to CALL_OPTIONS, each checked as `DecodeOptions` checks it and decided as
    `resolve` decides it (a change of `fused` or `exact` chooses the kernels again, with runtime's gemm and
    attention; exact=True where the attention is flash-attn-4 is a ValueError).
    None means what it means there (fused, exact: automatic; tile_batch: as many as fit; output_rank: every rank);
    tiling and attention_backends need a value. The options that place the weights (device, dtype, offload,
    max_gpu_memory) are fixed at load: asking for them here is a ValueError, as is a name that is no option
    (naming the nearest one). Whether the backends run on the decoder's device is the decoder's check
    (`check_backends_run`)."""
    check_option_names(changes, CALL_OPTIONS)
    fixed = sorted(set(changes) - set(CALL_OPTIONS))
    if fixed:
        raise ValueError(f"{', '.join(fixed)}: fixed when the decoder is loaded; give it to from_pretrained")
    for name in ("tiling", "attention_backends"):
        if name in changes and changes[name] is None:
            raise ValueError(f"{name}=None: give a value (the decoder's is {getattr(runtime, name)!r})")
    checked = {name: _CHECKS[name](value) for name, value in changes.items()}
    if "tiling" in checked:
        checked["tiling"].check(config)
    if "fused" in checked:
        checked["fused"] = resolve_fused(checked["fused"], runtime.device)
    if "exact" in checked:
        checked["exact"] = resolve_exact(checked["exact"], runtime.gemm, runtime.attention)
    r = dataclasses.replace(runtime, **checked)
    if r.exact and not runtime.exact and r.attention != "sdpa":
        raise ValueError(
            f"exact=True: this decoder was loaded with attention={r.attention!r}, which is not bit for bit the "
            "release's; load it with exact=True (or attention='sdpa')"
        )
    if (r.fused, r.exact) != (runtime.fused, runtime.exact):
        r = dataclasses.replace(
            r, kernels=fused.choose_kernels(config, r.device, r.dtype, r.fused, r.gemm, r.attention, r.exact)
        )
    return r


def placement_description(runtime: Runtime, device: torch.device) -> str:
    """What the run's offload and max_gpu_memory do on `device`, as every door reports them ("" when there is
    nothing to say). Both are accepted on the CPU, where neither changes where the weights are: they are in
    host memory already, so offload="blocks" streams nothing (its decode stays layer-major, at most
    memory.STREAMED_TILE_BATCH tiles per call by default), and max_gpu_memory has no GPU memory to budget."""
    notes = []
    if device.type == "cuda":
        if runtime.offload == "blocks":
            notes.append("block weights streamed from host memory")
        if runtime.max_gpu_memory is not None:
            notes.append(f"GPU memory budget {memory.format_size(runtime.max_gpu_memory)}")
    else:
        if runtime.offload == "blocks":
            notes.append("offload 'blocks' on the CPU: layer-major, nothing streamed (the weights are in host memory)")
        if runtime.max_gpu_memory is not None:
            notes.append("max_gpu_memory does nothing on the CPU")
    return "; ".join(notes)


# ---- one check per option ------------------------------------------------------------------------------


def check_option_names(names, valid: tuple[str, ...], door: str = "per call (decode, decode_stream, configure)"):
    """ValueError naming each of `names` that is no run option, with the nearest name (difflib) among those
    `door` takes and the run options. `valid`: the names `door` takes; the other run options (OPTION_NAMES)
    pass, for the door's own message (e.g. fixed at load)."""
    unknown = [name for name in names if name not in OPTION_NAMES and name not in valid]
    if not unknown:
        return
    described = []
    for name in unknown:
        near = nearest(str(name), [*valid, *OPTION_NAMES])
        described.append(f"{name!r}" + (f" (did you mean {near!r}?)" if near else ""))
    raise ValueError(
        f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(described)}; the options {door} are "
        f"{', '.join(valid)}"
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fused(value) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"fused must be True or False, got {value!r}")
    return value


def _check_exact(value) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"exact must be True, False or None (automatic), got {value!r}")
    return value


def _check_device(value) -> torch.device | None:
    if value is None:
        return None
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {value!r} is not a device name: use 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {value!r} is not supported: use 'cpu' or 'cuda'")
    return device


# The compute dtypes by name: float32, or float16 for the release's fp16 recipe.
DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}


def _check_dtype(value) -> torch.dtype | None:
    if value is None:
        return None
    dtype = DTYPE_NAMES.get(value) if isinstance(value, str) else value
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"dtype {value!r} is not supported: use torch.float32 ('fp32') or 'fp16' (release recipe)")
    return dtype


def _check_choice(name: str, value, kernels: tuple[str, str]) -> None:
    default, hopper = kernels
    if value not in ("auto", *kernels):
        raise ValueError(f"{name} must be 'auto', '{default}' or '{hopper}', got {value!r}")


def _check_tile_batch(value) -> int | None:
    if value is not None and not (_is_int(value) and value >= 1):
        raise ValueError(f"tile_batch must be a whole number of tiles >= 1 (or None for automatic), got {value!r}")
    return value


def _check_tiling(value) -> Tiling | None:
    if value is not None and not isinstance(value, Tiling):
        raise ValueError(f"tiling must be a minimax_h3_vae.Tiling(size, overlap) in pixels, or None; got {value!r}")
    return value


def _check_output_rank(value) -> int | None:
    if value is not None and not (_is_int(value) and value >= 0):
        raise ValueError(f"output_rank must be a rank number >= 0 (or None for every rank), got {value!r}")
    return value


def _check_backends(value) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else ()
    unknown = [name for name in names if not isinstance(name, str) or name not in ATTENTION_BACKENDS]
    if not names or unknown:
        near = [nearest(n.upper(), ATTENTION_BACKENDS) for n in unknown if isinstance(n, str)]
        hint = "; did you mean " + ", ".join(repr(n) for n in near if n) + "?" if any(near) else ""
        raise ValueError(
            f"attention_backends must name SDPA backends from {ATTENTION_BACKENDS}, most preferred first, "
            f"got {value!r}{hint}"
        )
    return names


def check_backends_run(backends: tuple[str, ...], device: torch.device, dtype: torch.dtype, head_dim: int = 64):
    """ValueError when none of `backends` can run the decoder's attention (head dim `head_dim`: 64 in every
    release) in `dtype` on `device`, naming those that can. A list may name backends that do not run here (a
    preference that also serves other machines): they are skipped at each call."""
    if not sdpa.runnable(backends, device, dtype, head_dim):
        here = sdpa.runnable(ATTENTION_BACKENDS, device, dtype, head_dim)
        raise ValueError(
            f"attention_backends {tuple(backends)}: none of them runs on {device} with {dtype}; "
            f"the backends that run there: {', '.join(here) or 'none'}"
        )


def _check_gib(value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_GPU_MEMORY_GIB:
        raise ValueError(f"max_gpu_memory must be a number of GiB in (0, {MAX_GPU_MEMORY_GIB}], got {value!r}")
    if int(value * GIB) < 1:
        raise ValueError(f"max_gpu_memory {value!r} GiB is less than one byte")


OPTION_NAMES = tuple(field.name for field in dataclasses.fields(DecodeOptions))
_CHECKS = {
    "fused": _check_fused,
    "exact": _check_exact,
    "tile_batch": _check_tile_batch,
    "tiling": _check_tiling,
    "output_rank": _check_output_rank,
    "attention_backends": _check_backends,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to run on: as given (if this machine has it), else CUDA when available, else the CPU. CUDA
    without an index is the current CUDA device, named (cuda:N): the resolved run state says which GPU."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    resolved = _check_device(device)
    device = str(device) if isinstance(device, torch.device) else device  # as the user wrote it, in messages
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA device is available; use 'cpu'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: there are only {torch.cuda.device_count()} CUDA device(s)")
        if resolved.index is None:
            return torch.device("cuda", torch.cuda.current_device())
    return resolved


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """The recipe's compute dtype: float32, or float16 for the release's fp16 recipe (default on CUDA)."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    return _check_dtype(dtype)


def resolve_gemm(gemm: str, device: torch.device, dtype: torch.dtype, use_fused: bool) -> str:
    """The fused path's GEMM backend. "quack" runs where every part of it can: the fused path, the fp16
    recipe, a Hopper GPU (compute capability 9.0, where it was measured) and quack-kernels with NVIDIA's
    CuTe DSL installed. With exact=True it runs only where it keeps the release's bits (w1 with the gate, in
    an epilogue that rounds as the release does; docs/kernels.md), the other ops as exact=True runs them
    without it. "auto" picks it there and cuBLAS elsewhere; an explicit "quack" anywhere else is a
    ValueError naming what is missing. Nothing is imported here: quack's import (8-17 s on an H200) happens
    at load, beside the weights."""

    def problem():
        needs = "quack-kernels and NVIDIA's CuTe DSL"
        return _hopper_problem(device, dtype, use_fused, "GEMMs", fused.quack_installed, needs)

    return _choose("gemm", gemm, GEMM_BACKENDS, problem, "the 'cublas' GEMMs")


def resolve_exact(exact: bool | None, gemm: str, attention: str) -> bool:
    """Whether the fused path keeps the release's bits: the explicit answer, else (None) on where that costs
    nothing, which is with quack's GEMMs (`gemm` as resolved: "quack" runs w1 and its gate in one exact GEMM,
    and the exact path then takes no longer than the fused default with cuBLAS, whose norms and proj_out are
    not exact; docs/kernels.md) unless `attention` (as asked for, or as resolved) is "fa4", the faster choice
    that is not exact. With cuBLAS alone the exact path is slower than the fused default, so it is off."""
    if exact is not None:
        return exact
    return gemm == "quack" and attention != "fa4"


def resolve_attention(
    attention: str, device: torch.device, dtype: torch.dtype, use_fused: bool, exact: bool = False
) -> str:
    """The fused path's attention. "fa4" runs where every part of it can: the fused path, the fp16 recipe, a
    Hopper GPU (where it was measured) and flash-attn-4 with quack-kernels and the CuTe DSL installed, and not
    `exact` (the release runs torch's SDPA). "auto" picks it there and SDPA elsewhere; an explicit "fa4"
    anywhere else is a ValueError naming what is missing. Nothing is imported here (flash-attn-4 imports
    quack: 8-17 s), only at load."""
    from .fused import flash_attention  # imports no flash-attn-4

    def problem():
        needs = "flash-attn-4, quack-kernels and NVIDIA's CuTe DSL"
        return _hopper_problem(device, dtype, use_fused, "attention", flash_attention.installed, needs, exact)

    return _choose("attention", attention, ATTENTION_KERNELS, problem, "'sdpa'")


def _choose(name: str, value: str, kernels: tuple[str, str], problem, way_out: str) -> str:
    """The option `name`'s kernel: `kernels` is (the default one, the Hopper one). "auto" takes the Hopper one
    unless `problem()` says why it cannot run; asking for it then is a ValueError naming why and `way_out`."""
    _check_choice(name, value, kernels)
    default, hopper = kernels
    if value == default:
        return default
    missing = problem()
    if missing is None:
        return hopper
    if value == hopper:
        raise ValueError(f"{name} '{hopper}' {missing}; or choose {way_out}")
    return default


def _hopper_problem(
    device: torch.device, dtype: torch.dtype, use_fused: bool, what: str, installed, needs: str, exact: bool = False
):
    """Why the `hopper` extra's kernel for the recipe's `what` cannot run with these settings (`installed()`:
    whether what it needs is installed, named `needs`), or None."""
    if exact:
        return "is not bit for bit the release's, which exact=True asks for"
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != fused.HOPPER:
        return f"needs a Hopper GPU (compute capability 9.0); {device} is not one"
    if dtype != torch.float16:
        return f"runs the fp16 recipe's {what}, not fp32: choose fp16"
    if not use_fused:
        return "runs on the fused path, not the eager one: turn the fused path on"
    if not installed():
        return f"needs {needs}: {fused.INSTALL}"
    return None


def resolve_fused(fused: bool | None, device: torch.device) -> bool:
    """Explicit argument, else MINIMAX_H3_VAE_FUSED=0|1 (read here and nowhere else), else on for CUDA when
    Triton is importable. The fused path without Triton installed is a ValueError."""
    if fused is None:
        env = os.environ.get(FUSED_ENV, "").strip()
        if env and env not in ("0", "1"):
            raise ValueError(f"{FUSED_ENV}={env!r}: set it to 0 or 1")
        fused = env == "1" if env else device.type == "cuda" and importlib.util.find_spec("triton") is not None
    if _check_fused(fused) and importlib.util.find_spec("triton") is None:
        raise ValueError(
            "the fused path needs Triton (pip install triton); "
            f"or ask for the eager path with fused=False / {FUSED_ENV}=0"
        )
    return bool(fused)
