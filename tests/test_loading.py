"""Loading the decoder from every released layout, from a (fake, offline) hub cache, and failing clearly.

The weights come from the session's random diffusers oracle (tests/checkpoints.py), written in the three
on-disk layouts. Expected values are taken from the oracle's own tensors and config, never from the
package's key table, so a wrong row in `minimax_h3_vae.checkpoints.diffusers` shows up here.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3VideoDecoder
from minimax_h3_vae.checkpoints import CheckpointError, load_checkpoint
from minimax_h3_vae.checkpoints.files import DIFFUSERS_INDEX
from minimax_h3_vae.checkpoints.locate import download
from minimax_h3_vae.checkpoints.original import original_config

BLOCK_LINEAR = re.compile(r"decoder\.transformer_blocks\.\d+\.(attn\.(to_qkv|to_out)|ff\.(w1|w2))\.(weight|bias)")


# ---- helpers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vae_only_root(tmp_path_factory, layouts) -> Path:
    """A repo root that holds only the diffusers vae/ folder."""
    root = tmp_path_factory.mktemp("vae_only_root")
    shutil.copytree(layouts["diffusers"], root / "vae")
    return root


@pytest.fixture(scope="module")
def sources(layouts, release_repo, vae_only_root) -> dict[str, tuple[Path, str]]:
    """Every way to point at a checkpoint -> (path, the layout it must be read as)."""
    return {
        "original_folder": (layouts["original"], "original"),
        "repo_root": (release_repo, "original"),
        "diffusers_folder": (layouts["diffusers"], "diffusers"),
        "vae_only_root": (vae_only_root, "diffusers"),
        "comfyui_file": (layouts["comfyui"], "comfyui"),
    }


@pytest.fixture(scope="module")
def reference_state(layouts) -> dict[str, torch.Tensor]:
    """State dict loaded from the original layout (the identity map), fp32."""
    return H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").state_dict()


SOURCE_NAMES = ["original_folder", "repo_root", "diffusers_folder", "vae_only_root", "comfyui_file"]
LAYOUT_NAMES = ["original", "diffusers", "comfyui"]


def copy_original(layouts, tmp_path: Path) -> Path:
    """A private copy of the original video_vae/ folder."""
    folder = tmp_path / "video_vae"
    shutil.copytree(layouts["original"], folder)
    return folder


def rewrite_tensors(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def shard_of(folder: Path, key: str) -> Path:
    index = json.loads((folder / DIFFUSERS_INDEX).read_text())
    return folder / index["weight_map"][key]


# ---- every layout loads, to the same weights ---------------------------------------------------------


@pytest.mark.parametrize("name", SOURCE_NAMES)
def test_layout_loads(sources, oracle_vae, name):
    path, layout = sources[name]
    assert load_checkpoint(path).layout == layout
    model = H3VideoDecoder.from_pretrained(path, device="cpu")
    c = oracle_vae.config
    assert model.config.num_layers == c.decoder_num_layers == len(model.decoder.transformer_blocks)
    assert model.config.num_heads == c.decoder_num_attention_heads
    assert model.config.head_dim == c.decoder_attention_head_dim
    assert model.config.latent_channels == c.latent_channels
    assert model.device.type == "cpu"
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert all(t.dtype == torch.float32 for t in model.state_dict().values())


@pytest.mark.parametrize("name", SOURCE_NAMES[1:])
def test_state_dicts_identical_across_layouts(sources, reference_state, name):
    state = H3VideoDecoder.from_pretrained(sources[name][0], device="cpu").state_dict()
    assert state.keys() == reference_state.keys()
    for key, tensor in state.items():
        assert tensor.dtype == torch.float32, key
        assert torch.equal(tensor, reference_state[key]), f"{name}: {key} differs from the original layout"


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_weights_equal_the_oracle(layouts, oracle_vae, layout):
    """Each of our tensors against the oracle's, by the spec's mapping (section 3), written out by hand."""
    ours = H3VideoDecoder.from_pretrained(layouts[layout], device="cpu").state_dict()
    theirs = {k: v.float() for k, v in oracle_vae.state_dict().items()}
    heads, hd = oracle_vae.config.decoder_num_attention_heads, oracle_vae.config.decoder_attention_head_dim
    assert heads >= 2  # so that head 1 is checked as well as head 0

    def same(our_key, their_tensor):
        assert torch.equal(ours[our_key], their_tensor), our_key

    same("decoder.x_embedder.weight", theirs["decoder.proj_in.weight"])
    same("decoder.x_embedder.bias", theirs["decoder.proj_in.bias"])
    for key in (
        "post_quant_conv.weight",
        "post_quant_conv.bias",
        "decoder.register_tokens",
        "decoder.norm_out.weight",
        "decoder.norm_out.bias",
        "decoder.proj_out.weight",
        "decoder.proj_out.bias",
    ):
        same(key, theirs[key])
    for i in range(oracle_vae.config.decoder_num_layers):
        b = f"decoder.transformer_blocks.{i}."
        for key in ("norm1.weight", "norm2.weight", "scale1", "scale2"):
            same(b + key, theirs[b + key])
        for kind in ("weight", "bias"):
            qkv = ours[b + f"attn.to_qkv.{kind}"]
            assert qkv.shape[0] == 3 * heads * hd
            for h in range(heads):
                rows = slice(64 * h, 64 * h + 64)
                assert torch.equal(qkv[192 * h : 192 * h + 64], theirs[b + f"attn.to_q.{kind}"][rows]), (i, h, "q")
                assert torch.equal(qkv[192 * h + 64 : 192 * h + 128], theirs[b + f"attn.to_k.{kind}"][rows]), (
                    i,
                    h,
                    "k",
                )
                assert torch.equal(qkv[192 * h + 128 : 192 * h + 192], theirs[b + f"attn.to_v.{kind}"][rows]), (
                    i,
                    h,
                    "v",
                )
            same(b + f"attn.to_out.{kind}", theirs[b + f"attn.to_out.0.{kind}"])
            w1, proj = ours[b + f"ff.w1.{kind}"], theirs[b + f"ff.net.0.proj.{kind}"]
            half = proj.shape[0] // 2
            assert torch.equal(w1[:half], proj[half:]), (i, kind, "ff.w1 gate half")
            assert torch.equal(w1[half:], proj[:half]), (i, kind, "ff.w1 value half")
            same(b + f"ff.w2.{kind}", theirs[b + f"ff.net.2.{kind}"])
    # nothing else: 9 top-level tensors + 12 per block
    assert len(ours) == 9 + 12 * oracle_vae.config.decoder_num_layers


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_config_matches_oracle(layouts, oracle_vae, layout):
    config = H3VideoDecoder.from_pretrained(layouts[layout], device="cpu").config
    mean, std = tuple(oracle_vae.config.latents_mean), tuple(oracle_vae.config.latents_std)
    assert len(mean) == 24
    assert config.latents_mean == mean
    assert config.latents_std == std
    assert config.num_layers == oracle_vae.config.decoder_num_layers
    assert config.num_heads == oracle_vae.config.decoder_num_attention_heads
    assert "fused" not in {f.name for f in dataclasses.fields(config)}, "run settings live in Runtime"


# ---- only the decoder is read --------------------------------------------------------------------------


class RecordingHandle:
    """A safetensors handle that records every tensor whose data is read."""

    def __init__(self, handle, log: list[str]):
        self._handle, self._log = handle, log

    def __enter__(self):
        self._handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)

    def get_tensor(self, name):
        self._log.append(name)
        return self._handle.get_tensor(name)

    def __getattr__(self, name):
        return getattr(self._handle, name)


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_encoder_tensors_are_not_read(layouts, monkeypatch, layout):
    real_open = safe_open
    read: list[str] = []
    stored: list[str] = []

    def recording_open(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        stored.extend(handle.keys())
        return RecordingHandle(handle, read)

    monkeypatch.setattr("minimax_h3_vae.checkpoints.stored.safe_open", recording_open)
    H3VideoDecoder.from_pretrained(layouts[layout], device="cpu")
    # the files do hold encoder tensors, and the spy does see the decoder being read
    assert any(k.startswith("encoder.") for k in stored)
    assert any(k.startswith("quant_conv.") for k in stored)
    assert {"decoder.x_embedder.weight", "decoder.proj_in.weight"} & set(read)
    assert "post_quant_conv.weight" in read
    assert not [k for k in read if k.startswith(("encoder.", "quant_conv."))]
    if layout != "diffusers":
        assert "decoder.mask_token" in stored
    assert "decoder.mask_token" not in read


# ---- dtype recipes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("dtype", ["fp16", torch.float16])
def test_fp16_recipe_casts_only_block_linears(layouts, reference_state, layout, dtype):
    model = H3VideoDecoder.from_pretrained(layouts[layout], device="cpu", dtype=dtype)
    state = model.state_dict()
    half = sorted(k for k, v in state.items() if v.dtype == torch.float16)
    expected = sorted(k for k in state if BLOCK_LINEAR.fullmatch(k))
    assert len(expected) == 8 * model.config.num_layers  # 4 linears x (weight, bias) per block
    assert half == expected
    for key, tensor in state.items():
        if key in expected:
            assert torch.equal(tensor, reference_state[key].half()), key
        else:
            assert tensor.dtype == torch.float32, key
            assert torch.equal(tensor, reference_state[key]), key
    for key in (
        "decoder.x_embedder.weight",
        "decoder.register_tokens",
        "decoder.norm_out.weight",
        "decoder.proj_out.weight",
        "post_quant_conv.weight",
        "decoder.transformer_blocks.0.scale1",
        "decoder.transformer_blocks.0.norm2.weight",
    ):
        assert state[key].dtype == torch.float32, key
    assert model.decoder.compute_dtype == torch.float16


@pytest.mark.parametrize("dtype", ["fp32", "float32", torch.float32, None])
def test_fp32_on_cpu(layouts, dtype):
    state = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype=dtype).state_dict()
    assert {t.dtype for t in state.values()} == {torch.float32}


@pytest.mark.parametrize("dtype", ["bf16", "bfloat16", torch.bfloat16, torch.float64])
def test_unsupported_dtype_raises(layouts, dtype):
    with pytest.raises(ValueError, match="not supported") as info:
        H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype=dtype)
    assert "fp16" in str(info.value) and "fp32" in str(info.value)
    assert not isinstance(info.value, CheckpointError)


# ---- errors --------------------------------------------------------------------------------------------


def load_error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        H3VideoDecoder.from_pretrained(path, device="cpu")
    return str(info.value)


def copy_layout(layouts, tmp_path, layout):
    """A private copy of one layout: (what to load, the file that holds a given stored key)."""
    if layout == "original":
        folder = copy_original(layouts, tmp_path)
        return folder, lambda key: folder / "source" / "model.safetensors"
    if layout == "diffusers":
        folder = tmp_path / "vae"
        shutil.copytree(layouts["diffusers"], folder)
        return folder, lambda key: shard_of(folder, key)
    path = tmp_path / "vae.safetensors"
    shutil.copy(layouts["comfyui"], path)
    return path, lambda key: path


@pytest.mark.parametrize(
    "layout, key",
    [
        ("original", "decoder.transformer_blocks.1.ff.w2.bias"),
        ("diffusers", "decoder.transformer_blocks.1.attn.to_k.weight"),  # one of three parts of to_qkv
        ("comfyui", "decoder.transformer_blocks.0.attn.to_out.weight"),
    ],
)
def test_missing_tensor(layouts, tmp_path, layout, key):
    source, file_of = copy_layout(layouts, tmp_path, layout)
    rewrite_tensors(file_of(key), lambda t: t.pop(key))
    message = load_error(source)
    assert key in message and "missing" in message


def test_unexpected_decoder_tensor(layouts, tmp_path):
    folder = copy_original(layouts, tmp_path)
    key = "decoder.transformer_blocks.7.norm1.weight"
    rewrite_tensors(folder / "source" / "model.safetensors", lambda t: t.__setitem__(key, torch.ones(128)))
    message = load_error(folder)
    assert key in message and "unexpected" in message


def test_unexpected_encoder_tensor_is_fine(layouts, tmp_path, reference_state):
    folder = copy_original(layouts, tmp_path)
    rewrite_tensors(
        folder / "source" / "model.safetensors", lambda t: t.__setitem__("encoder.something_new.weight", torch.ones(3))
    )
    state = H3VideoDecoder.from_pretrained(folder, device="cpu").state_dict()
    assert all(torch.equal(v, reference_state[k]) for k, v in state.items())


@pytest.mark.parametrize(
    "key, shape",
    [
        ("decoder.norm_out.weight", (64,)),
        ("decoder.transformer_blocks.0.attn.to_qkv.weight", (384, 64)),
        ("post_quant_conv.weight", (24, 24, 1, 1)),
    ],
)
def test_misshaped_tensor(layouts, tmp_path, key, shape):
    folder = copy_original(layouts, tmp_path)
    rewrite_tensors(folder / "source" / "model.safetensors", lambda t: t.__setitem__(key, torch.zeros(shape)))
    message = load_error(folder)
    assert key in message and "shape" in message and str(list(shape)) in message


def test_misshaped_tensor_diffusers(layouts, tmp_path):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    key = "decoder.transformer_blocks.0.attn.to_v.weight"
    rewrite_tensors(shard_of(folder, key), lambda t: t.__setitem__(key, torch.zeros(128, 64)))
    message = load_error(folder)
    assert key in message and "[128, 64]" in message


def test_truncated_original(layouts, tmp_path):
    folder = copy_original(layouts, tmp_path)
    weights = folder / "source" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    message = load_error(folder)
    assert "truncated" in message and str(weights) in message


def test_truncated_diffusers_shard(layouts, tmp_path):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    shard = shard_of(folder, "decoder.proj_out.weight")
    shard.write_bytes(shard.read_bytes()[:-4])
    message = load_error(folder)
    assert "truncated" in message and shard.name in message


def test_truncated_comfyui(layouts, tmp_path):
    path = tmp_path / "vae.safetensors"
    path.write_bytes(layouts["comfyui"].read_bytes()[:-1])
    assert "truncated" in load_error(path)


@pytest.mark.parametrize(
    "garbage", [b"", b"hello", b"this is not a safetensors file at all\n" * 50, (2**40).to_bytes(8, "little") + b"{}"]
)
def test_garbage_weights_file(layouts, tmp_path, garbage):
    folder = copy_original(layouts, tmp_path)
    weights = folder / "source" / "model.safetensors"
    weights.write_bytes(garbage)
    message = load_error(folder)
    assert "not a safetensors file" in message and str(weights) in message


def test_garbage_single_file(tmp_path):
    path = tmp_path / "vae.safetensors"
    path.write_bytes(b"\x00garbage" * 100)
    assert "not a safetensors file" in load_error(path)


def test_single_file_not_safetensors(layouts, tmp_path):
    path = tmp_path / "vae.ckpt"
    shutil.copy(layouts["comfyui"], path)
    assert ".safetensors" in load_error(path)


def test_single_file_without_decoder(tmp_path):
    path = tmp_path / "latents.safetensors"
    save_file({"latents": torch.zeros(24, 3, 2, 2)}, str(path))
    assert "decoder.x_embedder.weight" in load_error(path)


def test_missing_wrapper_config(layouts, tmp_path):
    folder = copy_original(layouts, tmp_path)
    (folder / "config.json").unlink()
    message = load_error(folder)
    assert "not a checkpoint folder" in message and "config.json" in message
    # the same through a repo root that only holds the broken original folder
    root = tmp_path / "root"
    shutil.copytree(folder, root / "FL2VA" / "video_vae")
    assert "not a checkpoint folder" in load_error(root)


def test_missing_source_config(layouts, tmp_path):
    folder = copy_original(layouts, tmp_path)
    (folder / "source" / "config.json").unlink()
    message = load_error(folder)
    assert "missing file" in message and str(folder / "source" / "config.json") in message


def test_missing_weights_file(layouts, tmp_path):
    folder = copy_original(layouts, tmp_path)
    (folder / "source" / "model.safetensors").unlink()
    message = load_error(folder)
    assert "missing weights file" in message and "model.safetensors" in message


def test_missing_diffusers_shard(layouts, tmp_path):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    shard = shard_of(folder, "decoder.proj_out.weight")
    shard.unlink()
    message = load_error(folder)
    assert "missing weights file" in message and shard.name in message


@pytest.mark.parametrize("which", ["config.json", "source/config.json"])
def test_invalid_json_original(layouts, tmp_path, which):
    folder = copy_original(layouts, tmp_path)
    (folder / which).write_text('{"source_path": "source",')
    message = load_error(folder)
    assert "not valid JSON" in message and str(folder / which) in message


@pytest.mark.parametrize("which", ["config.json", DIFFUSERS_INDEX])
def test_invalid_json_diffusers(layouts, tmp_path, which):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    (folder / which).write_bytes(b"\xff\xfe not json")
    message = load_error(folder)
    assert "not valid JSON" in message and which in message


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def asks_hub(monkeypatch) -> list:
    """Record each time the loader asks whether the hub can be reached (answer: no)."""
    asked = []
    monkeypatch.setattr(
        "minimax_h3_vae.checkpoints.hub.hub_reachable", lambda endpoint: asked.append(endpoint) or False
    )
    return asked


def test_hub_commit_hash_loads_from_the_cache_first(hub_unreachable, layouts, reference_state, monkeypatch):
    (add, calls), attempts = hub_unreachable
    add("Org/Original", original_files(layouts))
    asked = asks_hub(monkeypatch)
    model = H3VideoDecoder.from_pretrained("Org/Original", device="cpu", revision=COMMIT)
    assert asked == []
    assert_same_state(model, reference_state)


def test_hub_branch_revision_asks_the_hub_first(hub_unreachable, layouts, reference_state, monkeypatch):
    """revision="main" asks the hub for main's newest commit before it settles for the cached main (the hub
    is out of reach here): the way to bring a cached repo up to date. No revision never asks."""
    (add, calls), attempts = hub_unreachable
    add("Org/Original", original_files(layouts))
    asked = asks_hub(monkeypatch)
    load_checkpoint("Org/Original")
    assert asked == []
    model = H3VideoDecoder.from_pretrained("Org/Original", device="cpu", revision="main")
    assert len(asked) == 1
    assert_same_state(model, reference_state)


def test_revision_of_a_local_path_is_an_error(layouts):
    with pytest.raises(CheckpointError, match="is a local path; a revision .'main'. applies to hub repo ids only"):
        load_checkpoint(layouts["original"], revision="main")


def test_hub_branch_revision_offline(fake_hub, layouts, reference_state):
    """HF_HUB_OFFLINE: a branch name is looked up in the cache only; a tag that was never cached is the
    usual offline error."""
    add, calls = fake_hub
    add("Org/Original", original_files(layouts))
    assert_same_state(H3VideoDecoder.from_pretrained("Org/Original", device="cpu", revision="main"), reference_state)
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        H3VideoDecoder.from_pretrained("Org/Original", device="cpu", revision="v2")


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda m: m["vit_decoder_kwargs"].update(norm_type="layer_norm"),
            ["norm_type", "layer_norm", "not supported"],
        ),
        (lambda m: m["vit_decoder_kwargs"].update(qk_norm_affine=True), ["qk_norm_affine", "not supported"]),
        (lambda m: m["vit_decoder_kwargs"].update(ffn_activation_fn="gelu"), ["ffn_activation_fn", "gelu"]),
        (
            lambda m: m["vit_decoder_kwargs"].update(use_flash_sandwich=True),
            ["vit_decoder_kwargs", "use_flash_sandwich"],
        ),
        (lambda m: m.update(pixel_norm_type="minus_one_one"), ["pixel_norm_type", "minus_one_one"]),
        (lambda m: m.update(use_vit_decoder=False), ["use_vit_decoder"]),
        (lambda m: m.update(z_channels=16), ["latent channels"]),
    ],
)
def test_unsupported_original_config(layouts, tmp_path, edit, words):
    folder = copy_original(layouts, tmp_path)
    edit_json(folder / "source" / "config.json", edit)
    message = load_error(folder)
    for word in words:
        assert word in message


def test_unsupported_wrapper_config(layouts, tmp_path):
    folder = copy_original(layouts, tmp_path)
    edit_json(folder / "config.json", lambda w: w.update(vae_decoder_tiling=0))
    assert "vae_decoder_tiling" in load_error(folder)
    edit_json(folder / "config.json", lambda w: w.update(vae_decoder_tiling=1, latents_mean=[0.0] * 23))
    assert "latents_mean has 23 entries" in load_error(folder)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda c: c.update(_class_name="AutoencoderKLWan"), ["AutoencoderKLWan", "AutoencoderKLMiniMaxH3"]),
        (lambda c: c.update(decoder_use_magic=True), ["decoder_use_magic"]),
        (lambda c: c.update(out_channels=4), ["out_channels"]),
    ],
)
def test_unsupported_diffusers_config(layouts, tmp_path, edit, words):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    edit_json(folder / "config.json", edit)
    message = load_error(folder)
    for word in words:
        assert word in message


def test_config_error_is_a_value_error_naming_the_setting():
    from minimax_h3_vae.config import ConfigError

    with pytest.raises(ConfigError, match="norm_type='layer_norm' is not supported"):
        original_config({}, {"vit_decoder_kwargs": {"norm_type": "layer_norm"}})
    with pytest.raises(ValueError, match=r"\['mystery'\]"):
        original_config({}, {"vit_decoder_kwargs": {"mystery": 1}})


def test_path_that_does_not_exist(tmp_path, no_network, monkeypatch):
    def refuse(*args):
        pytest.fail("treated a missing path as a repo id")

    monkeypatch.setattr("minimax_h3_vae.checkpoints.locate.download", refuse)
    missing = tmp_path / "no" / "such" / "checkpoint"
    message = load_error(missing)
    assert "no such file or folder" in message and str(missing) in message
    monkeypatch.chdir(tmp_path)
    for text in ("./missing_folder", "missing.safetensors", "not a repo/id", "a/b/c"):
        assert "no such file or folder" in load_error(text), text


def test_folder_without_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "not a checkpoint folder" in load_error(tmp_path / "empty")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README.md").write_text("hello")
    (tmp_path / "other" / "video_vae").mkdir()
    assert "not a checkpoint folder" in load_error(tmp_path / "other")


# ---- hub loading from a fake, offline cache -------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def fake_hub(tmp_path, monkeypatch, no_network):
    """An HF cache in tmp_path, offline; returns add(repo_id, {path in repo: local file}) and the downloads log."""
    import huggingface_hub.constants

    cache = tmp_path / "hf_home" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # huggingface_hub reads both at import; hf_hub_download looks them up on the constants module at call time
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # so that "Org/Name" is not a local path by accident

    calls = []

    def spy(repo_id, revision):
        calls.append(repo_id)
        return download(repo_id, revision)

    monkeypatch.setattr("minimax_h3_vae.checkpoints.locate.download", spy)

    def add(repo_id: str, files: dict[str, Path]) -> Path:
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(COMMIT)
        snapshot = repo / "snapshots" / COMMIT
        for name, source in files.items():
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, snapshot / name)
        return snapshot

    return add, calls


def original_files(layouts) -> dict[str, Path]:
    folder = layouts["original"]
    return {
        f"FL2VA/video_vae/{name}": folder / name
        for name in ("config.json", "source/config.json", "source/model.safetensors")
    }


def diffusers_files(layouts) -> dict[str, Path]:
    return {f"vae/{p.name}": p for p in layouts["diffusers"].iterdir()}


def assert_same_state(model, reference_state):
    state = model.state_dict()
    assert state.keys() == reference_state.keys()
    assert all(torch.equal(v, reference_state[k]) for k, v in state.items())


def test_hub_original_layout(fake_hub, layouts, reference_state):
    add, calls = fake_hub
    snapshot = add("Org/Original", original_files(layouts))
    checkpoint = load_checkpoint("Org/Original")
    assert calls == ["Org/Original"]
    assert checkpoint.layout == "original"
    assert set(checkpoint.files.values()) == {snapshot / "FL2VA/video_vae/source/model.safetensors"}
    assert_same_state(H3VideoDecoder.from_pretrained("Org/Original", device="cpu"), reference_state)


def test_hub_original_layout_pinned_revision(fake_hub, layouts, reference_state):
    add, calls = fake_hub
    add("Org/Original", original_files(layouts))
    model = H3VideoDecoder.from_pretrained("Org/Original", device="cpu", revision=COMMIT)
    assert calls == ["Org/Original"]
    assert_same_state(model, reference_state)


def test_hub_diffusers_only_falls_back(fake_hub, layouts, reference_state):
    add, calls = fake_hub
    snapshot = add("Org/DiffusersOnly", diffusers_files(layouts))
    checkpoint = load_checkpoint("Org/DiffusersOnly")
    assert calls == ["Org/DiffusersOnly"]
    assert checkpoint.layout == "diffusers"
    assert {p.parent for p in checkpoint.files.values()} == {snapshot / "vae"}
    assert_same_state(H3VideoDecoder.from_pretrained("Org/DiffusersOnly", device="cpu"), reference_state)


def test_hub_repo_not_in_cache(fake_hub, layouts):
    add, calls = fake_hub
    add("Org/Original", original_files(layouts))  # some other repo is cached
    message = load_error("Org/NotCached")
    assert calls == ["Org/NotCached"]
    assert "Org/NotCached" in message
    assert "cache" in message and "HF_HUB_OFFLINE" in message


def test_hub_revision_not_in_cache(fake_hub, layouts):
    add, calls = fake_hub
    add("Org/Original", original_files(layouts))
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        H3VideoDecoder.from_pretrained("Org/Original", device="cpu", revision="f" * 40)


def test_hub_incomplete_cache(fake_hub, layouts):
    """The original layout cached without its weights, and no vae/: an offline error, not a crash."""
    add, calls = fake_hub
    files = original_files(layouts)
    del files["FL2VA/video_vae/source/model.safetensors"]
    add("Org/Partial", files)
    assert "cache" in load_error("Org/Partial")


@pytest.fixture
def hub_unreachable(fake_hub, monkeypatch):
    """Online mode (HF_HUB_OFFLINE unset) on a machine without network: every DNS lookup and connection
    fails at once, and is counted."""
    import socket

    import huggingface_hub.constants

    attempts = []

    def unreachable(*args, **kwargs):
        # Which thread tried, and from where: a failure names the caller.
        attempts.append((args[:1], threading.current_thread().name, "".join(traceback.format_stack(limit=12))))
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(socket.socket, "connect", unreachable)
    return fake_hub, attempts


def test_hub_without_network_fails_at_once(hub_unreachable, layouts, capfd):
    """Not cached, no network: one attempt, one line, in well under a second or two (was ~46 s of
    retries, and the offline error fell through to the vae/ fallback)."""
    (add, calls), attempts = hub_unreachable
    add("Org/Original", original_files(layouts))
    start = time.monotonic()
    message = load_error("Org/NotCached")
    assert time.monotonic() - start < 3
    assert "not in the local Hugging Face cache" in message and "\n" not in message
    assert len(attempts) <= 2, attempts
    assert "Retry" not in capfd.readouterr().err


def test_hub_cached_repo_loads_without_network(hub_unreachable, layouts, reference_state):
    """Cached: the cache answers first, the network is never tried."""
    (add, calls), attempts = hub_unreachable
    add("Org/Original", original_files(layouts))
    add("Org/DiffusersOnly", diffusers_files(layouts))
    start = time.monotonic()
    assert load_checkpoint("Org/Original").layout == "original"
    assert load_checkpoint("Org/DiffusersOnly").layout == "diffusers"
    assert time.monotonic() - start < 3
    assert not attempts, "\n".join(f"{where} on {thread}:\n{stack}" for where, thread, stack in attempts)
    assert_same_state(H3VideoDecoder.from_pretrained("Org/Original", device="cpu"), reference_state)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: m["vit_decoder_kwargs"].update(num_layers=1000), "num_layers 1000 (the tensors hold 2 blocks)"),
        (lambda m: m["vit_decoder_kwargs"].update(heads=4), "num_heads x head_dim 256 (the tensors say 128)"),
        (lambda m: m.update(vae_ratio=8), "patch_size"),
        (lambda m: m.update(vit_decoder_kwargs=[]), "JSON object"),
    ],
)
def test_config_checked_against_tensor_headers_before_allocating(layouts, tmp_path, monkeypatch, edit, words):
    from minimax_h3_vae import model as model_module

    monkeypatch.setattr(model_module.ViTDecoder, "__init__", lambda *a: pytest.fail("built the model"))
    folder = copy_original(layouts, tmp_path)
    edit_json(folder / "source" / "config.json", edit)
    assert words in load_error(folder)


def test_diffusers_config_checked_against_tensor_headers(layouts, tmp_path):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    edit_json(folder / "config.json", lambda c: c.update(decoder_num_layers=1000))
    assert "num_layers 1000 " in load_error(folder)
    edit_json(folder / "config.json", lambda c: c.update(decoder_num_layers=2, decoder_ffn_mult=3))
    assert "ffn_mult 3 (the tensors say 4)" in load_error(folder)


@pytest.mark.parametrize(
    "content, words", [("[1, 2]", "must hold a JSON object"), ('{"source_path": ', "not valid JSON")]
)
def test_hub_cached_config_that_is_broken(fake_hub, layouts, content, words):
    """Issue 18, row 12: a cached hub config holding an array or truncated JSON is a CheckpointError (exit
    2 at the command), not an AttributeError or a JSONDecodeError."""
    add, _ = fake_hub
    snapshot = add("Org/Broken", original_files(layouts))
    (snapshot / "FL2VA/video_vae/config.json").write_text(content)
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint("Org/Broken")


@pytest.mark.parametrize(
    "text, words",
    [('{"heads": ' + "9" * 5000 + "}", "not valid JSON"), ("[" * 100000 + "]" * 100000, "not valid JSON")],
)
def test_json_that_breaks_the_parser(layouts, tmp_path, text, words):
    """Issue 18, row 12: a 5000-digit number and 100000-deep nesting are bad input, not a ValueError or a
    RecursionError escaping."""
    folder = copy_original(layouts, tmp_path)
    (folder / "source" / "config.json").write_text(text)
    assert words in load_error(folder)


def test_one_dimensional_embedder_in_a_single_file(layouts, tmp_path):
    """Issue 18, row 12: a ComfyUI-style file whose decoder.x_embedder.weight is 1-D."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(layouts["comfyui"]))
    tensors["decoder.x_embedder.weight"] = tensors["decoder.x_embedder.weight"].flatten()
    path = tmp_path / "flat.safetensors"
    save_file(tensors, str(path))
    assert "expected 2-D" in load_error(path)
