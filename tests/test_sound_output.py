"""The command with sound: IN's audio latents decoded first, by the audio VAE found beside the
video one, into an mp4 with an AAC track from one ffmpeg process, a .safetensors `audio` tensor, or a .wav / .flac
alone; --no-audio; the duration check; and the faults of the new paths (nothing lost). ffmpeg reads every file
back: streams, codec, rate, channels, durations, colour tags, samples."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from command_runs import OLD, ffmpeg, fill, one_error_line, streams, tensor_bytes_in, tmpfs, tree
from repo import EXAMPLE_LATENTS, REPO, TINY
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3AudioDecoder, save_latents
from minimax_h3_vae.audio import loading as audio_loading
from minimax_h3_vae.command import checks, encoder, mux, readback
from minimax_h3_vae.command import main as cli


@pytest.fixture(autouse=True)
def offline(no_network, monkeypatch):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")


def clip(tmp_path: Path, audio_latents: int = 15, name: str = "z.safetensors", **kwargs) -> Path:
    """9 frames (3 latents) of 32x32 px at 24 fps and the 15 audio latents of the same 0.375 s (12,000 samples)."""
    z = torch.randn(24, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    audio = torch.randn(2, 32, audio_latents, generator=torch.Generator().manual_seed(1))
    path = tmp_path / name
    if audio_latents == 15 and not kwargs:
        return save_latents(path, z, fps=24, audio_latents=audio)
    save_file({"latents": z, "audio_latents": audio}, str(path), metadata=kwargs.get("metadata"))
    return path


def run(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    args = [str(a) for a in args]
    args += [] if "--model" in args else ["--model", str(TINY)]
    code = cli.main([*args, "--device", "cpu"])
    return code, capsys.readouterr().err


SOUNDS: dict[bytes, torch.Tensor] = {}  # audio latents' bytes -> their decode: most tests here decode one clip


def expected_sound(path: Path) -> torch.Tensor:
    """The tiny audio VAE's own decode of the file's audio latents, through the API (once per distinct latents)."""
    with safe_open(str(path), "pt") as handle:
        audio = handle.get_tensor("audio_latents")
    key = audio.numpy().tobytes()
    if key not in SOUNDS:
        SOUNDS[key] = H3AudioDecoder.from_pretrained(TINY, device="cpu", fused=False).decode(audio)
    return SOUNDS[key].clone()


def samples_of(path: Path) -> torch.Tensor:
    """The file's sound as ffmpeg decodes it, float32 (channels, samples)."""
    result = ffmpeg("-v", "error", "-i", str(path), "-map", "0:a:0", "-f", "f32le", "-")
    assert result.returncode == 0, result.stderr
    return torch.from_numpy(np.frombuffer(result.stdout, np.float32).copy()).view(-1, 2).T


# ---- what each OUT holds -------------------------------------------------------------------------------------------


