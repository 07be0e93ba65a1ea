"""The nodes' inputs: the widgets every node offers and their run options, and a ComfyUI LATENT's video latents,
checked as the command checks latents."""

from __future__ import annotations

import torch

from ..latents import check_latents
from ..runtime import DecodeOptions

DECODER_TYPE = "MINIMAX_H3_DECODER"
CATEGORY = "latent/minimax_h3"
# The loader's file list entry meaning "use the path field instead".
PATH_CHOICE = "(path below)"
FUSED_CHOICES = {"auto": None, "on": True, "off": False}
# The run options every node offers, as ComfyUI widgets; `node_options` turns their values into options.
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


# An optional input (a workflow saved without it still runs): the release's bits on the fused path too. Off
# leaves it to the default, which gives them where they cost nothing (quack's GEMMs with SDPA); the fastest
# path, FlashAttention 4, is asked for with attention "fa4".
EXACT_INPUT = {
    "exact": (
        "BOOLEAN",
        {
            "default": False,
            "tooltip": "on: the release's own bits on the fused path too (a little slower with cuBLAS). Off: they "
            "come by default where they cost nothing (Hopper with quack's GEMMs); attention fa4 is the fastest",
        },
    )
}


def node_options(
    fused: str,
    tile_batch: int,
    gemm: str = "auto",
    attention: str = "auto",
    device: torch.device | None = None,
    exact: bool = False,
) -> DecodeOptions:
    """The run options of a node's widgets (RUN_INPUTS and EXACT_INPUT), checked, on `device`. exact: True asks
    for the release's bits; False leaves it to the default (`DecodeOptions.exact` None)."""
    if not isinstance(fused, str) or fused not in FUSED_CHOICES:
        raise ValueError(f"fused must be one of {', '.join(map(repr, FUSED_CHOICES))}, got {fused!r}")
    if isinstance(tile_batch, bool) or not isinstance(tile_batch, int) or tile_batch < 0:
        raise ValueError(f"tile_batch must be a whole number of tiles >= 0 (0: as many as fit), got {tile_batch!r}")
    if not isinstance(exact, bool):
        raise ValueError(f"exact must be True or False (the widget's on or off), got {exact!r}")
    return DecodeOptions(
        device=device,
        fused=FUSED_CHOICES[fused],
        tile_batch=tile_batch or None,
        gemm=gemm,
        attention=attention,
        exact=exact or None,
    )


def describe(value) -> str:
    """What a value is, in words, for messages about wrong inputs."""
    if value is None:
        return "nothing (None)"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if type(value).__module__ == "numpy":
        return "a numpy array"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:5]}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return "a value of another kind"


def latent_samples(samples, channels: int) -> torch.Tensor:
    """The normalised video latents (B, channels, T, h, w) of a ComfyUI LATENT (a dict holding them under
    "samples"), checked as the command checks latents: floating point, finite, within range. ValueError naming
    what is wrong otherwise."""
    if not isinstance(samples, dict):
        raise ValueError(f"samples must be a ComfyUI LATENT (a dict with 'samples'), got {describe(samples)}")
    if "samples" not in samples:
        raise ValueError(f"this LATENT holds no 'samples' (it has {sorted(map(str, samples))[:5]})")
    z = video_latents(samples["samples"])
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"the LATENT's samples must be latents (B, 24, T, h, w), got {describe(z)}")
    check_latents(z, channels)
    return z


def video_latents(samples):
    """The video part of a LATENT's samples: a plain (B, 24, T, h, w) tensor as it is, or, for the packed
    audio + video latent that ComfyUI's H3 sampler outputs (a ComfyUI NestedTensor: not a torch.Tensor,
    `is_nested` True, `unbind()` giving (video, audio)), its first part, as ComfyUI's VAE Decode takes it."""
    if not isinstance(samples, torch.Tensor) and getattr(samples, "is_nested", False) and hasattr(samples, "unbind"):
        parts = list(samples.unbind())
        if not parts:
            raise ValueError("the packed LATENT holds no latents: give the (B, 24, T, h, w) video latents")
        if not isinstance(parts[0], torch.Tensor) or parts[0].is_nested:
            raise ValueError("the packed LATENT's video part is itself packed: give the (B, 24, T, h, w) video latents")
        return parts[0]
    if isinstance(samples, torch.Tensor) and samples.is_nested:
        raise ValueError("a torch nested tensor is not an H3 LATENT: give the (B, 24, T, h, w) video latents")
    return samples
