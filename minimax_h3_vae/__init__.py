"""Standalone, exact and fast decoder for MiniMax-H3 video latents, and for its audio latents."""

from .audio.config import H3AudioDecoderConfig
from .audio.decoder import H3AudioDecoder
from .config import H3DecoderConfig
from .decoding import H3VideoDecoder
from .frames import to_uint8_frames, to_unit_rgb
from .latents import denormalize_latents, load_latents, save_latents
from .runtime import DecodeOptions, Runtime
from .tiling import Tiling

__all__ = [
    "DecodeOptions",
    "H3AudioDecoder",
    "H3AudioDecoderConfig",
    "H3DecoderConfig",
    "H3VideoDecoder",
    "Runtime",
    "Tiling",
    "denormalize_latents",
    "load_latents",
    "save_latents",
    "to_unit_rgb",
    "to_uint8_frames",
]
__version__ = "0.3.0"