def test_the_tool_writes_the_committed_example(tmp_path):
    """tools/make_example_checkpoint.py makes the committed examples/latents.safetensors: its tensors and metadata."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_example", REPO / "tools" / "make_example_checkpoint.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.write_latents(tmp_path / "latents.safetensors", tool.SEED + 1)
    # The same tensors and metadata; not the same bytes: safetensors writes the metadata's keys in the order
    # of a hash map seeded per process.
    from safetensors import safe_open

    def content(path):
        with safe_open(str(path), framework="pt") as handle:
            return handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}

    (made_meta, made), (meta, committed) = content(tmp_path / "latents.safetensors"), content(EXAMPLE_LATENTS)
    assert made_meta == meta and made.keys() == committed.keys()
    assert all(torch.equal(made[key], committed[key]) for key in made)


def test_the_mp4_sound_is_the_decoders(tmp_path, capsys):
    """The AAC track decodes to the audio VAE's waveform within the codec's error, in time and in channel order:
    192 kb/s AAC on this noise-like sound is 0.13 off in relative L2 norm, the same off by one AAC frame (the
    encoder's priming left in) 0.84, the channels swapped 0.77; every sample is there."""
    source = clip(tmp_path)
    out = tmp_path / "v.mp4"
    assert run(capsys, source, out)[0] == 0
    want, got = expected_sound(source), samples_of(out)
    assert want.shape == (2, 12000)
    # Every sample is there; an ffmpeg that does not apply the mp4's trim of the last AAC frame (seen on the GPU
    # machine's image) decodes that frame's padding too: at most one frame more, after the sound.
    assert 12000 <= got.shape[1] < 12000 + 1024 and got.shape[0] == 2
    got = got[:, :12000]
    assert (got - want).norm() / want.norm() < 0.3
    assert (got - want.flip(0)).norm() > (got - want).norm()  # left is left


@pytest.mark.parametrize("crf", ["0", "17"])
def test_one_ffmpeg_writes_both_streams(tmp_path, capsys, monkeypatch, crf):
    """One ffmpeg process per mp4 (besides the checks that read a file or one test frame), given the sound as its
    second input: no second pass over the video. Lossless RGB (--crf 0) gets the same AAC track."""
    real, encoders = subprocess.Popen, []

    def popen(command, *args, **kwargs):
        if command[0] == encoder.ffmpeg_exe() and "-movflags" in command:
            encoders.append(command)
        return real(command, *args, **kwargs)

    monkeypatch.setattr(mux.subprocess, "Popen", popen)
    out = tmp_path / "v.mp4"
    assert run(capsys, clip(tmp_path), out, "--crf", crf)[0] == 0
    assert len(encoders) == 1 and encoders[0].count("-i") == 2 and "-an" not in encoders[0]
    assert [line.split(":")[2].split()[0] for line in streams(out)] == ["Video", "Audio"]


def test_safetensors_holds_the_sound(tmp_path, capsys):
    """`audio`: the decoded float32 waveform (2, samples), bit for bit the API's; `audio_sample_rate` in the
    metadata; `video` the same frames as without sound."""
    source = clip(tmp_path)
    with_sound, without = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert run(capsys, source, with_sound)[0] == 0
    assert run(capsys, source, without, "--no-audio")[0] == 0
    got = load_file(str(with_sound))
    assert got["audio"].dtype == torch.float32 and torch.equal(got["audio"], expected_sound(source))
    assert torch.equal(got["video"], load_file(str(without))["video"]) and set(load_file(str(without))) == {"video"}
    with safe_open(str(with_sound), "pt") as handle:
        assert handle.metadata() == {"audio_sample_rate": "32000"}


def test_wav_is_the_sound_alone_exactly(tmp_path, capsys, monkeypatch):
    """A .wav OUT: 32-bit float PCM, the decoder's samples exactly; the video checkpoint is not opened and the
    video latents are not read."""
    from minimax_h3_vae import latents

    def refuse(*args, **kwargs):
        raise AssertionError("the video was touched")

    monkeypatch.setattr("minimax_h3_vae.checkpoints.load_checkpoint", refuse)
    monkeypatch.setattr(latents, "read_latents", refuse)
    source, out = clip(tmp_path), tmp_path / "s.wav"
    code, err = run(capsys, source, out)
    assert code == 0, err
    (audio,) = streams(out)
    assert "pcm_f32le" in audio and "32000 Hz, stereo" in audio
    assert torch.equal(samples_of(out), expected_sound(source))
    assert out.stat().st_size == 58 + 2 * 12000 * 4 and re.search(
        r"0\.375 s of sound \(decoded in \d+\.\d s\)$", err, re.M
    )
    assert "sound: 100%" in err  # the sound's progress bar


def test_flac_is_the_sound_in_24_bits(tmp_path, capsys):
    """A .flac OUT: lossless 24-bit FLAC, each sample the decoded one rounded to 24 bits: within 2^-24, and 2^-23 at
    +1.0 (the clamp's value, which 24 bits cannot hold; this waveform reaches it)."""
    source, out = clip(tmp_path), tmp_path / "s.flac"
    assert run(capsys, source, out)[0] == 0
    (audio,) = streams(out)
    assert "flac" in audio and "32000 Hz, stereo" in audio and "24 bit" in audio
    want, got = expected_sound(source), samples_of(out)
    error, top = (got - want).abs(), want == 1
    assert got.shape == want.shape and error[~top].max() <= 2.0**-24 and error[top].max() == 2.0**-23
    assert error.max() > 0  # rounded, so not float32 any more


def test_no_audio_leaves_the_sound_out_and_its_model_alone(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the audio VAE was loaded")

    monkeypatch.setattr(audio_loading, "load_checkpoint", refuse)
    out = tmp_path / "v.mp4"
    assert run(capsys, clip(tmp_path, audio_latents=99), out, "--no-audio")[0] == 0  # not even checked
    assert [line.split(":")[2].split()[0] for line in streams(out)] == ["Video"]


# ---- where the audio VAE comes from --------------------------------------------------------------------------------


def test_the_audio_vae_beside_a_video_vae_folder(tmp_path, capsys):
    """--model .../video_vae: the audio_vae/ folder beside it is the audio VAE."""
    out = tmp_path / "a.safetensors"
    source = clip(tmp_path)
    assert run(capsys, source, out, "--model", TINY / "video_vae")[0] == 0
    assert torch.equal(load_file(str(out))["audio"], expected_sound(source))


@pytest.mark.parametrize("where", ["comfyui", "lonely folder", "root without audio"])
def test_no_audio_vae_found_is_bad_input_before_decoding(tmp_path, capsys, monkeypatch, oracle_vae, where):
    """A ComfyUI video file, a video VAE folder with nothing beside it, a repo root holding only the video VAE:
    one error line naming --audio-model and --no-audio, exit 2, before any weight is read; then --audio-model
    makes it work."""
    from checkpoints import write_comfyui

    from minimax_h3_vae.checkpoints import Checkpoint

    if where == "comfyui":
        model = write_comfyui(tmp_path / "minimax_h3_video_vae_fp16.safetensors", oracle_vae)
    else:
        shutil.copytree(TINY / "video_vae", tmp_path / "root" / "video_vae")
        model = tmp_path / "root" / ("video_vae" if where == "lonely folder" else "")
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    real_tensors = Checkpoint.tensors

    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the check")

    monkeypatch.setattr(Checkpoint, "tensors", refuse)
    code, err = run(capsys, clip(tmp_path), out, "--model", model)
    line = one_error_line(err)
    assert code == 2 and "--audio-model SOURCE" in line and "--no-audio" in line, line
    if where != "root without audio":
        assert "holds audio latents (2, 32, 15)" in line and "has no audio VAE" in line, line
    assert out.read_bytes() == OLD
    monkeypatch.setattr(Checkpoint, "tensors", real_tensors)
    if where == "comfyui":
        code, err = run(capsys, clip(tmp_path), out, "--model", model, "--audio-model", TINY / "audio_vae")
        assert code == 0, err
        assert [line.split(":")[2].split()[0] for line in streams(out)] == ["Video", "Audio"]


def test_an_audio_vae_of_other_latent_channels_is_named(tmp_path, capsys, audio_layouts):
    """The tests' oracle audio VAE takes 4 latent channels, not H3's 32: the message gives both."""
    code, err = run(capsys, clip(tmp_path), tmp_path / "v.mp4", "--audio-model", audio_layouts["comfyui"])
    line = one_error_line(err)
    assert code == 2 and "have 32 latent channels" in line and "takes 4" in line and "(2, 4, N)" in line, line


def test_a_sample_rate_other_than_the_audio_vaes_is_refused(tmp_path, capsys):
    source = clip(tmp_path, metadata={"audio_sample_rate": "16000"})
    code, err = run(capsys, source, tmp_path / "v.mp4")
    line = one_error_line(err)
    assert code == 2 and "16000 Hz" in line and "32000 Hz" in line and "--no-audio" in line, line


# ---- the duration check --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "latents, flags, words",
    [
        (16, [], "9 frames at 24 fps go with 15 audio latents"),
        (14, [], "the audio lasts 0.35 s (14 latents at 40 per second) and the video 0.375 s"),
        (15, ["--fps", "12"], "and 15 audio latents with 9 frames at 24 fps"),
    ],
)
def test_audio_and_video_of_different_durations_are_refused(tmp_path, capsys, monkeypatch, latents, flags, words):
    """From the shapes and the frame rate alone: exit 2 before any weight is read, the rule and the fix in the
    line, the old OUT untouched."""
    from minimax_h3_vae.checkpoints import Checkpoint

    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the check")

    monkeypatch.setattr(Checkpoint, "tensors", refuse)
    monkeypatch.setattr(audio_loading.AudioCheckpoint, "tensors", refuse)
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path, audio_latents=latents), out, *flags)
    line = one_error_line(err)
    assert code == 2 and words in line and "--fps" in line and "--no-audio" in line, line
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.mp4", "z.safetensors"}


