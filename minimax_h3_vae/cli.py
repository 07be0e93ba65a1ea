"""Decode MiniMax-H3 video latents to an mp4 (or to uint8 frames in a .safetensors file).

    minimax-h3-decode IN.safetensors OUT.mp4 [--model SOURCE] [--device cpu|cuda]
        [--dtype fp32|fp16] [--fps 24] [--raw-latents] [--eager] [--tile-batch N] [--verbose]

IN holds the latents under the key `latents` (or as its only tensor), shaped (24, T, h, w) or
(1, 24, T, h, w). They are the pipeline's normalised latents unless --raw-latents is given. Frames are
written as they are decoded; the output file appears only once it is complete.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

OUTPUT_FORMATS = (".mp4", ".safetensors")
DEFAULT_FPS = 24.0


class InputError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="minimax-h3-decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path, help="latents .safetensors file")
    parser.add_argument("output", type=Path, help="output .mp4 (H.264, yuv420p) or .safetensors (uint8 frames)")
    parser.add_argument(
        "--model",
        default="MiniMaxAI/MiniMax-H3",
        help="hub repo id, repo root, video_vae/ or vae/ folder, or single .safetensors file",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), help="default: fp16 (release recipe) on cuda, else fp32")
    parser.add_argument("--fps", type=float, help="frame rate (default: the input's fps metadata, else 24)")
    parser.add_argument("--raw-latents", action="store_true", help="latents are already denormalised")
    parser.add_argument("--eager", action="store_true", help="do not use the fused Triton kernels")
    parser.add_argument("--tile-batch", type=int, help="tiles per decoder call (lower it to save GPU memory)")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    return parser.parse_args(argv)


def read_latents(path: Path):
    """(latents (1, C, T, h, w) float32, fps from the metadata or None) from a .safetensors file."""
    from safetensors import safe_open

    from .latents import check_latents

    if not path.is_file():
        raise InputError(f"{path}: no such file")
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
            latents = handle.get_tensor(key)
    except InputError:
        raise
    except Exception as error:
        raise InputError(f"{path}: not a readable .safetensors file ({error})") from None
    if latents.ndim == 4:
        latents = latents[None]
    if latents.ndim != 5 or latents.shape[0] != 1:
        raise InputError(
            f"{path}: latents must be shaped (24, T, h, w) or (1, 24, T, h, w), got {tuple(latents.shape)}"
        )
    try:  # the decoder's own checks, before the (long) checkpoint load; channels once the model is known
        check_latents(latents, channels=None)
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
    return latents.float(), fps


class FrameSink:
    """Writes uint8 (H, W, 3) frames to a temporary file beside the output, renamed into place on commit."""

    def __init__(self, output: Path, width: int, height: int, fps: float):
        self.output = output
        self.kind = output.suffix.lower()
        handle, name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=self.kind, dir=output.parent)
        os.close(handle)
        self.temp = Path(name)
        self.frames = []
        self.writer = None
        if self.kind == ".mp4":
            import imageio_ffmpeg

            try:
                self.writer = imageio_ffmpeg.write_frames(
                    str(self.temp),
                    (width, height),
                    fps=fps,
                    codec="libx264",
                    pix_fmt_in="rgb24",
                    pix_fmt_out="yuv420p",
                    macro_block_size=1,
                    ffmpeg_log_level="error",
                    quality=None,
                    output_params=["-crf", "17", "-movflags", "+faststart"],
                )
                self.writer.send(None)
            except BaseException:
                self.discard()
                raise

    def write(self, frames) -> None:
        """frames: uint8 (f, H, W, 3) on the CPU."""
        if self.writer is not None:
            for frame in frames.numpy():
                self.writer.send(frame)
        else:
            self.frames.append(frames)

    def commit(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        else:
            import torch
            from safetensors.torch import save_file

            save_file({"video": torch.cat(self.frames).contiguous()}, str(self.temp))
        # mkstemp makes the file private; the output gets the permissions of any newly created file.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.temp, 0o666 & ~umask)
        os.replace(self.temp, self.output)

    def discard(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # ffmpeg may already be gone; the temporary file is removed either way
                pass
        self.temp.unlink(missing_ok=True)


class BackgroundWriter:
    """Feeds a FrameSink from a thread, so encoding a chunk overlaps decoding the next one on the GPU.

    At most `depth` chunks wait in the queue, which bounds host memory. An error in the writer is raised
    in the caller at its next `put` or at `close`.
    """

    def __init__(self, sink: FrameSink, depth: int = 2):
        self.sink = sink
        self.queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="frame-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (frames := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.sink.write(frames)
                except BaseException as error:  # handed to the caller; keep draining so it never blocks
                    self.error = error

    def put(self, frames) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(frames)

    def stop(self) -> None:
        """Let the thread write what is queued and end."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()

    def close(self) -> None:
        """Wait for every queued chunk to be written; raise the writer's error, if any."""
        self.stop()
        if self.error is not None:
            raise self.error


