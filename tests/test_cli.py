"""The `minimax-h3-decode` command (minimax_h3_vae/command/): end to end, flags, and its contract on bad input
(exit 2, one 'error:' line, nothing written) and on failure (nothing written, no temporary file left, an
existing output kept)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from command_runs import latents_file, one_error_line, run_cli_or_parser, stream_seconds, streams, tree
from repo import EXAMPLE_LATENTS, REPO, SCRIPT, TINY
from safetensors.torch import load_file

from minimax_h3_vae import H3VideoDecoder, denormalize_latents, to_uint8_frames
from minimax_h3_vae.command import mux, readback
from minimax_h3_vae.command.writer import BackgroundWriter
from minimax_h3_vae.latents import read_latents_header


@pytest.fixture(scope="module")
def tiny_model():
    return H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False)


@pytest.fixture(autouse=True)
def offline(no_network, monkeypatch):
    """The CLI defaults to a hub repo id: nothing here may reach the network; eager unless a test says."""
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")


def random_latents(seed=0, frames=3) -> torch.Tensor:
    return torch.randn(24, frames, 2, 2, generator=torch.Generator().manual_seed(seed))


# ---- end to end ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_frames(tiny_model) -> torch.Tensor:
    """What the example latents must decode to: (39, 256, 320, 3) uint8, computed through the library."""
    z = load_file(str(EXAMPLE_LATENTS))["latents"][None]
    return to_uint8_frames(tiny_model.decode(denormalize_latents(z, tiny_model.config)))


@pytest.fixture(scope="module")
def example_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The README's first command, the one real run of the script: the shipped example latents (39 frames at 24
    fps, 65 audio latents) to an mp4 with the tiny checkpoint. Its result, and the folder it ran in."""
    folder = tmp_path_factory.mktemp("example")
    # The script must find the package by itself: the repo is taken off PYTHONPATH (other entries stay).
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MINIMAX_H3_VAE_FUSED": "0", "PYTHONPATH": os.pathsep.join(path)}
    out = folder / "video.mp4"
    command = [sys.executable, str(SCRIPT), str(EXAMPLE_LATENTS), str(out), "--model", str(TINY), "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=folder, env=env, timeout=300)
    return result, folder


@pytest.mark.xdist_group("example_run")
def test_example_to_mp4_subprocess(example_run, example_frames):
    """The script's exit code, its stderr, and the frames of the mp4 it writes."""
    result, folder = example_run
    out = folder / "video.mp4"
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "error:" not in result.stderr
    assert f"device cpu, fp32, eager ops; checkpoint {TINY}" in result.stderr
    assert "latents (24, 12, 16, 20) -> 39 frames of 320x256 at 24 fps" in result.stderr
    assert re.search(
        r"^wrote .*video\.mp4: 39 frames with 1\.625 s of sound \(decoded in \d+\.\d s, before\) in \d+\.\d s "
        r"\(\d+\.\d\d frames/s; first chunk after "
        r"\d+\.\d s, "
        r"one-time kernel set-up included\)$",
        result.stderr,
        re.M,
    )
    assert tree(folder) == {"video.mp4"}
    # The sound's bar, from its first report (0 of the 21 AMP blocks) to the last, before the video's tiles.
    assert re.search(r"sound:\s+0%.*\| 0/21 ", result.stderr) and re.search(r"sound: 100%.*\| 21/21 ", result.stderr)
    assert result.stderr.index("sound: 100%") < result.stderr.index("decoding:")

    frames = iio.imread(out)
    assert frames.shape == (39, 256, 320, 3) and frames.dtype == np.uint8
    meta = iio.immeta(out)
    assert meta["fps"] == pytest.approx(24.0)
    assert meta.get("codec") == "h264"
    # lossy (and chroma is subsampled), so compare luma: close to the right frames, far from the same
    # frames in reverse order
    luma = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    got, ref = frames.astype(np.float32) @ luma, example_frames.numpy().astype(np.float32) @ luma
    error, reversed_error = np.abs(got - ref).mean(), np.abs(got - ref[::-1]).mean()
    assert error < 8 and error < 0.25 * reversed_error, (error, reversed_error)


@pytest.mark.xdist_group("example_run")
def test_the_example_mp4_has_tagged_video_and_its_sound(example_run):
    """One H.264 stream tagged bt709 and one AAC stream, 32 kHz stereo, as ffmpeg reads them; both last 1.625 s,
    within one AAC frame."""
    header = read_latents_header(EXAMPLE_LATENTS)
    assert header.audio.shape == (2, 32, 65) and header.audio.sample_rate == 32000 and header.fps == 24
    result, folder = example_run
    out = folder / "video.mp4"
    assert result.returncode == 0, result.stderr
    video, audio = streams(out)
    assert "Video: h264" in video and "yuv420p(tv, bt709, progressive, left)" in video and "24 fps" in video
    assert "Audio: aac (LC)" in audio and "32000 Hz, stereo" in audio
    assert stream_seconds(out, "0:v:0") == pytest.approx(39 / 24)
    assert abs(stream_seconds(out, "0:a:0") - 39 / 24) < 1024 / 32000
    assert readback.read_back(out) == (39, 65 * 800)


def test_console_script_is_installed_and_runs(tmp_path):
    """`minimax-h3-decode` is the package's console script; where the package is installed, it runs from
    any folder."""
    from importlib.metadata import PackageNotFoundError, distribution, entry_points

    try:
        distribution("minimax-h3-vae")
    except PackageNotFoundError:
        pytest.skip("the package is imported from a source tree, not installed: no console script")
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("minimax-h3-decode") == "minimax_h3_vae.command.console:console_main"
    command = shutil.which("minimax-h3-decode", path=str(Path(sys.executable).parent))
    assert command, "the console script is not beside this Python"
    result = subprocess.run([command, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: minimax-h3-decode ")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", [["--dtype", "fp32", "--eager"], []], ids=["fp32_eager", "default_fp16"])
def test_example_on_cuda(capsys, tmp_path, example_frames, recipe):
    """On CUDA the command defaults to the fp16 recipe (fused where Triton is present). Its frames are those
    of the CPU fp32 decode up to rounding: fp32 within 1 level, the fp16 recipe within a few levels."""
    out = tmp_path / "frames.safetensors"
    code, err = run_cli_or_parser(capsys, EXAMPLE_LATENTS, out, "--model", TINY, "--device", "cuda", *recipe)
    assert code == 0, err
    assert "device cuda" in err and ("fp32" in err if recipe else "fp16 (release recipe)" in err)
    frames = load_file(str(out))["video"]
    diff = (frames.int() - example_frames.int()).abs()
    assert diff.max() <= (1 if recipe else 6), diff.max()
    assert diff.float().mean() < 0.5


def test_example_to_safetensors(capsys, tmp_path, example_frames):
    out = tmp_path / "frames.safetensors"
    code, err = run_cli_or_parser(capsys, EXAMPLE_LATENTS, out, "--model", TINY)
    assert code == 0, err
    video = load_file(str(out))
    assert list(video) == ["audio", "video"]  # the example carries sound (tests/test_sound_output.py)
    assert video["video"].dtype == torch.uint8
    assert video["video"].shape == (39, 256, 320, 3)
    assert torch.equal(video["video"], example_frames)
    assert tree(tmp_path) == {"frames.safetensors"}


def decode_reference(model, z: torch.Tensor, raw: bool) -> torch.Tensor:
    z = z if z.ndim == 5 else z[None]
    return to_uint8_frames(model.decode(z if raw else denormalize_latents(z, model.config)))


def test_raw_latents(capsys, tmp_path, tiny_model):
    z = random_latents(1)
    latents = latents_file(tmp_path / "z.safetensors", z)
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "raw.safetensors", "--model", TINY, "--raw-latents")
    assert code == 0, err
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "norm.safetensors", "--model", TINY)
    assert code == 0, err
    raw = load_file(str(tmp_path / "raw.safetensors"))["video"]
    norm = load_file(str(tmp_path / "norm.safetensors"))["video"]
    assert raw.shape == norm.shape == (9, 32, 32, 3)
    assert not torch.equal(raw, norm)
    assert torch.equal(raw, decode_reference(tiny_model, z, raw=True))
    assert torch.equal(norm, decode_reference(tiny_model, z, raw=False))


