"""The MiniMax release's own video VAE code, for tests that compare this package with it bit for bit.

The code is the checkpoint's `video_vae/*.py` as the hub ships it (the remote code its `config.json` names),
read from the folder named by the environment variable MINIMAX_H3_RELEASE_VIDEO_VAE; nothing of it is in this
repository. Without the variable, `release_folder` (and everything here that needs the code) skips the test and
says why.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ENV = "MINIMAX_H3_RELEASE_VIDEO_VAE"
# The name the release's modules are imported under (they import each other relatively, as one package).
PACKAGE = "h3_release_video_vae"

# What the release's decoder needs of its model config that the test checkpoints' source/config.json leaves at
# the class's defaults, which are not the released model: the released values.
RELEASED_MODEL_FIELDS = dict(use_3d_conv=True, use_vit_decoder=True, causal_encoder=True, causal_decoder=False)
# The release builds its CNN encoder from the config; the tests never run it (its tensors are not loaded), so
# it is made small, with the released downsampling (16 spatial, 4 temporal), whatever the config says.
SMALL_ENCODER = dict(ch=32, ch_mult=[1, 1, 1, 1], num_res_blocks=1, space_down=[2, 2, 2, 2], time_down=[1, 2, 2, 1])
# The released wrapper config.json's run settings, for the fields a test checkpoint's wrapper leaves out.
RELEASED_WRAPPER = dict(
    vae_encoder_tiling=1,
    vae_decoder_tiling=1,
    vae_parallel_tiling=1,
    vae_tile_size=256,
    vae_tile_overlap_min=64,
    vae_encoder_parallel=0,
    vae_decoder_parallel=0,
    vae_chunk_dim=-1,
)


def release_folder() -> Path:
    """The folder of the release's video VAE code (MINIMAX_H3_RELEASE_VIDEO_VAE); skips the test when unset."""
    folder = os.environ.get(ENV)
    if not folder:
        pytest.skip(f"{ENV} is not set: it names the release's video_vae/ folder (its *.py), the code to compare with")
    path = Path(folder)
    if not (path / "klvae.py").is_file():
        raise FileNotFoundError(f"{ENV}={folder} holds no klvae.py: it must name the release's video_vae/ folder")
    return path


def release_module(name: str) -> types.ModuleType:
    """One module of the release's code (e.g. "klvae"), imported once per process as `h3_release_video_vae.<name>`.

    torchvision and einops, which the release imports for its encoder-side pixel transforms only, are stood in
    for while it is imported when they are not installed (the decode never calls them), and taken out of
    sys.modules again afterwards, so that nothing else in the process sees the stand-ins."""
    folder = release_folder()
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(folder)]
        sys.modules[PACKAGE] = package
    stand_ins = _stand_ins()
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        for key in stand_ins:
            del sys.modules[key]


def _stand_ins() -> dict[str, types.ModuleType]:
    modules = {}
    if importlib.util.find_spec("torchvision") is None:
        torchvision, transforms = types.ModuleType("torchvision"), types.ModuleType("torchvision.transforms")

        class Normalize:
            """Built by the release's model (its pixel transforms), never called by a decode."""

            def __init__(self, mean, std):
                self.mean, self.std = mean, std

        transforms.Normalize = Normalize
        torchvision.transforms = transforms
        modules.update({"torchvision": torchvision, "torchvision.transforms": transforms})
    if importlib.util.find_spec("einops") is None:
        einops = types.ModuleType("einops")

        def rearrange(*args, **kwargs):
            raise NotImplementedError("einops stand-in: the release's pixel transforms are not run by these tests")

        einops.rearrange = rearrange
        modules["einops"] = einops
    return modules


def release_vae(original: Path) -> torch.nn.Module:
    """The release's `AutoencoderKLLegacy` for a checkpoint of the original layout (`original`: its video_vae/
    folder), built as the release's own loader builds it (minimax_h3_video_vae.py), float32 on the CPU, eval.

    Only the decoder side is loaded (`decoder.*`, `post_quant_conv.*`, strictly: every such tensor of the file
    and of the model); the encoder is small and left random (SMALL_ENCODER). Decode with
    `vae.decode_base(z)`: denormalised latents (B, 24, T, h, w) -> (B, 3, F, 16h, 16w)."""
    klvae = release_module("klvae")
    wrapper = {**RELEASED_WRAPPER, **json.loads((original / "config.json").read_text())}
    source = original / wrapper["source_path"]
    model_config = json.loads((source / "config.json").read_text())
    config = {**RELEASED_MODEL_FIELDS, **model_config, **SMALL_ENCODER}
    if wrapper["vae_parallel_tiling"]:  # as the release's loader does for one process
        release_module("minimax_h3_video_vae")._ensure_vae_parallel_state()
    vae = klvae.AutoencoderKLLegacy(
        **config,
        clip_length=int(wrapper["vae_clip_length"]),
        token_drop=int(wrapper["vae_token_drop"]),
        encoder_tiling=int(wrapper["vae_encoder_tiling"]),
        decoder_tiling=int(wrapper["vae_decoder_tiling"]),
        parallel_tiling=int(wrapper["vae_parallel_tiling"]),
        tile_size=int(wrapper["vae_tile_size"]),
        tile_overlap_min=int(wrapper["vae_tile_overlap_min"]),
        encoder_parallel=int(wrapper["vae_encoder_parallel"]),
        decoder_parallel=int(wrapper["vae_decoder_parallel"]),
        chunk_dim=int(wrapper["vae_chunk_dim"]),
    )
    decoder_side = ("decoder.", "post_quant_conv.")
    tensors = load_file(str(source / wrapper["source_safetensors_path"]))
    missing, unexpected = vae.load_state_dict(
        {k: v for k, v in tensors.items() if k.startswith(decoder_side)}, strict=False
    )
    missing = [key for key in missing if key.startswith(decoder_side)]
    assert not missing and not unexpected, f"decoder tensors missing {missing}, unexpected {unexpected}"
    return vae.eval()
