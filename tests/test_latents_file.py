"""The latents file: what `save_latents` writes, what `load_latents` and the command read, and the
files they refuse, each with the reason. Headers are written by hand here where a case needs a dtype or a
layout that torch cannot save."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from repo import TINY
from safetensors.torch import save_file

from minimax_h3_vae import load_latents, save_latents
from minimax_h3_vae.command import main as cli
from minimax_h3_vae.latents import read_latents, read_latents_header


@pytest.fixture(autouse=True)
def offline(no_network, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")


def latents(seed: int = 0, shape=(24, 3, 2, 2)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def write_raw(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata=None) -> Path:
    """A safetensors file from (dtype name, shape, bytes) per tensor, in order, as the format lays it out."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def f32(z: torch.Tensor) -> tuple[str, list[int], bytes]:
    return "F32", list(z.shape), z.contiguous().numpy().tobytes()


def decode(capsys, source: Path, out: Path, *flags) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main([str(source), str(out), "--model", str(TINY), "--device", "cpu", *map(str, flags)])
    return code, capsys.readouterr().err


# ---- numbers in a file are read as strictly as the flags -----------------------------------------------------------


@pytest.mark.parametrize("fps", ["2_4", "24_0", " 24", "24\n", "\u0662\u0664", "infinity", "nan", "1e999", "0x18"])
def test_metadata_fps_is_read_strictly(tmp_path, fps):
    """Python's float() reads "2_4" as 24 and "24_0" as 240 (ten times the rate meant), Arabic-Indic digits,
    padded text; the file's fps is read as the --fps flag is: digits only."""
    path = tmp_path / "z.safetensors"
    save_file({"latents": latents()}, str(path), metadata={"fps": fps})
    with pytest.raises(ValueError, match="metadata fps=.* is not a positive number written in digits"):
        read_latents_header(path)


@pytest.mark.parametrize("fps, value", [("24", 24.0), ("23.976", 23.976), ("+30", 30.0), ("2.5e1", 25.0), (".5", 0.5)])
def test_metadata_fps_in_digits_is_read(tmp_path, fps, value):
    path = tmp_path / "z.safetensors"
    save_file({"latents": latents()}, str(path), metadata={"fps": fps})
    assert read_latents_header(path).fps == value


# ---- tensors we do not read are ignored, whatever their dtype ------------------------------------------------------

# Every dtype of the safetensors format that torch cannot write or we do not read: (name, bytes for 4 values).
OTHER_DTYPES = {"U16": 8, "U32": 16, "U64": 32, "C64": 32, "F8_E8M0": 4, "F4": 2, "F6_E2M3": 3, "I16": 8, "BOOL": 4}


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_a_tensor_of_another_dtype_beside_the_latents_is_ignored(tmp_path, dtype):
    z = latents(1)
    path = write_raw(tmp_path / "z.safetensors", {"extra": (dtype, [4], bytes(OTHER_DTYPES[dtype])), "latents": f32(z)})
    header = read_latents_header(path)
    assert header.key == "latents" and header.shape == (24, 3, 2, 2)
    assert torch.equal(read_latents(header), z[None])


@pytest.mark.parametrize("dtype, name", [("U16", "uint16"), ("U32", "uint32"), ("C64", "complex64"), ("F4", "F4")])
def test_latents_of_a_dtype_we_do_not_take_name_it(tmp_path, dtype, name):
    count = 24 * 3 * 2 * 2
    size = {"U16": 2, "U32": 4, "C64": 8}.get(dtype, 0.5)
    path = write_raw(tmp_path / "z.safetensors", {"latents": (dtype, [24, 3, 2, 2], bytes(int(count * size)))})
    with pytest.raises(ValueError, match=f"latents must be floating point, got {name} "):
        read_latents_header(path)


# ---- a ComfyUI .latent without its version marker ------------------------------------------------------------------


