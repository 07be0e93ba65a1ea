"""How a loaded decoder runs, as opposed to what it is.

`H3DecoderConfig` (config.py) is frozen and describes the checkpoint. `Runtime` holds this process's
choices for running it: the fused or eager ops, tiles per decoder call, which rank receives the output
under torch.distributed, and the attention backends. The resolvers below turn user-facing arguments
(device, dtype, the MINIMAX_H3_VAE_FUSED variable) into those choices, with one clear error each.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass

import torch

# SDPA backends in order of preference (names of torch.nn.attention.SDPBackend): cuDNN is the fastest on
# Hopper for S = 1797, D = 64 (benchmarks/RESULTS.md, run 8).
ATTENTION_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")

FUSED_ENV = "MINIMAX_H3_VAE_FUSED"
GIB = 2**30


@dataclass
class Runtime:
    """Per-model run settings; every assignment is validated, so a bad value fails where it is set.

    fused: run the Triton kernels of `minimax_h3_vae.fused` (the model picks its ops from this once).
    tile_batch: tiles per decoder call, an int >= 1; None chooses from free memory.
    output_rank: under torch.distributed, the one rank that receives the decoded video (None: every rank).
    attention_backends: SDPA backend names, most preferred first.
    offload: "none" (every weight on the device) or "blocks" (block linears in host memory, streamed to the
    device one block at a time, the decode layer-major over each chunk's tiles). Fixed at load.
    max_gpu_memory: bytes the decoder may hold on the GPU, weights included (None: what is free); the
    automatic tile batch plans within it.
    """

    fused: bool = False
    tile_batch: int | None = None
    output_rank: int | None = None
    attention_backends: tuple[str, ...] = ATTENTION_BACKENDS
    offload: str = "none"
    max_gpu_memory: int | None = None

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, _VALIDATORS[name](value))

    def replace(self, **changes) -> Runtime:
        return dataclasses.replace(self, **changes)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fused(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"fused must be True or False, got {value!r}")
    return value


def _check_tile_batch(value) -> int | None:
    if value is not None and not (_is_int(value) and value >= 1):
        raise ValueError(f"tile_batch must be a whole number of tiles >= 1 (or None for automatic), got {value!r}")
    return value


def _check_output_rank(value) -> int | None:
    if value is not None and not (_is_int(value) and value >= 0):
        raise ValueError(f"output_rank must be a rank number >= 0 (or None for every rank), got {value!r}")
    return value


def _check_backends(value) -> tuple[str, ...]:
    from torch.nn.attention import SDPBackend

    names = (value,) if isinstance(value, str) else tuple(value)
    unknown = [name for name in names if not hasattr(SDPBackend, str(name))]
    if not names or unknown:
        raise ValueError(f"attention_backends must name SDPBackend members (e.g. {ATTENTION_BACKENDS}), got {value!r}")
    return names


def _check_offload(value) -> str:
    if value not in OFFLOAD_MODES:
        raise ValueError(f"offload must be one of {OFFLOAD_MODES}, got {value!r}")
    return value


def _check_max_gpu_memory(value) -> int | None:
    if value is not None and not (_is_int(value) and value > 0):
        raise ValueError(f"max_gpu_memory must be a positive number of bytes (or None), got {value!r}")
    return value


_VALIDATORS = {
    "fused": _check_fused,
    "tile_batch": _check_tile_batch,
    "output_rank": _check_output_rank,
    "attention_backends": _check_backends,
    "offload": _check_offload,
    "max_gpu_memory": _check_max_gpu_memory,
}

OFFLOAD_MODES = ("none", "blocks")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to run on: as given, else CUDA when available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device name: use 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA device is available; use 'cpu'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: there are only {torch.cuda.device_count()} CUDA device(s)")
    elif resolved.type != "cpu":
        raise ValueError(f"device {device!r} is not supported: use 'cpu' or 'cuda'")
    return resolved


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """The recipe's compute dtype: float32, or float16 for the release's fp16 recipe (default on CUDA)."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    named = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
    resolved = named.get(dtype) if isinstance(dtype, str) else dtype
    if resolved not in (torch.float32, torch.float16):
        raise ValueError(f"dtype {dtype!r} is not supported: use torch.float32 ('fp32') or 'fp16' (release recipe)")
    return resolved


def resolve_fused(fused: bool | None, device: torch.device) -> bool:
    """Explicit argument, else MINIMAX_H3_VAE_FUSED=0|1, else on for CUDA when Triton is importable."""
    has_triton = importlib.util.find_spec("triton") is not None
    if fused is None:
        env = os.environ.get(FUSED_ENV, "").strip()
        if env and env not in ("0", "1"):
            raise ValueError(f"{FUSED_ENV}={env!r}: set it to 0 or 1")
        fused = env == "1" if env else device.type == "cuda" and has_triton
    fused = _check_fused(fused)
    if fused and not has_triton:
        raise ValueError(
            "the fused path needs Triton (pip install triton); "
            f"or ask for the eager path with fused=False / {FUSED_ENV}=0"
        )
    return fused


def resolve_max_gpu_memory(gib: float | None) -> int | None:
    """`max_gpu_memory` in GiB, as users give it -> bytes."""
    if gib is None:
        return None
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0 or gib == float("inf"):
        raise ValueError(f"max_gpu_memory must be a positive number of GiB, got {gib!r}")
    return int(gib * GIB)


def check_offload_choice(offload) -> None:
    """What users may ask for: a mode of OFFLOAD_MODES, or "auto"."""
    if offload not in ("auto", *OFFLOAD_MODES):
        raise ValueError(f"offload must be 'auto', 'none' or 'blocks', got {offload!r}")


def resolve_offload(
    offload: str, device: torch.device, resident_bytes: int, reserve_bytes: int, max_gpu_memory: int | None
) -> str:
    """ "none" / "blocks" as asked, or for "auto": resident when the weights plus a working reserve (one chunk
    of a 1344x768 decode at one tile per call) fit in `max_gpu_memory`, else in the free GPU memory; else
    "blocks". On the CPU, "auto" is "none"."""
    check_offload_choice(offload)
    if offload != "auto":
        return offload
    if device.type != "cuda":
        return "none"
    budget = max_gpu_memory if max_gpu_memory is not None else torch.cuda.mem_get_info(device)[0]
    return "none" if resident_bytes + reserve_bytes <= budget else "blocks"
