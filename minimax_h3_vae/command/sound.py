"""The sound of a run: its audio VAE located and checked from headers (`check_sound`), then its latents
decoded on rank 0 (`decode_sound`), before the video decoder is loaded, or beside its load and, where the GPU
has room for both, beside the video's decode too (`SoundBeside`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..text import shown
from . import checks, formats
from .commit import WriteError
from .report import InputError, progress_bar, say


@dataclass(frozen=True)
class SoundPlan:
    """What `check_sound` found: the located audio checkpoint, the sound's format, and the GPU bytes its
    decode needs (0 on the CPU)."""

    checkpoint: object  # audio.loading.AudioCheckpoint
    format: formats.SoundFormat
    device_bytes: int


@dataclass(frozen=True)
class Decoded:
    """The decoded sound, on the host, the seconds its decode took (its load included), and the line that says
    so (`sound: audio latents ... in 1.3 s`)."""

    sound: formats.Soundtrack
    seconds: float
    line: str


class Cancelled(Exception):
    """A sound decode stopped by `SoundBeside.cancel`."""


def audio_source(args: argparse.Namespace) -> tuple[str | None, str | None, str]:
    """Where the audio VAE is: (source, revision, what --model is, for a message); source None when there is
    none to be found. --audio-model if given; else --model itself for a hub repo id or a repo root (the audio
    loader finds its FL2VA/audio_vae/ or audio_vae/), the audio_vae/ folder beside a video VAE folder
    (FL2VA/video_vae/ -> FL2VA/audio_vae/, vae/ -> audio_vae/), and nothing for a single video VAE file."""
    if args.audio_model is not None:
        return args.audio_model, None, "--audio-model's"
    path = Path(args.model).expanduser()
    try:
        exists = path.exists()
    except OSError as error:  # a name too long for the filesystem, a folder that may not be searched
        raise InputError(f"{shown(args.model)}: cannot look there ({error.strerror})") from None
    if not exists:  # a hub repo id, at the same revision (the loader explains anything else)
        return args.model, args.revision, "the hub repo's"
    if path.is_file():
        return None, None, "a single video VAE file"
    if (path / "config.json").is_file():  # the video VAE's own folder
        sibling = path.absolute().parent / "audio_vae"
        if (sibling / "config.json").is_file():
            return str(sibling), None, "the audio_vae/ folder beside --model's"
        return None, None, "a video VAE folder with no audio_vae/ folder beside it"
    return args.model, None, "the repo root's"


def check_sound(args: argparse.Namespace, options, source, video: tuple[int, float] | None) -> SoundPlan:
    """Rank 0's checks of IN's audio latents, from headers alone: the audio VAE located (its tensor headers
    read), OUT none of its files, its latent channels and sample rate against IN's, the audio's duration
    against the video's (`video`: frames and fps; None for the sound alone), and the memory of its decode."""
    from fractions import Fraction

    from ..audio.loading import DECODER_PREFIXES
    from ..audio.loading import load_checkpoint as load_audio_checkpoint
    from ..checkpoints import CheckpointError
    from ..latents import AUDIO_RATE_KEY, check_durations
    from ..memory import audio_decode_bytes, check_bytes
    from ..runtime import GIB

    name, shape = shown(args.input), source.audio.shape
    leave_out = "leave the sound out with --no-audio"
    where, revision, what = audio_source(args)
    if where is None:
        raise InputError(
            f"{name}: holds audio latents {shape}, and --model {shown(args.model)} ({what}) has no audio VAE; give "
            f"one with --audio-model SOURCE (a repo root, an audio_vae/ folder or ComfyUI's audio VAE file), or "
            f"{leave_out}"
        )
    try:
        checkpoint = load_audio_checkpoint(where, revision=revision)
    except CheckpointError as error:
        fix = "fix --audio-model" if args.audio_model is not None else "give one with --audio-model SOURCE"
        raise InputError(
            f"{name}: holds audio latents {shape}, and their audio VAE ({what}) cannot be loaded: {error}; {fix}, "
            f"or {leave_out}"
        ) from None
    if any(checks.same_file(args.output, path) for path in checks.checkpoint_files(where, checkpoint)):
        raise InputError(f"{shown(args.output)}: is a file of the audio checkpoint {shown(where)}; give another name")
    config = checkpoint.config
    if shape[1] != config.latent_channels:
        raise InputError(
            f"{name}: audio latents {shape} have {shape[1]} latent channels, the audio VAE {shown(where)} takes "
            f"{config.latent_channels}: expected (2, {config.latent_channels}, N); or {leave_out}"
        )
    if source.audio.sample_rate not in (None, config.sample_rate):
        raise InputError(
            f"{name}: audio latents for {source.audio.sample_rate} Hz sound (metadata {AUDIO_RATE_KEY}), the audio "
            f"VAE {shown(where)} decodes to {config.sample_rate} Hz; give the matching one with --audio-model, or "
            f"{leave_out}"
        )
    latents = shape[2]
    if video is not None:
        try:
            check_durations(*video, latents, Fraction(config.sample_rate, config.hop_length))
        except ValueError as error:
            raise InputError(f"{name}: {error}; give the clip's --fps, or {leave_out}") from None
    weights = 4 * sum(math.prod(s) for key, s in checkpoint.shapes.items() if key.startswith(DECODER_PREFIXES))
    host, device_bytes = audio_decode_bytes(config, weights, shape[0], latents, options.device.type)
    cap = None if options.max_gpu_memory is None else int(options.max_gpu_memory * GIB)  # --max-gpu-memory
    try:
        check_bytes(host, device_bytes, options.device, f"decoding audio latents {shape}", cap)
    except ValueError as error:
        raise InputError(str(error)) from None
    sound_format = formats.SoundFormat(shape[0], latents * config.hop_length, config.sample_rate)
    return SoundPlan(checkpoint, sound_format, device_bytes)