def test_comfyui_latent_without_its_version_marker_is_refused(capsys, tmp_path):
    """ComfyUI's Load Latent (nodes.py, LoadLatent.load) scales a file without `latent_format_version_0` by
    1 / 0.18215; decoding it unscaled would give another video than ComfyUI does, so it is refused, saying so."""
    path = tmp_path / "old.latent"
    save_file({"latent_tensor": latents(2)[None]}, str(path))
    with pytest.raises(ValueError, match="latent_format_version_0.*1/0.18215"):
        read_latents_header(path)
    code, err = decode(capsys, path, tmp_path / "v.safetensors")
    assert code == 2 and "0.18215" in err.splitlines()[-1]
    assert not (tmp_path / "v.safetensors").exists()


def test_comfyui_latent_with_its_marker_reads_as_saved(tmp_path):
    z = latents(3)[None]
    path = tmp_path / "new.latent"
    save_file({"latent_tensor": z, "latent_format_version_0": torch.tensor([])}, str(path))
    got, fps, audio = load_latents(path)
    assert torch.equal(got, z) and fps is None and audio is None


# ---- save_latents keeps the mode, takes real numbers, refuses what the command refuses -----------------------------


def test_save_latents_keeps_an_existing_files_mode(tmp_path):
    path = tmp_path / "z.safetensors"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    save_latents(path, latents(4), fps=24)
    assert path.stat().st_mode & 0o7777 == 0o600
    assert torch.equal(load_latents(path)[0], latents(4)[None])


@pytest.mark.parametrize("fps", [np.float32(24), np.float64(23.976), np.int64(30), 12, 12.5])
def test_save_latents_takes_any_real_number(tmp_path, fps):
    path = save_latents(tmp_path / "z.safetensors", latents(5), fps=fps)
    assert load_latents(path)[1] == pytest.approx(float(fps))


@pytest.mark.parametrize("fps", [5000, 0.001, float("inf"), float("nan"), -24, "24", True, 10**400])
def test_save_latents_refuses_an_fps_the_command_refuses(tmp_path, fps):
    path = tmp_path / "z.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="fps must be"):
        save_latents(path, latents(6), fps=fps)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["z.safetensors"]


def test_save_latents_fps_bounds_are_the_commands(capsys, tmp_path):
    """The largest fps save_latents writes, the command decodes to an mp4."""
    path = save_latents(tmp_path / "z.safetensors", latents(7), fps=1000)
    code, err = decode(capsys, path, tmp_path / "v.mp4")
    assert code == 0, err


# ---- what a new user tripped on ------------------------------------------------------------------------------------


def test_load_latents_is_public_and_reads_what_save_latents_wrote(tmp_path):
    import minimax_h3_vae

    assert "load_latents" in minimax_h3_vae.__all__
    z = latents(8).to(torch.bfloat16)
    got, fps, audio = load_latents(save_latents(tmp_path / "z.safetensors", z[None], fps=12.5))
    assert got.dtype == torch.float32 and torch.equal(got, z.float()[None]) and fps == 12.5 and audio is None
    with pytest.raises(ValueError, match="no such file"):
        load_latents(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("kind", ["pickle", "zip", "text"])
def test_a_file_that_is_not_safetensors_says_so(capsys, tmp_path, kind):
    path = tmp_path / "z.safetensors"
    if kind == "text":
        path.write_text("latents = [[0.1, 0.2]]\n" * 20)
    else:
        torch.save({"latents": latents(9)}, path, _use_new_zipfile_serialization=kind == "zip")
    with pytest.raises(ValueError, match="not a safetensors file") as error:
        load_latents(path)
    assert "header of" not in str(error.value)
    code, err = decode(capsys, path, tmp_path / "v.safetensors")
    assert code == 2 and "z.safetensors: not a safetensors file" in err.splitlines()[-1]


def test_latents_stored_frames_first_are_named_swapped(capsys, tmp_path):
    """(T, 24, h, w): the message gives the expected layout and says the axes look swapped."""
    path = tmp_path / "z.safetensors"
    save_file({"latents": latents(10, (7, 24, 2, 2))}, str(path))
    code, err = decode(capsys, path, tmp_path / "v.safetensors")
    line = err.splitlines()[-1]
    assert code == 2 and "have 7 channels" in line and "expected (24, T, h, w)" in line, line
    assert "axes look swapped" in line and "(T, C, h, w)" in line
    from minimax_h3_vae.latents import check_latents

    with pytest.raises(ValueError, match="axes look swapped"):
        check_latents(latents(10, (1, 7, 24, 2, 2)), channels=24)
