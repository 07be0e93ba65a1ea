"""Decode MiniMax-H3 latents to an mp4 with sound (or to uint8 frames in a .safetensors file, or the sound alone).

    minimax-h3-decode IN.safetensors OUT.mp4 [--model SOURCE] [--revision REV] [--audio-model SOURCE]
        [--no-audio] [--device cpu|cuda] [--dtype fp32|fp16] [--fps 24] [--crf 17] [--preset NAME] [--raw-latents]
        [--eager] [--tile-batch N] [--offload auto|none|blocks] [--max-gpu-memory GIB] [--verbose]

IN holds the latents under the key `latents` (or as its only tensor), shaped (24, T, h, w) or
(1, 24, T, h, w). They are the pipeline's normalised latents unless --raw-latents is given. Audio latents
under `audio_latents`, (2, 32, N) as the pipeline makes them, are decoded first (on rank 0 alone under torchrun)
and go into OUT beside the video. Frames are written as they are decoded; the output file appears only once it
is complete and verified.

Exit codes: 0 written; 1 failed while decoding or writing; 2 bad input (one `error:` line, checked before
the model is loaded where possible); 130, 143, 129 stopped by SIGINT, SIGTERM, SIGHUP (128 + the number of
any handled signal; 152 for SIGXCPU, which `ulimit -t` sends). Whatever the failure, nothing is left behind
and an existing OUT is unchanged (README, "Command line").
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import distributed, output
from .output import WriteError
from .text import one_line, parse_number, parse_whole, shown

DEFAULT_FPS = output.DEFAULT_FPS
DEFAULT_CRF = 17
# Every signal whose default action ends the process and that a handler may catch (SIGKILL and SIGSTOP
# cannot be caught; SIGPIPE stays ignored, as Python sets it, so a closed pipe is an error where it is
# written; the fault signals SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT are crashes, not requests to stop).
STOP_SIGNALS = {
    signum: signum.name
    for signum in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGVTALRM,
        signal.SIGPROF,
        signal.SIGXCPU,
        signal.SIGXFSZ,
    )
}
# `ulimit -t N` sets the soft and the hard CPU limit to N seconds: the kernel then sends SIGKILL at N with no
# SIGXCPU first, and nothing could clean up. The command lowers the soft limit by this share of N (at least
# CPU_MARGIN_S seconds), so that SIGXCPU comes first and the cleanup has that much CPU time left to run.
CPU_MARGIN_S, CPU_MARGIN_SHARE = 2, 0.1


# What writing to a closed (None or a closed file), full or broken stream raises.
STREAM_ERRORS = (OSError, ValueError, AttributeError)


class Diagnostics:
    """A file-like stderr (for `say`, tqdm and tracebacks) that writes best-effort: a closed, full or broken
    stderr never costs the output."""

    def write(self, text: str) -> None:
        try:
            sys.stderr.write(text)
        except STREAM_ERRORS:
            pass

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except STREAM_ERRORS:
            pass


def say(line: str) -> None:
    """One line on stderr, best-effort (Diagnostics)."""
    diagnostics = Diagnostics()
    diagnostics.write(line + "\n")
    diagnostics.flush()


class InputError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


class Stopped(BaseException):
    """A stop signal (STOP_SIGNALS) arrived: unwinds like KeyboardInterrupt, exit code 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(STOP_SIGNALS.get(signum, f"signal {signum}"))
        self.signum = signum


