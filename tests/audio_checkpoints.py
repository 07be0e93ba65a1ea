"""Random MiniMax-H3 audio VAEs written in the three on-disk layouts of the real release.

The weights start life in the external oracle (diffusers' AutoencoderKLMiniMaxH3Audio). The diffusers layout is
written by diffusers itself (`save_pretrained`); the original and ComfyUI layouts are converted here key by key,
independently of `minimax_h3_vae.audio.loading`: the original release's keys are diffusers' own (a passthrough,
weight norm as `weight_g` / `weight_v`), and ComfyUI's fold each pair into `weight` with torch's own weight-norm
computation. A wrong rule in the package's key handling then shows up as a failure instead of cancelling out.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# The release's stage structure (7 upsamplers 5 5 2 2 2 2 2, AMP kernels 3 7 11, dilations 1 3 5: what the
# original layout implies) at small widths: 128 -> 64 ... 1 channels, latent_dim 32 = encoder_dim * 2**5.
RELEASED_STRUCTURE = dict(encoder_dim=1, latent_dim=32, latent_channels=4, num_attention_heads=2, decoder_dim=128)
# A geometry unlike the release's in every decoder field (two stages, other kernels and dilations), which only
# the diffusers layout can state.
OTHER_GEOMETRY = dict(
    encoder_dim=1,
    encoder_rates=(2, 3),
    latent_dim=8,
    latent_channels=2,
    num_attention_heads=2,
    decoder_dim=12,
    decoder_rates=(2, 3),
    decoder_kernel_sizes=(4, 5),
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 2), (1, 3)),
    sampling_rate=12000,
)


def random_diffusers_audio_vae(seed: int = 0, **config):
    """The oracle with every parameter random (SnakeBeta's alpha and beta, which start at 0, too), scaled so that
    a decode's samples spread over (-1, 1) rather than sitting at the clamp."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    config = {**RELEASED_STRUCTURE, **config}
    channels = config["latent_channels"]
    generator = torch.Generator().manual_seed(seed)
    vae = AutoencoderKLMiniMaxH3Audio(
        **config,
        latents_mean=(0.3 * torch.randn(channels, generator=generator)).tolist(),
        latents_std=(torch.rand(channels, generator=generator) + 0.5).tolist(),
    )
    with torch.no_grad():
        for name, param in vae.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("weight_g"):
                gain = 0.15 if "conv_post" in name else 1.0
                value = gain * (0.75 + 0.25 * torch.rand(param.shape, generator=generator))
            elif name.endswith((".alpha", ".beta")):
                value = 0.5 * noise
            elif param.ndim > 1:
                value = noise / param[0].numel() ** 0.5
            else:
                value = 0.1 * noise
            param.copy_(value)
    return vae.eval()


def original_state_dict(vae) -> dict[str, torch.Tensor]:
    """The release's model.safetensors: diffusers' names are the original ones (encoder and buffers included)."""
    return {key: tensor.contiguous() for key, tensor in vae.state_dict().items()}


def write_original(folder: Path, vae) -> Path:
    """`folder/` as the release's FL2VA/audio_vae/: config.json (names the files, holds the latent statistics),
    config.yaml and metadata.json (the constructor's arguments), model.safetensors."""
    c = vae.config
    folder.mkdir(parents=True)
    wrapper = {
        "_class_name": "MiniMaxH3AudioVAE",
        "auto_map": {"AutoModel": "dac_audio_vae.MiniMaxH3AudioVAE"},
        "output_channel": 2,
        "sample_rate": c.sampling_rate,
        "source_config_path": "config.yaml",
        "source_metadata_path": "metadata.json",
        "source_safetensors_path": "model.safetensors",
        "latent_channels": c.latent_channels,
        "latents_mean": list(c.latents_mean),
        "latents_std": list(c.latents_std),
    }
    kwargs = {
        "attn_proj": True,
        "decoder_dim": c.decoder_dim,
        "decoder_rates": list(c.decoder_rates),
        "decoder_type": "bigvgan",
        "encoder_dim": c.encoder_dim,
        "encoder_rates": list(c.encoder_rates),
        "latent_dim": c.latent_dim,
        "sample_rate": c.sampling_rate,
        "vae_latent_channels": c.latent_channels,
    }
    yaml = (
        f"model_config:\n  sr: {c.sampling_rate}\n  decoder_dim: {c.decoder_dim}\n  audio_channel: 1\n"
        f"  vae_latent_channels: {c.latent_channels}\n"
    )
    (folder / "config.json").write_text(json.dumps(wrapper, indent=2))
    (folder / "config.yaml").write_text(yaml)
    (folder / "metadata.json").write_text(json.dumps({"metadata": {"kwargs": kwargs}}, indent=2))
    save_file(original_state_dict(vae), str(folder / "model.safetensors"))
    return folder


def write_diffusers(folder: Path, vae, shards: int = 1) -> Path:
    """`folder/` through diffusers' own writer; with shards > 1, that many shards and an index."""
    total = sum(t.numel() * t.element_size() for t in vae.state_dict().values())
    vae.save_pretrained(folder, max_shard_size=f"{total // shards // 1024 + 1}KB", safe_serialization=True)
    return folder


def comfyui_state_dict(vae, filters: bool = True) -> dict[str, torch.Tensor]:
    """ComfyUI's single file: every weight_g / weight_v pair folded into `weight` as torch's weight_norm computes
    it (`torch._weight_norm`, dim 0), the latent statistics as tensors; `filters=False` leaves out the resampling
    filter buffers."""
    source = original_state_dict(vae)
    out = {}
    for key, tensor in source.items():
        if key.endswith("weight_v"):
            continue
        if key.endswith("weight_g"):
            conv = key.removesuffix("_g")
            out[conv] = torch._weight_norm(source[conv + "_v"], tensor, 0).contiguous()
        elif filters or not key.endswith(".filter"):
            out[key] = tensor
    out["latents_mean"] = torch.tensor(vae.config.latents_mean)
    out["latents_std"] = torch.tensor(vae.config.latents_std)
    return out


def write_comfyui(path: Path, vae, filters: bool = True) -> Path:
    save_file(comfyui_state_dict(vae, filters), str(path))
    return path


def diffusers_waveform(vae, audio_latents: torch.Tensor) -> torch.Tensor:
    """diffusers' H3 audio decode step on (C, channels, N) normalised latents -> (C, samples): its
    denormalisation (float32 statistics from the config), then `decode`."""
    mean = torch.tensor(vae.config.latents_mean, device=audio_latents.device).view(1, -1, 1)
    std = torch.tensor(vae.config.latents_std, device=audio_latents.device).view(1, -1, 1)
    with torch.inference_mode():
        return vae.decode(audio_latents * std + mean).sample.squeeze(1)