@pytest.mark.parametrize("layout", ["5d", "other_name", "among_others", "fp16", "fp64"])
def test_accepted_latent_files(capsys, tmp_path, tiny_model, layout):
    z = random_latents(2)
    tensors = {
        "5d": {"latents": z[None]},
        "other_name": {"z_0": z},
        "among_others": {"latents": z, "text_embeds": torch.zeros(3, 7)},
        "fp16": {"latents": z.half()},
        "fp64": {"latents": z.double()},
    }[layout]
    latents = latents_file(tmp_path / "in.safetensors", tensors)
    out = tmp_path / "out.safetensors"
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY)
    assert code == 0, err
    expected_z = z.half().float() if layout == "fp16" else z
    assert torch.equal(load_file(str(out))["video"], decode_reference(tiny_model, expected_z, raw=False))


@pytest.mark.parametrize(
    "metadata, flag, fps",
    [
        ({"fps": "12"}, [], 12.0),
        ({"fps": "12"}, ["--fps", "30"], 30.0),
        (None, [], 24.0),
        (None, ["--fps", "8.5"], 8.5),
    ],
)
def test_fps(capsys, tmp_path, metadata, flag, fps):
    latents = latents_file(tmp_path / "z.safetensors", random_latents(3), metadata=metadata)
    out = tmp_path / "out.mp4"
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY, *flag)
    assert code == 0, err
    assert f"at {fps:g} fps" in err
    assert iio.immeta(out)["fps"] == pytest.approx(fps)
    assert iio.imread(out).shape == (9, 32, 32, 3)


