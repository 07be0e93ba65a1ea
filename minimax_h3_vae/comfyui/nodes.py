"""The four nodes, as ComfyUI sees them (`NODE_CLASS_MAPPINGS`): the loader of our own decoder and its decode,
the decode with the VAE a workflow holds, and the VAE -> VAE node for the stock VAE Decode."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoints import Checkpoint, load_checkpoint
from ..decoding import H3VideoDecoder
from ..runtime import Runtime, resolve_call
from ..tiling import plan_chunks
from .frames import decode_into, decode_to_images
from .host import comfy_vae_device, load_vae, make_room, optional, progress_bar, vae_device, warn_own_decode
from .inputs import CATEGORY, DECODER_TYPE, EXACT_INPUT, PATH_CHOICE, RUN_INPUTS, latent_samples, node_options
from .vae import decoder_for_vae, h3_state, structure


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


def loaded_decoders() -> int:
    """How many decoders the loader node holds: 0, or 1 after a load."""
    return len(_cache)


def release_decoders() -> None:
    """Forget the loader node's decoder; its memory is freed once nothing else refers to it (a later load reads
    the checkpoint again)."""
    _cache.clear()


class H3DecoderLoader:
    """Loads a MiniMax-H3 video VAE checkpoint (any layout this package reads) as a decoder, once."""

    DESCRIPTION = "Loads the MiniMax-H3 video decoder of minimax_h3_vae from models/vae or any path."
    RETURN_TYPES = (DECODER_TYPE,)
    RETURN_NAMES = ("decoder",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        folder_paths = optional("folder_paths")
        names = folder_paths.get_filename_list("vae") if folder_paths is not None else []
        return {
            "required": {
                "vae_name": ([*names, PATH_CHOICE], {"tooltip": "a checkpoint in models/vae"}),
                "path": (
                    "STRING",
                    {"default": "", "tooltip": f"used when vae_name is {PATH_CHOICE}: a file or folder"},
                ),
                **RUN_INPUTS,
            },
            "optional": EXACT_INPUT,
        }

    def load(
        self,
        vae_name: str,
        path: str,
        fused: str,
        tile_batch: int,
        gemm: str = "auto",
        attention: str = "auto",
        exact: bool = False,
    ) -> tuple[NodeDecoder]:
        options = node_options(fused, tile_batch, gemm, attention, comfy_vae_device(), exact)
        source = _source(vae_name, path)
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
        if not isinstance(decoder, NodeDecoder):
            raise ValueError(f"decoder must be the output of {NODE_DISPLAY_NAME_MAPPINGS['MiniMaxH3DecoderLoader']}")
        z = latent_samples(samples, decoder.decoder.config.latent_channels)
        make_room(decoder.decoder, z, decoder.tile_batch)
        return (decode_to_images(decoder.decoder, z, decoder.tile_batch),)


class H3DecodeWithVAE:
    """Decodes a MiniMax-H3 LATENT with minimax_h3_vae, built from the ComfyUI VAE the workflow already holds
    (no second copy of the weights is read)."""

    DESCRIPTION = (
        "Decodes MiniMax-H3 video latents with minimax_h3_vae, using the weights of the VAE already loaded; "
        "falls back to the VAE's own decode for quantized or partly loaded weights."
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
            },
            "optional": EXACT_INPUT,
        }

    def decode(
        self,
        vae,
        samples: dict,
        fused: str = "auto",
        tile_batch: int = 0,
        gemm: str = "auto",
        attention: str = "auto",
        exact: bool = False,
    ) -> tuple[torch.Tensor]:
        """As `H3Decode.decode`, with the decoder made from `vae.first_stage_model` for this decode
        (`decoder_for_vae`), after ComfyUI has loaded the VAE where it computes."""
        config = structure(h3_state(vae))
        options = node_options(fused, tile_batch, gemm, attention, vae_device(vae), exact)
        z = latent_samples(samples, config.latent_channels)
        load_vae(vae, config, z, options)
        model = decoder_for_vae(vae, options.replace(tile_batch=None))
        if model is None:
            warn_own_decode()
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
        return {"required": {"vae": ("VAE",), **RUN_INPUTS}, "optional": EXACT_INPUT}

    def patch(
        self,
        vae,
        fused: str = "auto",
        tile_batch: int = 0,
        gemm: str = "auto",
        attention: str = "auto",
        exact: bool = False,
    ) -> tuple:
        """A shallow copy of `vae` whose `first_stage_model` is a shallow copy of the original (the same
        weights, buffers and submodules) with ComfyUI's decode contract served by our decoder:
        `decode(z, output_buffer=None)` takes normalised latents (B, 24, T, h, w) and returns float32
        (B, 3, F, H, W) in [0, 1], written into `output_buffer` when given; `decode_output_shape(shape)`
        and `decode_tiled` match it (tile settings are ignored: the decoder tiles as released, as ComfyUI's
        own H3 VAE does). The VAE given is not changed."""
        # Checks now that it is H3's video VAE, of a known structure (its statistics are read at each decode).
        config = structure(h3_state(vae))
        options = node_options(fused, tile_batch, gemm, attention, vae_device(vae), exact)
        stage = copy.copy(vae.first_stage_model)  # its parameter, buffer and module tables are the original's
        own_decode = getattr(vae.first_stage_model, "decode", None)

        def decode(z, output_buffer=None, **unused):
            load_vae(vae, config, z, options)
            model = decoder_for_vae(vae, options.replace(tile_batch=None))
            if model is None:
                warn_own_decode()
                return own_decode(z, output_buffer=output_buffer)
            return decode_into(model, z, options.tile_batch, output_buffer, progress=progress_bar())

        def decode_output_shape(shape):
            batch, _, frames, h, w = shape
            c = config
            return (batch, c.out_channels, plan_chunks(frames, c).out_frames, h * c.patch_size, w * c.patch_size)

        stage.decode = decode
        stage.decode_tiled = lambda z, *tile_settings, **named: decode(z)
        stage.decode_output_shape = decode_output_shape
        patched = copy.copy(vae)
        patched.first_stage_model = stage
        return (patched,)


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
    if not isinstance(vae_name, str) or not isinstance(path, str):
        raise ValueError("vae_name and path must be text: a file in models/vae, or a path to a checkpoint")
    if vae_name == PATH_CHOICE:
        if not path.strip():
            raise ValueError(f"vae_name is {PATH_CHOICE}: give the checkpoint's path")
        return os.path.expanduser(path.strip())
    folder_paths = optional("folder_paths")
    full = folder_paths.get_full_path("vae", vae_name) if folder_paths is not None else None
    if full is None:
        raise ValueError(f"{vae_name!r} is not in ComfyUI's models/vae folder")
    return full


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
