"""Standalone, exact and fast decoder for MiniMax-H3 video latents."""

from .config import H3DecoderConfig
from .model import H3VideoDecoder, denormalize_latents, to_uint8_frames, to_unit_rgb

__all__ = ["H3DecoderConfig", "H3VideoDecoder", "denormalize_latents", "to_unit_rgb", "to_uint8_frames"]
__version__ = "0.1.0"
