"""Decode MiniMax-H3 video latents to an mp4 (or to uint8 frames in a .safetensors file).

    minimax-h3-decode IN.safetensors OUT.mp4 [--model SOURCE] [--revision REV] [--device cpu|cuda]
        [--dtype fp32|fp16] [--fps 24] [--crf 17] [--preset NAME] [--raw-latents] [--eager] [--tile-batch N]
        [--offload auto|none|blocks] [--max-gpu-memory GIB] [--verbose]

IN holds the latents under the key `latents` (or as its only tensor), shaped (24, T, h, w) or
(1, 24, T, h, w). They are the pipeline's normalised latents unless --raw-latents is given. Frames are
written as they are decoded; the output file appears only once it is complete and verified.

Exit codes: 0 written; 1 failed while decoding or writing; 2 bad input (one `error:` line, checked before
the model is loaded where possible); 130, 143, 129 stopped by SIGINT, SIGTERM, SIGHUP. Whatever the
failure, nothing is left behind and an existing OUT is unchanged (README, "Command line").
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import output
from .output import WriteError

DEFAULT_FPS = 24.0
DEFAULT_CRF = 17
STOP_SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class InputError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGHUP) arrived: unwinds like KeyboardInterrupt, exit code 128 + signal."""

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
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="minimax-h3-decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="latents .safetensors file")
    parser.add_argument("output", type=Path, help="output .mp4 (H.264) or .safetensors (uint8 frames, key 'video')")
    parser.add_argument(
        "--model",
        default="MiniMaxAI/MiniMax-H3",
        help="hub repo id, repo root, video_vae/ or vae/ folder, or single .safetensors file",
    )
    parser.add_argument(
        "--revision",
        help="hub branch, tag or commit of --model (default: the cached main, else the hub's); a branch or tag "
        "asks the hub for its newest commit",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), help="default: fp16 (release recipe) on cuda, else fp32")
    parser.add_argument(
        "--fps", type=float, help="frame rate, 0.01 to 1000 (default: the input's fps metadata, else 24)"
    )
    parser.add_argument(
        "--crf",
        type=int,
        default=DEFAULT_CRF,
        help="mp4 quality, 0-51, lower is better (default 17); 0 is lossless RGB (exact frames, few players)",
    )
    parser.add_argument("--preset", choices=output.X264_PRESETS, help="mp4 encoder speed (default: ffmpeg's, medium)")
    parser.add_argument("--raw-latents", action="store_true", help="latents are already denormalised")
    parser.add_argument("--eager", action="store_true", help="do not use the fused Triton kernels")
    parser.add_argument("--tile-batch", type=int, help="tiles per decoder call (lower it to save GPU memory)")
    parser.add_argument(
        "--offload",
        choices=("auto", "none", "blocks"),
        default="auto",
        help="blocks: stream the block weights from host memory (small GPUs); auto (default): only if needed",
    )
    parser.add_argument(
        "--max-gpu-memory", type=float, metavar="GIB", help="GPU memory the decoder may hold, weights included"
    )
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    return parser.parse_args(argv)


@dataclass
class LatentsFile:
    """What the header of IN says, before any tensor data is read."""

    path: Path
    key: str
    shape: tuple[int, ...]  # (C, T, h, w)
    fps: float | None


def check_input_path(path: Path) -> None:
    if path.is_dir():
        raise InputError(f"{path}: is a folder; give the latents .safetensors file")
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: is not a regular file (a FIFO, socket or device); give a .safetensors file")
    if not path.exists():
        raise InputError(f"{path}: no such file")


