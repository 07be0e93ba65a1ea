"""The MiniMax-H3 audio VAE decoder: H3's audio latents to a 32 kHz waveform per stereo channel, in float32."""

from .config import H3AudioDecoderConfig
from .decoder import H3AudioDecoder, check_audio_latents

__all__ = ["H3AudioDecoder", "H3AudioDecoderConfig", "check_audio_latents"]
