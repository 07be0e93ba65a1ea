"""The MiniMax-H3 audio VAE decoder: H3's audio latents to a 32 kHz waveform per stereo channel, in float32.

config.py (H3AudioDecoderConfig) -> model.py (the modules, the eager forward) -> loading.py (the three layouts)
-> decoder.py (H3AudioDecoder). The package exports H3AudioDecoder and H3AudioDecoderConfig; this file imports
nothing, so that the fused kernels can import the eager op of model.py without the loader.
"""
