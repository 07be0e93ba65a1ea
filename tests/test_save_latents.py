"""save_latents writes what the command line reads: the latents, and the frame rate in the metadata."""

from __future__ import annotations

import os

import pytest
import torch
from repo import REPO
from safetensors.torch import load_file

from minimax_h3_vae import H3VideoDecoder, denormalize_latents, files, save_latents, to_uint8_frames
from minimax_h3_vae.command import main as cli_module
from minimax_h3_vae.latents import read_latents, read_latents_header


@pytest.mark.parametrize("batched", [False, True])
def test_round_trip_through_the_cli_reader(tmp_path, batched):
    z = torch.randn(1, 24, 3, 2, 3, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    path = save_latents(tmp_path / "latents.safetensors", z if batched else z[0], fps=24)
    header = read_latents_header(path)
    assert header.fps == 24.0 and header.shape == tuple(z.shape[1:])
    assert torch.equal(read_latents(header), z.float())
    assert read_latents_header(save_latents(tmp_path / "no_fps.safetensors", z)).fps is None


def test_cli_decodes_the_saved_file(tmp_path, no_network, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")
    tiny = REPO / "examples" / "tiny_h3_vae"
    z = torch.randn(24, 3, 2, 3, generator=torch.Generator().manual_seed(1))
    source = save_latents(tmp_path / "in.safetensors", z, fps=12.5)
    out = tmp_path / "out.safetensors"
    assert cli_module.main([str(source), str(out), "--model", str(tiny), "--device", "cpu"]) == 0
    model = H3VideoDecoder.from_pretrained(tiny, device="cpu", fused=False)
    expected = to_uint8_frames(model.decode(denormalize_latents(z[None], model.config)))
    assert torch.equal(load_file(str(out))["video"], expected)


@pytest.mark.parametrize(
    "latents, fps, message",
    [
        (torch.zeros(2, 24, 3, 2, 2), None, "one video"),
        (torch.zeros(24, 2, 2), None, "one video"),
        (torch.full((24, 3, 2, 2), float("nan")), None, "NaN"),
        (torch.zeros(24, 3, 2, 2), 0, "fps"),
        (torch.zeros(24, 3, 2, 2), "24", "fps"),
    ],
)
def test_bad_arguments(tmp_path, latents, fps, message):
    with pytest.raises(ValueError, match=message):
        save_latents(tmp_path / "x.safetensors", latents, fps=fps)
    assert not (tmp_path / "x.safetensors").exists()


def test_a_missing_folder_is_named(tmp_path):
    """Not a FileNotFoundError naming the hidden temporary file: the folder that is missing, and the fix."""
    with pytest.raises(ValueError, match=r"no_such_folder: the folder does not exist; create it first") as error:
        save_latents(tmp_path / "no_such_folder" / "z.safetensors", torch.zeros(24, 3, 2, 2))
    assert ".part" not in str(error.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["z.pt", "z", "z.safetensor", "z.latent"])
def test_a_name_not_ending_safetensors_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match=r"ending in \.safetensors.*z\.safetensors"):
        save_latents(tmp_path / name, torch.zeros(24, 3, 2, 2))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", [(16, 3, 2, 2), (1, 16, 3, 2, 2), (3, 24, 2, 2)])
def test_latents_that_are_not_h3s_24_channels_are_refused(tmp_path, shape):
    with pytest.raises(ValueError, match=f"latents have {shape[-4]} channels, the decoder takes 24"):
        save_latents(tmp_path / "z.safetensors", torch.zeros(shape))
    assert os.listdir(tmp_path) == []


def test_the_command_reads_a_comfyui_latent_file(tmp_path):
    """ComfyUI's SaveLatent file: `latent_tensor` (1, 24, T, h, w), normalised, beside an empty
    `latent_format_version_0`: the command decodes it as the same latents saved with save_latents."""
    from safetensors.torch import save_file

    z = torch.randn(1, 24, 3, 2, 2, generator=torch.Generator().manual_seed(3))
    comfy = tmp_path / "ComfyUI_00001_.latent"
    save_file({"latent_tensor": z, "latent_format_version_0": torch.tensor([])}, str(comfy))
    ours = save_latents(tmp_path / "z.safetensors", z)
    outputs = []
    for source in (comfy, ours):
        out = tmp_path / f"{source.stem}.out.safetensors"
        assert (
            cli_module.main(
                [str(source), str(out), "--model", str(REPO / "examples" / "tiny_h3_vae"), "--device", "cpu"]
            )
            == 0
        )
        outputs.append(load_file(str(out))["video"])
    assert torch.equal(outputs[0], outputs[1])
    batch = tmp_path / "batch.latent"
    save_file({"latent_tensor": torch.zeros(2, 24, 3, 2, 2), "latent_format_version_0": torch.tensor([])}, str(batch))
    with pytest.raises(ValueError, match="a batch of 2 videos"):
        read_latents_header(batch)


# ---- the file's mode and the frame rate's range --------------------------------------------------------------------


def test_save_latents_honours_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = save_latents(tmp_path / "z.safetensors", torch.zeros(24, 1, 1, 1))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


SET_UMASK = os.umask  # the test is the host: it sets the umask, even while os.umask is patched to fail


@pytest.mark.parametrize("from_proc", [True, False])
def test_new_file_mode_reads_the_umask_without_setting_it(tmp_path, monkeypatch, from_proc):
    """files.new_file_mode gives 0o666 less the process umask, for two umasks, from /proc/self/status or
    (where that is missing) from a probe file it removes again; os.umask is never called, since setting it
    even for an instant gives other threads' new files that mode. save_latents uses it: its new file's mode
    is still 0o666 less the umask."""
    if not from_proc:
        monkeypatch.setattr(files, "PROC_STATUS", tmp_path / "no-such-status")
    old = SET_UMASK(0o022)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(os, "umask", lambda mask: pytest.fail("os.umask was called"))
            for umask in (0o022, 0o077):
                SET_UMASK(umask)
                folder = tmp_path / f"u{umask:o}"
                folder.mkdir()
                assert files.new_file_mode(folder) == 0o666 & ~umask
                path = save_latents(folder / "z.safetensors", torch.zeros(24, 1, 1, 1))
                assert path.stat().st_mode & 0o777 == 0o666 & ~umask
                assert sorted(p.name for p in folder.iterdir()) == ["z.safetensors"]  # no probe left
    finally:
        SET_UMASK(old)


def test_save_latents_refuses_a_huge_fps(tmp_path):
    with pytest.raises(ValueError, match="fps must be a frame rate between 0.01 and 1000"):
        save_latents(tmp_path / "y.safetensors", torch.zeros(24, 1, 1, 1), fps=10**400)