def test_summary_and_setup_lines(capsys, tmp_path):
    latents = latents_file(tmp_path / "z.safetensors", random_latents(4, frames=7))
    out = tmp_path / "out.safetensors"
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY, "--device", "cpu", "--eager")
    assert code == 0, err
    assert f"device cpu, fp32, eager ops; checkpoint {TINY}" in err
    assert "latents (24, 7, 2, 2) -> 22 frames of 32x32 at 24 fps" in err
    match = re.search(
        r"^wrote (.+): (\d+) frames in (\d+\.\d) s \((\d+\.\d\d) frames/s; first chunk after \d+\.\d s[^)]*\)$",
        err,
        re.M,
    )
    assert match, err
    assert match.group(1) == str(out) and match.group(2) == "22"
    assert load_file(str(out))["video"].shape[0] == 22
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY, "--dtype", "fp16", "--tile-batch", "1")
    assert code == 0, err
    assert "device cpu, fp16 (release recipe), eager ops" in err


def test_tile_batch_does_not_change_the_frames(capsys, tmp_path):
    z = torch.randn(24, 3, 20, 2, generator=torch.Generator().manual_seed(5))  # 320 px high: 2 tiles
    latents = latents_file(tmp_path / "z.safetensors", z)
    results = []
    for batch in ([], ["--tile-batch", "1"]):
        out = tmp_path / f"out{len(results)}.safetensors"
        code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY, *batch)
        assert code == 0, err
        results.append(load_file(str(out))["video"])
    assert results[0].shape == (9, 320, 32, 3)
    # float32 GEMMs over 1 or 2 tiles may round differently: at most one level, on a few pixels
    diff = (results[0].int() - results[1].int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3


# ---- bad input: exit 2, one error line, nothing written -------------------------------------------------


def _bad_latents(tensors, metadata=None):
    def make(tmp_path):
        return [latents_file(tmp_path / "in.safetensors", tensors, metadata), tmp_path / "out" / "video.mp4"]

    return make


def _nan():
    z = random_latents()
    z[3, 1, 0, 1] = float("nan")
    return z


def _inf():
    z = random_latents()
    z[0, 0, 1, 1] = -float("inf")
    return z


def _missing_input(tmp_path):
    return [tmp_path / "missing.safetensors", tmp_path / "out" / "video.mp4"]


def _not_safetensors(tmp_path):
    path = tmp_path / "in.safetensors"
    path.write_bytes(b"\x89PNG\r\n\x1a\n not latents at all" * 10)
    return [path, tmp_path / "out" / "video.mp4"]


def _unknown_extension(tmp_path):
    return [_bad_latents(random_latents())(tmp_path)[0], tmp_path / "out" / "video.avi"]


def _missing_output_folder(tmp_path):
    return [_bad_latents(random_latents())(tmp_path)[0], tmp_path / "out" / "missing" / "video.mp4"]


def _output_is_folder(tmp_path):
    (tmp_path / "out" / "video.mp4").mkdir()
    return [_bad_latents(random_latents())(tmp_path)[0], tmp_path / "out" / "video.mp4"]


def _truncated_checkpoint(tmp_path):
    model = tmp_path / "ckpt"
    shutil.copytree(TINY, model)
    weights = model / "video_vae" / "source" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    return [*_bad_latents(random_latents())(tmp_path), "--model", model]


def _missing_checkpoint(tmp_path):
    return [*_bad_latents(random_latents())(tmp_path), "--model", tmp_path / "no_such_checkpoint"]


def _flag(*flags):
    def make(tmp_path):
        return [*_bad_latents(random_latents())(tmp_path), *flags]

    return make


def _fps_metadata(value):
    return _bad_latents(random_latents(), {"fps": value})


BAD_INPUTS = {
    "16_channels": _bad_latents(torch.randn(16, 3, 2, 2)),
    "3d_tensor": _bad_latents(torch.randn(24, 3, 2)),
    "6d_tensor": _bad_latents(torch.randn(1, 1, 24, 3, 2, 2)),
    "batch_of_2": _bad_latents(torch.randn(2, 24, 3, 2, 2)),
    "nan": _bad_latents(_nan()),
    "inf": _bad_latents(_inf()),
    "int_latents": _bad_latents(torch.randint(0, 5, (24, 3, 2, 2))),
    "bool_latents": _bad_latents(torch.ones(24, 3, 2, 2, dtype=torch.bool)),
    "missing_input": _missing_input,
    "not_safetensors": _not_safetensors,
    "two_tensors_no_latents": _bad_latents({"a": random_latents(), "b": random_latents(1)}),
    "fps_metadata_not_a_number": _fps_metadata("fast"),
    "unknown_extension": _unknown_extension,
    "missing_output_folder": _missing_output_folder,
    "output_is_a_folder": _output_is_folder,
    "truncated_checkpoint": _truncated_checkpoint,
    "missing_checkpoint": _missing_checkpoint,
    "device_cuda": _flag("--device", "cuda"),
    "tile_batch_0": _flag("--tile-batch", "0"),
    "tile_batch_negative": _flag("--tile-batch", "-3"),
    "fps_0": _flag("--fps", "0"),
    "fps_negative": _flag("--fps", "-24"),
    "fps_nan": _flag("--fps", "nan"),
    "fps_inf": _flag("--fps", "inf"),
}

BAD_INPUTS.update(
    {
        "fps_metadata_negative": _fps_metadata("-5"),
        "fps_metadata_nan": _fps_metadata("nan"),
        "fps_metadata_inf": _fps_metadata("inf"),
        "fps_metadata_zero": _fps_metadata("0"),
        "zero_frames": _bad_latents(torch.randn(24, 0, 2, 2)),
        "zero_height": _bad_latents(torch.randn(24, 3, 0, 2)),
        "revision_of_a_local_checkpoint": _flag("--revision", "main"),
    }
)


@pytest.mark.parametrize("make", BAD_INPUTS.values(), ids=BAD_INPUTS)
def test_bad_input(capsys, tmp_path, make):
    (tmp_path / "out").mkdir()
    args = make(tmp_path)
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("CUDA is available")
    if "--model" not in [str(a) for a in args]:
        args += ["--model", TINY]
    before = tree(tmp_path)
    code, err = run_cli_or_parser(capsys, *args)
    assert code == 2, err
    one_error_line(err)
    assert not Path(args[1]).is_file()
    assert tree(tmp_path) == before  # no output, no temporary file anywhere


def test_bad_input_messages(capsys, tmp_path):
    """A few messages say what is wrong, not only that something is."""
    (tmp_path / "out").mkdir()
    cases = {
        "16_channels": "16 channels",
        "batch_of_2": "(2, 24, 3, 2, 2)",
        "nan": "NaN",
        "int_latents": "int64",
        "two_tensors_no_latents": "'latents'",
        "unknown_extension": ".avi",
        "device_cuda": "CUDA",
        "tile_batch_0": "--tile-batch",
        "missing_checkpoint": "no_such_checkpoint",
        "truncated_checkpoint": "truncated",
        "revision_of_a_local_checkpoint": "applies to hub repo ids only",
    }
    for name, words in cases.items():
        if name == "device_cuda" and torch.cuda.is_available():
            continue
        args = BAD_INPUTS[name](tmp_path)
        if "--model" not in [str(a) for a in args]:
            args += ["--model", TINY]
        code, err = run_cli_or_parser(capsys, *args)
        assert code == 2, (name, err)
        assert words in err.splitlines()[-1], (name, err)


@pytest.mark.parametrize("name", ["out", "clips.mp4"])
def test_an_out_that_is_a_folder_says_so_and_how_to_name_the_file(capsys, tmp_path, name):
    """Not "unknown output format ''": OUT is a folder, and the fix is a file name with one of the formats."""
    folder = tmp_path / name
    folder.mkdir()
    code, err = run_cli_or_parser(capsys, _bad_latents(random_latents())(tmp_path)[0], folder)
    line = one_error_line(err)
    assert code == 2 and f"{folder}: is a folder" in line, line
    assert "give a file name ending in .mp4, .safetensors, .wav or .flac" in line, line
    assert f"{folder / 'video.mp4'}" in line and "unknown output format" not in line, line


def test_an_out_without_an_extension_names_the_formats(capsys, tmp_path):
    code, err = run_cli_or_parser(capsys, _bad_latents(random_latents())(tmp_path)[0], tmp_path / "video")
    line = one_error_line(err)
    assert code == 2 and "has no extension" in line and ".mp4, .safetensors, .wav or .flac" in line, line


def test_verbose_shows_traceback(capsys, tmp_path):
    latents = latents_file(tmp_path / "in.safetensors", _nan())
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "out.mp4", "--model", TINY, "--verbose")
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert "InputError" in err
    assert err.strip().splitlines()[-1].startswith("error:")
    assert not (tmp_path / "out.mp4").exists()


