"""Standalone, exact and fast decoder for MiniMax-H3 video latents, and for its audio latents.

The names below are imported when first used, so that `import minimax_h3_vae.command...` costs nothing
before the command has set up its signal handling (command/console.py); torch comes with the first of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .audio.config import H3AudioDecoderConfig
    from .audio.decoder import H3AudioDecoder
    from .config import H3DecoderConfig
    from .decoding import H3VideoDecoder
    from .frames import to_uint8_frames, to_unit_rgb
    from .latents import denormalize_latents, load_latents, save_latents
    from .runtime import DecodeOptions, Runtime
    from .tiling import Tiling

# Each public name -> the module that defines it.
_HOMES = {
    "DecodeOptions": "runtime",
    "H3AudioDecoder": "audio.decoder",
    "H3AudioDecoderConfig": "audio.config",
    "H3DecoderConfig": "config",
    "H3VideoDecoder": "decoding",
    "Runtime": "runtime",
    "Tiling": "tiling",
    "denormalize_latents": "latents",
    "load_latents": "latents",
    "save_latents": "latents",
    "to_unit_rgb": "frames",
    "to_uint8_frames": "frames",
}

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


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
