"""Before the decode: every check, cheapest first, then the decoders built through the library's doors and
the sound decoded (`prepare`); what it hands to the run is a `Prepared`."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..files import resolve_output
from ..latents import DEFAULT_FPS, check_fps
from ..text import shown
from . import checks, formats, output
from .commit import OutputFile, WriteError
from .flags import check_arguments, decode_options
from .report import InputError, progress_bar, say
from .timing import Phases


@dataclass
class Prepared:
    decoder: object | None  # H3VideoDecoder; None when OUT holds the sound alone
    z: object | None  # raw latents (1, C, T, h, w), float32
    fps: float
    frames: int
    height: int
    width: int
    sink: OutputFile | None  # rank 0's open output
    sound: formats.Soundtrack | None = None  # rank 0's decoded sound, already in the sink
    phases: Phases = field(default_factory=Phases)  # the run's wall clock so far, by phase (--verbose)


def checkpoint_files(model: str, checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: its weights and, for a local path, everything under it."""
    files = list(checkpoint.files.values())
    path = Path(model).expanduser()
    if path.is_file():
        files.append(path)
    elif path.is_dir():
        files += [Path(root) / name for root, _, names in os.walk(path) for name in names]
    return files


def prepare(args: argparse.Namespace, device, rank: int, ranks: int = 1, phases: Phases | None = None) -> Prepared:
    """Every check, cheapest first, then the decoders, the sound decoded (on rank 0), and (on rank 0) the open
    output. `phases` (the run's, begun at its start) gets the laps start-up, checks, kernels, read and sound.

    Before anything is loaded: the arguments and run options, OUT (format, its folder takes a file, not IN),
    IN's header. From the checkpoints' headers alone: OUT is none of their files, the latent channels, the
    frame rate, the audio's duration against the video's, free disk space, and the memory plan of the resolved
    run settings. Only then are the latents and the weights read, and the sound decoded before the video
    decoder is built.
    """
    from ..checkpoints import CheckpointError, load_checkpoint
    from ..decoding import H3VideoDecoder
    from ..latents import (
        check_latents,
        check_latents_path,
        denormalize_latents,
        read_latents,
        read_latents_header,
        swapped_axes,
    )
    from ..memory import check_fits, decode_plan
    from ..runtime import resolve
    from ..tiling import plan_chunks

    phases = Phases() if phases is None else phases
    check_arguments(args)
    options = decode_options(args, device)
    try:
        args.output = resolve_output(args.output)  # a symbolic link is written through
        checks.check_output_name(args.output)
        check_latents_path(args.input)
    except ValueError as error:
        raise InputError(str(error)) from None
    if checks.same_file(args.output, args.input):
        raise InputError(f"{shown(args.output)}: is the input file; give another output name")
    try:
        if rank == 0:
            checks.probe_folder(args.output)
        sound_alone = args.output.suffix.lower() in formats.AUDIO_FORMATS  # the video latents are not needed
        source = read_latents_header(args.input, audio=not args.no_audio, video=not sound_alone)
    except ValueError as error:
        raise InputError(str(error)) from None
    phases.lap("start-up")  # the interpreter, torch's import, the arguments and IN's header
    if sound_alone:
        return prepare_sound_alone(args, options, source, rank, phases)

    if rank == 0:
        say(f"loading {shown(args.model)} onto {options.device} ...")
    try:
        checkpoint = load_checkpoint(args.model, revision=args.revision)
    except CheckpointError as error:
        raise InputError(str(error)) from None
    if any(checks.same_file(args.output, path) for path in checkpoint_files(args.model, checkpoint)):
        raise InputError(
            f"{shown(args.output)}: is a file of the checkpoint {shown(args.model)}; give another output name"
        )
    config = checkpoint.config
    channels, frames_in, h, w = source.shape
    if channels != config.latent_channels:
        raise InputError(
            f"{shown(args.input)}: latents {source.shape} have {channels} channels, the model takes "
            f"{config.latent_channels}: expected ({config.latent_channels}, T, h, w) or (1, "
            f"{config.latent_channels}, T, h, w){swapped_axes(source.shape, config.latent_channels)}"
        )
    frames = plan_chunks(frames_in, config).out_frames
    height, width = h * config.patch_size, w * config.patch_size
    fps = args.fps or source.fps or DEFAULT_FPS
    try:
        if args.output.suffix.lower() == ".mp4":
            check_fps(fps, "--fps" if args.fps else f"{shown(args.input)}: metadata fps")
    except ValueError as error:
        raise InputError(str(error)) from None
    audio = None  # rank 0: (the audio checkpoint, the sound's format)
    if rank == 0 and source.audio is not None:
        audio = check_sound(args, options, source, (frames, fps))
    sound_format = audio[1] if audio is not None else None
    try:
        output_rank = 0 if ranks > 1 else None  # as `decode` asks for it
        phases.lap("checks")
        runtime = resolve(options.replace(output_rank=output_rank), config, checkpoint.tiling)
        phases.lap("kernels")  # chosen: asking for quack's GEMMs or flash-attn-4 imports quack, seconds of it
        needs = decode_plan(config, (1, *source.shape), options.dtype, options.device.type, runtime)
        what = f"decoding latents {source.shape} to {frames} frames of {width}x{height}"
        check_fits(needs, options.device, what, runtime.max_gpu_memory)
        if rank == 0:
            needed = checks.least_bytes(args.output, frames, height, width, sound_format)
            checks.check_free_space(args.output, needed)
            checks.check_encoder(args.output, width, height, fps, args.crf, args.preset, sound_format)
        phases.lap("checks")
        latents = read_latents(source)
    except ValueError as error:
        raise InputError(str(error)) from None
    try:
        z = latents if args.raw_latents else denormalize_latents(latents, config)
        check_latents(z, config.latent_channels)  # what the decoder will be given, before it is loaded
    except ValueError as error:
        raise InputError(f"{shown(args.input)}: {error}") from None
    phases.lap("read")
    sound = None
    if audio is not None:
        sound = decode_sound(args, options, source, audio[0], phases)
    try:  # the checkpoint located and checked above, not opened again; the offload decided above
        decoder = H3VideoDecoder.from_checkpoint(checkpoint, options.replace(offload=runtime.offload))
    except (CheckpointError, ValueError) as error:
        raise InputError(str(error)) from None
    phases.lap("read")
    sink = None
    if rank == 0:
        video = formats.VideoFormat(frames, height, width, fps, args.crf, args.preset)
        sink = output.open_sink(args.output, video, sound)
    return Prepared(decoder, z, fps, frames, height, width, sink, sound, phases)