@pytest.mark.parametrize(
    "name, flags, words",
    [
        ("s.wav", ["--no-audio"], "holds the sound alone, and --no-audio leaves it out"),
        ("v.mp4", ["--no-audio", "--audio-model", "x"], "give one of them"),
        ("s.flac", ["--crf", "3"], "the output is not an .mp4"),
    ],
)
def test_contradicting_flags(tmp_path, capsys, name, flags, words):
    code, err = run(capsys, clip(tmp_path), tmp_path / name, *flags)
    assert code == 2 and words in one_error_line(err)
    assert tree(tmp_path) == {"z.safetensors"}


def test_sound_alone_from_a_silent_file_is_refused(tmp_path, capsys):
    source = save_latents(tmp_path / "z.safetensors", torch.zeros(24, 3, 2, 2))
    code, err = run(capsys, source, tmp_path / "s.wav")
    assert code == 2 and "holds no audio latents ('audio_latents')" in one_error_line(err)


def test_huge_audio_latents_are_refused_from_the_header(tmp_path, capsys, monkeypatch):
    """A sparse file declaring 2 x 32 x 2^28 audio latents (10 days of sound) for the sound alone: refused by the
    memory count before anything is read or allocated."""
    from minimax_h3_vae import memory

    monkeypatch.setattr(memory, "available_host", lambda: 64 * 2**30)
    path = tmp_path / "z.safetensors"
    header = b'{"audio_latents":{"dtype":"F32","shape":[2,32,268435456],"data_offsets":[0,68719476736]},'
    header += b'"latents":{"dtype":"F32","shape":[24,3,2,2],"data_offsets":[68719476736,68719477888]}}'
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as handle:
        handle.write(len(header).to_bytes(8, "little") + header)
        handle.truncate(8 + len(header) + 68719477888)
    code, err = run(capsys, path, tmp_path / "s.wav")
    line = one_error_line(err)
    assert code == 2 and "decoding audio latents (2, 32, 268435456) needs about" in line and "host memory" in line


