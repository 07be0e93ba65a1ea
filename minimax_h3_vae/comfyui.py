"""ComfyUI nodes: load the H3 video decoder once, decode a LATENT to IMAGE frames with it.

ComfyUI finds them through `NODE_CLASS_MAPPINGS` / `NODE_DISPLAY_NAME_MAPPINGS`, re-exported by the node
pack in `comfyui/minimax_h3_vae_nodes/` of the source tree. ComfyUI's own modules (`folder_paths`,
`comfy.utils`, `comfy.model_management`) are imported only when a node runs, and only if present: the
nodes work without them.
"""

from __future__ import annotations

import copy
import importlib
import os
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from . import memory
from .config import H3DecoderConfig
from .decoding import H3VideoDecoder
from .frames import to_unit_rgb
from .latents import check_latents, denormalize_latents
from .loading import Checkpoint, checkpoint_in_memory, comfyui_config, load_checkpoint
from .runtime import DecodeOptions, Runtime, resolve_call
from .tiling import plan_chunks

DECODER_TYPE = "MINIMAX_H3_DECODER"
CATEGORY = "latent/minimax_h3"
# The loader's file list entry meaning "use the path field instead".
PATH_CHOICE = "(path below)"
FUSED_CHOICES = ("auto", "on", "off")
# The run options every node offers, as ComfyUI widgets; `_node_options` turns their values into options.
RUN_INPUTS = {
    "fused": (list(FUSED_CHOICES), {"default": "auto", "tooltip": "Triton kernels; auto: on CUDA"}),
    "tile_batch": (
        "INT",
        {"default": 0, "min": 0, "max": 4096, "tooltip": "tiles per decoder call; 0: as many as fit"},
    ),
    "gemm": (
        ["auto", "cublas", "quack"],
        {"default": "auto", "tooltip": "block GEMMs of the fused fp16 path; auto: quack on Hopper where installed"},
    ),
    "attention": (
        ["auto", "sdpa", "fa4"],
        {
            "default": "auto",
            "tooltip": "attention of the fused fp16 path; auto: FlashAttention 4 on Hopper where installed",
        },
    ),
}


@dataclass(frozen=True)
class NodeDecoder:
    """What the loader node outputs: the (shared, cached) decoder and this node's tiles per call, which each
    decode passes as a per-call option (the shared decoder itself is never changed)."""

    decoder: H3VideoDecoder
    tile_batch: int | None

    @property
    def runtime(self) -> Runtime:
        """The run settings a decode through this node uses."""
        return resolve_call(self.decoder.runtime, self.decoder.config, tile_batch=self.tile_batch)


# The last loaded decoder, keyed by the identity of every file it was read from and the load options. One
# entry: a second one would hold another 4.8 GB of weights on the GPU.
_cache: dict[tuple, H3VideoDecoder] = {}


