"""Tile-parallel decode timing under torchrun, released architecture with random weights, fp16 fused.

    torchrun --standalone --nproc_per_node N benchmarks/bench_distributed.py [--tile-batch 7] [--clip]

Reports, on rank 0: ms per temporal unit at 1344x768 (28 tiles; CUDA events, warm-up, median of 5), peak
GPU memory per rank, and a SHA-256 of the decoded unit, so runs with different N can be compared bit for
bit (with the same --tile-batch, the decoder calls are the same for every N). With N = 1 it also times the
plain path before the process group exists, for the distributed path's overhead at world size 1.
With --clip, a 10 s clip (72 latent frames) through decode_stream. JSON goes to $OUT/distributed-N.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import UNIT_SHAPE, random_released_decoder, timed  # noqa: E402


def time_unit(model, z: torch.Tensor, repeats: int = 5) -> tuple[float, torch.Tensor]:
    """Median CUDA-event ms of one decode, the ranks lined up by a barrier before each call."""
    t = timed(lambda: model.decode(z), repeats, before_each=dist.barrier if dist.is_initialized() else None)
    return t.ms, t.out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tile-batch", type=int)
    parser.add_argument("--clip", action="store_true")
    parser.add_argument("--write-checkpoint", help="rank 0 also writes the weights here (ComfyUI fp16 layout)")
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    model = random_released_decoder(device)
    model.configure(fused=True)
    model.configure(tile_batch=args.tile_batch)
    z = torch.randn(UNIT_SHAPE, device=device, generator=torch.Generator(device).manual_seed(1))
    result = {
        "world_size": world,
        "tile_batch": args.tile_batch,
        "card": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    if world == 1:
        result["plain_ms_per_unit"], plain = time_unit(model, z)
    dist.init_process_group("nccl", device_id=device)
    torch.cuda.reset_peak_memory_stats()
    result["distributed_ms_per_unit"], out = time_unit(model, z)
    result["sha256"] = hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()
    if world == 1:
        result["plain_equals_distributed"] = bool(torch.equal(plain, out))
        result["overhead_percent"] = 100 * (result["distributed_ms_per_unit"] / result["plain_ms_per_unit"] - 1)
    if args.clip:
        clip = torch.randn(1, 24, 72, 48, 84, device=device, generator=torch.Generator(device).manual_seed(2))
        dist.barrier()
        start = time.perf_counter()
        frames = sum(chunk.shape[2] for chunk in model.decode_stream(clip))
        torch.cuda.synchronize()
        result["clip_seconds"], result["clip_frames"] = time.perf_counter() - start, frames
    peaks = [None] * world
    dist.all_gather_object(peaks, torch.cuda.max_memory_allocated(device) / 2**30)
    result["peak_gib_per_rank"] = peaks
    if dist.get_rank() == 0:
        if args.write_checkpoint:
            from safetensors.torch import save_file

            save_file(
                {k: (v.half() if v.ndim >= 2 else v.float()).contiguous().cpu() for k, v in model.state_dict().items()},
                args.write_checkpoint,
            )
        print(json.dumps(result), flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"distributed-{world}.json").write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
