"""Regenerate examples/: a tiny random-weight checkpoint in the original release layout, and latents with sound.

    python tools/make_example_checkpoint.py [--out examples]

The video VAE has the released architecture except for its size (2 blocks, 2 heads of 64, width 128):
real RoPE, patch sizes, tiling and chunking, seeded random weights, so its videos are noise, not pictures.
The audio VAE (audio_vae/) has the released stage structure (7 upsamplers, 800 samples per latent, AMP
kernels 3 7 11, 32 latent channels, the released latent statistics) at the smallest widths that structure
allows (conv_pre 32 -> 128, halving to 1 channel); its sound is noise too. A few stand-in encoder tensors are
included in both so that the files are laid out like the release's, which hold the encoders too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minimax_h3_vae import H3AudioDecoderConfig, H3DecoderConfig, H3VideoDecoder, Tiling, save_latents  # noqa: E402
from minimax_h3_vae.audio.model import AudioDecoder, kaiser_sinc_filter  # noqa: E402

TINY = H3DecoderConfig(num_layers=2, num_heads=2)
# 7 stages halve decoder_dim 7 times: 128 is the smallest width that keeps a channel in the last stage.
TINY_AUDIO = H3AudioDecoderConfig(latent_dim=32, decoder_dim=128)
SEED = 20261129
AUDIO_SEED = 20261201


def random_weights(config: H3DecoderConfig, seed: int) -> dict[str, torch.Tensor]:
    """Original-layout tensors: decoder and post_quant_conv with non-zero layer scales, plus the encoder side."""
    generator = torch.Generator().manual_seed(seed)
    model = H3VideoDecoder(config)
    tensors = {}
    for name, param in model.state_dict().items():
        noise = torch.randn(param.shape, generator=generator)
        if name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
            value = 1.0 + 0.1 * noise
        elif name.endswith(("scale1", "scale2")):
            value = 0.5 * noise
        else:
            fan_in = param[0].numel() if param.ndim > 1 else 50
            value = noise / fan_in**0.5
        tensors[name] = value.contiguous()
    c = config.latent_channels
    tensors["decoder.mask_token"] = torch.zeros(1, 1, config.dim)
    tensors["quant_conv.weight"] = torch.randn(2 * c, 2 * c, 1, 1, 1, generator=generator) / (2 * c) ** 0.5
    tensors["quant_conv.bias"] = torch.zeros(2 * c)
    tensors["encoder.conv_in.weight"] = torch.randn(8, 3, 3, 3, 3, generator=generator) / 9
    tensors["encoder.conv_in.bias"] = torch.zeros(8)
    tensors["encoder.conv_out.weight"] = torch.randn(2 * c, 8, 3, 3, 3, generator=generator) / 15
    tensors["encoder.conv_out.bias"] = torch.zeros(2 * c)
    return tensors


def write_checkpoint(folder: Path, config: H3DecoderConfig, seed: int) -> None:
    """`folder/video_vae/` in the original release layout."""
    root = folder / "video_vae"
    (root / "source").mkdir(parents=True, exist_ok=True)
    wrapper = {
        "source_path": "source",
        "source_safetensors_path": "model.safetensors",
        "vae_clip_length": config.clip_length,
        "vae_token_drop": config.token_drop,
        "vae_tile_size": Tiling().size,
        "vae_tile_overlap_min": Tiling().overlap,
        "vae_decoder_tiling": 1,
        "latent_channels": config.latent_channels,
        "latents_mean": list(config.latents_mean),
        "latents_std": list(config.latents_std),
    }
    model = {
        "_class_name": "AutoencoderKLLegacy",
        "z_channels": config.latent_channels,
        "embed_dim": config.latent_channels,
        "vae_ratio": config.patch_size,
        "vae_ratio_t": config.patch_size_t,
        "pixel_norm_type": "imagenet",
        "scaling_factor": 1.0,
        "shift_factor": 0.0,
        "use_vit_decoder": True,
        "vit_decoder_kwargs": {
            "dim_head": config.head_dim,
            "heads": config.num_heads,
            "num_layers": config.num_layers,
            "rope_dim_ratio": config.rope_dim_ratio,
            "rope_theta": config.rope_theta,
            "norm_type": "rms_norm",
            "norm_affine": True,
            "qk_norm_type": "rms_norm",
            "qk_norm_affine": False,
            "ffn_use_gated": True,
            "ffn_activation_fn": "silu",
        },
    }
    (root / "config.json").write_text(json.dumps(wrapper, indent=2) + "\n")
    (root / "source" / "config.json").write_text(json.dumps(model, indent=2) + "\n")
    save_file(random_weights(config, seed), str(root / "source" / "model.safetensors"))


def random_audio_weights(config: H3AudioDecoderConfig, seed: int) -> dict[str, torch.Tensor]:
    """Original-layout tensors of the audio VAE: dec_in_proj, and the decoder with every conv weight-normed (as
    `weight_g`, one gain per output row, and `weight_v`), SnakeBeta's alpha and beta in log scale, the Kaiser
    filters; gains chosen so that the waveform spreads over (-1, 1). Plus stand-ins for the encoder side."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=generator)

    tensors = {}
    for name, value in AudioDecoder(config).state_dict().items():
        shape = tuple(value.shape)
        if name.endswith(".filter"):
            tensors[name] = kaiser_sinc_filter()
        elif name.endswith((".alpha", ".beta")):
            tensors[name] = 0.5 * randn(*shape)
        elif name.startswith("decoder.") and name.endswith(".weight"):  # weight norm: g * v / ||v||
            conv = name.removesuffix(".weight")
            gain = 0.05 if conv == "decoder.conv_post" else 1.0
            tensors[f"{conv}.weight_g"] = gain * (0.75 + 0.25 * torch.rand(shape[0], 1, 1, generator=generator))
            tensors[f"{conv}.weight_v"] = randn(*shape)
        elif name.endswith(".weight"):
            tensors[name] = randn(*shape) / (shape[1] * shape[2]) ** 0.5
        else:
            tensors[name] = 0.1 * randn(*shape)
    c = config.latent_channels
    tensors["encoder.block.0.weight_g"] = torch.ones(1, 1, 1)
    tensors["encoder.block.0.weight_v"] = randn(1, 1, 7)
    tensors["encoder.block.0.bias"] = torch.zeros(1)
    tensors["pre_block.attn.zero_k_bias"] = torch.zeros(config.latent_dim)
    tensors["mean_proj.weight"] = randn(c, c, 1) / c**0.5
    tensors["mean_proj.bias"] = torch.zeros(c)
    return tensors