def decode_sound(
    args: argparse.Namespace, options, source, checkpoint, cancelled=None, beside_decode: bool = False
) -> Decoded:
    """Rank 0: IN's audio latents read and checked, the audio decoder built on this run's device (float32; the
    fused activation unless --eager), the sound decoded and brought to the host, the decoder dropped (its
    cached GPU memory released: the video decoder's automatic tile batch reads the free memory), a `sound`
    progress bar over its AMP blocks meanwhile and its line said at the end. InputError for unreadable latents
    or weights, WriteError for NaN in the sound; `Cancelled` between blocks once `cancelled` (a
    threading.Event) is set.

    `beside_decode`: the video decodes meanwhile. Its progress bar is the one shown, so the sound shows none and
    leaves its line to the caller (`Decoded.line`); its cached memory stays cached, because emptying the cache
    waits for the device to finish all its work, the video's too (the memory plan counted the sound's bytes
    beside the decode's: `memory.fits_beside`)."""
    import torch

    from ..audio.decoder import H3AudioDecoder
    from ..checkpoints import CheckpointError
    from ..latents import read_audio_latents

    start = time.perf_counter()
    try:
        audio_latents = read_audio_latents(source)
        decoder = H3AudioDecoder.from_checkpoint(checkpoint, device=options.device, fused=False if args.eager else None)
    except (CheckpointError, ValueError) as error:
        raise InputError(str(error)) from None
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if cancelled is not None and cancelled.is_set():
            raise Cancelled
        if beside_decode:
            return
        if bar is None:  # the first report comes before the first block: the bar shows from the start
            bar = progress_bar(total, "sound", "block")
        bar.update(done - bar.n)

    try:
        samples = decoder.decode(audio_latents, progress)
    finally:
        if bar is not None:
            bar.close()
    if not torch.isfinite(samples).all():
        raise WriteError(
            f"{shown(args.output)}: the decoded sound holds NaN or Inf (check the audio VAE's weights); "
            "nothing was written"
        )
    sound = formats.Soundtrack(samples.cpu(), decoder.sample_rate)
    del decoder, samples
    if options.device.type == "cuda" and not beside_decode:
        torch.cuda.empty_cache()
    seconds = time.perf_counter() - start
    channels, length = sound.samples.shape
    line = (
        f"sound: audio latents {tuple(audio_latents.shape)} -> {channels} x {length} samples at {sound.sample_rate} "
        f"Hz ({length / sound.sample_rate:.3f} s) in {seconds:.1f} s"
    )
    if not beside_decode:
        say(line)
    return Decoded(sound, seconds, line)


class SoundBeside:
    """`decode_sound` in a thread of its own, on its own CUDA stream, while the caller loads the video decoder
    and, with `beside_decode`, while it decodes the video too: the audio decoder's load and its one-time set-up
    overlap the video weights' load, and what is left of them the video's first tiles (the run decides when there
    is room: `memory.fits_beside`). `result()` waits for it and returns its `Decoded` or raises its error;
    `cancel()` stops it at its next block and waits (for a run that failed or was stopped meanwhile)."""

    def __init__(self, args: argparse.Namespace, options, source, checkpoint, beside_decode: bool = False):
        self.beside_decode = beside_decode
        self._cancelled = threading.Event()
        self._outcome: Decoded | BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(args, options, source, checkpoint), name="sound", daemon=True
        )
        self._thread.start()

    def _run(self, args, options, source, checkpoint) -> None:
        import torch

        device = options.device
        try:
            with contextlib.ExitStack() as on_device:
                if device.type == "cuda":  # a thread starts on device 0 and its default stream
                    on_device.enter_context(torch.cuda.device(device))
                    on_device.enter_context(torch.cuda.stream(torch.cuda.Stream(device)))
                self._outcome = decode_sound(args, options, source, checkpoint, self._cancelled, self.beside_decode)
        except BaseException as error:  # handed to the caller's thread by `result`
            self._outcome = error

    def result(self) -> Decoded:
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def cancel(self) -> None:
        self._cancelled.set()
        self._thread.join()