# ---- nothing lost --------------------------------------------------------------------------------------------------


def broken_audio_vae(tmp_path: Path, how: str) -> Path:
    """A copy of the tiny repo root whose audio weights are truncated (the header intact) or hold NaN."""
    root = tmp_path / "model"
    shutil.copytree(TINY, root)
    weights = root / "audio_vae" / "model.safetensors"
    if how == "truncated":
        with open(weights, "r+b") as handle:
            handle.truncate(weights.stat().st_size - 1000)
    else:
        tensors = load_file(str(weights))
        tensors["decoder.conv_post.weight_v"][0, 0, 3] = float("nan")
        save_file(tensors, str(weights))
    return root


def sound_beside(monkeypatch, decode: bool = False) -> None:
    """Make the run decode the sound beside the video weights' load, and with `decode` beside the video's decode
    too, as it does on a GPU with room for them (`memory.fits_beside`, whose arithmetic test_memory.py checks),
    here on the CPU."""
    from minimax_h3_vae import memory

    monkeypatch.setattr(memory, "fits_beside", lambda *args, **kwargs: decode or not kwargs.get("decode", False))


# The summary's words for where the sound was decoded, by how `sound_beside` set the run.
WHEN = {None: "before", False: "beside the weights' load", True: "beside the weights' load and the decode"}


