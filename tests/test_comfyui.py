"""The ComfyUI nodes without a ComfyUI install: their contract, the loader's cache, and exact decode output."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os
import subprocess
import sys
import types
import weakref

import comfy_stand_in
import pytest
import torch
from command_runs import tiny_copy
from repo import REPO, TINY
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3VideoDecoder, comfyui, denormalize_latents, to_unit_rgb
from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, PATH_CHOICE


@pytest.fixture
def loaded(layouts):
    """The loader node's output for the ComfyUI-layout file, given by path, eager, 3 tiles per call."""
    comfyui.release_decoders()
    (node_decoder,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(
        PATH_CHOICE, str(layouts["comfyui"]), "off", 3
    )
    yield node_decoder
    comfyui.release_decoders()


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
    # exact is optional, so that a workflow saved without it still runs (off: the API's default, exact=None)
    for name in ("MiniMaxH3DecoderLoader", "MiniMaxH3DecodeWithVAE", "MiniMaxH3UseForVAE"):
        optional = NODE_CLASS_MAPPINGS[name].INPUT_TYPES()["optional"]
        assert list(optional) == ["exact"] and optional["exact"][0] == "BOOLEAN"
        assert optional["exact"][1]["default"] is False
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
    assert other.decoder is not loaded.decoder and comfyui.loaded_decoders() == 1


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
    comfyui.release_decoders()


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
    """A stand-in for ComfyUI's NestedTensor as its H3 sampler outputs it: not a torch.Tensor,
    `is_nested` True, `unbind()` gives (video (B, 24, T, h, w), audio)."""

    is_nested = True

    def __init__(self, *parts):
        self.parts = parts

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


# ---- decoding with the ComfyUI VAE the workflow already holds ------------------------------------------------------


@pytest.fixture(autouse=True)
def host(monkeypatch):
    """ComfyUI's model management and progress bar (tests/comfy_stand_in.py), recording the nodes' calls. Its
    VAE device is the CPU (a stand-in VAE lives there, and the references decode there in fp32), also on a
    machine with a GPU."""
    return comfy_stand_in.install(monkeypatch)


def reference_images(state: dict, z: torch.Tensor, tile_batch: int | None = None) -> torch.Tensor:
    """IMAGE frames of normalised latents z decoded by a decoder loaded from `state` (release names) as a
    file would load, in fp32 on the CPU: what every VAE node must give."""
    from minimax_h3_vae.checkpoints import checkpoint_in_memory

    _, config = comfy_stand_in.tiny_state()
    tensors = {k: v.float() for k, v in state.items()}
    if "latents_mean" in tensors:  # the VAE's statistics, in its dtype, as ComfyUI's own decode uses them
        stats = {name: tuple(tensors[name].tolist()) for name in ("latents_mean", "latents_std")}
        config = dataclasses.replace(config, **stats)
    model = H3VideoDecoder.from_checkpoint(checkpoint_in_memory(tensors, config, "original"), device="cpu", fused=False)
    video = to_unit_rgb(model.decode(denormalize_latents(z.float(), config), tile_batch=tile_batch))
    return video.permute(0, 2, 3, 4, 1).reshape(-1, *video.shape[-2:], 3)


def through(path: str, vae, z: torch.Tensor, tile_batch: int = 2) -> torch.Tensor:
    """IMAGE frames of latents z through one of the nodes that take a ComfyUI VAE, as ComfyUI runs them: under
    torch.inference_mode(). "with_vae": Decode with VAE; "patched": Use for VAE, then ComfyUI's VAE.decode."""
    with torch.inference_mode():
        if path == "with_vae":
            return NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(vae, {"samples": z}, "off", tile_batch)[0]
        (patched,) = NODE_CLASS_MAPPINGS["MiniMaxH3UseForVAE"]().patch(vae, "off", tile_batch)
        video = patched.decode(z)  # ComfyUI's VAE.decode: (B, F, H, W, 3)
        return video.reshape(-1, *video.shape[-3:])


VAE_PATHS = ["with_vae", "patched"]


def seen(path: str, vae, z: torch.Tensor) -> torch.Tensor:
    """The latents a path's decoder gets: ComfyUI's VAE.decode (the patched path) casts them to the VAE's dtype."""
    return z.to(vae.vae_dtype) if path == "patched" else z


@pytest.mark.parametrize("path", [*VAE_PATHS, "loader"])
def test_every_node_runs_under_inference_mode(host, path):
    """ComfyUI runs nodes under torch.inference_mode(), and its VAE Loader makes the weights there: inference
    tensors, which have no version counter. Every node decodes there as a file-loaded decoder does."""
    state, _ = comfy_stand_in.tiny_state()
    z = torch.randn(1, 24, 3, 4, 20, generator=torch.Generator().manual_seed(9))  # 2 tiles, stitched
    if path == "loader":
        comfyui.release_decoders()
        with torch.inference_mode():
            (node,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, str(TINY), "off", 2)
            (images,) = NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]().decode(node, {"samples": z})
        comfyui.release_decoders()
    else:
        vae = comfy_stand_in.tiny_vae()
        assert vae.first_stage_model.decoder.proj_out.weight.is_inference()
        images = through(path, vae, z)
    assert torch.equal(images, reference_images(state, z, tile_batch=2))
    assert host.progress and host.progress[-1][0] == host.progress[-1][1], "the progress bar reaches the end"