class Agreed(Exception):
    """A failure that every rank has agreed on (under torchrun); rank 0 alone reports it."""

    def __init__(self, code: int, line: str):
        super().__init__(line)
        self.code, self.line = code, line


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as the one-line `error:` of every other bad input (exit code 2)."""

    def error(self, message: str):
        say(f"error: {message} (see {self.prog} --help)")
        sys.exit(2)


EXAMPLES = """examples:
  minimax-h3-decode latents.safetensors out.mp4                           # the released VAE, from the hub
  minimax-h3-decode latents.safetensors out.mp4 --model /models/MiniMax-H3 --fps 24
  minimax-h3-decode examples/latents.safetensors example.mp4 --model examples/tiny_h3_vae   # in the checkout
  minimax-h3-decode latents.safetensors frames.safetensors --device cpu   # uint8 frames, no ffmpeg needed
  minimax-h3-decode latents.safetensors sound.wav                         # the sound alone
  minimax-h3-decode latents.safetensors out.mp4 --model vae.safetensors --audio-model audio_vae.safetensors"""


def flag_type(parse):
    """An argparse type reading a flag's value the one strict way (text.parse_number or parse_whole)."""

    def read(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return read


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="minimax-h3-decode",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", type=Path, help="latents .safetensors file")
    parser.add_argument(
        "output",
        type=Path,
        help="output .mp4 (H.264, with AAC sound when IN holds audio latents), .safetensors (uint8 frames 'video', "
        "float32 sound 'audio'), or .wav / .flac (the sound alone)",
    )
    parser.add_argument(
        "--model",
        default="MiniMaxAI/MiniMax-H3",
        help="hub repo id, repo root, video_vae/ or vae/ folder, or single .safetensors file "
        "(default: MiniMaxAI/MiniMax-H3 from the Hugging Face hub, or its cached copy)",
    )
    parser.add_argument(
        "--revision",
        help="hub branch, tag or commit of --model (default: the cached main, else the hub's); a branch or tag "
        "asks the hub for its newest commit",
    )
    parser.add_argument(
        "--audio-model",
        metavar="SOURCE",
        help="the audio VAE: hub repo id, repo root, audio_vae/ folder or ComfyUI audio .safetensors file (default: "
        "--model's own, or the audio_vae/ folder beside a video_vae/ or vae/ folder)",
    )
    parser.add_argument("--no-audio", action="store_true", help="leave IN's audio latents out: the video alone")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), help="default: fp16 (release recipe) on cuda, else fp32")
    parser.add_argument(
        "--fps",
        type=flag_type(parse_number),
        help="frame rate, 0.01 to 1000 (default: the input's fps metadata, else 24)",
    )
    parser.add_argument(
        "--crf",
        type=flag_type(parse_whole),
        default=DEFAULT_CRF,
        help="mp4 quality, 0-51, lower is better (default 17); 0 is lossless RGB (exact frames, few players)",
    )
    parser.add_argument("--preset", choices=output.X264_PRESETS, help="mp4 encoder speed (default: ffmpeg's, medium)")
    parser.add_argument("--raw-latents", action="store_true", help="latents are already denormalised")
    parser.add_argument("--eager", action="store_true", help="do not use the fused Triton kernels")
    parser.add_argument(
        "--tile-batch",
        type=flag_type(parse_whole),
        metavar="N",
        help="tiles per decoder call (default: as many as fit; lower it to save GPU memory)",
    )
    parser.add_argument(
        "--gemm",
        choices=("auto", "cublas", "quack"),
        default="cublas",
        help="GEMMs of the fused fp16 path: cublas (default: importing quack takes 8-17 s, more than it "
        "saves on one clip), quack (Hopper, the hopper extra; ~7%% faster per unit) or auto (quack where it runs)",
    )
    parser.add_argument(
        "--attention",
        choices=("auto", "sdpa", "fa4"),
        default="sdpa",
        help="attention of the fused fp16 path: sdpa (default: torch's; FlashAttention 4 imports quack, 8-17 s), "
        "fa4 (Hopper, the hopper extra; ~4%% faster per unit) or auto (fa4 where it runs)",
    )
    parser.add_argument(
        "--offload",
        choices=("auto", "none", "blocks"),
        default="auto",
        help="blocks: stream the block weights from host memory (small GPUs); auto (default): only if needed",
    )
    parser.add_argument(
        "--max-gpu-memory",
        type=flag_type(parse_number),
        metavar="GIB",
        help="GPU memory the decoder may hold, weights included",
    )
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    return parser.parse_args(argv)


def agree(error: Exception | None, ranks: int) -> None:
    """Every rank calls this at the same points (after preparing, after each chunk, after writing): all
    learn whether any rank failed, and all raise the first failing rank's report as `Agreed`, with its
    exit code, so none is left waiting in a collective. On one process: the error itself, if any."""
    if ranks == 1:
        if error is not None:
            raise error
        return
    failed = distributed.agree(None if error is None else describe(error), ranks)
    if failed is not None:
        rank, (code, line) = failed
        raise Agreed(code, f"{line} (rank {rank})" if rank else line)


# ---- the run --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    decoder: object | None  # H3VideoDecoder; None when OUT holds the sound alone
    z: object | None  # raw latents (1, C, T, h, w), float32
    fps: float
    frames: int
    height: int
    width: int
    sink: output.OutputFile | None  # rank 0's open output
    sound: output.Soundtrack | None = None  # rank 0's decoded sound, already in the sink


