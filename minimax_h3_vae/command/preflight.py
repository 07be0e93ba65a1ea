"""Before the decode: every check, cheapest first, then the decoders built through the library's doors and
the sound decoded (`prepare`); what it hands to the run is a `Prepared`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..files import resolve_output
from ..latents import DEFAULT_FPS, check_fps
from ..text import shown
from . import checks, formats, output
from .commit import OutputFile
from .flags import check_arguments, decode_options
from .report import InputError, say
from .sound import SoundBeside, check_sound, decode_sound
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
    sound_seconds: float = 0.0  # the sound's decode, its load included
    sound_when: str = "before"  # before the video weights' load, or beside it (and the decode): SOUND_WHEN
    sound_pending: SoundBeside | None = None  # still decoding beside the video: the sink waits for it (`begin`)


# When the sound was decoded, as the run's summary says it.
SOUND_WHEN = ("before", "beside the weights' load", "beside the weights' load and the decode")


def prepare(args: argparse.Namespace, device, rank: int, ranks: int = 1, phases: Phases | None = None) -> Prepared:
    """Every check, cheapest first, then the decoders, the sound decoded (on rank 0), and (on rank 0) the open
    output. `phases` (the run's, begun at its start) gets the laps start-up, checks, kernels, read and sound.

    Before anything is loaded: the arguments and run options, OUT (format, its folder takes a file, not IN),
    IN's header. From the checkpoints' headers alone: OUT is none of their files, the latent channels, the
    frame rate, the audio's duration against the video's, free disk space, and the memory plan of the resolved
    run settings. Only then are the latents and the weights read, and on rank 0 the sound decoded: beside the
    video decoder's load where the GPU has room for both, and then beside the video's decode too where it has
    room for the decode's whole working set and the sound's (`memory.fits_beside`); else before the load. A
    sound still decoding is handed to the run as `sound_pending`, with a sink that waits for it.
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
    from ..memory import check_fits, decode_plan, fits_beside
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
    if any(checks.same_file(args.output, path) for path in checks.checkpoint_files(args.model, checkpoint)):
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
    audio = None  # rank 0: sound.SoundPlan
    if rank == 0 and source.audio is not None:
        audio = check_sound(args, options, source, (frames, fps))
    sound_format = audio.format if audio is not None else None
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
    beside, decoded, failure = None, None, None
    if audio is not None:
        cap = runtime.max_gpu_memory
        if fits_beside(needs, audio.device_bytes, options.device, cap):
            through = fits_beside(needs, audio.device_bytes, options.device, cap, decode=True)
            beside = SoundBeside(args, options, source, audio.checkpoint, beside_decode=through)
        else:
            decoded = decode_sound(args, options, source, audio.checkpoint)
            phases.lap("sound")
    try:
        try:  # the checkpoint located and checked above, not opened again; the offload decided above
            decoder = H3VideoDecoder.from_checkpoint(checkpoint, options.replace(offload=runtime.offload))
        except (CheckpointError, ValueError) as error:
            failure = InputError(str(error))
        phases.lap("read")
        if beside is not None and (failure is not None or not beside.beside_decode):
            decoded = beside.result()  # its failure first, as if it had been decoded before the load
            phases.lap("sound")  # what the sound took beyond the load
        if failure is not None:
            raise failure
        pending = beside if beside is not None and decoded is None else None
        sound = decoded.sound if decoded is not None else None
        sink = None
        if rank == 0:
            video = formats.VideoFormat(frames, height, width, fps, args.crf, args.preset)
            sink = output.open_sink(args.output, video, sound_format if pending is not None else sound)
    except BaseException:
        if beside is not None:
            beside.cancel()
        raise
    when = SOUND_WHEN[0 if beside is None else 2 if pending is not None else 1]
    seconds = decoded.seconds if decoded is not None else 0.0
    return Prepared(decoder, z, fps, frames, height, width, sink, sound, phases, seconds, when, pending)


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
    audio = check_sound(args, options, source, None)
    try:
        checks.check_free_space(args.output, checks.least_bytes(args.output, 0, 0, 0, audio.format))
        checks.check_encoder(args.output, 0, 0, fps, args.crf, args.preset, audio.format)
    except ValueError as error:
        raise InputError(str(error)) from None
    phases.lap("checks")
    decoded = decode_sound(args, options, source, audio.checkpoint)
    phases.lap("sound")
    sink = output.open_sink(args.output, formats.VideoFormat(0, 0, 0, fps), decoded.sound)
    return Prepared(None, None, fps, 0, 0, 0, sink, decoded.sound, phases, decoded.seconds)