def time_line(err: str) -> tuple[dict[str, float], float]:
    """--verbose's `time:` line, the last line of stderr: ({phase: seconds} in its order, the total)."""
    last = err.strip().splitlines()[-1]
    found = re.fullmatch(r"time: (.*); total (\d+\.\d\d) s", last)
    assert found, err
    phases = {}
    for part in found[1].split(", "):
        name, seconds = re.fullmatch(r"([a-z -]+) (\d+\.\d\d) s", part).groups()
        phases[name] = float(seconds)
    return phases, float(found[2])


def test_verbose_shows_where_the_time_went(capsys, tmp_path):
    """--verbose ends with the run's wall clock by phase, in the order they ran; without it, no such line."""
    out = tmp_path / "out.mp4"
    code, err = run_cli_or_parser(capsys, EXAMPLE_LATENTS, out, "--verbose")
    assert code == 0, err
    phases, total = time_line(err)
    assert list(phases) == ["start-up", "checks", "kernels", "read", "sound", "decode", "encode tail", "write"], err
    assert total == pytest.approx(sum(phases.values()), abs=0.01 * len(phases))
    code, err = run_cli_or_parser(capsys, EXAMPLE_LATENTS, tmp_path / "again.mp4")
    assert code == 0 and "time:" not in err, err


