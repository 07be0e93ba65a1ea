"""The ComfyUI nodes without a ComfyUI install: their contract, the loader's cache, and exact decode output."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

import pytest
import torch
from conftest import REPO

from minimax_h3_vae import comfyui, denormalize_latents, to_unit_rgb
from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, PATH_CHOICE


@pytest.fixture
def loaded(layouts):
    """The loader node's output for the ComfyUI-layout file, given by path, eager, 3 tiles per call."""
    comfyui._cache.clear()
    (node_decoder,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(
        PATH_CHOICE, str(layouts["comfyui"]), "off", 3
    )
    yield node_decoder
    comfyui._cache.clear()


def test_node_contract():
    assert set(NODE_CLASS_MAPPINGS) == set(NODE_DISPLAY_NAME_MAPPINGS) == {"MiniMaxH3DecoderLoader", "MiniMaxH3Decode"}
    loader, decode = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"], NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]
    inputs = loader.INPUT_TYPES()["required"]
    assert list(inputs) == ["vae_name", "path", "fused", "tile_batch"]
    assert inputs["vae_name"][0] == [PATH_CHOICE]  # no ComfyUI here: only the path entry
    assert inputs["path"][0] == "STRING" and inputs["tile_batch"][0] == "INT"
    assert inputs["fused"][0] == ["auto", "on", "off"]
    assert loader.RETURN_TYPES == ("MINIMAX_H3_DECODER",) and callable(getattr(loader(), loader.FUNCTION))
    assert decode.INPUT_TYPES() == {"required": {"decoder": ("MINIMAX_H3_DECODER",), "samples": ("LATENT",)}}
    assert decode.RETURN_TYPES == ("IMAGE",) and callable(getattr(decode(), decode.FUNCTION))
    assert all(isinstance(node.CATEGORY, str) for node in (loader, decode))


@pytest.mark.parametrize("batch", [1, 2])
def test_decode_node_output(loaded, batch):
    """IMAGE (B*F, H, W, 3) equals to_unit_rgb(decode(denormalize(z))) in ComfyUI's layout, bit for bit."""
    z = torch.randn(batch, 24, 8, 5, 7, generator=torch.Generator().manual_seed(batch))
    (images,) = NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]().decode(loaded, {"samples": z})
    model = loaded.decoder
    assert model.tile_batch is None and loaded.tile_batch == 3, "the node's tile batch goes with each call"
    expected = to_unit_rgb(model.decode(denormalize_latents(z, model.config), tile_batch=3)).cpu()  # (B, 3, F, H, W)
    assert images.shape == (batch * 26, 80, 112, 3) and images.dtype == torch.float32
    assert images.device.type == "cpu" and images.is_contiguous()
    assert torch.equal(images, expected.permute(0, 2, 3, 4, 1).reshape(-1, 80, 112, 3))
    assert 0.2 < images.mean() < 0.8 and images.std() > 0.05


def test_loader_caches(layouts, loaded):
    loader = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]()
    (again,) = loader.load(PATH_CHOICE, str(layouts["comfyui"]), "off", 0)
    assert again.decoder is loaded.decoder and again.tile_batch is None
    (other,) = loader.load(PATH_CHOICE, str(layouts["original"]), "off", 0)
    assert other.decoder is not loaded.decoder and len(comfyui._cache) == 1


def test_loader_reads_models_vae(monkeypatch, layouts):
    """Inside ComfyUI the file list comes from its `folder_paths` module (a stand-in here: no ComfyUI in CI)."""
    path = layouts["comfyui"]
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.get_filename_list = lambda kind: [path.name] if kind == "vae" else []
    folder_paths.get_full_path = lambda kind, name: str(path) if (kind, name) == ("vae", path.name) else None
    monkeypatch.setitem(sys.modules, "folder_paths", folder_paths)
    loader = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]
    assert loader.INPUT_TYPES()["required"]["vae_name"][0] == [path.name, PATH_CHOICE]
    (node_decoder,) = loader().load(path.name, "", "off", 0)
    assert node_decoder.decoder.config.num_layers == 2
    with pytest.raises(ValueError, match="models/vae"):
        loader().load("missing.safetensors", "", "off", 0)
    comfyui._cache.clear()


def test_loader_needs_a_path():
    with pytest.raises(ValueError, match="path"):
        NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, " ", "auto", 0)


def test_node_pack_reexports():
    spec = importlib.util.spec_from_file_location(
        "minimax_h3_vae_nodes", REPO / "comfyui" / "minimax_h3_vae_nodes" / "__init__.py"
    )
    pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack)
    assert pack.NODE_CLASS_MAPPINGS is NODE_CLASS_MAPPINGS
    assert pack.NODE_DISPLAY_NAME_MAPPINGS is NODE_DISPLAY_NAME_MAPPINGS


def test_imports_stay_optional():
    """Importing the package and the node module loads neither diffusers nor ComfyUI."""
    code = (
        "import sys, minimax_h3_vae, minimax_h3_vae.comfyui; "
        "print(sorted(m for m in ('diffusers', 'comfy', 'folder_paths') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"


class PackedLatent:
    """A stand-in for ComfyUI's NestedTensor as its H3 sampler outputs it (issue 19): not a torch.Tensor,
    `is_nested` True, `unbind()` gives (video (B, 24, T, h, w), audio)."""

    is_nested = True

    def __init__(self, video: torch.Tensor, audio: torch.Tensor):
        self.parts = (video, audio)

    def unbind(self):
        return self.parts


def test_packed_audio_video_latent_decodes_its_video(loaded):
    video = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(7))
    audio = torch.randn(1, 8, 40, generator=torch.Generator().manual_seed(8))
    decode = NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]()
    (from_packed,) = decode.decode(loaded, {"samples": PackedLatent(video, audio)})
    (from_plain,) = decode.decode(loaded, {"samples": video})
    assert torch.equal(from_packed, from_plain) and from_plain.shape == (9, 80, 112, 3)


def test_a_torch_nested_tensor_is_not_a_latent(loaded):
    nested = torch.nested.nested_tensor([torch.zeros(24, 3, 5, 7), torch.zeros(24, 3, 5, 7)])
    with pytest.raises(ValueError, match="nested tensor is not an H3 LATENT"):
        NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]().decode(loaded, {"samples": nested})
