"""Random MiniMax-H3 video VAEs written in the three on-disk layouts of the real release.

The weights start life in the external oracle (diffusers' AutoencoderKLMiniMaxH3). The diffusers layout is
written by diffusers itself (`save_pretrained`, sharded with an index); the original and ComfyUI layouts
are converted here key by key from the key table of docs/decoder.md (section 2), independently of
`minimax_h3_vae.loading`, so a wrong row in the package's key table shows up as a parity failure instead of
cancelling out.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# A small VAE with the released patch sizes (16 spatial, 4 temporal), head dim 64 and RoPE ratio 0.75, so
# tiling, chunking and RoPE are the released ones; a tiny encoder so that encoder keys exist to be skipped.
SMALL_DIFFUSERS_CONFIG = dict(
    block_out_channels=(8, 16),
    layers_per_block=1,
    spatial_downsample_factors=(4, 4),
    temporal_downsample_factors=(2, 2),
    norm_num_groups=4,
    decoder_num_layers=2,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=64,
)


def random_diffusers_vae(seed: int = 0, **config):
    """The oracle with every parameter random (the layer scales initialise to zero, which hides every
    block). Values are fp16-representable so the fp16 ComfyUI file holds exactly the same weights."""
    from diffusers import AutoencoderKLMiniMaxH3

    torch.manual_seed(seed)
    vae = AutoencoderKLMiniMaxH3(
        **{**SMALL_DIFFUSERS_CONFIG, **config},
        latents_mean=tuple(torch.randn(24).tolist()),
        latents_std=tuple((torch.rand(24) + 0.5).tolist()),
    )
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
                value = 1.0 + 0.1 * torch.randn_like(param)
            elif name.endswith(("scale1", "scale2")):
                value = 0.5 * torch.randn_like(param)
            else:
                fan_in = param[0].numel() if param.ndim > 1 else 50
                value = torch.randn_like(param) / fan_in**0.5
            param.copy_(value.half().float())
    return vae.eval()


def _original_name(key: str) -> str:
    """diffusers name -> release name, for keys that convert by renaming alone (docs/decoder.md, section 2)."""
    renames = [
        ("decoder.proj_in.", "decoder.x_embedder."),
        (".attn.to_out.0.", ".attn.to_out."),
        (".ff.net.0.proj.", ".ff.w1."),
        (".ff.net.2.", ".ff.w2."),
        (".resnets.", ".block."),
        (".conv_shortcut.", ".nin_shortcut."),
        (".downsamplers.0.", ".downsample."),
        ("encoder.down_blocks.", "encoder.down."),
    ]
    for old, new in renames:
        key = key.replace(old, new)
    return key


def original_state_dict(vae) -> dict[str, torch.Tensor]:
    """The release's 560-style state dict (encoder included, with `decoder.mask_token`)."""
    heads, head_dim = vae.config.decoder_num_attention_heads, vae.config.decoder_attention_head_dim
    source = vae.state_dict()
    out = {}
    for key, tensor in source.items():
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            q, k, v = (source[key.replace(".to_q.", f".to_{n}.")] for n in "qkv")
            rows = [t.reshape(heads, head_dim, *t.shape[1:]) for t in (q, k, v)]
            out[key.replace(".attn.to_q.", ".attn.to_qkv.")] = torch.cat(rows, dim=1).reshape(
                3 * heads * head_dim, *q.shape[1:]
            )
        elif ".ff.net.0.proj." in key:
            value, gate = tensor.chunk(2)
            out[_original_name(key)] = torch.cat([gate, value])
        else:
            out[_original_name(key)] = tensor
    out["decoder.mask_token"] = torch.zeros(1, 1, vae.config.decoder_num_attention_heads * head_dim)
    return {k: v.contiguous() for k, v in out.items()}


def write_original(root: Path, vae) -> Path:
    """`root/video_vae/` as released: wrapper config, source/config.json, source/model.safetensors."""
    c = vae.config
    folder = root / "video_vae"
    (folder / "source").mkdir(parents=True)
    wrapper = {
        "source_path": "source",
        "source_safetensors_path": "model.safetensors",
        "vae_clip_length": c.clip_length,
        "vae_token_drop": c.token_drop,
        "vae_tile_size": 256,
        "vae_tile_overlap_min": 64,
        "vae_decoder_tiling": 1,
        "latent_channels": c.latent_channels,
        "latents_mean": list(c.latents_mean),
        "latents_std": list(c.latents_std),
    }
    model = {
        "_class_name": "AutoencoderKLLegacy",
        "z_channels": c.latent_channels,
        "embed_dim": c.latent_channels,
        "vae_ratio": 16,
        "vae_ratio_t": 4,
        "pixel_norm_type": "imagenet",
        "scaling_factor": 1.0,
        "shift_factor": 0.0,
        "use_vit_decoder": True,
        "vit_decoder_kwargs": {
            "dim_head": c.decoder_attention_head_dim,
            "heads": c.decoder_num_attention_heads,
            "num_layers": c.decoder_num_layers,
            "rope_dim_ratio": c.decoder_rope_dim_ratio,
            "rope_theta": c.decoder_rope_theta,
            "norm_type": "rms_norm",
            "norm_affine": True,
            "qk_norm_type": "rms_norm",
            "qk_norm_affine": False,
            "ffn_use_gated": True,
            "ffn_activation_fn": "silu",
        },
    }
    (folder / "config.json").write_text(json.dumps(wrapper, indent=2))
    (folder / "source" / "config.json").write_text(json.dumps(model, indent=2))
    save_file(original_state_dict(vae), str(folder / "source" / "model.safetensors"))
    return folder


def write_diffusers(root: Path, vae) -> Path:
    """`root/vae/` through diffusers' own writer, in three shards with an index, like the release."""
    folder = root / "vae"
    total = sum(t.numel() * t.element_size() for t in vae.state_dict().values())
    vae.save_pretrained(folder, max_shard_size=f"{total // 3 // 1024 + 1}KB", safe_serialization=True)
    return folder


def write_comfyui(path: Path, vae) -> Path:
    """One file, original names, matrices in fp16, plus the latent statistics as tensors."""
    tensors = {k: (v.half() if v.ndim >= 2 else v) for k, v in original_state_dict(vae).items()}
    tensors["latents_mean"] = torch.tensor(vae.config.latents_mean)
    tensors["latents_std"] = torch.tensor(vae.config.latents_std)
    save_file(tensors, str(path))
    return path