def test_verbose_puts_the_kernel_choice_in_its_own_phase(capsys, tmp_path, monkeypatch):
    """The kernels' choice (where asking for quack or flash-attn-4 imports quack, seconds of it) is the
    `kernels` phase, not the checks: a choice made to take 0.4 s shows there."""
    import time

    from minimax_h3_vae import runtime

    resolve = runtime.resolve

    def slow_resolve(*args, **kwargs):
        time.sleep(0.4)
        return resolve(*args, **kwargs)

    monkeypatch.setattr(runtime, "resolve", slow_resolve)
    code, err = run_cli_or_parser(capsys, EXAMPLE_LATENTS, tmp_path / "out.safetensors", "--verbose")
    assert code == 0, err
    phases, _ = time_line(err)
    assert phases["kernels"] >= 0.4 and phases["checks"] < 0.4, phases


def test_verbose_counts_the_start_up_from_the_process_start(tmp_path):
    """In its own process the start-up phase begins when the process did: a child that sleeps before running the
    command shows at least that sleep there; the whole is within the wall clock the parent saw. The sound alone
    (.wav) has no video phases."""
    import time

    code = (
        "import sys, time; time.sleep(1.5); sys.argv = sys.argv[:1] + sys.argv[1:]; "
        "from minimax_h3_vae.command.console import console_main; console_main()"
    )
    out = tmp_path / "sound.wav"
    command = [sys.executable, "-c", code, str(EXAMPLE_LATENTS), str(out), "--model", str(TINY), "--device", "cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    began = time.perf_counter()
    result = subprocess.run([*command, "--verbose"], capture_output=True, text=True, env=env, timeout=300)
    wall = time.perf_counter() - began
    assert result.returncode == 0, result.stderr
    phases, total = time_line(result.stderr)
    assert list(phases) == ["start-up", "checks", "sound", "write"], result.stderr
    assert phases["start-up"] >= 1.5 and total <= wall + 0.05, (phases, wall)
    assert out.is_file()


# ---- an existing output, and failures during decoding -------------------------------------------------


def test_existing_output_kept_on_failure_and_replaced_on_success(capsys, tmp_path):
    out = tmp_path / "out" / "video.mp4"
    out.parent.mkdir()
    old = b"an older video that must survive a failed run" * 100
    out.write_bytes(old)
    bad = latents_file(tmp_path / "bad.safetensors", _nan())
    code, err = run_cli_or_parser(capsys, bad, out, "--model", TINY)
    assert code == 2, err
    assert out.read_bytes() == old
    assert tree(out.parent) == {"video.mp4"}

    good = latents_file(tmp_path / "good.safetensors", random_latents(6))
    code, err = run_cli_or_parser(capsys, good, out, "--model", TINY)
    assert code == 0, err
    assert out.read_bytes() != old
    assert iio.imread(out).shape == (9, 32, 32, 3)
    assert tree(out.parent) == {"video.mp4"}


@pytest.fixture
def failing_stream(monkeypatch):
    """decode_stream yields its first real chunk, then fails; returns the list of chunks it yielded."""
    real = H3VideoDecoder.decode_stream
    yielded = []

    def decode_stream(self, z, progress=None, **options):
        stream = real(self, z, progress, **options)
        chunk = next(stream)
        yielded.append(chunk.shape)
        yield chunk
        raise RuntimeError("simulated failure in the middle of decoding")

    monkeypatch.setattr(H3VideoDecoder, "decode_stream", decode_stream)
    return yielded


@pytest.mark.parametrize("suffix", [".mp4", ".safetensors"])
def test_failure_during_decoding(capsys, tmp_path, failing_stream, suffix):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / f"video{suffix}"
    latents = latents_file(tmp_path / "in.safetensors", random_latents(7, frames=8))  # two chunks
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY)
    assert failing_stream == [(1, 3, 17, 32, 32)]  # the sink did get frames before the failure
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]  # a bug's error names its type, unlike bad input's
    assert [line for line in lines if line.startswith("error:")] == lines[-1:] and "Traceback" not in err
    assert lines[-1].startswith("error: RuntimeError: simulated failure in the middle of decoding")
    assert not out.exists()
    assert tree(tmp_path / "out") == set()


