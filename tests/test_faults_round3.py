"""Nothing lost, round 3: one test per defect the third hostile trial found (issue 18's table, rows 1-16).
S = latents (24, 3, 4, 4); the checkpoint is a copy of examples/tiny_h3_vae."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_cli_faults import SCRIPT, TINY, latents_file, one_error_line, run_cli, tree

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, comfyui, save_latents
from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, PATH_CHOICE
from minimax_h3_vae.loading import CheckpointError, load_checkpoint


@pytest.fixture(autouse=True)
def offline(no_network, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")


def small(tmp_path: Path, value=None, dtype=torch.float32) -> Path:
    z = torch.randn(24, 3, 4, 4, generator=torch.Generator().manual_seed(0)) if value is None else value
    return latents_file(tmp_path / "s.safetensors", z.to(dtype))


def model_copy(tmp_path: Path) -> Path:
    shutil.copytree(TINY, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def comfy_file(tmp_path: Path, **extra) -> Path:
    """The tiny decoder's tensors as one ComfyUI-style file, plus `extra` tensors."""
    tensors = load_file(str(TINY / "video_vae" / "source" / "model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if k.startswith(("decoder.", "post_quant_conv."))}
    path = tmp_path / "comfy.safetensors"
    save_file({**tensors, **extra}, str(path))
    return path


def refused(capsys, *args) -> str:
    code, err = run_cli(capsys, *args)
    assert code == 2, err
    return one_error_line(err)


# ---- 1, 11: ranks from the environment ----------------------------------------------------------------------


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"RANK": "3", "WORLD_SIZE": "1"}])
def test_1_stray_rank_is_one_process(capsys, tmp_path, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if "WORLD_SIZE" not in env:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "o.safetensors"
    code, err = run_cli(capsys, small(tmp_path), out)
    assert code == 0 and out.is_file(), err


@pytest.mark.parametrize(
    "env, name",
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE"),
    ],
)
def test_11_bad_rank_variables(capsys, tmp_path, monkeypatch, env, name):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    line = refused(capsys, small(tmp_path), tmp_path / "o.safetensors")
    assert name in line and "torchrun" in line
    assert tree(tmp_path) == {"s.safetensors"}


# ---- 2, 3, 4, 6, 12: malicious checkpoints and configs ----------------------------------------------------


def test_2_a_huge_block_index_is_refused_at_once(capsys, tmp_path):
    path = comfy_file(tmp_path, **{"decoder.transformer_blocks.100000000.norm1.weight": torch.ones(128)})
    with pytest.raises(CheckpointError, match="do not follow on from blocks 0..1"):
        H3VideoDecoder.from_pretrained(path, device="cpu")
    assert "do not follow on" in refused(capsys, small(tmp_path), tmp_path / "o.mp4", "--model", path)


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
def test_3_config_numbers_are_bounded(capsys, tmp_path, edit, words):
    model = model_copy(tmp_path)
    wrapper = model / "video_vae" / "config.json"
    wrapper.write_text(json.dumps({**json.loads(wrapper.read_text()), **edit}))
    assert words in refused(capsys, small(tmp_path), tmp_path / "o.mp4", "--model", model)


@pytest.mark.parametrize("kind", ["zero", "fifo"])
def test_4_config_that_is_not_a_regular_file(capsys, tmp_path, kind):
    model = model_copy(tmp_path)
    config = model / "video_vae" / "source" / "config.json"
    config.unlink()
    if kind == "zero":
        config.symlink_to("/dev/zero")
    else:
        os.mkfifo(config)
    assert "is not a regular file" in refused(capsys, small(tmp_path), tmp_path / "o.mp4", "--model", model)


def test_4_an_oversized_config_is_refused(capsys, tmp_path):
    model = model_copy(tmp_path)
    with open(model / "video_vae" / "source" / "config.json", "a") as f:
        f.truncate(17 * 2**20)
    assert "not a config" in refused(capsys, small(tmp_path), tmp_path / "o.mp4", "--model", model)


def test_5_out_of_range_latents(capsys, tmp_path):
    out = tmp_path / "o.safetensors"
    line = refused(capsys, small(tmp_path, torch.full((24, 3, 4, 4), 1e30)), out)
    assert "beyond +-10000" in line and not out.exists()
    z = torch.randn(1, 24, 3, 4, 4, dtype=torch.float64)
    z[0, 0, 0, 0, 0] = 1e300
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    with pytest.raises(ValueError, match="beyond"):
        model.decode(z)