def run(args: argparse.Namespace, rank: int, ranks: int, device, watchdog: Watchdog | None = None) -> None:
    prepared = None
    try:
        error = None
        try:
            prepared = prepare(args, device, rank, ranks)
        except Exception as failure:
            error = failure
        if watchdog is not None and prepared is not None and prepared.sink is not None:
            watchdog.cleanups.append(prepared.sink.discard)
        agree(error, ranks)
        decode(args, prepared, rank, ranks, watchdog)
    except BaseException:
        if prepared is not None and prepared.sink is not None:
            prepared.sink.discard()
        raise


# Each run option's command-line flag, for the messages of DecodeOptions' checks.
FLAGS = {
    "device": "--device",
    "dtype": "--dtype",
    "tile_batch": "--tile-batch",
    "max_gpu_memory": "--max-gpu-memory",
    "offload": "--offload",
    "gemm": "--gemm",
    "attention": "--attention",
}


def decode_options(args: argparse.Namespace, device=None):
    """The command's run options, checked by `DecodeOptions` as at every other door; InputError naming the
    flag. `device`: this rank's device under torchrun (else --device)."""
    from .runtime import DecodeOptions

    try:
        return DecodeOptions(
            device=device or args.device,
            dtype=args.dtype,
            fused=False if args.eager else None,
            tile_batch=args.tile_batch,
            offload=args.offload,
            max_gpu_memory=args.max_gpu_memory,
            gemm=args.gemm,
            attention=args.attention,
        )
    except ValueError as error:
        message = str(error)
        for field, flag in FLAGS.items():
            if message.startswith(field):
                # In the flag's own words: a flag left out is the API's None.
                message = flag + re.sub(
                    r"\(or None for ([^)]*)\)", rf"(or leave {flag} out for \1)", message[len(field) :]
                )
        raise InputError(message) from None


def check_arguments(args: argparse.Namespace) -> None:
    """The output's own settings: frame rate, encoder quality and preset."""
    if args.fps is not None:
        try:
            output.check_fps(args.fps, "--fps")
        except ValueError as error:
            raise InputError(str(error)) from None
    low, high = output.CRF_RANGE
    if not low <= args.crf <= high:
        raise InputError(f"--crf must be a whole number from {low} (lossless) to {high} (worst), got {args.crf}")
    if args.output.suffix.lower() != ".mp4" and (args.crf != DEFAULT_CRF or args.preset):
        raise InputError("--crf and --preset set the mp4 encoder; the output is not an .mp4")
    if args.no_audio and args.audio_model is not None:
        raise InputError("--audio-model names the audio VAE and --no-audio leaves the sound out; give one of them")
    if args.no_audio and args.output.suffix.lower() in output.AUDIO_FORMATS:
        raise InputError(f"{shown(args.output)}: holds the sound alone, and --no-audio leaves it out; give one of them")