@pytest.mark.parametrize("path", VAE_PATHS)
def test_vae_nodes_share_the_weights_and_keep_nothing(host, path):
    """The decoder of a VAE node is built on the VAE's own tensors (fp32 on the CPU: every one shared, none
    copied) for the one decode, and nothing of it outlives the decode: after ComfyUI offloads the VAE no copy
    of its weights is left behind."""
    vae = comfy_stand_in.tiny_vae()
    weight = vae.first_stage_model.decoder.proj_out.weight
    built = []
    real = H3VideoDecoder.from_checkpoint

    def spy(checkpoint, options=None, **fields):
        model = real(checkpoint, options, **fields)
        built.append(weakref.ref(model))
        assert model.decoder.proj_out.weight.data_ptr() == weight.data_ptr(), "fp32 weights shared, not copied"
        return model

    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(3))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(H3VideoDecoder, "from_checkpoint", spy)
        through(path, vae, z)
    gc.collect()
    assert built and all(ref() is None for ref in built), "no decoder outlives its decode"


@pytest.mark.parametrize("path", VAE_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vae_nodes_see_every_weight_change(host, path, dtype):
    """ComfyUI changes a VAE's weights in place (its patcher writes `param.data.copy_(...)`, which bumps no
    version counter), replaces them, or moves them (offload, then load: new tensors). Whatever the VAE's dtype
    (ComfyUI's --fp16-vae / --bf16-vae: the fp32 recipe then works on converted copies), the next decode
    uses the weights as they are then."""
    vae = comfy_stand_in.tiny_vae(dtype)
    stage = vae.first_stage_model
    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(4))
    first = through(path, vae, z)
    assert torch.equal(first, reference_images(stage.state_dict(), seen(path, vae, z), tile_batch=2))
    with torch.inference_mode():
        qkv = stage.decoder.transformer_blocks[0].attn.to_qkv.weight
        qkv.data.copy_(qkv.data.flip(0))  # in place, as ComfyUI's weight patches are
    patched = through(path, vae, z)
    assert not torch.equal(patched, first)
    assert torch.equal(patched, reference_images(stage.state_dict(), seen(path, vae, z), tile_batch=2))
    with torch.inference_mode():
        stage.decoder.proj_out.bias.data = stage.decoder.proj_out.bias.data + 0.5  # replaced
    vae.patcher.offload()  # moved away: the next decode has ComfyUI load it back as new tensors
    moved = through(path, vae, z)
    assert not torch.equal(moved, patched) and vae.patcher.loads >= 1
    assert torch.equal(moved, reference_images(stage.state_dict(), seen(path, vae, z), tile_batch=2))