def check_output(output: Path) -> None:
    if output.suffix.lower() not in OUTPUT_FORMATS:
        raise InputError(f"{output}: unknown output format {output.suffix!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if not output.parent.is_dir():
        raise InputError(f"{output.parent}: output folder does not exist")
    if output.is_dir():
        raise InputError(f"{output}: is a folder; give a file name")


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


def agree(error: InputError | None, ranks: int) -> None:
    """All ranks learn whether any rank failed its checks, and all raise the first failing rank's error, so
    none goes on to wait for the others in the decode."""
    if ranks == 1:
        if error is not None:
            raise error
        return
    import torch.distributed as dist

    errors = [None] * ranks
    dist.all_gather_object(errors, None if error is None else str(error))
    failed = [(rank, text) for rank, text in enumerate(errors) if text is not None]
    if failed:
        rank, text = failed[0]
        raise InputError(f"{text} (rank {rank})")


def run(args: argparse.Namespace) -> None:
    import torch

    rank, ranks, device = init_distributed(args) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else (0, 1, None)
    try:
        error, prepared = None, None
        try:
            prepared = prepare(args, device)
        except InputError as failure:
            error = failure
        agree(error, ranks)
        decode(args, *prepared, rank=rank, ranks=ranks)
    finally:
        if ranks > 1:
            torch.distributed.destroy_process_group()


def prepare(args: argparse.Namespace, device):
    """Check the arguments, read the latents, load the decoder: (decoder, latents z, fps), or InputError."""
    import torch

    from .latents import denormalize_latents
    from .loading import CheckpointError
    from .model import H3VideoDecoder

    check_output(args.output)
    if args.tile_batch is not None and args.tile_batch < 1:
        raise InputError(f"--tile-batch must be at least 1, got {args.tile_batch}")
    if args.fps is not None and not (args.fps > 0 and math.isfinite(args.fps)):
        raise InputError(f"--fps must be a positive number, got {args.fps}")
    latents, file_fps = read_latents(args.input)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available; use --device cpu")
    device = device or torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"loading {args.model} onto {device} ...", file=sys.stderr, flush=True)
    try:
        decoder = H3VideoDecoder.from_pretrained(
            args.model, device=device, dtype=args.dtype, fused=False if args.eager else None, tile_batch=args.tile_batch
        )
    except (CheckpointError, ValueError) as error:  # ValueError: a setting, e.g. MINIMAX_H3_VAE_FUSED=yes
        raise InputError(str(error)) from None
    if latents.shape[1] != decoder.config.latent_channels:
        raise InputError(
            f"{args.input}: latents have {latents.shape[1]} channels, the model takes {decoder.config.latent_channels}"
        )
    z = latents if args.raw_latents else denormalize_latents(latents, decoder.config)
    return decoder, z, args.fps or file_fps or DEFAULT_FPS


def decode(args: argparse.Namespace, decoder, z, fps: float, rank: int, ranks: int) -> None:
    """Decode and write; with several ranks, each decodes its tiles and rank 0 alone writes the file."""
    import torch
    from tqdm import tqdm

    from .frames import to_uint8_frames
    from .tiling import plan_chunks

    config, device = decoder.config, decoder.device
    decoder.output_rank = 0 if ranks > 1 else None
    _, _, frames_in, h, w = z.shape
    frames_out = plan_chunks(frames_in, config).out_frames
    height, width = h * config.patch_size, w * config.patch_size
    if rank != 0:
        for _ in decoder.decode_stream(z.to(device)):
            pass
        return
    dtype = "fp16 (release recipe)" if decoder.compute_dtype == torch.float16 else "fp32"
    path = "fused" if decoder.runtime.fused else "eager"
    spread = f" x {ranks} ranks" if ranks > 1 else ""
    print(f"device {device}{spread}, {dtype}, {path} ops; checkpoint {args.model}", file=sys.stderr)
    print(f"latents {tuple(z.shape[1:])} -> {frames_out} frames of {width}x{height} at {fps:g} fps", file=sys.stderr)

    start = time.perf_counter()
    sink = writer = None
    try:
        sink = FrameSink(args.output, width, height, fps)
        writer = BackgroundWriter(sink)
        with tqdm(total=None, unit="tile", desc="decoding", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            for chunk in decoder.decode_stream(z.to(device), progress):
                writer.put(to_uint8_frames(chunk).cpu())
        writer.close()
        sink.commit()
    except BaseException:
        if writer is not None:
            writer.stop()
        if sink is not None:
            sink.discard()
        raise
    seconds = time.perf_counter() - start
    memory = (
        f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else ""
    )
    print(
        f"wrote {args.output}: {frames_out} frames in {seconds:.1f} s ({frames_out / seconds:.2f} frames/s){memory}",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except InputError as error:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as error:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {type(error).__name__}: {error} (run with --verbose for the traceback)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
