"""Where quack's GEMMs run, how to install them, and importing quack. Imports no quack itself.

quack-kernels (Tri Dao's CuTe-DSL kernel library) runs the GEMMs of gemm="quack" with work in their epilogues
(linear_silu_mul.py, linear_qk_rms_norm_rope.py, fp16x3_linear.py). Importing it costs 8-17 s, so this module
only looks for it until a launcher asks for it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

import torch

# The compute capability the GEMMs were measured on (H100, H200), and how to install what they need.
HOPPER = (9, 0)
INSTALL = 'pip install -e ".[hopper]" in the checkout'
DTYPES = (torch.float16, torch.bfloat16)
# TMA loads and stores need 16-byte aligned rows: 8 half-precision elements.
ALIGN = 8
# The N tile of gemm_config().
TILE_N = 192
# This package's folder, whose sources go into the keys of quack's on-disk compile cache (`fingerprint_sources`).
PACKAGE = Path(__file__).resolve().parents[1]


def installed() -> bool:
    """Whether quack-kernels and NVIDIA's CuTe DSL are installed (nothing is imported)."""
    return importlib.util.find_spec("quack") is not None and importlib.util.find_spec("cutlass") is not None


@functools.cache
def load() -> None:
    """Import quack once, give the DSL's logger the fingerprint quack's compile cache asks of it, and put this
    package's sources into that cache's keys (`fingerprint_sources`).

    quack 0.6.5 keys its compile cache on a fingerprint of everything an epilogue's code refers to, and
    refuses values it cannot fingerprint. Code outside site-packages is followed into its globals (an
    install with `pip --target`, as on our GPU machine), and there the activation's code reaches the CuTe
    DSL's logger, so every gated build fails with "no fail-closed semantic key". quack's keyer takes any type
    with `__quack_semantic_key__`; a logger changes no traced math, so its name is its key (`key_logger`).
    """
    importlib.import_module("quack.gemm_interface")
    importlib.import_module("quack.epilogue.frontend")
    key_logger(importlib.import_module("cutlass.base_dsl.utils.logger"))
    fingerprint_sources(importlib.import_module("quack.cache"))


def fingerprint_sources(cache) -> None:
    """Put this package's sources into the fingerprint of quack's on-disk compile cache (`cache`: quack.cache;
    its `EXTRA_SOURCE_DIRS`, read when the cache first keys a build in the process).

    quack 0.6.5 keys a compiled GEMM by its epilogue's source, except for code installed in site-packages,
    which it knows by qualified name alone: after an upgrade of this package that changed an epilogue
    (linear_qk_rms_norm_rope.py, fp16x3_linear.py), a kernel built by the old one would be loaded from
    /tmp/$USER/quack_cache by name. With the package's sources in the fingerprint, any change to them keys
    new builds. Once per list; the other entries stay (a host's own)."""
    if PACKAGE not in cache.EXTRA_SOURCE_DIRS:
        cache.EXTRA_SOURCE_DIRS.append(PACKAGE)


def key_logger(module) -> None:
    """Give the logger `module.logger` (the CuTe DSL's, in cutlass.base_dsl.utils.logger) a fingerprint for
    quack's keyer, by making that one object an instance of a subclass of its class with the key (`_keyed`).
    Every other logger of the process, and logging.Logger itself, stay as they are."""
    logger = getattr(module, "logger", None)
    if isinstance(logger, logging.Logger) and not hasattr(type(logger), "__quack_semantic_key__"):
        logger.__class__ = _keyed(type(logger))


@functools.cache
def _keyed(cls: type) -> type:
    """`cls` (a Logger class) with `__quack_semantic_key__`: a logger is fingerprinted by its name."""
    return type(f"Keyed{cls.__name__}", (cls,), {"__quack_semantic_key__": lambda self: ("logging.Logger", self.name)})


@functools.cache
def gemm_config():
    """The tile the package's quack GEMMs run with: quack's Hopper default (128 x 192, pingpong) in clusters of
    two along N instead of M. Alone, w1's and the projection's GEMMs were 2-9% faster so in a probe, with the
    same bits; in a whole decode the difference was within run-to-run noise (benchmarks/LOG.md,
    #2026-12-01-qkv-clusters and #2026-12-01-quack-tile-config). linear_qk_rms_norm_rope relies on the 192
    columns (TILE_N)."""
    from quack.gemm_config import GemmConfig

    return GemmConfig(tile_m=128, tile_n=TILE_N, cluster_m=1, cluster_n=2, pingpong=True, is_dynamic_persistent=False)


def judge_import(what: str, installed: bool, missing: str, load) -> str | None:
    """Why `what` cannot be used here: `missing` when it is not `installed`, or why `load()` failed; None once
    it is imported."""
    if not installed:
        return f"{missing} ({INSTALL})"
    try:
        load()
    except Exception as error:  # an install that does not import: report it, the caller falls back
        return f"{what} did not import ({type(error).__name__}: {error})"
    return None


@functools.cache
def import_problem() -> str | None:
    """Why quack cannot be used here, or None once it is imported. Decided once per process: every launch asks,
    and looking for the install scans the import path (~65 us)."""
    return judge_import("quack", installed(), "quack-kernels and nvidia-cutlass-dsl are not installed", load)


def tensors_problem(tensors: list[torch.Tensor], dtypes: tuple[torch.dtype, ...] = DTYPES) -> str | None:
    """Why these GEMM operands cannot go to quack (dtype: one of `dtypes`, device, alignment), or None. Imports
    nothing."""
    if any(t.dtype != tensors[0].dtype for t in tensors) or tensors[0].dtype not in dtypes:
        got = sorted({str(t.dtype) for t in tensors})
        return f"the tensors must share one of {[str(d) for d in dtypes]}, got {got}"
    if any(t.device.type != "cuda" for t in tensors) or len({t.device for t in tensors}) != 1:
        return "the tensors must be on one CUDA device"
    if torch.cuda.get_device_capability(tensors[0].device) != HOPPER:
        return f"quack's GEMMs are used on Hopper (compute capability 9.0) only; {tensors[0].device} is not one"
    if any(t.data_ptr() % 16 for t in tensors):
        return "the tensors must start at 16-byte aligned addresses"
    return None