def test_vae_node_asks_comfyui_to_load_the_whole_vae(host):
    """Decode with VAE has ComfyUI load the VAE (fully) where it computes before reading its weights, as
    ComfyUI's VAE Decode does: a VAE ComfyUI had offloaded decodes, not its absent tensors."""
    vae = comfy_stand_in.tiny_vae()
    vae.patcher.offload()
    assert vae.first_stage_model.decoder.proj_out.weight.is_meta
    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(5))
    images = through("with_vae", vae, z)
    assert host.loads and host.loads[0][0] == 1 and host.loads[0][2] is True, "one model, force_full_load"
    assert torch.equal(images, reference_images(vae.first_stage_model.state_dict(), z, tile_batch=2))


@pytest.mark.parametrize("path", VAE_PATHS)
def test_vae_nodes_fall_back_for_a_partly_loaded_vae(host, path):
    """Weights not all on the VAE's device after ComfyUI loaded it (its partial load for a small card) are
    left to the VAE's own decode, which streams them, rather than copied to the device behind ComfyUI."""
    vae = comfy_stand_in.tiny_vae()
    vae.patcher.load = lambda: None  # ComfyUI loads nothing more: part of the model stays elsewhere
    with torch.inference_mode():
        block = vae.first_stage_model.decoder.transformer_blocks[1].ff.w2
        block.weight = torch.nn.Parameter(torch.empty_like(block.weight, device="meta"), requires_grad=False)
    z = torch.randn(1, 24, 3, 5, 7)
    with pytest.warns(UserWarning, match="not all on its device"):
        images = through(path, vae, z)
    assert vae.first_stage_model.own_decodes and images.shape == (9, 80, 112, 3)


def test_vae_node_decodes_normalised_latents_once(host):
    """The node denormalises once, as ComfyUI's VAE does: its frames are those of the raw latents
    `z * std + mean`, not of latents denormalised twice."""
    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(10))
    images = through("with_vae", comfy_stand_in.tiny_vae(), z, tile_batch=0)
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False)
    once = to_unit_rgb(model.decode(denormalize_latents(z, model.config)))[0].permute(1, 2, 3, 0)
    twice = to_unit_rgb(model.decode(denormalize_latents(denormalize_latents(z, model.config), model.config)))
    assert torch.allclose(images, once, atol=1e-5)
    assert not torch.allclose(images, twice[0].permute(1, 2, 3, 0), atol=1e-2)


@pytest.mark.parametrize("path", VAE_PATHS)
def test_vae_nodes_fall_back_for_quantized_weights(host, path):
    class Quantized(torch.Tensor):
        """Stands for a quantized weight type: a tensor subclass the recipe cannot use as it is."""

    vae = comfy_stand_in.tiny_vae()
    with torch.inference_mode():
        block = vae.first_stage_model.decoder.transformer_blocks[0].attn.to_qkv
        block.weight = torch.nn.Parameter(block.weight.detach().as_subclass(Quantized), requires_grad=False)
    z = torch.randn(1, 24, 3, 5, 7)
    with pytest.warns(UserWarning, match="quantized"):
        images = through(path, vae, z)
    assert vae.first_stage_model.own_decodes == [z.shape] and images.shape == (9, 80, 112, 3)


def test_vae_node_refuses_another_vae():
    class SD:
        first_stage_model = torch.nn.Conv2d(4, 4, 1)

    with pytest.raises(ValueError, match="not MiniMax-H3's video VAE"):
        NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(SD(), {"samples": torch.zeros(1, 24, 3, 2, 2)})


