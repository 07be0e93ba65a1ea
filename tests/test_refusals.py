"""Bad input is refused with one clear message and nothing lost: checkpoints and configs built to hurt (a huge
block index, unbounded numbers, a config that is not a file, weights that are not floats, paths leading out of
the checkpoint), latents out of range, outputs the command cannot write, flags out of range, and the API's
own refusals. The command's input is tmp_path/s.safetensors (24, 3, 4, 4); its checkpoint a copy of
examples/tiny_h3_vae."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from command_runs import latents_file, refused, small_latents, tiny_copy, tree
from repo import TINY
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder
from minimax_h3_vae.checkpoints import CheckpointError, load_checkpoint


@pytest.fixture(autouse=True)
def offline(eager_offline):
    pass


def comfy_file(tmp_path: Path, **extra) -> Path:
    """The tiny decoder's tensors as one ComfyUI-style file, plus `extra` tensors."""
    tensors = load_file(str(TINY / "video_vae" / "source" / "model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if k.startswith(("decoder.", "post_quant_conv."))}
    path = tmp_path / "comfy.safetensors"
    save_file({**tensors, **extra}, str(path))
    return path


# ---- checkpoints and configs built to hurt -------------------------------------------------------------------


HUGE_BLOCK = {"decoder.transformer_blocks.100000000.norm1.weight": torch.ones(128)}


def test_a_huge_block_index_is_refused_at_once(tmp_path):
    path = comfy_file(tmp_path, **HUGE_BLOCK)
    with pytest.raises(CheckpointError, match="do not follow on from blocks 0..1"):
        H3VideoDecoder.from_pretrained(path, device="cpu")


def test_the_command_refuses_a_huge_block_index(capsys, tmp_path):
    path = comfy_file(tmp_path, **HUGE_BLOCK)
    assert "do not follow on" in refused(capsys, small_latents(tmp_path), tmp_path / "o.mp4", "--model", path)


@pytest.mark.parametrize(
    "edit, words",
    [
        ({"vae_clip_length": 10**12}, "clip_length must be a whole number from 1 to 1024"),
        ({"vae_token_drop": 10**12}, "token_drop must be a whole number from 0 to 1024"),
        ({"vae_clip_length": 1}, "gives no temporal plan"),
        ({"vae_token_drop": 9}, "gives no temporal plan"),
        ({"vae_tile_size": 10**12}, "tiling size must be a whole number of pixels"),
    ],
)
def test_config_numbers_are_bounded(capsys, tmp_path, edit, words):
    model = tiny_copy(tmp_path)
    wrapper = model / "video_vae" / "config.json"
    wrapper.write_text(json.dumps({**json.loads(wrapper.read_text()), **edit}))
    assert words in refused(capsys, small_latents(tmp_path), tmp_path / "o.mp4", "--model", model)


@pytest.mark.parametrize("kind", ["zero", "fifo"])
def test_a_config_that_is_not_a_regular_file_is_refused(capsys, tmp_path, kind):
    model = tiny_copy(tmp_path)
    config = model / "video_vae" / "source" / "config.json"
    config.unlink()
    if kind == "zero":
        config.symlink_to("/dev/zero")
    else:
        os.mkfifo(config)
    assert "is not a regular file" in refused(capsys, small_latents(tmp_path), tmp_path / "o.mp4", "--model", model)


def test_an_oversized_config_is_refused(capsys, tmp_path):
    model = tiny_copy(tmp_path)
    with open(model / "video_vae" / "source" / "config.json", "a") as f:
        f.truncate(17 * 2**20)
    assert "not a config" in refused(capsys, small_latents(tmp_path), tmp_path / "o.mp4", "--model", model)


# ---- latents out of range -----------------------------------------------------------------------------------


def test_the_command_refuses_out_of_range_latents(capsys, tmp_path):
    out = tmp_path / "o.safetensors"
    line = refused(capsys, small_latents(tmp_path, torch.full((24, 3, 4, 4), 1e30)), out)
    assert "beyond +-10000" in line and not out.exists()


def test_decode_refuses_out_of_range_latents():
    z = torch.randn(1, 24, 3, 4, 4, dtype=torch.float64)
    z[0, 0, 0, 0, 0] = 1e300
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    with pytest.raises(ValueError, match="beyond"):
        model.decode(z)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_non_float_weights_are_refused(capsys, tmp_path, dtype):
    tensors = load_file(str(TINY / "video_vae" / "source" / "model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if k.startswith(("decoder.", "post_quant_conv."))}
    for key, value in tensors.items():
        if value.ndim == 2 and ".transformer_blocks." in key:
            tensors[key] = value.to(dtype)
    path = tmp_path / "q.safetensors"
    save_file(tensors, str(path))
    assert "not floating point" in refused(capsys, small_latents(tmp_path), tmp_path / "o.mp4", "--model", path)


# ---- outputs the command cannot write -------------------------------------------------------------------------


def test_an_out_that_is_a_symlink_loop_is_refused(capsys, tmp_path):
    loop = tmp_path / "loop.mp4"
    loop.symlink_to(loop)
    assert "symbolic link loop" in refused(capsys, small_latents(tmp_path), loop)
    assert tree(tmp_path) == {"s.safetensors", "loop.mp4"}


def test_a_frame_size_x264_cannot_encode_is_refused(capsys, tmp_path):
    wide = latents_file(tmp_path / "wide.safetensors", torch.randn(24, 3, 1, 1250))  # 20000 x 16 px
    line = refused(capsys, wide, tmp_path / "wide.mp4")
    assert "ffmpeg cannot encode 20000x16" in line and tree(tmp_path) == {"wide.safetensors"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_another_users_file_in_a_sticky_folder_is_refused(capsys, tmp_path, monkeypatch):
    """In a sticky folder (like /tmp) only the file's owner may replace it: the command, run as a third
    user (its effective uid faked), refuses before decoding instead of failing at the rename."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    out = sticky / "o.mp4"
    out.write_bytes(b"theirs")
    os.chown(out, 12345, 12345)
    monkeypatch.setattr(os, "geteuid", lambda: 23456)
    assert "belongs to another user in a sticky folder" in refused(capsys, small_latents(tmp_path), out)
    assert out.read_bytes() == b"theirs" and tree(sticky) == {"o.mp4"}


# ---- flags and names out of range ------------------------------------------------------------------------------


def test_an_fps_over_1000_is_refused(capsys, tmp_path):
    assert "got 1000.0001" in refused(capsys, small_latents(tmp_path), tmp_path / "o.mp4", "--fps", "1000.0001")


def test_an_out_with_no_name_before_its_extension_is_refused(capsys, tmp_path):
    assert "no name before its extension" in refused(capsys, small_latents(tmp_path), tmp_path / ".mp4")


def test_a_gpu_budget_too_small_is_refused(capsys, tmp_path):
    args = small_latents(tmp_path), tmp_path / "o.mp4", "--max-gpu-memory", "1e-300"
    assert "max-gpu-memory" in refused(capsys, *args)


# ---- the API's refusals --------------------------------------------------------------------------------------


def test_decode_refuses_an_output_rank_beyond_the_processes():
    with pytest.raises(ValueError, match="output_rank 3: there are 1 process"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu").decode(torch.randn(1, 24, 3, 2, 2), output_rank=3)


def test_the_runtime_is_read_only():
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    with pytest.raises(ValueError, match="read-only"):
        model.runtime = None


def test_decode_refuses_a_decoder_cast_after_load():
    with pytest.raises(ValueError, match="precision recipe is chosen at load"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu").to(torch.float16).decode(torch.randn(1, 24, 3, 2, 2))


def test_decode_refuses_the_meta_device():
    with pytest.raises(ValueError, match="meta device"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu").to("meta").decode(torch.randn(1, 24, 3, 2, 2))


# ---- paths named by a checkpoint ---------------------------------------------------------------------------------


def test_paths_named_by_a_checkpoint_stay_inside_it(tmp_path):
    model = tiny_copy(tmp_path)
    wrapper = model / "video_vae" / "config.json"
    wrapper.write_text(json.dumps({**json.loads(wrapper.read_text()), "source_path": "../../"}))
    with pytest.raises(CheckpointError, match="outside its folder"):
        load_checkpoint(model)


@pytest.mark.parametrize("name", ["../x.safetensors", "/etc/passwd"])
def test_a_diffusers_index_stays_inside_its_folder(layouts, tmp_path, name):
    folder = tmp_path / "vae"
    shutil.copytree(layouts["diffusers"], folder)
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {key: name for key in data["weight_map"]}
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="outside its folder"):
        load_checkpoint(folder)


def test_config_bounds_in_the_api():
    with pytest.raises(ValueError, match="num_layers must be a whole number from 1 to 1024"):
        H3DecoderConfig(num_layers=10**8)