def test_failure_during_decoding_keeps_existing_output(capsys, tmp_path, failing_stream):
    out = tmp_path / "video.mp4"
    out.write_bytes(b"previous")
    latents = latents_file(tmp_path / "in.safetensors", random_latents(7, frames=7))
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY)
    assert code == 1, err
    assert out.read_bytes() == b"previous"
    assert tree(tmp_path) == {"video.mp4", "in.safetensors"}


def test_interrupt_during_decoding(capsys, tmp_path, monkeypatch):
    def decode_stream(self, z, progress=None, **options):
        yield torch.zeros(1, 3, 5, 32, 32)
        raise KeyboardInterrupt

    monkeypatch.setattr(H3VideoDecoder, "decode_stream", decode_stream)
    latents = latents_file(tmp_path / "in.safetensors", random_latents())
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "video.mp4", "--model", TINY)
    assert code == 130
    assert "nothing was written" in err
    assert tree(tmp_path) == {"in.safetensors"}


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_output_has_default_permissions(capsys, tmp_path, monkeypatch, umask):
    """A new OUT takes 0o666 less the umask, read without os.umask (which would set it for an instant)."""
    set_umask = os.umask  # the test is the host: it sets the umask
    old = set_umask(umask)
    try:
        monkeypatch.setattr(os, "umask", lambda mask: pytest.fail("os.umask was called"))
        latents = latents_file(tmp_path / "in.safetensors", random_latents())
        out = tmp_path / "video.safetensors"
        code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY)
    finally:
        monkeypatch.undo()
        set_umask(old)
    assert code == 0, err
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_eager_flag_overrides_the_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    latents = latents_file(tmp_path / "in.safetensors", random_latents())
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "a.safetensors", "--model", TINY)
    # The line names the ops that run: on the CPU the kernels run only under the Triton interpreter.
    assert code == 0 and ("fused ops" if os.environ.get("TRITON_INTERPRET") == "1" else "eager ops") in err
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "b.safetensors", "--model", TINY, "--eager")
    assert code == 0 and "eager ops" in err