def test_newer_comfyui_structure_is_accepted_and_an_unknown_one_refused(host):
    """ComfyUI's later comfy-kitchen vae.py (commit 2266077b) adds non-persistent buffers (a unit scale per
    attention for its fused QK norm + RoPE kernel, the rotary frequencies): not in the state dict, so the
    structure our nodes read is unchanged and they decode. A decoder tensor we do not know (a future
    persistent buffer) is refused, naming the ComfyUI versions the nodes support."""
    vae = comfy_stand_in.tiny_vae()
    for block in vae.first_stage_model.decoder.transformer_blocks:
        block.attn.register_buffer("qk_norm_scale", torch.ones(64), persistent=False)
    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(6))
    assert torch.equal(through("with_vae", vae, z), reference_images(comfy_stand_in.tiny_state()[0], z, 2))
    vae.first_stage_model.decoder.transformer_blocks[0].attn.register_buffer("qk_norm_scale", torch.ones(64))
    for node in ("MiniMaxH3DecodeWithVAE", "MiniMaxH3UseForVAE"):
        with pytest.raises(ValueError, match=r"unexpected decoder tensor.*ComfyUI 0\.32\.0 \(commit bd34f338\)"):
            if node == "MiniMaxH3UseForVAE":
                NODE_CLASS_MAPPINGS[node]().patch(vae, "off", 0)
            else:
                NODE_CLASS_MAPPINGS[node]().decode(vae, {"samples": z}, "off", 0)


def test_vae_to_vae_node_keeps_comfyuis_decode_contract(host):
    """The patched VAE's first_stage_model decodes as ComfyUI's VAE.decode drives it: latents in the VAE's
    dtype, a float32 buffer preallocated from decode_output_shape and filled in place; the frames are the
    decode node's, and the VAE given is left as it was."""
    vae = comfy_stand_in.tiny_vae()
    (patched,) = NODE_CLASS_MAPPINGS["MiniMaxH3UseForVAE"]().patch(vae, "off", 2)
    assert patched is not vae and patched.first_stage_model is not vae.first_stage_model
    assert vae.first_stage_model.decode.__func__ is comfy_stand_in.FirstStage.decode, "the original is untouched"
    stage = patched.first_stage_model
    assert stage.decoder.proj_out.weight is vae.first_stage_model.decoder.proj_out.weight, "the same weights"
    z = torch.randn(1, 24, 3, 4, 20, generator=torch.Generator().manual_seed(11))  # 2 tiles
    for frames, expected in ((1, 1), (2, 5), (3, 9), (7, 22), (8, 26)):
        assert stage.decode_output_shape((1, 24, frames, 20, 20)) == (1, 3, expected, 320, 320)
    buffer = torch.empty(stage.decode_output_shape(z.shape))
    assert stage.decode(z, output_buffer=buffer) is buffer
    (images,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(vae, {"samples": z}, "off", 2)
    assert torch.equal(buffer.movedim(1, -1).reshape(-1, 64, 320, 3), images)
    tiled = stage.decode_tiled(z, 32, 32, 8, tile_t=64)  # ComfyUI's tile settings, positional or named
    assert torch.equal(tiled, buffer)
    with pytest.raises(ValueError, match="output_buffer is"):
        stage.decode(z, output_buffer=torch.empty(1, 3, 8, 64, 320))


# ---- what each node refuses, with one clear error ------------------------------------------------------------------

# Python's own words that must not reach a ComfyUI user in place of a reason.
PYTHON_WORDS = ("KeyError", "AttributeError", "IndexError", "TypeError", "NoneType", "object has no", "subscript")


def refusal(call) -> str:
    """The ValueError `call()` raises (nothing else passes), checked to be one line in the user's terms."""
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and not any(word in message for word in PYTHON_WORDS), message
    return message


@pytest.fixture
def node_calls(host):
    """node name -> a function that runs that node on a LATENT with the given widget values, as ComfyUI does
    (under inference mode), each VAE node on a fresh stand-in VAE."""
    comfyui.release_decoders()
    (loaded,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, str(TINY), "off", 0)

    def with_vae(samples, fused="off", tile_batch=0):
        with torch.inference_mode():
            vae = comfy_stand_in.tiny_vae()
            return NODE_CLASS_MAPPINGS["MiniMaxH3DecodeWithVAE"]().decode(vae, samples, fused, tile_batch)

    def patched(samples, fused="off", tile_batch=0):
        with torch.inference_mode():
            vae = comfy_stand_in.tiny_vae()
            (patched,) = NODE_CLASS_MAPPINGS["MiniMaxH3UseForVAE"]().patch(vae, fused, tile_batch)
            return patched.first_stage_model.decode(samples["samples"])  # as ComfyUI's VAE.decode calls it

    def loader(samples, fused="off", tile_batch=0):
        with torch.inference_mode():
            (node,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, str(TINY), fused, tile_batch)
            return NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]().decode(node, samples)

    yield {"with_vae": with_vae, "patched": patched, "loader": loader}
    del loaded
    comfyui.release_decoders()


