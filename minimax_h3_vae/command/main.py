"""Decode MiniMax-H3 latents to an mp4 with sound (or to uint8 frames in a .safetensors file, or the sound alone).

    minimax-h3-decode IN.safetensors OUT.mp4 [--model SOURCE] [--revision REV] [--audio-model SOURCE]
        [--no-audio] [--device cpu|cuda] [--dtype fp32|fp16] [--fps 24] [--crf 17] [--preset NAME] [--raw-latents]
        [--eager] [--tile-batch N] [--offload auto|none|blocks] [--max-gpu-memory GIB] [--verbose]

IN holds the latents under the key `latents` (or as its only tensor), shaped (24, T, h, w) or
(1, 24, T, h, w). They are the pipeline's normalised latents unless --raw-latents is given. Audio latents
under `audio_latents`, (2, 32, N) as the pipeline makes them, are decoded on rank 0 alone under torchrun (before
the video, or beside its load and decode where the GPU has room) and go into OUT beside the video. Frames are
written as they are decoded; the output file appears only once it is complete and verified.

Exit codes: 0 written; 1 failed while decoding or writing; 2 bad input (one `error:` line, checked before
the model is loaded where possible); 130, 143, 129 stopped by SIGINT, SIGTERM, SIGHUP (128 + the number of
any handled signal; 152 for SIGXCPU, which `ulimit -t` sends). Whatever the failure, nothing is left behind
and an existing OUT is unchanged (README, "Command line").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import sys
import threading
import time
import traceback

from .. import distributed
from ..text import shown
from .flags import parse_args
from .preflight import Prepared, prepare
from .report import STOP_SIGNALS, STREAM_ERRORS, Agreed, Diagnostics, InputError, Stopped, describe, progress_bar, say
from .signals import Watchdog, reserve_cpu_time, unwind
from .stops import Ended, Written
from .timing import Phases, process_age
from .writer import BackgroundWriter

# The fused ops that run a GEMM on quack, as the run's summary line names them.
GEMM_WORDS = {
    "linear_silu_mul": "w1",
    "linear_qk_rms_norm_rope": "the attention's projection",
    "linear_fp32": "proj_out",
}


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


def run(
    args: argparse.Namespace, rank: int, ranks: int, device, watchdog: Watchdog | None = None, started: float = 0.0
) -> None:
    """Prepare, decode and write. `started`: seconds this process ran before the run began (its start-up)."""
    prepared = None
    try:
        error = None
        try:
            prepared = prepare(args, device, rank, ranks, Phases(started))
        except Exception as failure:
            error = failure
        if watchdog is not None and prepared is not None and prepared.sink is not None:
            watchdog.cleanups.append(prepared.sink.discard)
        agree(error, ranks)
        decode(args, prepared, rank, ranks, watchdog)
    except BaseException:
        if prepared is not None and prepared.sound_pending is not None:
            prepared.sound_pending.cancel()
        if prepared is not None and prepared.sink is not None:
            prepared.sink.discard()
        raise


def decode(args: argparse.Namespace, prepared: Prepared, rank: int, ranks: int, watchdog=None) -> None:
    """Decode and write; with several ranks, each decodes its tiles and rank 0 alone writes the file."""
    import torch

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
            prepared.phases.lap("write")
            say(
                f"wrote {shown(args.output)}: {prepared.sound.format.seconds:.3f} s of sound "
                f"(decoded in {prepared.sound_seconds:.1f} s)"
            )
            if args.verbose:
                say(prepared.phases.line())
        return
    device = decoder.device
    output_rank = 0 if ranks > 1 else None  # rank 0 writes the file: the others need not receive the frames
    if rank != 0:
        for _ in decoder.decode_stream(z.to(device), output_rank=output_rank):
            agree(None, ranks)
        agree(None, ranks)
        return
    from .. import fused
    from ..runtime import placement_description

    dtype = "fp16 (release recipe)" if decoder.compute_dtype == torch.float16 else "fp32"
    chosen = decoder.runtime.kernels  # what will run: a kernel that cannot run here was left for its eager op
    kernels = sum(getattr(chosen, name) != "eager" for name in fused.FUSED_OPS)
    path = (
        "eager" if not kernels else "fused" if kernels == len(fused.FUSED_OPS) else f"{kernels} fused, the other eager"
    )
    details = []
    on_quack = [GEMM_WORDS[op] for op in fused.quack_ops(chosen)]
    if on_quack:
        details.append("quack's GEMMs for " + " and ".join(filter(None, (", ".join(on_quack[:-1]), on_quack[-1]))))
    if fused.uses_fa4(chosen):
        details.append("FlashAttention 4")
    if decoder.runtime.exact:
        details.append("exact: the release's bits")
    detailed = f" ({', '.join(details)})" if details else ""
    placement = placement_description(decoder.runtime, device)  # offload and the GPU budget, as every door says
    spread = f" x {ranks} ranks" if ranks > 1 else ""
    frames, size = prepared.frames, f"{prepared.width}x{prepared.height}"
    placed = f"; {placement}" if placement else ""
    say(f"device {device}{spread}, {dtype}, {path} ops{detailed}{placed}; checkpoint {shown(args.model)}")
    say(f"latents {tuple(z.shape[1:])} -> {frames} frames of {size} at {prepared.fps:g} fps")

    start = time.perf_counter()
    sound, sound_seconds = prepared.sound, prepared.sound_seconds
    pending = prepared.sound_pending  # the sound still decoding: the writer hands it to the sink once it is done
    writer = BackgroundWriter(sink, before=(lambda: sink.begin(pending.result().sound)) if pending else None)
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:  # made at the first report, which comes before the first tile: the total shows at once
            bar = progress_bar(total, "decoding", "tile")
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
        phases = prepared.phases
        phases.lap("decode")
        error = None
        try:
            writer.close()
            if pending is not None:  # decoded, and in the sink: the writer began with it
                decoded = pending.result()
                sound, sound_seconds = decoded.sound, decoded.seconds
                say(decoded.line)
            phases.lap("encode tail")  # the frames queued behind the decode, and the encoder's finish
            with watchdog.committing() if watchdog is not None else contextlib.nullcontext():
                sink.commit()
            phases.lap("write")  # read back, synced, renamed
        except Exception as failure:
            error = failure
        agree(error, ranks)
    except BaseException:
        if bar is not None:
            bar.close()
        sink.discard()  # first: it stops ffmpeg, so a writer blocked on ffmpeg's pipe returns
        if pending is not None:  # and a writer waiting for the sound
            pending.cancel()
        writer.cancel()
        sink.discard()
        raise
    seconds = time.perf_counter() - start
    # The first chunk carries the one-time costs left after loading (Triton compiles new kernels, shape plans).
    first_chunk = writer.first_written - start
    memory = (
        f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else ""
    )
    said = (
        f" with {sound.format.seconds:.3f} s of sound (decoded in {sound_seconds:.1f} s, {prepared.sound_when})"
        if sound is not None
        else ""
    )
    say(
        f"wrote {shown(args.output)}: {frames} frames{said} in {seconds:.1f} s ({frames / seconds:.2f} frames/s; "
        f"first chunk after {first_chunk:.1f} s, one-time kernel set-up included){memory}"
    )
    if args.verbose:
        say(phases.line())


def main(argv: list[str] | None = None, started: float = 0.0) -> int:
    """The command on `argv` (default: sys.argv); returns its exit code. `started`: the seconds this process
    ran before the call, counted into --verbose's start-up (the console entry passes the process's age)."""
    args = parse_args(argv)
    Written.note(None)
    Ended.note(None)
    handlers, cpu_limit = {}, None
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        handlers = {signum: signal.signal(signum, unwind) for signum in STOP_SIGNALS}
        cpu_limit = reserve_cpu_time()  # only with the handlers: SIGXCPU's default action would end the process
    rank, ranks, device, watchdog = 0, 1, None, None

    def hold_stops() -> None:
        """The run's outcome is decided and its one line said or about to be: a stop from now on is ignored,
        and after `main` ends the process with the run's code and no second line (`Ended`)."""
        for signum in handlers:
            signal.signal(signum, signal.SIG_IGN)

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
        run(args, rank, ranks, device, watchdog, started)
        hold_stops()
        Ended.note(0)
    except (Exception, KeyboardInterrupt, Stopped) as error:
        hold_stops()
        code, line = describe(error)
        if args.verbose and not isinstance(error, Agreed):
            traceback.print_exc(file=Diagnostics())
        if ranks == 1 or distributed.reports_failures():  # under torchrun: once, by the lowest running rank
            (watchdog.say_once if watchdog is not None else say)(line)
            if ranks > 1:
                distributed.outlive_local_ranks(Watchdog.OUTLIVE)
        Ended.note(code)
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


def console_main() -> None:
    """The `minimax-h3-decode` command: `main`, then a quick exit.

    By the time `main` returns, the run has closed, flushed and removed everything it made (the output is
    renamed or discarded, ffmpeg and the writer have finished, the process group is gone). Skipping the
    interpreter's teardown (the CUDA context, thousands of torch objects) saves about half a second per
    run on an H200. `main` stays a plain function for callers in Python.
    """
    code = main(started=process_age() or 0.0)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except STREAM_ERRORS:  # closed or broken: nothing more can be said there
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
