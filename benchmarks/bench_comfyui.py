"""The ComfyUI VAE nodes' accuracy for an fp16 ComfyUI VAE (`--fp16-vae`, or a card where ComfyUI picks fp16
for VAEs), against an fp32 decode of the same weights, on one 1344x768 unit (28 tiles) at the released size.

ComfyUI casts the whole VAE to its VAE dtype (comfy/sd.py: `first_stage_model.to(vae_dtype)`), so an fp16 VAE
holds every tensor in fp16: the block linears (which the fp16 recipe runs in fp16 anyway) and the norms, layer
scales, biases, register tokens, x_embedder, proj_out and post_quant_conv (which the recipe keeps in float32:
here float32 copies of fp16-rounded values). The nodes build the decoder from those tensors as
`comfyui.decoder_for_vae` does (`checkpoint_in_memory` + `from_checkpoint` on the VAE's device) and write
frames through `comfyui.decode_into`. The reference is the fp32 recipe on the file's own values (what an fp32
ComfyUI VAE of the ComfyUI fp16 file holds: fp16-valued matrices, float32 vectors), TF32 off. Errors are on
the [0, 1] frames the nodes return, and in uint8 levels.

    PYTHONPATH=. python benchmarks/bench_comfyui.py
"""

from __future__ import annotations

import subprocess

import torch
from common import random_latents, randomize_, run_info

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder
from minimax_h3_vae.checkpoints import checkpoint_in_memory
from minimax_h3_vae.checkpoints.comfyui import comfyui_config
from minimax_h3_vae.comfyui import decode_into
from minimax_h3_vae.config import RELEASED_LATENTS_MEAN, RELEASED_LATENTS_STD

UNIT = (1, 24, 7, 48, 84)


def frames(state: dict, z: torch.Tensor, dtype: str, fused: bool) -> torch.Tensor:
    """The nodes' frames (B, 3, F, H, W) in [0, 1] of normalised latents z, decoded by a decoder on `state`
    (its config, latent statistics included, read off the tensors as the nodes read it)."""
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    config = comfyui_config(shapes, lambda name: tuple(state[name].float().tolist()), "the ComfyUI VAE")
    checkpoint = checkpoint_in_memory(state, config, "original", "the ComfyUI VAE")
    model = H3VideoDecoder.from_checkpoint(checkpoint, device="cuda", dtype=dtype, fused=fused)
    return decode_into(model, z, None, output_buffer=torch.empty(1, 3, 22, 768, 1344, device="cuda"))


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    run_info(commit, shape=UNIT)
    with torch.device("cuda"):
        model = H3VideoDecoder(H3DecoderConfig())
    randomize_(model.named_parameters(), torch.Generator(device="cuda").manual_seed(0), only=("",))
    # The ComfyUI file's values: matrices in fp16, vectors (norms, biases, layer scales, statistics) in fp32.
    fp32 = {k: v.detach().half().float() if v.ndim >= 2 else v.detach() for k, v in model.state_dict().items()}
    del model
    fp32["latents_mean"] = torch.tensor(RELEASED_LATENTS_MEAN, device="cuda")
    fp32["latents_std"] = torch.tensor(RELEASED_LATENTS_STD, device="cuda")
    fp16 = {k: v.half() for k, v in fp32.items()}  # ComfyUI's fp16 VAE: every tensor cast
    mean = torch.tensor(RELEASED_LATENTS_MEAN, device="cuda").view(1, 24, 1, 1, 1)
    std = torch.tensor(RELEASED_LATENTS_STD, device="cuda").view(1, 24, 1, 1, 1)
    z = (random_latents(UNIT, seed=1) - mean) / std  # normalised, as a LATENT holds them
    reference = frames(fp32, z, "fp32", fused=False)
    rows = []
    for name, state, dtype, fused in (
        ("fp16 VAE, fp16 recipe, fused (the nodes' default on CUDA)", fp16, "fp16", True),
        ("fp16 VAE, fp16 recipe, eager", fp16, "fp16", False),
        ("fp32 VAE, fp16 recipe, fused", fp32, "fp16", True),
        ("fp16 VAE, fp32 recipe, eager", fp16, "fp32", False),
    ):
        out = frames(state, z, dtype, fused)
        error = (out - reference).abs()
        levels = ((out * 255).round() - (reference * 255).round()).abs()
        rows.append((name, error.max().item(), error.mean().item(), levels.max().item(), (levels > 0).float().mean()))
        del out
    print(f"{'path':<58} {'max abs':>9} {'mean abs':>9} {'max uint8':>9} {'uint8 off':>9}")
    for name, worst, mean_error, level, off in rows:
        print(f"{name:<58} {worst:9.2e} {mean_error:9.2e} {level:9.0f} {100 * off:8.2f}%")


if __name__ == "__main__":
    main()