@pytest.mark.parametrize("path", [*VAE_PATHS, "loader"])
@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.complex64]
)
def test_nodes_refuse_latents_that_are_not_floating_point(node_calls, path, dtype):
    """Integer, bool, float8 and complex latents are refused, as the command refuses them, not cast."""
    z = torch.randn(1, 24, 3, 5, 7).to(dtype)
    message = refusal(lambda: node_calls[path]({"samples": z}))
    assert "latents must be floating point" in message and str(dtype).removeprefix("torch.") in message


@pytest.mark.parametrize("path", [*VAE_PATHS, "loader"])
def test_nodes_refuse_frames_with_nan(node_calls, monkeypatch, path):
    """A weight that overflows the decode into NaN / Inf frames is an error naming it, as in the command, not
    NaN images passed on downstream."""
    z = torch.randn(1, 24, 3, 5, 7)
    real = comfy_stand_in.VAE.__init__

    def poisoned(self, state, config, dtype=torch.float32, device="cpu"):
        state = dict(state, **{"decoder.proj_out.bias": torch.full_like(state["decoder.proj_out.bias"], float("inf"))})
        real(self, state, config, dtype, device)

    monkeypatch.setattr(comfy_stand_in.VAE, "__init__", poisoned)
    if path == "loader":  # the loader's decoder reads the file: poison its weights in place
        comfyui.release_decoders()
        (node,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, str(TINY), "off", 0)
        node.decoder.decoder.proj_out.bias.fill_(float("inf"))
        message = refusal(lambda: NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]().decode(node, {"samples": z}))
        comfyui.release_decoders()
    else:
        message = refusal(lambda: node_calls[path]({"samples": z}))
    assert "NaN or Inf" in message


@pytest.mark.parametrize(
    "buffer, words",
    [
        (torch.empty(1, 3, 9, 80, 112, dtype=torch.uint8), "float32"),
        (torch.empty(1, 3, 9, 80, 112, dtype=torch.int64), "float32"),
        (torch.empty(1, 3, 9, 80, 112, dtype=torch.bool), "float32"),
        (torch.empty(1, 3, 9, 80, 112, device="meta"), "meta device"),
    ],
)
def test_patched_vae_refuses_a_buffer_it_cannot_fill(host, buffer, words):
    """An output buffer that would truncate the frames (integer, bool) or hold none (meta) is refused."""
    (patched,) = NODE_CLASS_MAPPINGS["MiniMaxH3UseForVAE"]().patch(comfy_stand_in.tiny_vae(), "off", 0)
    z = torch.randn(1, 24, 3, 5, 7)
    assert words in refusal(lambda: patched.first_stage_model.decode(z, output_buffer=buffer))


class NumpyLike:
    """Stands for a numpy array in a LATENT (numpy may not be installed): what `_describe` calls one."""

    __module__ = "numpy"