def prepare_sound_alone(args: argparse.Namespace, options, source, rank: int, phases: Phases) -> Prepared:
    """`prepare` for a .wav or .flac OUT: the sound alone, decoded on rank 0 (the other ranks have nothing to
    do); the video latents are not read and the video checkpoint is not opened."""
    from ..latents import AUDIO_KEY

    fps = args.fps or source.fps or DEFAULT_FPS
    if source.audio is None:
        raise InputError(
            f"{shown(args.input)}: holds no audio latents ({AUDIO_KEY!r}), and {shown(args.output)} holds the sound "
            "alone; write an .mp4 or .safetensors for the video"
        )
    if rank != 0:
        return Prepared(None, None, fps, 0, 0, 0, None, phases=phases)
    checkpoint, sound_format = check_sound(args, options, source, None)
    try:
        checks.check_free_space(args.output, checks.least_bytes(args.output, 0, 0, 0, sound_format))
        checks.check_encoder(args.output, 0, 0, fps, args.crf, args.preset, sound_format)
    except ValueError as error:
        raise InputError(str(error)) from None
    phases.lap("checks")
    sound = decode_sound(args, options, source, checkpoint, phases)
    sink = output.open_sink(args.output, formats.VideoFormat(0, 0, 0, fps), sound)
    return Prepared(None, None, fps, 0, 0, 0, sink, sound, phases)


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


def check_sound(args: argparse.Namespace, options, source, video: tuple[int, float] | None):
    """Rank 0's checks of IN's audio latents, from headers alone: the audio VAE located (its tensor headers
    read), OUT none of its files, its latent channels and sample rate against IN's, the audio's duration
    against the video's (`video`: frames and fps; None for the sound alone), and the memory of its decode.
    Returns (the audio checkpoint, the sound's formats.SoundFormat)."""
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
    if any(checks.same_file(args.output, path) for path in checkpoint_files(where, checkpoint)):
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
    return checkpoint, formats.SoundFormat(shape[0], latents * config.hop_length, config.sample_rate)


def decode_sound(args: argparse.Namespace, options, source, checkpoint, phases: Phases) -> formats.Soundtrack:
    """Rank 0: IN's audio latents read and checked, the audio decoder built on this run's device (float32; the
    fused activation unless --eager), the sound decoded and brought to the host, the decoder dropped before the
    video decoder is built, a `sound` progress bar over its AMP blocks meanwhile; all that is `phases`'s lap
    "sound". InputError for unreadable latents or weights, WriteError for NaN in the sound."""
    import torch

    from ..audio.decoder import H3AudioDecoder
    from ..checkpoints import CheckpointError
    from ..latents import read_audio_latents

    try:
        audio_latents = read_audio_latents(source)
        decoder = H3AudioDecoder.from_checkpoint(checkpoint, device=options.device, fused=False if args.eager else None)
    except (CheckpointError, ValueError) as error:
        raise InputError(str(error)) from None
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
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
    if options.device.type == "cuda":
        torch.cuda.empty_cache()  # the video decoder's automatic tile batch reads the free memory
    channels, length = sound.samples.shape
    phases.lap("sound")
    say(
        f"sound: audio latents {tuple(audio_latents.shape)} -> {channels} x {length} samples at {sound.sample_rate} "
        f"Hz ({length / sound.sample_rate:.3f} s) in {phases.seconds['sound']:.1f} s"
    )
    return sound
