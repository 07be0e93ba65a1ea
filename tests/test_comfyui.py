"""The ComfyUI nodes without a ComfyUI install: their contract, the loader's cache, and exact decode output."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

import pytest
import torch
from conftest import REPO

from minimax_h3_vae import H3VideoDecoder, comfyui, denormalize_latents, to_unit_rgb
from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, PATH_CHOICE

TINY = REPO / "examples" / "tiny_h3_vae"


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
    assert (
        set(NODE_CLASS_MAPPINGS)
        == set(NODE_DISPLAY_NAME_MAPPINGS)
        == {
            "MiniMaxH3DecoderLoader",
            "MiniMaxH3Decode",
            "MiniMaxH3DecodeWithVAE",
            "MiniMaxH3UseForVAE",
        }
    )
    loader, decode = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"], NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]
    inputs = loader.INPUT_TYPES()["required"]
    assert list(inputs) == ["vae_name", "path", "fused", "tile_batch", "gemm", "attention"]
    assert inputs["vae_name"][0] == [PATH_CHOICE]  # no ComfyUI here: only the path entry
    assert inputs["path"][0] == "STRING" and inputs["tile_batch"][0] == "INT"
    assert inputs["fused"][0] == ["auto", "on", "off"]
    assert inputs["gemm"][0] == ["auto", "cublas", "quack"] and inputs["gemm"][1]["default"] == "auto"
    assert inputs["attention"][0] == ["auto", "sdpa", "fa4"] and inputs["attention"][1]["default"] == "auto"
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


# ---- decoding with the ComfyUI VAE the workflow already holds (issue 19) -----------------------------------


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    """ComfyUI's device, for these tests the CPU (a stand-in VAE lives there, and the references decode there
    in fp32), also on a machine with a GPU."""
    monkeypatch.setattr(comfyui, "_device", lambda: torch.device("cpu"))


def stand_in_vae(seed_offset: float = 0.0):
    """A stand-in for ComfyUI's `VAE` holding H3's video VAE: `first_stage_model` has the release's module
    names (decoder.x_embedder, decoder.transformer_blocks.N..., decoder.mask_token, post_quant_conv) and the
    latent statistics as buffers, filled from the tiny checkpoint; `decode` stands for ComfyUI's own."""
    from safetensors.torch import load_file

    from minimax_h3_vae.model import H3Decoder

    tensors = load_file(str(TINY / "video_vae" / "source" / "model.safetensors"))
    config = H3VideoDecoder.from_pretrained(TINY, device="cpu").config
    stage = H3Decoder(config)
    stage.decoder.register_buffer("mask_token", torch.zeros(1, 1, config.dim))
    stage.register_buffer("latents_mean", torch.tensor(config.latents_mean))
    stage.register_buffer("latents_std", torch.tensor(config.latents_std))
    stage.load_state_dict({k: v for k, v in tensors.items() if k in stage.state_dict()}, strict=False)

    class VAE:
        first_stage_model = stage
        decoded = []

        def decode(self, z):
            self.decoded.append(z.shape)
            return torch.zeros(z.shape[0], 9, 16 * z.shape[-2], 16 * z.shape[-1], 3)

    return VAE()


def test_vae_node_equals_the_loader_path():
    from minimax_h3_vae.comfyui import _vae_decoders

    comfyui._cache.clear()
    z = torch.randn(1, 24, 3, 20, 20, generator=torch.Generator().manual_seed(9))
    (node,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, str(TINY), "off", 2)
    (expected,) = NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]().decode(node, {"samples": z})
    comfyui._cache.clear()
    vae = stand_in_vae()
    decode = NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]()
    (images,) = decode.decode(vae, {"samples": z}, "off", 2)
    assert torch.equal(images, expected)
    made = _vae_decoders[vae.first_stage_model][2]
    linear = vae.first_stage_model.decoder.proj_out.weight
    assert made.decoder.proj_out.weight.data_ptr() == linear.data_ptr(), "fp32 weights shared, not copied"
    decode.decode(vae, {"samples": z}, "off", 2)
    assert _vae_decoders[vae.first_stage_model][2] is made, "made once per VAE"
    with torch.no_grad():
        linear.mul_(2)  # weights changed in place: made again
    decode.decode(vae, {"samples": z}, "off", 2)
    assert _vae_decoders[vae.first_stage_model][2] is not made


def test_vae_node_decodes_normalised_latents_once():
    """The node denormalises once, as ComfyUI's VAE does: its frames are those of the raw latents
    `z * std + mean`, not of latents denormalised twice."""
    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(10))
    vae = stand_in_vae()
    (images,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(vae, {"samples": z}, "off", 0)
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False)
    once = to_unit_rgb(model.decode(denormalize_latents(z, model.config)))[0].permute(1, 2, 3, 0)
    twice = to_unit_rgb(model.decode(denormalize_latents(denormalize_latents(z, model.config), model.config)))
    assert torch.allclose(images, once, atol=1e-5)
    assert not torch.allclose(images, twice[0].permute(1, 2, 3, 0), atol=1e-2)