def read_latents_header(path: Path) -> LatentsFile:
    """IN's tensor name, shape and dtype and its fps metadata, from the header alone; InputError if the
    decoder cannot take them."""
    from safetensors import safe_open

    from .latents import check_dtype

    check_input_path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            keys = list(handle.keys())
            metadata = handle.metadata() or {}
            if "latents" in keys:
                key = "latents"
            elif len(keys) == 1:
                key = keys[0]
            else:
                raise InputError(f"{path}: no tensor named 'latents' among {keys[:8]}; name it 'latents'")
            tensor = handle.get_slice(key)
            shape, dtype_name = tuple(tensor.get_shape()), tensor.get_dtype()
    except InputError:
        raise
    except Exception as error:  # safetensors' own error types; their text says what is wrong
        raise InputError(f"{path}: not a readable .safetensors file ({error})") from None
    if len(shape) == 5 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != 4:
        raise InputError(f"{path}: latents must be shaped (24, T, h, w) or (1, 24, T, h, w), got {shape}")
    if min(shape) == 0:
        raise InputError(f"{path}: latents are empty: shape {shape}")
    dtype = torch_dtype(dtype_name)
    if dtype is None or not dtype.is_floating_point:
        got = str(dtype).removeprefix("torch.") if dtype is not None else dtype_name
        raise InputError(f"{path}: latents must be floating point, got {got}")
    try:
        check_dtype(dtype)
    except ValueError as error:
        raise InputError(f"{path}: {error}") from None
    fps = None
    if "fps" in metadata:
        try:
            fps = float(metadata["fps"])
        except ValueError:
            fps = math.nan
        if not (fps > 0 and math.isfinite(fps)):
            raise InputError(f"{path}: metadata fps={metadata['fps']!r} is not a positive number; fix it or pass --fps")
    return LatentsFile(path, key, shape, fps)


def torch_dtype(name: str):
    """A safetensors dtype name (F32, BF16, F8_E4M3, I64, ...) as a torch dtype; None if torch has none."""
    import torch

    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn"}
    names.update(F8_E5M2="float8_e5m2", I64="int64", I32="int32", I16="int16", I8="int8", U8="uint8", BOOL="bool")
    return getattr(torch, names.get(name, ""), None)


def read_latents(source: LatentsFile):
    """The latents (1, C, T, h, w) as float32; InputError for NaN or Inf."""
    from safetensors import safe_open

    from .latents import check_latents

    try:
        with safe_open(str(source.path), framework="pt", device="cpu") as handle:
            latents = handle.get_tensor(source.key)
    except Exception as error:
        raise InputError(f"{source.path}: not a readable .safetensors file ({error})") from None
    latents = latents.reshape(1, *source.shape)
    try:
        check_latents(latents, channels=None)
    except ValueError as error:
        raise InputError(f"{source.path}: {error}") from None
    return latents.float()