def sound_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sound"]


@pytest.mark.parametrize("beside", [None, False, True])
@pytest.mark.parametrize("suffix", [".mp4", ".safetensors", ".wav"])
@pytest.mark.parametrize("how, code, words", [("truncated", 2, "audio_vae"), ("nan", 1, "the decoded sound holds NaN")])
def test_a_broken_audio_vae_leaves_nothing(tmp_path, capsys, monkeypatch, suffix, how, code, words, beside):
    """Before the load, beside it, or beside the load and the decode (`beside` None, False, True): one line, the
    old OUT kept, nothing beside it, no thread left."""
    if beside is not None:
        sound_beside(monkeypatch, decode=beside)
    out = tmp_path / f"out{suffix}"
    out.write_bytes(OLD)
    source = clip(tmp_path)
    model = broken_audio_vae(tmp_path, how)
    got, err = run(capsys, source, out, "--model", model)
    line = one_error_line(err)
    assert got == code and words in line, line
    assert out.read_bytes() == OLD
    assert {p for p in tree(tmp_path) if not p.startswith("model")} == {out.name, "z.safetensors"}
    assert not sound_threads()


@pytest.mark.parametrize("suffix", [".safetensors", ".mp4"])
def test_the_sound_beside_the_load_and_the_decode_writes_the_same_file(tmp_path, capsys, monkeypatch, suffix):
    """Decoded in a thread of its own while the video decoder loads, and then while it decodes, the sound goes
    into the same bytes as when it is decoded first, and the summary says which it was."""
    threads = []
    real_audio = H3AudioDecoder.decode

    def audio(self, z, progress=None):
        threads.append(threading.current_thread().name)
        return real_audio(self, z, progress)

    monkeypatch.setattr(H3AudioDecoder, "decode", audio)
    source = clip(tmp_path)
    for beside in WHEN:
        if beside is not None:
            sound_beside(monkeypatch, decode=beside)
        threads.clear()
        code, err = run(capsys, source, tmp_path / f"{beside}{suffix}")
        assert code == 0 and f", {WHEN[beside]}) in" in err, err
        assert threads == ["MainThread" if beside is None else "sound"], threads
        assert "sound: audio latents (2, 32, 15) -> 2 x 12000 samples at 32000 Hz (0.375 s)" in err
        assert not sound_threads()
    for beside in (False, True):
        if suffix == ".safetensors":
            assert (tmp_path / f"{beside}.safetensors").read_bytes() == (tmp_path / "None.safetensors").read_bytes()
        else:  # the same samples into the same encoder
            assert torch.equal(samples_of(tmp_path / f"{beside}.mp4"), samples_of(tmp_path / "None.mp4"))


def test_the_sound_beside_the_decode_shows_the_video_bar_alone(tmp_path, capsys, monkeypatch):
    """Beside the decode the sound draws no bar of its own over the video's; its line comes after the video's
    bar, once the sound is in the output."""
    sound_beside(monkeypatch, decode=True)
    code, err = run(capsys, clip(tmp_path), tmp_path / "out.safetensors")
    assert code == 0 and "sound:   0%" not in err and "decoding:" in err, err
    lines = err.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("sound: audio latents"))
    assert said > max(i for i, line in enumerate(lines) if "decoding:" in line), err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_sound_decodes_beside_the_load_and_the_decode(tmp_path, capsys):
    """On a GPU with room for all, the sound decodes on its own thread and stream beside the video weights' load
    and the video's decode, to the same samples as the sound alone (decoded by itself), bit for bit."""
    source = clip(tmp_path)
    capsys.readouterr()
    assert cli.main([str(source), str(tmp_path / "v.safetensors"), "--model", str(TINY), "--device", "cuda"]) == 0
    err = capsys.readouterr().err
    assert ", beside the weights' load and the decode) in" in err, err  # the tiny model leaves room for all
    assert cli.main([str(source), str(tmp_path / "a.wav"), "--model", str(TINY), "--device", "cuda"]) == 0
    got = load_file(str(tmp_path / "v.safetensors"))["audio"]
    assert torch.equal(got, samples_of(tmp_path / "a.wav"))  # the .wav holds the float samples exactly