def checkpoint_files(model: str, checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: its weights and, for a local path, everything under it."""
    files = list(checkpoint.files.values())
    path = Path(model).expanduser()
    if path.is_file():
        files.append(path)
    elif path.is_dir():
        files += [Path(root) / name for root, _, names in os.walk(path) for name in names]
    return files


def prepare(args: argparse.Namespace, device, rank: int, ranks: int = 1) -> Prepared:
    """Every check, cheapest first, then the decoders, the sound decoded (on rank 0), and (on rank 0) the open
    output.

    Before anything is loaded: the arguments and run options, OUT (format, its folder takes a file, not IN),
    IN's header. From the checkpoints' headers alone: OUT is none of their files, the latent channels, the
    frame rate, the audio's duration against the video's, free disk space, and the memory plan of the resolved
    run settings. Only then are the latents and the weights read, and the sound decoded before the video
    decoder is built.
    """
    from .decoding import H3VideoDecoder
    from .latents import (
        check_latents,
        check_latents_path,
        denormalize_latents,
        read_latents,
        read_latents_header,
        swapped_axes,
    )
    from .loading import CheckpointError, load_checkpoint
    from .memory import check_fits, decode_plan
    from .runtime import resolve
    from .tiling import plan_chunks

    check_arguments(args)
    options = decode_options(args, device)
    try:
        args.output = output.resolve_output(args.output)  # a symbolic link is written through
        output.check_output_name(args.output)
        check_latents_path(args.input)
    except ValueError as error:
        raise InputError(str(error)) from None
    if output.same_file(args.output, args.input):
        raise InputError(f"{shown(args.output)}: is the input file; give another output name")
    try:
        if rank == 0:
            output.probe_folder(args.output)
        source = read_latents_header(args.input, audio=not args.no_audio)
    except ValueError as error:
        raise InputError(str(error)) from None
    if args.output.suffix.lower() in output.AUDIO_FORMATS:
        return prepare_sound_alone(args, options, source, rank)

    if rank == 0:
        say(f"loading {shown(args.model)} onto {options.device} ...")
    try:
        checkpoint = load_checkpoint(args.model, revision=args.revision)
    except CheckpointError as error:
        raise InputError(str(error)) from None
    if any(output.same_file(args.output, path) for path in checkpoint_files(args.model, checkpoint)):
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
            output.check_fps(fps, "--fps" if args.fps else f"{shown(args.input)}: metadata fps")
    except ValueError as error:
        raise InputError(str(error)) from None
    audio = None  # rank 0: (the audio checkpoint, the sound's format)
    if rank == 0 and source.audio is not None:
        audio = check_sound(args, options, source, (frames, fps))
    sound_format = audio[1] if audio is not None else None
    try:
        output_rank = 0 if ranks > 1 else None  # as `decode` asks for it
        runtime = resolve(options.replace(output_rank=output_rank), config, checkpoint.tiling)
        needs = decode_plan(config, (1, *source.shape), options.dtype, options.device.type, runtime)
        what = f"decoding latents {source.shape} to {frames} frames of {width}x{height}"
        check_fits(needs, options.device, what, runtime.max_gpu_memory)
        if rank == 0:
            needed = output.least_bytes(args.output, frames, height, width, sound_format)
            output.check_free_space(args.output, needed)
            output.check_encoder(args.output, width, height, fps, args.crf, args.preset, sound_format)
        latents = read_latents(source)
    except ValueError as error:
        raise InputError(str(error)) from None
    try:
        z = latents if args.raw_latents else denormalize_latents(latents, config)
        check_latents(z, config.latent_channels)  # what the decoder will be given, before it is loaded
    except ValueError as error:
        raise InputError(f"{shown(args.input)}: {error}") from None
    sound = decode_sound(args, options, source, audio[0]) if audio is not None else None
    try:  # the checkpoint located and checked above, not opened again; the offload decided above
        decoder = H3VideoDecoder.from_checkpoint(checkpoint, options.replace(offload=runtime.offload))
    except (CheckpointError, ValueError) as error:
        raise InputError(str(error)) from None
    sink = None
    if rank == 0:
        sink = output.open_sink(args.output, frames, height, width, fps, args.crf, args.preset, sound)
    return Prepared(decoder, z, fps, frames, height, width, sink, sound)


def prepare_sound_alone(args: argparse.Namespace, options, source, rank: int) -> Prepared:
    """`prepare` for a .wav or .flac OUT: the sound alone, decoded on rank 0 (the other ranks have nothing to
    do); the video latents are not read and the video checkpoint is not opened."""
    from .latents import AUDIO_KEY

    fps = args.fps or source.fps or DEFAULT_FPS
    if source.audio is None:
        raise InputError(
            f"{shown(args.input)}: holds no audio latents ({AUDIO_KEY!r}), and {shown(args.output)} holds the sound "
            "alone; write an .mp4 or .safetensors for the video"
        )
    if rank != 0:
        return Prepared(None, None, fps, 0, 0, 0, None)
    checkpoint, sound_format = check_sound(args, options, source, None)
    try:
        output.check_free_space(args.output, output.least_bytes(args.output, 0, 0, 0, sound_format))
        output.check_encoder(args.output, 0, 0, fps, args.crf, args.preset, sound_format)
    except ValueError as error:
        raise InputError(str(error)) from None
    sound = decode_sound(args, options, source, checkpoint)
    return Prepared(None, None, fps, 0, 0, 0, output.open_sink(args.output, 0, 0, 0, fps, sound=sound), sound)


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
    Returns (the audio checkpoint, the sound's output.SoundFormat)."""
    from fractions import Fraction

    from .audio.loading import DECODER_PREFIXES
    from .audio.loading import load_checkpoint as load_audio_checkpoint
    from .latents import AUDIO_RATE_KEY, check_durations
    from .loading import CheckpointError
    from .memory import audio_decode_bytes, check_bytes
    from .runtime import GIB

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
    if any(output.same_file(args.output, path) for path in checkpoint_files(where, checkpoint)):
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
    return checkpoint, output.SoundFormat(shape[0], latents * config.hop_length, config.sample_rate)


def decode_sound(args: argparse.Namespace, options, source, checkpoint) -> output.Soundtrack:
    """Rank 0: IN's audio latents read and checked, the audio decoder built on this run's device (float32; the
    fused activation unless --eager), the sound decoded and brought to the host, the decoder dropped before the
    video decoder is built. InputError for unreadable latents or weights, WriteError for NaN in the sound."""
    import torch

    from .audio.decoder import H3AudioDecoder
    from .latents import read_audio_latents
    from .loading import CheckpointError

    start = time.perf_counter()
    try:
        audio_latents = read_audio_latents(source)
        decoder = H3AudioDecoder.from_checkpoint(checkpoint, device=options.device, fused=False if args.eager else None)
    except (CheckpointError, ValueError) as error:
        raise InputError(str(error)) from None
    samples = decoder.decode(audio_latents)
    if not torch.isfinite(samples).all():
        raise WriteError(
            f"{shown(args.output)}: the decoded sound holds NaN or Inf (check the audio VAE's weights); "
            "nothing was written"
        )
    sound = output.Soundtrack(samples.cpu(), decoder.sample_rate)
    del decoder, samples
    if options.device.type == "cuda":
        torch.cuda.empty_cache()  # the video decoder's automatic tile batch reads the free memory
    channels, length = sound.samples.shape
    say(
        f"sound: audio latents {tuple(audio_latents.shape)} -> {channels} x {length} samples at {sound.sample_rate} "
        f"Hz ({length / sound.sample_rate:.3f} s) in {time.perf_counter() - start:.1f} s"
    )
    return sound


def decode(args: argparse.Namespace, prepared: Prepared, rank: int, ranks: int, watchdog=None) -> None:
    """Decode and write; with several ranks, each decodes its tiles and rank 0 alone writes the file."""
    import torch
    from tqdm import tqdm

    decoder, z, sink = prepared.decoder, prepared.z, prepared.sink
    if decoder is None:  # OUT holds the sound alone, decoded while preparing: rank 0 writes it
        error = None
        try:
            if sink is not None:
                sink.commit()
        except Exception as failure:
            error = failure
        agree(error, ranks)
        if sink is not None:
            say(f"wrote {shown(args.output)}: {prepared.sound.format.seconds:.3f} s of sound")
        return
    device = decoder.device
    output_rank = 0 if ranks > 1 else None  # rank 0 writes the file: the others need not receive the frames
    if rank != 0:
        for _ in decoder.decode_stream(z.to(device), output_rank=output_rank):
            agree(None, ranks)
        agree(None, ranks)
        return
    from . import fused
    from .blocks import EAGER_OPS
    from .runtime import placement_description

    dtype = "fp16 (release recipe)" if decoder.compute_dtype == torch.float16 else "fp32"
    ops = decoder.ops()  # what will run: a kernel that cannot run here was replaced by its eager op
    kernels = sum(getattr(ops, name) is not getattr(EAGER_OPS, name) for name in fused.FUSED_OPS)
    path = (
        "eager" if not kernels else "fused" if kernels == len(fused.FUSED_OPS) else f"{kernels} fused, the other eager"
    )
    path += ", quack's GEMMs for w1, the attention's projection and proj_out" if fused.uses_quack(ops) else ""
    path += ", FlashAttention 4" if fused.uses_fa4(ops) else ""
    placement = placement_description(decoder.runtime, device)  # offload and the GPU budget, as every door says
    spread = f" x {ranks} ranks" if ranks > 1 else ""
    frames, size = prepared.frames, f"{prepared.width}x{prepared.height}"
    placed = f"; {placement}" if placement else ""
    say(f"device {device}{spread}, {dtype}, {path} ops{placed}; checkpoint {shown(args.model)}")
    say(f"latents {tuple(z.shape[1:])} -> {frames} frames of {size} at {prepared.fps:g} fps")

    start = time.perf_counter()
    writer = output.BackgroundWriter(sink)
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:  # made at the first report, which comes before the first tile: the total shows at once
            bar = tqdm(total=total, unit="tile", desc="decoding", file=Diagnostics())
        bar.update(done - bar.n)

    try:
        for chunk in decoder.decode_stream(z.to(device), progress, output_rank=output_rank):
            error = None
            try:  # the finite check stays on the device: the writer reads it once the copy has landed
                writer.put(sink.convert(chunk), torch.isfinite(chunk).all())
            except Exception as failure:
                error = failure
            agree(error, ranks)
        if bar is not None:
            bar.close()
        error = None
        try:
            writer.close()
            with watchdog.committing() if watchdog is not None else contextlib.nullcontext():
                sink.commit()
        except Exception as failure:
            error = failure
        agree(error, ranks)
    except BaseException:
        if bar is not None:
            bar.close()
        sink.discard()  # first: it stops ffmpeg, so a writer blocked on ffmpeg's pipe returns
        writer.cancel()
        sink.discard()
        raise
    seconds = time.perf_counter() - start
    # The first chunk carries the one-time costs left after loading (Triton compiles new kernels, shape plans).
    first_chunk = writer.first_written - start
    memory = (
        f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else ""
    )
    sound = f" with {prepared.sound.format.seconds:.3f} s of sound" if prepared.sound is not None else ""
    say(
        f"wrote {shown(args.output)}: {frames} frames{sound} in {seconds:.1f} s ({frames / seconds:.2f} frames/s; "
        f"first chunk after {first_chunk:.1f} s, one-time kernel set-up included){memory}"
    )


# ---- exit codes, messages, signals ---------------------------------------------------------------------


def describe(error: BaseException) -> tuple[int, str]:
    """(exit code, the one line to print) for every way a run can end early: one line, whatever names or
    text the message holds (text.one_line)."""
    code, line = _describe(error)
    return code, one_line(line)


def _describe(error: BaseException) -> tuple[int, str]:
    if isinstance(error, Agreed):
        return error.code, error.line
    if isinstance(error, InputError):
        return 2, f"error: {error}"
    gone = distributed.stopped_ranks()  # under torchrun, the ranks of this host that have stopped
    cause = f" (rank {', '.join(map(str, gone))} had stopped)" if gone else ""
    if isinstance(error, Stopped):
        return 128 + error.signum, f"interrupted by {error}{cause}: nothing was written"
    if isinstance(error, KeyboardInterrupt):
        return 130, f"interrupted by SIGINT{cause}: nothing was written"
    if isinstance(error, distributed.RankLost):
        return 1, f"error: {error}; nothing was written"
    if isinstance(error, distributed.RankFailed):
        return 1, f"error: {error} (run with --verbose for rank {error.rank}'s traceback)"
    if isinstance(error, WriteError):
        return 1, f"error: {error}"
    if isinstance(error, OSError) and error.strerror:
        where = f"{shown(error.filename)}: " if error.filename else ""
        return 1, f"error: {where}{error.strerror}; nothing was written"
    return 1, f"error: {type(error).__name__}: {error} (run with --verbose for the traceback)"


def _stop(signum, frame) -> None:
    """The first stop signal unwinds the run, cleanup included; later ones are ignored, so that the cleanup
    finishes."""
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)