def test_the_run_line_says_when_the_fused_path_is_exact(capsys, tmp_path, monkeypatch):
    """--exact / --no-exact: the run's line says whether the run keeps the release's bits (on the CPU, with the
    fused kernels under TRITON_INTERPRET=1, else with the eager ops that stand in for them)."""
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    latents = latents_file(tmp_path / "in.safetensors", random_latents())
    said, lines = {}, {}
    for flag in ("--exact", "--no-exact"):
        code, err = run_cli_or_parser(capsys, latents, tmp_path / f"{flag}.safetensors", "--model", TINY, flag)
        assert code == 0, err
        said[flag] = "exact: the release's bits" in err
        lines[flag] = [line for line in err.splitlines() if line.startswith("device ")]
    assert said == {"--exact": True, "--no-exact": False}, lines


def test_failure_while_writing(capsys, tmp_path, monkeypatch):
    """The frames are written from a background thread: its error (here a full disk reported as frames are
    piped to ffmpeg) still fails the run, cleanly, with one line that names the cause and no Python type name."""
    real_popen, calls = subprocess.Popen, []

    class FullPipe:
        """ffmpeg's stdin, whose writes fail as on a full disk."""

        def __init__(self, pipe):
            self.pipe = pipe

        def write(self, data):
            calls.append(len(data))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            self.pipe.close()

    def popen(command, *args, **kwargs):
        process = real_popen(command, *args, **kwargs)
        if kwargs.get("stdin") == subprocess.PIPE and "-movflags" in command:
            process.stdin = FullPipe(process.stdin)
        return process

    monkeypatch.setattr(mux.subprocess, "Popen", popen)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "video.mp4"
    latents = latents_file(tmp_path / "in.safetensors", random_latents(7, frames=12))  # two chunks
    code, err = run_cli_or_parser(capsys, latents, out, "--model", TINY)
    assert calls, "the writer thread ran"
    assert code == 1
    one_error_line(err)
    assert f"{out}: no space left on the disk of {out.parent}" in err and "OSError" not in err
    assert tree(tmp_path / "out") == set()


def test_bad_fused_setting_is_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "yes")
    latents = latents_file(tmp_path / "in.safetensors", random_latents())
    code, err = run_cli_or_parser(capsys, latents, tmp_path / "out.mp4", "--model", TINY)
    assert code == 2
    one_error_line(err)
    assert "MINIMAX_H3_VAE_FUSED" in err and tree(tmp_path) == {"in.safetensors"}


class RecordingSink:
    """Stands in for an output file: keeps a copy of every chunk it is given (and the buffer it came in)."""

    def __init__(self):
        self.chunks, self.pointers, self.pinned = [], set(), []

    def write(self, frames: torch.Tensor) -> None:
        self.chunks.append(frames.clone())
        self.pointers.add(frames.untyped_storage().data_ptr())
        self.pinned.append(frames.is_pinned())