@pytest.mark.parametrize("decode", [False, True])
def test_a_video_vae_that_fails_to_load_beside_the_sound(tmp_path, capsys, monkeypatch, decode):
    """The video weights fail to load while the sound decodes beside them: the video's error line, after the
    sound's thread has ended; nothing written."""
    sound_beside(monkeypatch, decode)
    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    weights = model / "video_vae" / "source" / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size - 1000)
    out = tmp_path / "out.safetensors"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path), out, "--model", model)
    line = one_error_line(err)
    assert code == 2 and "model.safetensors" in line, line
    assert out.read_bytes() == OLD and not sound_threads()


def hold_the_sound(monkeypatch) -> tuple[list[int], Callable[[], None]]:
    """Hold the sound's decode at its first block until a stop has been taken: (the blocks it reached, `stop`),
    where `stop()`, called where the stop is to come from, waits for the sound to be held, lets it go on 0.5 s
    later and raises KeyboardInterrupt (Ctrl-C)."""
    started, go, blocks = threading.Event(), threading.Event(), []
    real_audio = H3AudioDecoder.decode

    def audio(self, z, progress=None):
        def held(done, total):
            blocks.append(done)
            started.set()
            go.wait(60)
            progress(done, total)

        return real_audio(self, z, held)

    def stop() -> None:
        assert started.wait(60)
        threading.Timer(0.5, go.set).start()
        raise KeyboardInterrupt

    monkeypatch.setattr(H3AudioDecoder, "decode", audio)
    return blocks, stop


@pytest.mark.parametrize("decode", [False, True])
def test_a_stop_during_the_load_ends_the_sound_beside_it(tmp_path, capsys, monkeypatch, decode):
    """Ctrl-C while the video decoder loads and the sound decodes beside it: the sound stops at its next block
    (it does not run on after the command), exit 130, nothing written."""
    from minimax_h3_vae import H3VideoDecoder

    sound_beside(monkeypatch, decode)
    blocks, stop = hold_the_sound(monkeypatch)

    def video(cls, *args, **kwargs):
        stop()

    monkeypatch.setattr(H3VideoDecoder, "from_checkpoint", classmethod(video))
    out = tmp_path / "out.safetensors"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path), out)
    assert code == 130 and err.splitlines()[-1] == "interrupted by SIGINT: nothing was written", err
    assert not sound_threads() and blocks == [0], "stopped before its first block"
    assert out.read_bytes() == OLD and tree(tmp_path) == {out.name, "z.safetensors"}


@pytest.mark.parametrize("suffix", [".safetensors", ".mp4"])
def test_a_stop_during_the_decode_ends_the_sound_beside_it(tmp_path, capsys, monkeypatch, suffix):
    """Ctrl-C while the video decodes and the sound, beside it, has not reached the output yet (the writer waits
    for it): the sound stops at its next block, exit 130, nothing written, no thread left."""
    from minimax_h3_vae import H3VideoDecoder

    sound_beside(monkeypatch, decode=True)
    blocks, stop = hold_the_sound(monkeypatch)

    def video(self, *args, **kwargs):
        stop()
        yield

    monkeypatch.setattr(H3VideoDecoder, "decode_stream", video)
    out = tmp_path / f"out{suffix}"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path), out)
    assert code == 130 and err.splitlines()[-1] == "interrupted by SIGINT: nothing was written", err
    assert not sound_threads() and blocks == [0], "stopped before its first block"
    assert not [t for t in threading.enumerate() if t.name == "frame-writer"]
    assert out.read_bytes() == OLD and tree(tmp_path) == {out.name, "z.safetensors"}