class BackgroundWriter:
    """Writes frames to a sink from a thread, so that copying and encoding a chunk overlap decoding the next.

    `put(frames)` takes one chunk's uint8 frames (f, H, W, 3) on the CPU or a CUDA device. CUDA frames are
    copied into a pinned host buffer in stream order, without waiting; `put` then waits only for the copy
    of the chunk before, so the GPU always has the next chunk's work queued while the host writes, and the
    host runs at most one chunk ahead of the GPU. At most `depth` chunks wait for the thread, which bounds
    host memory (`depth` + 2 pinned buffers). An error in the writer is raised in the caller at its next
    `put` or at `close`.
    """

    def __init__(self, sink: output.Sink, depth: int = 2):
        self.sink = sink
        self.queue = queue.Queue(maxsize=depth)
        self.idle = queue.Queue()  # pinned buffers the thread has written out
        self.buffers, self.most_buffers, self.largest = 0, depth + 2, 0
        self.last_copy = None  # the event of the latest chunk's copy to the host
        self.error: BaseException | None = None
        self.cancelled = False
        self.first_written: float | None = None  # time.perf_counter() when the first chunk was written
        self.thread = threading.Thread(target=self._run, name="frame-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            frames, copied, buffer = item
            if self.error is None and not self.cancelled:
                try:
                    if copied is not None:
                        copied.synchronize()
                    self.sink.write(frames)
                    self.first_written = self.first_written or time.perf_counter()
                except BaseException as error:  # handed to the caller; keep draining so it never blocks
                    self.error = error
            if buffer is not None:
                self.idle.put(buffer)

    def put(self, frames) -> None:
        import torch

        if self.error is not None:
            raise self.error
        buffer = copied = None
        if frames.is_cuda:
            buffer = self._buffer(frames.numel())
            host = buffer[: frames.numel()].view(frames.shape)
            host.copy_(frames, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(frames.device))
            earlier, self.last_copy, frames = self.last_copy, copied, host
            if earlier is not None:
                earlier.synchronize()
        self.queue.put((frames, copied, buffer))

    def _buffer(self, size: int):
        """A pinned uint8 buffer of at least `size` bytes: one the thread is done with, or a new one while
        there are fewer than `most_buffers`. New buffers take the largest chunk seen so far, so that a short
        chunk (a clip's last) never leaves a buffer too small for the next."""
        import torch

        self.largest = max(self.largest, size)
        buffer = None
        if self.buffers < self.most_buffers and self.idle.empty():
            self.buffers += 1
        else:
            buffer = self.idle.get()
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(self.largest, dtype=torch.uint8, pin_memory=True)
        return buffer

    def close(self) -> None:
        """Wait for every queued chunk to be written; raise the writer's error, if any."""
        self._stop()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """Drop what is queued and end the thread (after the chunk it is writing, if any)."""
        self.cancelled = True
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self._stop()

    def _stop(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


# ---- torch.distributed ---------------------------------------------------------------------------------


def init_distributed(args: argparse.Namespace):
    """Under torchrun (WORLD_SIZE > 1): join the process group, NCCL on CUDA (the GPU of LOCAL_RANK), gloo
    on the CPU. Returns (rank, world size, device)."""
    import datetime

    import torch
    import torch.distributed as dist

    use_cuda = args.device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # A rank that dies mid-decode leaves the others waiting in a collective: bound that wait.
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=10))
    return dist.get_rank(), dist.get_world_size(), device


def agree(error: Exception | None, ranks: int) -> None:
    """Every rank calls this at the same points (after preparing, after each chunk, after writing): all
    learn whether any rank failed, and all raise the first failing rank's report as `Agreed`, with its
    exit code, so none is left waiting in a collective. On one process: the error itself, if any."""
    if ranks == 1:
        if error is not None:
            raise error
        return
    import torch.distributed as dist

    reports = [None] * ranks
    dist.all_gather_object(reports, None if error is None else describe(error))
    failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
    if failed:
        rank, (code, line) = failed[0]
        raise Agreed(code, f"{line} (rank {rank})" if rank else line)


# ---- the run --------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    decoder: object  # H3VideoDecoder
    z: object  # raw latents (1, C, T, h, w), float32
    fps: float
    frames: int
    height: int
    width: int
    sink: output.Sink | None  # rank 0's open output


def run(args: argparse.Namespace, rank: int, ranks: int, device) -> None:
    prepared = None
    try:
        error = None
        try:
            prepared = prepare(args, device, rank)
        except Exception as failure:
            error = failure
        agree(error, ranks)
        decode(args, prepared, rank, ranks)
    except BaseException:
        if prepared is not None and prepared.sink is not None:
            prepared.sink.discard()
        raise


def check_arguments(args: argparse.Namespace) -> None:
    if args.tile_batch is not None and args.tile_batch < 1:
        raise InputError(f"--tile-batch must be at least 1, got {args.tile_batch}")
    if args.fps is not None:
        try:
            output.check_fps(args.fps, "--fps")
        except ValueError as error:
            raise InputError(str(error)) from None
    if args.max_gpu_memory is not None and not (0 < args.max_gpu_memory < math.inf):
        raise InputError(f"--max-gpu-memory must be a positive number of GiB, got {args.max_gpu_memory}")
    low, high = output.CRF_RANGE
    if not low <= args.crf <= high:
        raise InputError(f"--crf must be a whole number from {low} (lossless) to {high} (worst), got {args.crf}")
    if args.output.suffix.lower() != ".mp4" and (args.crf != DEFAULT_CRF or args.preset):
        raise InputError("--crf and --preset set the mp4 encoder; the output is not an .mp4")