def test_writer_takes_host_frames_in_order():
    sink = RecordingSink()
    writer = BackgroundWriter(sink)
    chunks = [torch.randint(0, 256, (3, 4, 5, 3), dtype=torch.uint8) for _ in range(6)]
    for chunk in chunks:
        writer.put(chunk)
    writer.close()
    assert all(torch.equal(got, want) for got, want in zip(sink.chunks, chunks, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_writer_copies_cuda_frames_through_a_few_pinned_buffers():
    """CUDA chunks arrive in order and intact, through pinned buffers that are reused (depth + 2 at most)."""
    sink = RecordingSink()
    writer = BackgroundWriter(sink, depth=2)
    chunks = [torch.randint(0, 256, (f, 64, 96, 3), dtype=torch.uint8, device="cuda") for f in (17, 17, 5) * 4]
    for chunk in chunks:
        writer.put(chunk)
    writer.close()
    assert len(sink.chunks) == len(chunks)
    assert all(torch.equal(got, want.cpu()) for got, want in zip(sink.chunks, chunks, strict=True))
    assert all(sink.pinned) and len(sink.pointers) <= 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_writer_does_not_wait_for_the_chunk_it_is_given():
    """`put` queues the copy of its chunk and waits only for the chunk before: with a second of GPU work
    queued ahead of the new chunk, it returns at once, and the copy is still pending."""
    sink = RecordingSink()
    writer = BackgroundWriter(sink)
    first = torch.full((2, 8, 8, 3), 7, dtype=torch.uint8, device="cuda")
    writer.put(first)
    torch.cuda._sleep(int(2e9))  # about a second of GPU time at H200 clocks, queued before the next chunk
    second = torch.full((2, 8, 8, 3), 9, dtype=torch.uint8, device="cuda")
    writer.put(second)
    assert not writer.last_copy.query(), "put waited for its own chunk's copy"
    writer.close()
    assert [int(chunk[0, 0, 0, 0]) for chunk in sink.chunks] == [7, 9]


class FailingSink(RecordingSink):
    """Takes one chunk, then fails as a full disk would."""

    def write(self, frames: torch.Tensor) -> None:
        if self.chunks:
            raise OSError(28, "No space left on device")
        super().write(frames)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_writer_error_reaches_the_caller_and_cancel_returns(device):
    """The sink's error is raised in the caller (at a later `put` or at `close`), and `cancel` returns even
    with chunks still queued or being copied."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for finish in ("close", "cancel"):
        writer = BackgroundWriter(FailingSink(), depth=2)
        chunks = [torch.full((3, 16, 16, 3), i, dtype=torch.uint8, device=device) for i in range(8)]
        if finish == "close":
            with pytest.raises(OSError, match="No space left"):
                for chunk in chunks:
                    writer.put(chunk)
                writer.close()
            writer.cancel()  # what the command does after any failure
        else:
            writer.put(chunks[0])
            writer.put(chunks[1])
            writer.cancel()
        assert not writer.thread.is_alive()
        # close: the first chunk, then the failure; cancel: queued chunks are dropped unwritten
        assert len(writer.sink.chunks) == 1 if finish == "close" else len(writer.sink.chunks) <= 1


def test_main_in_process_leaves_no_thread(capsys, tmp_path):
    """A host that runs main in-process keeps no thread of ours after the call: tqdm's monitor thread (which
    tqdm's class starts with its first bar, for the life of the process) included, while the decode still
    shows its progress bar. A monitor the host already had is stopped first (a later bar makes a new one), so
    the check does not depend on what earlier tests ran."""
    from tqdm import tqdm

    if tqdm.monitor is not None:
        tqdm.monitor.exit()
    before = {(thread.ident, thread.name) for thread in threading.enumerate()}
    code, err = run_cli_or_parser(capsys, EXAMPLE_LATENTS, tmp_path / "out.mp4", "--model", TINY, "--device", "cpu")
    assert code == 0, err
    assert re.search(r"decoding: 100%.*\d+/\d+ \[", err), err
    assert {(thread.ident, thread.name) for thread in threading.enumerate()} == before