def reserve_cpu_time() -> tuple[int, int] | None:
    """Under a CPU limit whose soft and hard values are equal (`ulimit -t N`), lower the soft one by the
    margin (CPU_MARGIN_S), so that SIGXCPU, which unwinds the run like any stop signal, comes before the
    hard limit's SIGKILL. Returns the limits to put back, or None when nothing was changed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft != hard or hard == resource.RLIM_INFINITY:
        return None
    margin = max(CPU_MARGIN_S, int(hard * CPU_MARGIN_SHARE))
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (max(1, hard - margin), hard))
    except (OSError, ValueError):
        return None
    return soft, hard


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handlers, cpu_limit = {}, None
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        handlers = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
        cpu_limit = reserve_cpu_time()  # only with the handlers: SIGXCPU's default action would end the process
    rank, ranks, device, watchdog = 0, 1, None, None
    try:
        try:
            ranks = distributed.launched_world_size()
        except ValueError as error:
            raise InputError(str(error)) from None
        if ranks > 1:
            watchdog = Watchdog() if main_thread else None
            try:
                rank, ranks, device = distributed.init_process_group(cpu=args.device == "cpu")
            except distributed.RankLost:
                raise
            except (RuntimeError, ValueError) as error:  # the rendezvous: an address that does not resolve
                reason = (str(error).strip().splitlines() or ["no reason given"])[0]
                raise InputError(f"cannot join torchrun's process group ({reason}): launch with torchrun") from None
        run(args, rank, ranks, device, watchdog)
    except (Exception, KeyboardInterrupt, Stopped) as error:
        code, line = describe(error)
        if args.verbose and not isinstance(error, Agreed):
            traceback.print_exc(file=Diagnostics())
        if ranks == 1 or distributed.reports_failures():  # under torchrun: once, by the lowest running rank
            (watchdog.say_once if watchdog is not None else say)(line)
        return code
    finally:
        if ranks > 1:
            distributed.destroy_process_group()
        if watchdog is not None:
            watchdog.stop()
        if cpu_limit is not None:
            resource.setrlimit(resource.RLIMIT_CPU, cpu_limit)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return 0


class Watchdog:
    """Under torchrun, a bounded end for a rank whose main thread cannot run Python: gloo and NCCL wait
    inside C++, where a signal handler never runs, and a collective with a rank that died may wait until
    its timeout (10 minutes), while torchrun kills the rank (SIGKILL, 30 s after its SIGTERM) and its
    temporary file stays behind.

    Python writes each signal's number to the wakeup fd (`signal.set_wakeup_fd`) whatever the main thread is
    doing; this thread reads it. GRACE seconds after a stop signal, or after the main thread has waited that
    long in a collective with a rank of this host that has stopped, it discards the output (`cleanups`),
    prints the one line (on the lowest running rank, unless the main thread has) and exits the process, with
    the code the main thread would have returned. A commit in progress (`committing`: the output's fsync and
    rename) is waited for, at most COMMIT_WAIT seconds, so that it is not cut off halfway.
    """

    GRACE = 2.0  # seconds: the main thread's own unwinding takes milliseconds
    POLL = 0.25
    COMMIT_WAIT = 10.0  # at most, for the fsync and rename of a finished output (torchrun kills at 30 s)

    def __init__(self):
        self.cleanups: list = []
        self._said = False
        self._lock = threading.Lock()  # one line, once
        self._commit = threading.Lock()
        self._reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._writer = writer
        self._previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._reader.settimeout(self.POLL)
        self._thread = threading.Thread(target=self._watch, name="torchrun-watchdog", daemon=True)
        self._thread.start()

    def say_once(self, line: str) -> None:
        with self._lock:
            if not self._said:
                self._said = True
                say(line)

    def committing(self):
        return self._commit

    def stop(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self._writer.close()  # the reader sees the end and the thread returns
        self._thread.join()
        self._reader.close()

    def _watch(self) -> None:
        stopped_by, since = None, None
        while True:
            try:
                data = self._reader.recv(16)
                if not data:
                    return  # stop(): the run has ended
                if stopped_by is None and any(signum in STOP_SIGNALS for signum in data):
                    stopped_by, since = next(signum for signum in data if signum in STOP_SIGNALS), time.monotonic()
            except TimeoutError:
                pass
            now = time.monotonic()
            waiting = distributed.in_collective_since
            if stopped_by is not None and now - since > self.GRACE:
                self._end(describe(Stopped(stopped_by)))
            if waiting is not None and now - waiting > self.GRACE and distributed.stopped_ranks():
                self._end(describe(distributed.RankLost()))

    def _end(self, described: tuple[int, str]) -> None:
        code, line = described
        self._commit.acquire(timeout=self.COMMIT_WAIT)  # a commit in progress finishes first
        for cleanup in self.cleanups:
            try:
                cleanup()
            except Exception:  # the line and the exit matter more than a cleanup that fails
                pass
        if distributed.reports_failures():
            self.say_once(line)
        Diagnostics().flush()
        os._exit(code)


def console_main() -> None:
    """The `minimax-h3-decode` command: `main`, then a quick exit.

    By the time `main` returns, the run has closed, flushed and removed everything it made (the output is
    renamed or discarded, ffmpeg and the writer have finished, the process group is gone). Skipping the
    interpreter's teardown (the CUDA context, thousands of torch objects) saves about half a second per
    run on an H200 (benchmarks/RESULTS.md, run 11). `main` stays a plain function for callers in Python.
    """
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except STREAM_ERRORS:  # closed or broken: nothing more can be said there
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