@pytest.mark.parametrize("suffix", [".safetensors", ".mp4"])
def test_a_sink_opened_before_the_sound_is_decoded(tmp_path, suffix):
    """A sink opened with the sound's format takes the sound at `begin` and then writes what a sink opened with
    the sound writes; it refuses frames before `begin`, and a sound other than the one announced."""
    from minimax_h3_vae.command import formats, output
    from minimax_h3_vae.command.commit import WriteError

    sound = formats.Soundtrack(torch.rand(2, 12000, generator=torch.Generator().manual_seed(2)) * 2 - 1, 32000)
    frames = torch.randint(0, 256, (3, 32, 48, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    video = formats.VideoFormat(3, 32, 48, 24.0, crf=0)  # RGB frames in, lossless
    files = {}
    for name, opened in (("now", sound), ("later", sound.format)):
        sink = output.open_sink(tmp_path / f"{name}{suffix}", video, opened)
        if name == "later":
            with pytest.raises(ValueError, match="once `begin` has handed it the sound"):
                sink.write(frames)
            sink.begin(sound)
        sink.write(frames)
        sink.commit()
        files[name] = tmp_path / f"{name}{suffix}"
    if suffix == ".safetensors":
        assert files["later"].read_bytes() == files["now"].read_bytes()
    else:
        assert torch.equal(samples_of(files["later"]), samples_of(files["now"]))
    other = formats.Soundtrack(sound.samples[:, :-1], 32000)
    for given in (other, None):
        sink = output.open_sink(tmp_path / f"wrong{suffix}", video, sound.format)
        with pytest.raises(WriteError, match="the decoded sound has .*, the output was opened for 2 x 12000 samples"):
            sink.begin(given)
        sink.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in files.values())


def test_ffmpeg_failing_on_the_audio_input_keeps_the_old_output(tmp_path, capsys, monkeypatch):
    """The real encoder told its second input is a WAV file (it is raw float samples): ffmpeg fails on it while
    the frames are piped; exit 1 with ffmpeg's reason, the old mp4 untouched, nothing left."""
    real = subprocess.Popen

    def popen(command, *args, **kwargs):
        if command[0] == encoder.ffmpeg_exe() and "-movflags" in command:
            at = command.index("f32le")
            command = [*command[:at], "wav", *command[at + 1 :]]
        return real(command, *args, **kwargs)

    monkeypatch.setattr(mux.subprocess, "Popen", popen)
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path), out)
    assert code == 1 and "ffmpeg failed (exit status" in one_error_line(err)
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.mp4", "z.safetensors"}


def test_an_audio_encoder_that_refuses_is_found_before_decoding(tmp_path, capsys, monkeypatch):
    """The same refusal in the preflight (one AAC frame of silence with the test frame): exit 2, ffmpeg's reason."""
    monkeypatch.setattr(encoder, "SOUND_INPUT", ["-f", "wav"])
    from minimax_h3_vae.checkpoints import Checkpoint

    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the check")

    monkeypatch.setattr(Checkpoint, "tensors", refuse)
    code, err = run(capsys, clip(tmp_path), tmp_path / "v.mp4")
    assert code == 2 and "ffmpeg cannot encode 32x32 frames and 32000 Hz sound" in one_error_line(err)


def test_an_mp4_whose_sound_does_not_read_back_is_not_committed(tmp_path, capsys, monkeypatch):
    real = readback.read_back
    monkeypatch.setattr(readback, "read_back", lambda path: (real(path)[0], None))
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path), out)
    assert code == 1 and "reads back no audio stream of 12000 per channel" in one_error_line(err)
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.mp4", "z.safetensors"}


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_disk_filled_while_writing_the_sound(tmp_path, capsys, monkeypatch, suffix):
    """A real tmpfs with room at the preflight, filled by someone else right after it: the error names OUT and its
    disk, the old file is untouched and nothing else is left."""
    real = checks.check_free_space

    def check_then_fill(out, needed):
        real(out, needed)
        fill(out.parent)

    monkeypatch.setattr(checks, "check_free_space", check_then_fill)
    source = clip(tmp_path)
    with tmpfs(tmp_path / "disk", "256k") as disk:
        out = disk / f"s{suffix}"
        out.write_bytes(OLD)
        code, err = run(capsys, source, out)
        assert code == 1
        assert f"{out}: no space left on the disk of {disk}; free some space" in one_error_line(err), err
        assert out.read_bytes() == OLD and tree(disk) == {out.name, "filler"}