def _optional(module: str):
    """A ComfyUI module when running inside ComfyUI, else None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


class H3DecoderLoader:
    """Loads a MiniMax-H3 video VAE checkpoint (any layout this package reads) as a decoder, once."""

    DESCRIPTION = "Loads the MiniMax-H3 video decoder of minimax_h3_vae from models/vae or any path."
    RETURN_TYPES = (DECODER_TYPE,)
    RETURN_NAMES = ("decoder",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        folder_paths = _optional("folder_paths")
        names = folder_paths.get_filename_list("vae") if folder_paths is not None else []
        return {
            "required": {
                "vae_name": ([*names, PATH_CHOICE], {"tooltip": "a checkpoint in models/vae"}),
                "path": (
                    "STRING",
                    {"default": "", "tooltip": f"used when vae_name is {PATH_CHOICE}: a file or folder"},
                ),
                **RUN_INPUTS,
            }
        }

    def load(
        self, vae_name: str, path: str, fused: str, tile_batch: int, gemm: str = "auto", attention: str = "auto"
    ) -> tuple[NodeDecoder]:
        source = _source(vae_name, path)
        options = _node_options(fused, tile_batch, gemm, attention)
        shared = options.replace(tile_batch=None)  # the tile batch is this node's, passed with each decode
        checkpoint = load_checkpoint(source)  # its headers only: which files it is read from
        key = (_identity(source, checkpoint), shared)
        if key not in _cache:
            _cache.clear()  # free the previous decoder before loading the next
            _cache[key] = H3VideoDecoder.from_checkpoint(checkpoint, shared)
        return (NodeDecoder(_cache[key], options.tile_batch),)


class H3Decode:
    """Decodes a MiniMax-H3 LATENT into IMAGE frames with a decoder from the loader node."""

    DESCRIPTION = "Decodes MiniMax-H3 video latents with minimax_h3_vae; frames of every video, in order."
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"decoder": (DECODER_TYPE,), "samples": ("LATENT",)}}

    def decode(self, decoder: NodeDecoder, samples: dict) -> tuple[torch.Tensor]:
        """samples["samples"]: normalised latents (B, 24, T, h, w), as ComfyUI stores H3 latents, or the packed
        audio + video latent of ComfyUI's H3 sampler (its video part is decoded, `video_latents`) -> IMAGE
        (B * F, 16h, 16w, 3) float32 in [0, 1] on the CPU, video b's frames at [b * F, (b + 1) * F).

        The frames are written chunk by chunk into one preallocated CPU tensor, so GPU memory holds one
        temporal chunk of output at a time.
        """
        return (decode_to_images(decoder.decoder, video_latents(samples["samples"]), decoder.tile_batch),)


class H3DecodeWithVAE:
    """Decodes a MiniMax-H3 LATENT with minimax_h3_vae, built from the ComfyUI VAE the workflow already holds
    (no second copy of the weights is read)."""

    DESCRIPTION = (
        "Decodes MiniMax-H3 video latents with minimax_h3_vae, using the weights of the VAE already loaded; "
        "falls back to the VAE's own decode for quantized or not yet loaded weights."
    )
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": ("VAE",),
                "samples": ("LATENT",),
                **RUN_INPUTS,
            }
        }

    def decode(
        self,
        vae,
        samples: dict,
        fused: str = "auto",
        tile_batch: int = 0,
        gemm: str = "auto",
        attention: str = "auto",
    ) -> tuple[torch.Tensor]:
        """As `H3Decode.decode`, with the decoder made from `vae.first_stage_model` (once per VAE and weights,
        `decoder_for_vae`)."""
        options = _node_options(fused, tile_batch, gemm, attention)
        z = video_latents(samples["samples"])
        model = decoder_for_vae(vae, options.replace(tile_batch=None))
        if model is None:
            warnings.warn(
                "minimax_h3_vae: this VAE's weights are quantized or not loaded; decoding with the VAE's own decode",
                stacklevel=2,
            )
            video = vae.decode(z)  # ComfyUI's VAE.decode: (B, F, H, W, 3) frames in [0, 1]
            return (video.reshape(-1, *video.shape[-3:]),)
        return (decode_to_images(model, z, options.tile_batch),)


class H3UseForVAE:
    """VAE -> VAE: the same VAE, whose video decode runs through minimax_h3_vae. Its output plugs into the
    stock VAE Decode and the H3 conditioning nodes (encoding is the VAE's own)."""

    DESCRIPTION = "Makes a MiniMax-H3 VAE decode video with minimax_h3_vae; everything else stays the VAE's own."
    RETURN_TYPES = ("VAE",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",), **RUN_INPUTS}}

    def patch(
        self, vae, fused: str = "auto", tile_batch: int = 0, gemm: str = "auto", attention: str = "auto"
    ) -> tuple:
        """A shallow copy of `vae` whose `first_stage_model` is a shallow copy of the original (the same
        weights, buffers and submodules) with ComfyUI's decode contract served by our decoder:
        `decode(z, output_buffer=None)` takes normalised latents (B, 24, T, h, w) and returns float32
        (B, 3, F, H, W) in [0, 1], written into `output_buffer` when given; `decode_output_shape(shape)`
        and `decode_tiled` match it. The VAE given is not changed."""
        options = _node_options(fused, tile_batch, gemm, attention)
        config = _state_config(_h3_state(vae)[1])  # checks now that it is H3's video VAE
        stage = copy.copy(vae.first_stage_model)  # its parameter, buffer and module tables are the original's
        own_decode = getattr(vae.first_stage_model, "decode", None)

        def decode(z, output_buffer=None, **unused):
            model = decoder_for_vae(vae, options.replace(tile_batch=None))
            if model is None:
                warnings.warn("minimax_h3_vae: quantized or unloaded weights; the VAE decodes itself", stacklevel=2)
                return own_decode(z, output_buffer=output_buffer)
            return decode_into(model, z, options.tile_batch, output_buffer)

        def decode_output_shape(shape):
            batch, _, frames, h, w = shape
            c = config
            return (batch, c.out_channels, plan_chunks(frames, c).out_frames, h * c.patch_size, w * c.patch_size)

        stage.decode = decode
        stage.decode_tiled = lambda z, **unused: decode(z)
        stage.decode_output_shape = decode_output_shape
        patched = copy.copy(vae)
        patched.first_stage_model = stage
        return (patched,)


def _node_options(fused: str, tile_batch: int, gemm: str = "auto", attention: str = "auto") -> DecodeOptions:
    """The run options of a node's widgets (RUN_INPUTS), on ComfyUI's device."""
    return DecodeOptions(
        device=_device(),
        fused={"auto": None, "on": True, "off": False}[fused],
        tile_batch=tile_batch or None,
        gemm=gemm,
        attention=attention,
    )


def decode_into(
    model: H3VideoDecoder,
    z: torch.Tensor,
    tile_batch: int | None,
    output_buffer: torch.Tensor | None = None,
    progress=None,
    channels_last: bool = False,
) -> torch.Tensor:
    """ComfyUI's decode contract: normalised latents (B, 24, T, h, w), any float dtype -> float32 frames
    (B, 3, F, 16h, 16w) in [0, 1], written chunk by chunk into `output_buffer` (any device, any strides)
    when given, else into a new CPU tensor (with `channels_last`, a (B, 3, F, H, W) view of a contiguous
    (B, F, H, W, 3) one: ComfyUI's IMAGE layout); ComfyUI is asked to free what the decode's memory plan
    needs first. progress(done, total) as in `decode_stream`."""
    c = model.config
    z = z.float()
    check_latents(z, c.latent_channels)
    z = denormalize_latents(z.to(model.device), c)
    batch, _, latent_frames, height, width = z.shape
    shape = (
        batch,
        c.out_channels,
        plan_chunks(latent_frames, c).out_frames,
        height * c.patch_size,
        width * c.patch_size,
    )
    if output_buffer is None and channels_last:
        output_buffer = torch.empty(shape[0], *shape[2:], shape[1]).permute(0, 4, 1, 2, 3)
    elif output_buffer is None:
        output_buffer = torch.empty(shape)
    elif tuple(output_buffer.shape) != shape:
        raise ValueError(f"output_buffer is {tuple(output_buffer.shape)}, the decode gives {shape}")
    _free_memory(model, z, tile_batch)
    start = 0
    for chunk in model.decode_stream(z, progress, tile_batch=tile_batch):
        count = chunk.shape[2]
        output_buffer[:, :, start : start + count].copy_(to_unit_rgb(chunk))
        start += count
    return output_buffer


def decode_to_images(model: H3VideoDecoder, z: torch.Tensor, tile_batch: int | None) -> torch.Tensor:
    """Normalised latents (B, 24, T, h, w) -> IMAGE (B * F, 16h, 16w, 3) float32 in [0, 1] on the CPU, video
    b's frames at [b * F, (b + 1) * F): `decode_into` one preallocated CPU tensor in ComfyUI's layout, so GPU
    memory holds one temporal chunk of output at a time; ComfyUI's progress bar follows the tiles."""
    utils = _optional("comfy.utils")
    bar = utils.ProgressBar(1) if utils is not None else None
    progress = (lambda done, total: bar.update_absolute(done, total)) if bar is not None else None
    video = decode_into(model, z, tile_batch, progress=progress, channels_last=True)
    return video.permute(0, 2, 3, 4, 1).flatten(0, 1)  # a view: the buffer is (B, F, H, W, 3) already


def _free_memory(model: H3VideoDecoder, z: torch.Tensor, tile_batch: int | None) -> None:
    """Inside ComfyUI on CUDA: ask its model management to make room for this decode's memory plan."""
    management = _optional("comfy.model_management")
    if management is None or model.device.type != "cuda" or not hasattr(management, "free_memory"):
        return
    batch, channels, frames, h, w = z.shape
    need = memory.plan(
        model.config,
        (channels, frames, h, w),
        dtype=model.compute_dtype,
        device_type="cuda",
        offload=model.runtime.offload,
        tiling=model.runtime.tiling,
        tile_batch=tile_batch,
        batch=batch,
    )
    management.free_memory(need.device - need.weights - need.streamed_slots, model.device)


# Decoders made from ComfyUI VAEs: first_stage_model -> (its weights' identity, the options, the decoder).
# Weakly keyed: when ComfyUI drops the VAE, its decoder goes with it.
_vae_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# The parts of an H3 video VAE's first_stage_model our decoder is made from (ComfyUI names them as the release).
_H3_VIDEO_PARTS = ("decoder.x_embedder", "decoder.transformer_blocks", "decoder.proj_out", "post_quant_conv")


def decoder_for_vae(vae, options: DecodeOptions) -> H3VideoDecoder | None:
    """Our decoder for a ComfyUI VAE holding MiniMax-H3's video VAE, made once per VAE and weights (rebuilt
    when a weight is replaced or changed in place), sharing its tensors where the recipe's dtype and the
    device allow. None when its weights are quantized or not loaded (meta); ValueError for another VAE."""
    stage, state = _h3_state(vae)
    if any(type(t) is not torch.Tensor or t.is_meta or not t.is_floating_point() for t in state.values()):
        return None
    identity = tuple((k, t.data_ptr(), t._version, t.dtype, t.device) for k, t in state.items())
    cached = _vae_decoders.get(stage)
    if cached is not None and cached[:2] == (identity, options):
        return cached[2]
    checkpoint = checkpoint_in_memory(state, _state_config(state), "original", "the ComfyUI VAE")
    model = H3VideoDecoder.from_checkpoint(checkpoint, options)
    _vae_decoders[stage] = (identity, options, model)
    return model


def _h3_state(vae) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """(first_stage_model, the tensors our decoder is made from: decoder, post_quant_conv, latent statistics)
    of a ComfyUI VAE holding H3's video VAE, checked by the model's structure; ValueError for another VAE.
    The tensors are detached views: a quantized weight stays its own tensor type."""
    stage = getattr(vae, "first_stage_model", None)
    if not isinstance(stage, torch.nn.Module) or not all(_has(stage, part) for part in _H3_VIDEO_PARTS):
        raise ValueError("this VAE is not MiniMax-H3's video VAE (its model has no ViT decoder): use VAE Decode")
    everything = stage.state_dict(keep_vars=True)
    stats = ("latents_mean", "latents_std")
    names = [k for k in everything if k.startswith(("decoder.", "post_quant_conv.")) or k in stats]
    return stage, {k: everything[k].detach() for k in names}


def _state_config(state: dict[str, torch.Tensor]) -> H3DecoderConfig:
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    return comfyui_config(shapes, lambda name: tuple(state[name].float().tolist()), "the ComfyUI VAE")


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False


def video_latents(samples):
    """The video part of a LATENT's samples: a plain (B, 24, T, h, w) tensor as it is, or, for the packed
    audio + video latent that ComfyUI's H3 sampler outputs (a ComfyUI NestedTensor: not a torch.Tensor,
    `is_nested` True, `unbind()` giving (video, audio)), its first part, as ComfyUI's VAE Decode takes it."""
    if not isinstance(samples, torch.Tensor) and getattr(samples, "is_nested", False) and hasattr(samples, "unbind"):
        return samples.unbind()[0]
    if isinstance(samples, torch.Tensor) and samples.is_nested:
        raise ValueError("a torch nested tensor is not an H3 LATENT: give the (B, 24, T, h, w) video latents")
    return samples


def _identity(source: str, checkpoint: Checkpoint) -> tuple:
    """(path, size, mtime, inode) of every file the checkpoint is read from, its weights and its configs: a
    file rewritten in place, or swapped for another, is a different checkpoint."""
    files = set(checkpoint.files.values())
    if os.path.isdir(source):
        files.update(Path(source).rglob("*.json"))
    identity = []
    for path in sorted(files):
        stat = os.stat(path)
        identity.append((os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return tuple(identity)


def _source(vae_name: str, path: str) -> str:
    if vae_name == PATH_CHOICE:
        if not path.strip():
            raise ValueError(f"vae_name is {PATH_CHOICE}: give the checkpoint's path")
        return os.path.expanduser(path.strip())
    folder_paths = _optional("folder_paths")
    full = folder_paths.get_full_path("vae", vae_name) if folder_paths is not None else None
    if full is None:
        raise ValueError(f"{vae_name!r} is not in ComfyUI's models/vae folder")
    return full


def _device() -> torch.device | None:
    """ComfyUI's compute device when running inside ComfyUI, else None (CUDA when available)."""
    management = _optional("comfy.model_management")
    return management.get_torch_device() if management is not None else None


NODE_CLASS_MAPPINGS = {
    "MiniMaxH3DecoderLoader": H3DecoderLoader,
    "MiniMaxH3Decode": H3Decode,
    "MiniMaxH3DecodeWithVAE": H3DecodeWithVAE,
    "MiniMaxH3UseForVAE": H3UseForVAE,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "MiniMaxH3DecoderLoader": "Load MiniMax-H3 Decoder (minimax_h3_vae)",
    "MiniMaxH3Decode": "MiniMax-H3 Decode (minimax_h3_vae)",
    "MiniMaxH3DecodeWithVAE": "MiniMax-H3 Decode with VAE (minimax_h3_vae)",
    "MiniMaxH3UseForVAE": "Use minimax_h3_vae for this MiniMax-H3 VAE",
}