def test_5_nan_frames_are_never_written(capsys, tmp_path, monkeypatch):
    """A decode that yields NaN (here: weights made NaN) fails the run; no file appears."""
    real = H3VideoDecoder.decode_stream

    def poisoned(self, z, progress=None, **options):
        for chunk in real(self, z, progress, **options):
            yield torch.full_like(chunk, float("nan"))

    monkeypatch.setattr(H3VideoDecoder, "decode_stream", poisoned)
    out = tmp_path / "o.mp4"
    code, err = run_cli(capsys, small(tmp_path), out)
    assert code == 1 and "NaN or Inf" in one_error_line(err)
    assert tree(tmp_path) == {"s.safetensors"}


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_6_non_float_weights_are_refused(capsys, tmp_path, dtype):
    tensors = load_file(str(TINY / "video_vae" / "source" / "model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if k.startswith(("decoder.", "post_quant_conv."))}
    for key, value in tensors.items():
        if value.ndim == 2 and ".transformer_blocks." in key:
            tensors[key] = value.to(dtype)
    path = tmp_path / "q.safetensors"
    save_file(tensors, str(path))
    assert "not floating point" in refused(capsys, small(tmp_path), tmp_path / "o.mp4", "--model", path)


# ---- 7, 8: shared state ---------------------------------------------------------------------------------------
# Row 7 (a swapped VAE decoding in two threads) is tests/test_doors.py::test_swapped_vae_decodes_in_two_threads.


def test_8_comfyui_cache_sees_a_rewritten_file(tmp_path):
    model = model_copy(tmp_path)
    loader = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]()
    comfyui._cache.clear()
    (first,) = loader.load(PATH_CHOICE, str(model), "off", 0)
    weights = model / "video_vae" / "source" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["decoder.proj_out.bias"] = tensors["decoder.proj_out.bias"] + 1
    save_file(tensors, str(weights) + ".new")
    os.replace(str(weights) + ".new", weights)  # same name, same size, another file
    (second,) = loader.load(PATH_CHOICE, str(model), "off", 0)
    comfyui._cache.clear()
    assert second.decoder is not first.decoder
    assert torch.equal(second.decoder.decoder.proj_out.bias, first.decoder.decoder.proj_out.bias + 1)


# ---- 9, 10, 13, 14: litter, signals, closed streams, late failures ---------------------------------------------


def test_9_no_temporary_folder_leaves_no_litter(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent")
    out = tmp_path / "out" / "o.mp4"
    out.parent.mkdir()
    code, err = run_cli(capsys, small(tmp_path), out)
    assert code == 0, err
    assert tree(out.parent) == {"o.mp4"}


def run_script(tmp_path: Path, *args, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MINIMAX_H3_VAE_FUSED": "0"}
    command = [sys.executable, str(SCRIPT), *map(str, args), "--model", str(TINY), "--device", "cpu"]
    return subprocess.run(command, env=env, timeout=120, **popen)


@pytest.mark.parametrize("stderr", ["closed", "full", "head"])
def test_13_diagnostics_never_cost_the_output(tmp_path, stderr):
    latents, out = small(tmp_path), tmp_path / "o.mp4"
    if stderr == "closed":
        result = run_script(tmp_path, latents, out, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    elif stderr == "full":
        with open("/dev/full", "w") as full:
            result = run_script(tmp_path, latents, out, stderr=full)
    else:  # 2>&1 | head -1: the reader goes away after one line
        command = f"{sys.executable} {SCRIPT} {latents} {out} --model {TINY} --device cpu 2>&1 | head -1"
        result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, timeout=120)
        result.returncode = 0 if out.is_file() else 1
    assert result.returncode == 0 and out.is_file()


def test_14_symlink_loop_and_a_frame_size_x264_refuses(capsys, tmp_path):
    loop = tmp_path / "loop.mp4"
    loop.symlink_to(loop)
    assert "symbolic link loop" in refused(capsys, small(tmp_path), loop)
    wide = latents_file(tmp_path / "wide.safetensors", torch.randn(24, 3, 1, 1250))  # 20000 x 16 px
    line = refused(capsys, wide, tmp_path / "wide.mp4")
    assert "ffmpeg cannot encode 20000x16" in line and tree(tmp_path) == {
        "s.safetensors",
        "loop.mp4",
        "wide.safetensors",
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_14_another_users_file_in_a_sticky_folder(capsys, tmp_path, monkeypatch):
    """In a sticky folder (like /tmp) only the file's owner may replace it: the command, run as a third
    user (its effective uid faked), refuses before decoding instead of failing at the rename."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    out = sticky / "o.mp4"
    out.write_bytes(b"theirs")
    os.chown(out, 12345, 12345)
    monkeypatch.setattr(os, "geteuid", lambda: 23456)
    assert "belongs to another user in a sticky folder" in refused(capsys, small(tmp_path), out)
    assert out.read_bytes() == b"theirs" and tree(sticky) == {"o.mp4"}


def test_symlink_out_is_written_through(capsys, tmp_path):
    """Decided: an OUT that is a symbolic link is written through, as cp does: the link stays, its target
    gets the video."""
    target = tmp_path / "real.safetensors"
    target.write_bytes(b"old")
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    code, err = run_cli(capsys, small(tmp_path), link)
    assert code == 0, err
    assert link.is_symlink() and load_file(str(target))["video"].shape[0] == 9


# ---- 15: the API -------------------------------------------------------------------------------------------


def test_15_api_refusals():
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    z = torch.randn(1, 24, 3, 2, 2)
    with pytest.raises(ValueError, match="output_rank 3: there are 1 process"):
        model.decode(z, output_rank=3)
    with pytest.raises(ValueError, match="read-only"):
        model.runtime = None
    with pytest.raises(ValueError, match="precision recipe is chosen at load"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu").to(torch.float16).decode(z)
    with pytest.raises(ValueError, match="meta device"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu").to("meta").decode(z)


# ---- 16: the small ones ----------------------------------------------------------------------------------------


def test_16_messages(capsys, tmp_path):
    latents = small(tmp_path)
    assert "got 1000.0001" in refused(capsys, latents, tmp_path / "o.mp4", "--fps", "1000.0001")
    assert "no name before its extension" in refused(capsys, latents, tmp_path / ".mp4")
    assert "max-gpu-memory" in refused(capsys, latents, tmp_path / "o.mp4", "--max-gpu-memory", "1e-300")


def test_16_save_latents_honours_umask_and_refuses_a_huge_fps(tmp_path):
    old = os.umask(0o022)
    try:
        path = save_latents(tmp_path / "z.safetensors", torch.zeros(24, 1, 1, 1))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    with pytest.raises(ValueError, match="fps must be a frame rate between 0.01 and 1000"):
        save_latents(tmp_path / "y.safetensors", torch.zeros(24, 1, 1, 1), fps=10**400)


def test_16_paths_named_by_a_checkpoint_stay_inside_it(tmp_path):
    model = model_copy(tmp_path)
    wrapper = model / "video_vae" / "config.json"
    wrapper.write_text(json.dumps({**json.loads(wrapper.read_text()), "source_path": "../../"}))
    with pytest.raises(CheckpointError, match="outside its folder"):
        load_checkpoint(model)


@pytest.mark.parametrize("name", ["../x.safetensors", "/etc/passwd"])
def test_16_diffusers_index_stays_inside(layouts, tmp_path, name):
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


def test_signals_handled_are_every_catchable_terminating_one():
    from minimax_h3_vae.command.report import STOP_SIGNALS

    assert {signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM, signal.SIGXCPU} <= set(STOP_SIGNALS)


def test_16_the_ops_line_names_what_runs(capsys, tmp_path, monkeypatch):
    """MINIMAX_H3_VAE_FUSED=1 where no kernel can run (the CPU without the Triton interpreter): the line says
    eager, as the decode runs, not fused."""
    from minimax_h3_vae import fused
    from minimax_h3_vae.blocks import EAGER_OPS

    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    monkeypatch.setattr(fused, "select_ops", lambda *args: EAGER_OPS)
    code, err = run_cli(capsys, small(tmp_path), tmp_path / "o.safetensors")
    assert code == 0 and "eager ops" in err and "fused ops" not in err
