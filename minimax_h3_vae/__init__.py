"""Standalone, exact and fast decoder for MiniMax-H3 video latents."""

from .config import H3DecoderConfig
from .frames import to_uint8_frames, to_unit_rgb
from .latents import denormalize_latents, save_latents
from .model import H3VideoDecoder
from .runtime import Runtime

__all__ = [
    "H3DecoderConfig",
    "H3VideoDecoder",
    "Runtime",
    "denormalize_latents",
    "save_latents",
    "to_unit_rgb",
    "to_uint8_frames",
]
__version__ = "0.2.0"