def test_vae_node_falls_back_for_quantized_weights():
    class Quantized(torch.Tensor):
        """Stands for a quantized weight type: a tensor subclass the recipe cannot use as it is."""

    vae = stand_in_vae()
    block = vae.first_stage_model.decoder.transformer_blocks[0].attn.to_qkv
    block.weight = torch.nn.Parameter(block.weight.detach().as_subclass(Quantized), requires_grad=False)
    z = torch.randn(1, 24, 3, 5, 7)
    with pytest.warns(UserWarning, match="quantized or not loaded"):
        (images,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(vae, {"samples": z}, "off", 0)
    assert vae.decoded == [z.shape] and images.shape == (9, 80, 112, 3)


def test_vae_node_refuses_another_vae():
    class SD:
        first_stage_model = torch.nn.Conv2d(4, 4, 1)

    with pytest.raises(ValueError, match="not MiniMax-H3's video VAE"):
        NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(SD(), {"samples": torch.zeros(1, 24, 3, 2, 2)})


def test_vae_to_vae_node_keeps_comfyuis_decode_contract():
    """The patched VAE's first_stage_model decodes as ComfyUI's VAE.decode drives it: latents in the VAE's
    dtype, a float32 buffer preallocated from decode_output_shape and filled in place; the frames are the
    decode node's, and the VAE given is left as it was."""
    vae = stand_in_vae()
    (patched,) = NODE_CLASS_MAPPINGS["MiniMaxH3UseForVAE"]().patch(vae, "off", 2)
    assert patched is not vae and patched.first_stage_model is not vae.first_stage_model
    assert not hasattr(vae.first_stage_model, "decode_output_shape"), "the original is untouched"
    stage = patched.first_stage_model
    assert stage.decoder.proj_out.weight is vae.first_stage_model.decoder.proj_out.weight, "the same weights"
    z = torch.randn(1, 24, 3, 20, 20, generator=torch.Generator().manual_seed(11))
    for frames, expected in ((1, 1), (2, 5), (3, 9), (7, 22), (8, 26)):
        assert stage.decode_output_shape((1, 24, frames, 20, 20)) == (1, 3, expected, 320, 320)
    buffer = torch.empty(stage.decode_output_shape(z.shape))
    assert stage.decode(z, output_buffer=buffer) is buffer
    (images,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(vae, {"samples": z}, "off", 2)
    assert torch.equal(buffer.movedim(1, -1).reshape(-1, 320, 320, 3), images)
    with pytest.raises(ValueError, match="output_buffer is"):
        stage.decode(z, output_buffer=torch.empty(1, 3, 8, 320, 320))


@pytest.mark.parametrize("name", ["decode_with_vae.json", "patched_vae_decode.json"])
def test_example_workflows_wire_our_nodes(name):
    """The node pack's API-format workflows: every link names a node of the workflow, and every node of ours
    gets exactly its required inputs."""
    import json

    workflow = json.loads((REPO / "comfyui" / "minimax_h3_vae_nodes" / "workflows" / name).read_text())
    for node in workflow.values():
        for value in node["inputs"].values():
            if isinstance(value, list):
                assert value[0] in workflow, value
        if node["class_type"] in NODE_CLASS_MAPPINGS:
            required = NODE_CLASS_MAPPINGS[node["class_type"]].INPUT_TYPES()["required"]
            assert set(node["inputs"]) == set(required), node["class_type"]
    assert {"LoadLatent", "SaveVideo"} <= {node["class_type"] for node in workflow.values()}


# T -> F as ComfyUI's H3 VAE plans it (comfy/ldm/minimax/vae.py: `_decode_temporal_chunks`, then
# `_decode_temporal_frame_plan` less `_decode_temporal_pad_frames`), worked out by hand: e.g. T = 2 pads to
# one chunk of 7 latents, 17 + 5 frames, less 4 + 4 + 4 + 1 + 4 padded ones = 5; T = 73 pads 4 latents to
# 15 chunks, 15 x 17 + 5 = 260 frames, less 4 + 4 + 1 + 4 = 247.
COMFYUI_FRAMES = {1: 1, 2: 5, 3: 9, 7: 22, 8: 26, 12: 39, 13: 43, 72: 243, 73: 247}


def test_frame_counts_match_comfyuis_planner():
    from minimax_h3_vae.tiling import plan_chunks

    vae = stand_in_vae()
    (patched,) = NODE_CLASS_MAPPINGS["MiniMaxH3UseForVAE"]().patch(vae, "off", 0)
    config = H3VideoDecoder.from_pretrained(TINY, device="cpu").config
    for latents, frames in COMFYUI_FRAMES.items():
        assert plan_chunks(latents, config).out_frames == frames, latents
        assert patched.first_stage_model.decode_output_shape((1, 24, latents, 2, 3))[2] == frames, latents


def test_comfyui_is_asked_to_free_what_the_decode_needs(monkeypatch):
    """Inside ComfyUI on CUDA, a decode first asks its model management for the memory plan's working set
    (everything but the weights, which are already placed). A stand-in module records the call."""
    import sys
    import types as pytypes

    from minimax_h3_vae import Runtime
    from minimax_h3_vae.config import H3DecoderConfig

    calls = []
    management = pytypes.ModuleType("comfy.model_management")
    management.free_memory = lambda need, device: calls.append((need, device))
    monkeypatch.setitem(sys.modules, "comfy", pytypes.ModuleType("comfy"))
    monkeypatch.setitem(sys.modules, "comfy.model_management", management)
    cuda = torch.device("cuda")
    model = pytypes.SimpleNamespace(
        config=H3DecoderConfig(), device=cuda, compute_dtype=torch.float16, runtime=Runtime(offload="none")
    )
    comfyui._free_memory(model, torch.zeros(1, 24, 7, 48, 84), tile_batch=1)
    window, per_tile, frames_out = 1_315_012_608, 448_991_232, 619_315_200  # tests/test_memory.py, by hand
    assert calls == [(24 * 7 * 48 * 84 * 4 + window + per_tile + frames_out, cuda)]