def checkpoint_files(model: str, checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: its weights and, for a local path, everything under it."""
    files = list(checkpoint.files.values())
    path = Path(model).expanduser()
    if path.is_file():
        files.append(path)
    elif path.is_dir():
        files += [Path(root) / name for root, _, names in os.walk(path) for name in names]
    return files


def prepare(args: argparse.Namespace, device, rank: int) -> Prepared:
    """Every check, cheapest first, then the decoder and (on rank 0) the open output.

    Before anything is loaded: the arguments, OUT (format, its folder takes a file, not IN), IN's header,
    the device settings. From the checkpoint's headers alone: OUT is none of its files, the latent
    channels, the frame rate, free disk space and the memory estimate. Only then are the latents and the
    weights read.
    """
    import torch

    from .latents import denormalize_latents
    from .limits import check_fits, estimate
    from .loading import CheckpointError, load_checkpoint
    from .model import H3VideoDecoder, weight_bytes
    from .runtime import resolve_device, resolve_dtype, resolve_fused
    from .tiling import plan_chunks

    check_arguments(args)
    try:
        output.check_output_name(args.output)
    except ValueError as error:
        raise InputError(str(error)) from None
    check_input_path(args.input)
    if output.same_file(args.output, args.input):
        raise InputError(f"{args.output}: is the input file; give another output name")
    if rank == 0:
        try:
            output.probe_folder(args.output)
        except ValueError as error:
            raise InputError(str(error)) from None
    source = read_latents_header(args.input)

    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available; use --device cpu")
    try:
        device = device or resolve_device(args.device)
        dtype = resolve_dtype(args.dtype, device)
        fused = False if args.eager else resolve_fused(None, device)
    except ValueError as error:  # e.g. MINIMAX_H3_VAE_FUSED=yes
        raise InputError(str(error)) from None

    if rank == 0:
        print(f"loading {args.model} onto {device} ...", file=sys.stderr, flush=True)
    try:
        checkpoint = load_checkpoint(args.model, revision=args.revision)
    except CheckpointError as error:
        raise InputError(str(error)) from None
    if any(output.same_file(args.output, path) for path in checkpoint_files(args.model, checkpoint)):
        raise InputError(f"{args.output}: is a file of the checkpoint {args.model}; give another output name")
    config = checkpoint.config
    channels, frames_in, h, w = source.shape
    if channels != config.latent_channels:
        raise InputError(f"{args.input}: latents have {channels} channels, the model takes {config.latent_channels}")
    frames = plan_chunks(frames_in, config).out_frames
    height, width = h * config.patch_size, w * config.patch_size
    fps = args.fps or source.fps or DEFAULT_FPS
    element = 2 if dtype == torch.float16 else 4
    linears, others = weight_bytes(config, dtype)
    if args.offload != "none" and device.type == "cuda":  # streamed (or streamed if it must): two blocks' linears
        linears = 2 * linears // config.num_layers
    weights = linears + others
    cap = None if args.max_gpu_memory is None else int(args.max_gpu_memory * 2**30)
    try:
        if args.output.suffix.lower() == ".mp4":
            output.check_fps(fps, "--fps" if args.fps else f"{args.input}: metadata fps")
        needs = estimate(source.shape, config, device, weights, args.tile_batch, element)
        what = f"decoding latents {source.shape} to {frames} frames of {width}x{height}"
        check_fits(needs, device, what, cap)
        if rank == 0:
            output.check_free_space(args.output, output.least_bytes(args.output, frames, height, width))
    except ValueError as error:
        raise InputError(str(error)) from None

    latents = read_latents(source)
    try:
        z = latents if args.raw_latents else denormalize_latents(latents, config)
    except ValueError as error:
        raise InputError(f"{args.input}: {error}") from None
    try:
        decoder = H3VideoDecoder.from_checkpoint(  # the checkpoint located and checked above, not opened again
            checkpoint,
            device=device,
            dtype=dtype,
            fused=fused,
            tile_batch=args.tile_batch,
            offload=args.offload,
            max_gpu_memory=args.max_gpu_memory,
        )
    except (CheckpointError, ValueError) as error:
        raise InputError(str(error)) from None
    sink = output.open_sink(args.output, frames, height, width, fps, args.crf, args.preset) if rank == 0 else None
    return Prepared(decoder, z, fps, frames, height, width, sink)


def decode(args: argparse.Namespace, prepared: Prepared, rank: int, ranks: int) -> None:
    """Decode and write; with several ranks, each decodes its tiles and rank 0 alone writes the file."""
    import torch
    from tqdm import tqdm

    from .frames import to_uint8_frames

    decoder, z, sink = prepared.decoder, prepared.z, prepared.sink
    device = decoder.device
    decoder.output_rank = 0 if ranks > 1 else None
    if rank != 0:
        for _ in decoder.decode_stream(z.to(device)):
            agree(None, ranks)
        agree(None, ranks)
        return
    dtype = "fp16 (release recipe)" if decoder.compute_dtype == torch.float16 else "fp32"
    path = "fused" if decoder.runtime.fused else "eager"
    path += ", block weights streamed from host memory" if decoder.runtime.offload == "blocks" else ""
    spread = f" x {ranks} ranks" if ranks > 1 else ""
    frames, size = prepared.frames, f"{prepared.width}x{prepared.height}"
    print(f"device {device}{spread}, {dtype}, {path} ops; checkpoint {args.model}", file=sys.stderr)
    print(f"latents {tuple(z.shape[1:])} -> {frames} frames of {size} at {prepared.fps:g} fps", file=sys.stderr)

    start = time.perf_counter()
    writer = BackgroundWriter(sink)
    try:
        with tqdm(total=None, unit="tile", desc="decoding", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            for chunk in decoder.decode_stream(z.to(device), progress):
                error = None
                try:
                    writer.put(to_uint8_frames(chunk))
                except Exception as failure:
                    error = failure
                agree(error, ranks)
        error = None
        try:
            writer.close()
            sink.commit()
        except Exception as failure:
            error = failure
        agree(error, ranks)
    except BaseException:
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
    print(
        f"wrote {args.output}: {frames} frames in {seconds:.1f} s ({frames / seconds:.2f} frames/s; first chunk "
        f"after {first_chunk:.1f} s, one-time kernel set-up included){memory}",
        file=sys.stderr,
    )


# ---- exit codes, messages, signals ---------------------------------------------------------------------


def describe(error: BaseException) -> tuple[int, str]:
    """(exit code, the one line to print) for every way a run can end early."""
    if isinstance(error, Agreed):
        return error.code, error.line
    if isinstance(error, InputError):
        return 2, f"error: {error}"
    if isinstance(error, Stopped):
        return 128 + error.signum, f"interrupted by {error}: nothing was written"
    if isinstance(error, KeyboardInterrupt):
        return 130, "interrupted by SIGINT: nothing was written"
    if isinstance(error, WriteError):
        return 1, f"error: {error}"
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
    rank = int(os.environ.get("RANK", "0"))
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = False
    try:
        device = None
        if ranks > 1:
            rank, ranks, device = init_distributed(args)
            distributed = True
        run(args, rank, ranks, device)
    except (Exception, KeyboardInterrupt, Stopped) as error:
        code, line = describe(error)
        if args.verbose and not isinstance(error, Agreed):
            traceback.print_exc()
        if rank == 0 or not isinstance(error, Agreed):
            print(line, file=sys.stderr, flush=True)
        return code
    finally:
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return 0


def console_main() -> None:
    """The `minimax-h3-decode` command: `main`, then a quick exit.

    By the time `main` returns, the run has closed, flushed and removed everything it made (the output is
    renamed or discarded, ffmpeg and the writer have finished, the process group is gone). Skipping the
    interpreter's teardown (the CUDA context, thousands of torch objects) saves about half a second per
    run on an H200 (benchmarks/RESULTS.md, run 11). `main` stays a plain function for callers in Python.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