def write_audio_checkpoint(folder: Path, config: H3AudioDecoderConfig, seed: int) -> None:
    """`folder/audio_vae/` in the original release layout: config.json (names the files, the latent statistics),
    config.yaml and metadata.json (the constructor's arguments), model.safetensors."""
    root = folder / "audio_vae"
    root.mkdir(parents=True, exist_ok=True)
    wrapper = {
        "_class_name": "MiniMaxH3AudioVAE",
        "output_channel": 2,
        "sample_rate": config.sample_rate,
        "source_config_path": "config.yaml",
        "source_metadata_path": "metadata.json",
        "source_safetensors_path": "model.safetensors",
        "latent_channels": config.latent_channels,
        "latents_mean": list(config.latents_mean),
        "latents_std": list(config.latents_std),
    }
    encoder_dim = config.latent_dim // 2**5  # latent_dim is the encoder's width after its 5 stages
    kwargs = {
        "attn_proj": True,
        "decoder_dim": config.decoder_dim,
        "decoder_rates": list(config.upsample_rates),
        "decoder_type": "bigvgan",
        "encoder_dim": encoder_dim,
        "encoder_rates": [2, 4, 4, 5, 5],
        "latent_dim": config.latent_dim,
        "sample_rate": config.sample_rate,
        "vae_latent_channels": config.latent_channels,
    }
    yaml = (
        f"model_config:\n  sr: {config.sample_rate}\n  decoder_dim: {config.decoder_dim}\n  audio_channel: 1\n"
        f"  vae_latent_channels: {config.latent_channels}\n"
    )
    (root / "config.json").write_text(json.dumps(wrapper, indent=2) + "\n")
    (root / "config.yaml").write_text(yaml)
    (root / "metadata.json").write_text(json.dumps({"metadata": {"kwargs": kwargs}}, indent=2) + "\n")
    save_file(random_audio_weights(config, seed), str(root / "model.safetensors"))


def write_latents(path: Path, seed: int) -> None:
    """Normalised latents for 12 latent frames (39 pixel frames at 24 fps, two temporal chunks) of 320x256 px (2
    tiles), and the audio latents of the same 1.625 s: (2, 32, 65), 65 = round(39 / 24 * 40), as H3's pipeline
    pairs them (52,000 samples per channel at 32 kHz)."""
    latents = torch.randn(24, 12, 16, 20, generator=torch.Generator().manual_seed(seed))
    audio_latents = torch.randn(2, 32, 65, generator=torch.Generator().manual_seed(seed + 1))
    save_latents(path, latents, fps=24, audio_latents=audio_latents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "examples")
    args = parser.parse_args()
    write_checkpoint(args.out / "tiny_h3_vae", TINY, SEED)
    write_audio_checkpoint(args.out / "tiny_h3_vae", TINY_AUDIO, AUDIO_SEED)
    write_latents(args.out / "latents.safetensors", SEED + 1)  # the audio latents from SEED + 2
    print(f"wrote {args.out / 'tiny_h3_vae'} and {args.out / 'latents.safetensors'}")


if __name__ == "__main__":
    main()
