"""A ComfyUI VAE holding MiniMax-H3's video VAE: its tensors, checked by names and shapes, and our decoder built
on them as they are at a decode."""

from __future__ import annotations

import torch

from ..checkpoints import Checkpoint, CheckpointError, checkpoint_in_memory
from ..checkpoints.comfyui import comfyui_config
from ..config import H3DecoderConfig
from ..decoding import H3VideoDecoder
from ..model import H3Decoder
from ..runtime import DecodeOptions

# The ComfyUI versions whose H3 video VAE these nodes were checked against (README, "ComfyUI nodes"): 0.32.0
# (commit bd34f338) in a real server, and the later comfy-kitchen vae.py (commit 2266077b) by its module
# structure. A VAE whose decoder holds other tensors is refused with this in the message.
SUPPORTED_COMFYUI = "ComfyUI 0.32.0 (commit bd34f338) to commit 2266077b"
# The parts of an H3 video VAE's first_stage_model our decoder is made from (ComfyUI names them as the release).
_H3_VIDEO_PARTS = ("decoder.x_embedder", "decoder.transformer_blocks", "decoder.proj_out", "post_quant_conv")


def decoder_for_vae(vae, options: DecodeOptions) -> H3VideoDecoder | None:
    """Our decoder on the tensors of a ComfyUI VAE holding MiniMax-H3's video VAE, as they are now, on
    `options.device`: the VAE's tensors themselves where they already have the recipe's dtype there, copies
    for this decoder alone where not (it is made for one decode and dropped). None when its weights are
    quantized, not loaded (meta), or not all on `options.device` (ComfyUI loaded part of it); ValueError for
    another VAE, or an H3 VAE of a structure these nodes do not know."""
    state = h3_state(vae)
    structure(state)  # before anything is read
    if any(type(t) is not torch.Tensor or t.is_meta or not t.is_floating_point() for t in state.values()):
        return None
    if any(t.device != options.device for t in state.values()):
        return None
    checkpoint = checkpoint_in_memory(state, _read_config(state), "original", "the ComfyUI VAE")
    return H3VideoDecoder.from_checkpoint(checkpoint, options)


def h3_state(vae) -> dict[str, torch.Tensor]:
    """The tensors our decoder is made from (decoder, post_quant_conv, latent statistics) of a ComfyUI VAE
    holding H3's video VAE, as they are now; ValueError for another VAE. Detached views: a quantized weight
    stays its own tensor type."""
    stage = getattr(vae, "first_stage_model", None)
    if not isinstance(stage, torch.nn.Module) or not all(_has(stage, part) for part in _H3_VIDEO_PARTS):
        raise ValueError("this VAE is not MiniMax-H3's video VAE (its model has no ViT decoder): use VAE Decode")
    everything = stage.state_dict(keep_vars=True)
    stats = ("latents_mean", "latents_std")
    names = [k for k in everything if k.startswith(("decoder.", "post_quant_conv.")) or k in stats]
    return {k: everything[k].detach() for k in names}


def structure(state: dict[str, torch.Tensor]) -> H3DecoderConfig:
    """The config of a ComfyUI VAE's H3 tensors (the released latent statistics: the VAE's own may not hold
    values yet), after checking that they are exactly the tensors of an H3 decoder, by names and shapes;
    ValueError naming the supported ComfyUI versions otherwise. Reads no tensor."""
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    try:
        config = comfyui_config(shapes, None, "the ComfyUI VAE")  # the statistics' shapes checked, none read
        with torch.device("meta"):
            expected = {k: tuple(t.shape) for k, t in H3Decoder(config).state_dict().items()}
        Checkpoint("original", config, {}, shapes, "the ComfyUI VAE").check(expected)
    except CheckpointError as error:
        raise ValueError(
            f"{error}. These nodes read the MiniMax-H3 VAE of {SUPPORTED_COMFYUI}; with another ComfyUI, use VAE "
            "Decode, or Load MiniMax-H3 Decoder on the checkpoint file"
        ) from None
    return config


def _read_config(state: dict[str, torch.Tensor]) -> H3DecoderConfig:
    """The config of a ComfyUI VAE's H3 tensors whose structure `structure` checked, with the VAE's own latent
    statistics (read from its tensors, which must hold values)."""
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    return comfyui_config(shapes, lambda name: tuple(state[name].float().flatten().tolist()), "the ComfyUI VAE")


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False