BAD_LATENTS = {
    "not a dict": (None, "a ComfyUI LATENT"),
    "a list": ([torch.zeros(1, 24, 3, 5, 7)], "a ComfyUI LATENT"),
    "no samples": ({"noise_mask": torch.zeros(1)}, "holds no 'samples'"),
    "samples None": ({"samples": None}, "got nothing"),
    "numpy": ({"samples": NumpyLike()}, "numpy array"),
    "empty packed": ({"samples": PackedLatent()}, "holds no latents"),
    "packed in packed": ({"samples": PackedLatent(PackedLatent(torch.zeros(1, 24, 3, 5, 7)))}, "itself packed"),
}


@pytest.mark.parametrize("path", ["with_vae", "loader"])
@pytest.mark.parametrize("case", list(BAD_LATENTS))
def test_nodes_refuse_a_bad_latent_clearly(node_calls, path, case):
    samples, words = BAD_LATENTS[case]
    assert words in refusal(lambda: node_calls[path](samples))


@pytest.mark.parametrize("z, words", [(None, "got nothing"), (NumpyLike(), "numpy array"), ([1, 2], "a list")])
def test_patched_vae_refuses_what_is_not_latents(node_calls, z, words):
    """The patched VAE's decode is given latents by ComfyUI's VAE.decode; anything else is refused clearly."""
    assert words in refusal(lambda: node_calls["patched"]({"samples": z}))


@pytest.mark.parametrize("path", [*VAE_PATHS, "loader"])
@pytest.mark.parametrize(
    "widgets, words", [(("yes", 0), "fused must be one of"), (("off", -1), "tile_batch"), (("off", "2"), "tile_batch")]
)
def test_nodes_refuse_bad_widget_values(node_calls, path, widgets, words):
    z = torch.randn(1, 24, 3, 5, 7)
    assert words in refusal(lambda: node_calls[path]({"samples": z}, *widgets))


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

    vae = comfy_stand_in.tiny_vae()
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
    model.memory_plan = lambda shape, **options: H3VideoDecoder.memory_plan(model, shape, **options)
    comfyui.make_room(model, torch.zeros(1, 24, 7, 48, 84), tile_batch=1)
    window, per_tile, frames_out = 1_315_012_608, 448_991_232, 619_315_200  # tests/test_memory.py, by hand
    assert calls == [(24 * 7 * 48 * 84 * 4 + window + per_tile + frames_out, cuda)]


# ---- the loader's cache --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("eager_offline")
def test_loader_cache_sees_a_rewritten_file(tmp_path):
    model = tiny_copy(tmp_path)
    loader = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]()
    comfyui.release_decoders()
    (first,) = loader.load(PATH_CHOICE, str(model), "off", 0)
    weights = model / "video_vae" / "source" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["decoder.proj_out.bias"] = tensors["decoder.proj_out.bias"] + 1
    save_file(tensors, str(weights) + ".new")
    os.replace(str(weights) + ".new", weights)  # same name, same size, another file
    (second,) = loader.load(PATH_CHOICE, str(model), "off", 0)
    comfyui.release_decoders()
    assert second.decoder is not first.decoder
    assert torch.equal(second.decoder.decoder.proj_out.bias, first.decoder.decoder.proj_out.bias + 1)


def test_the_loader_passes_exact_to_the_decoder(layouts):
    """exact=True from the loader's optional input reaches the decoder's run settings; a value that is no bool
    is refused, naming the input."""
    comfyui.release_decoders()
    try:
        loader = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]()
        (node_decoder,) = loader.load(PATH_CHOICE, str(layouts["comfyui"]), "off", 3, exact=True)
        assert node_decoder.decoder.runtime.exact
        with pytest.raises(ValueError, match="exact must be True or False"):
            loader.load(PATH_CHOICE, str(layouts["comfyui"]), "off", 3, exact="yes")
    finally:
        comfyui.release_decoders()