def test_full_disk_while_writing_the_safetensors_sound(tmp_path, capsys, monkeypatch):
    """ENOSPC as the sound is synced, before any frame: WriteError, the old file untouched, no thread left."""
    real, calls = os.fdatasync, []

    def fdatasync(fd):
        calls.append(tensor_bytes_in(fd))
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    out = tmp_path / "v.safetensors"
    out.write_bytes(OLD)
    code, err = run(capsys, clip(tmp_path), out)
    assert code == 1 and f"{out}: no space left on the disk of {tmp_path}" in one_error_line(err)
    assert calls == [2 * 12000 * 4]
    assert out.read_bytes() == OLD and tree(tmp_path) == {"v.safetensors", "z.safetensors"}
    assert not [t for t in threading.enumerate() if t.name == "frame-writer"]


def test_the_sound_decodes_before_the_video(tmp_path, capsys, monkeypatch):
    """The audio decoder runs (and is dropped) before the video decoder is built."""
    from minimax_h3_vae import H3VideoDecoder

    events = []
    real_audio, real_video = H3AudioDecoder.decode, H3VideoDecoder.from_checkpoint.__func__

    def audio(self, z, progress=None):
        events.append("audio")
        return real_audio(self, z, progress)

    def video(cls, *args, **kwargs):
        events.append("video")
        return real_video(cls, *args, **kwargs)

    monkeypatch.setattr(H3AudioDecoder, "decode", audio)
    monkeypatch.setattr(H3VideoDecoder, "from_checkpoint", classmethod(video))
    code, err = run(capsys, clip(tmp_path), tmp_path / "v.mp4")
    assert code == 0 and events == ["audio", "video"]
    assert "sound: audio latents (2, 32, 15) -> 2 x 12000 samples at 32000 Hz (0.375 s)" in err


@pytest.mark.xdist_group("torchrun_command")
def test_under_torchrun_rank_0_alone_decodes_the_sound(torchrun_command):
    """Two CPU ranks (gloo): rank 1's checkpoint has no audio VAE, which it never looks for; rank 0 decodes the
    sound and writes one file equal to a single process's (on one thread, as each rank runs)."""
    run = torchrun_command
    assert run.result.returncode == 0, run.result.stderr[-3000:]
    assert run.result.stderr.count("sound: audio latents (2, 32, 43)") == 1
    assert sorted(p.name for p in run.spread.parent.iterdir()) == ["out.safetensors"]
    got, want = load_file(str(run.spread)), load_file(str(run.single))
    assert torch.equal(got["audio"], want["audio"]) and torch.equal(got["video"], want["video"])


def test_a_file_of_audio_latents_alone_decodes_to_sound(tmp_path, capsys):
    """A latents file holding `audio_latents` and no video latents: a .wav or .flac OUT needs only the sound, so
    it decodes, to the very bytes the example file (which holds both) gives; an mp4 or .safetensors OUT needs the
    video latents, so it is refused with one error line that says so and what to do, writing nothing."""
    with safe_open(str(EXAMPLE_LATENTS), "pt") as handle:
        audio, metadata = handle.get_tensor("audio_latents"), handle.metadata()
    sound_alone = tmp_path / "sound.safetensors"
    save_file({"audio_latents": audio}, str(sound_alone), metadata=metadata)
    for suffix in (".wav", ".flac"):
        code, err = run(capsys, EXAMPLE_LATENTS, tmp_path / f"full{suffix}")
        assert code == 0, err
        code, err = run(capsys, sound_alone, tmp_path / f"alone{suffix}")
        assert code == 0, err
        assert (tmp_path / f"alone{suffix}").read_bytes() == (tmp_path / f"full{suffix}").read_bytes()
    for suffix in (".mp4", ".safetensors"):
        code, err = run(capsys, sound_alone, tmp_path / f"video{suffix}")
        assert code == 2, err
        line = one_error_line(err)
        assert "no video latents" in line and ".wav or .flac" in line, line
        assert not (tmp_path / f"video{suffix}").exists()
