"""ComfyUI's own modules, where the nodes run inside it: its model management (where VAEs compute, room for a
decode, loading a VAE) and its progress bar. Each is imported when a node runs, and only if present: outside
ComfyUI these do nothing."""

from __future__ import annotations

import importlib
import warnings

import torch

from .. import memory
from ..config import H3DecoderConfig
from ..decoding import H3VideoDecoder
from ..fused import qkv_rows
from ..runtime import DecodeOptions, check_machine, resolve


def optional(module: str):
    """A ComfyUI module when running inside ComfyUI, else None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def comfy_vae_device() -> torch.device | None:
    """Where ComfyUI runs VAEs (its --cpu-vae honoured) when running inside ComfyUI, else None (CUDA when
    available)."""
    management = optional("comfy.model_management")
    if management is None:
        return None
    return management.vae_device() if hasattr(management, "vae_device") else management.get_torch_device()


def vae_device(vae) -> torch.device | None:
    """Where a ComfyUI VAE computes (`VAE.device`, set by ComfyUI at load), else where ComfyUI runs VAEs."""
    device = getattr(vae, "device", None)
    return torch.device(device) if isinstance(device, (str, torch.device)) else comfy_vae_device()


def progress_bar():
    """progress(done, total) that moves ComfyUI's progress bar (in the browser, per tile), or None outside it."""
    utils = optional("comfy.utils")
    if utils is None:
        return None
    bar = utils.ProgressBar(1)
    return lambda done, total: bar.update_absolute(done, total)


def _working_set(plan: memory.MemoryPlan) -> int:
    """Bytes of GPU memory a decode of this memory plan needs besides the weights."""
    return plan.device - plan.weights - plan.streamed_slots


def make_room(model: H3VideoDecoder, z: torch.Tensor, tile_batch: int | None) -> None:
    """Inside ComfyUI on CUDA, for the loader's own decoder: ask ComfyUI's model management to make room for
    this decode's memory plan."""
    management = optional("comfy.model_management")
    if management is None or model.device.type != "cuda" or not hasattr(management, "free_memory"):
        return
    management.free_memory(_working_set(model.memory_plan(tuple(z.shape), tile_batch=tile_batch)), model.device)


def load_vae(vae, config: H3DecoderConfig, z: torch.Tensor, options: DecodeOptions) -> None:
    """Inside ComfyUI: have it load the whole VAE where it computes, with room for this decode's memory plan,
    as its own VAE Decode does before decoding (a VAE it offloaded comes back; other models make room)."""
    management = optional("comfy.model_management")
    patcher = getattr(vae, "patcher", None)
    if management is None or patcher is None or not hasattr(management, "load_models_gpu"):
        return
    need = 0
    if check_machine(options)[0].type == "cuda":  # the whole VAE loaded: the decoder built on it holds every weight
        runtime = resolve(options.replace(offload="none"), config)
        need = _working_set(memory.decode_plan(config, tuple(z.shape), runtime.dtype, "cuda", runtime))
        if qkv_rows(runtime.kernels, config) is not None:  # its w_qkv: a copy in its kernel's row order
            qkv = config.num_layers * 3 * config.dim * (config.dim + 1)
            need += qkv * torch.empty(0, dtype=runtime.dtype).element_size()
    management.load_models_gpu([patcher], memory_required=need, force_full_load=True)


def warn_own_decode() -> None:
    warnings.warn(
        "minimax_h3_vae: this VAE's weights are quantized, or not all on its device (a partial load); "
        "decoding with the VAE's own decode",
        stacklevel=3,
    )
