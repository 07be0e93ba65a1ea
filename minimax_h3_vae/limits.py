"""What a decode will need, estimated from shapes alone before anything is allocated, against what the
machine has: so that a clip that cannot fit is refused in a second with the sizes, not after minutes of
swapping.

The estimate counts the large buffers of decoding.py and cli.py (small ones are noise):
- host: the latents as read, denormalised and padded (three float32 copies), and the uint8 frames on
  their way to the writer (the chunk being converted, two queued, one being written);
- device (the host itself on the CPU): the weights; per temporal window, the latent tiles, the decoded
  tiles and the stitched frames of the current and the previous window (the cross-fade holds its tail);
  the float32 copies that `to_uint8_frames` makes of a chunk; one decoder call's activations (every tile
  of a window on the CPU, one tile on CUDA, where the tile batch adapts to free memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import H3DecoderConfig
from .tiling import plan_chunks, plan_tiles


@dataclass(frozen=True)
class Needs:
    host: int  # bytes of host memory
    device: int  # bytes of GPU memory (0 on the CPU: counted in `host`)


def estimate(
    shape: tuple[int, ...],
    config: H3DecoderConfig,
    device: torch.device,
    weight_bytes: int,
    tile_batch: int | None,
    compute_bytes: int = 4,
) -> Needs:
    """Bytes a decode of latents `shape` (C, T, h, w) needs. weight_bytes: the model's weights as loaded;
    compute_bytes: element size of the block linears (2 for the fp16 recipe)."""
    c = config
    channels, frames, h, w = shape
    chunks = plan_chunks(frames, c)
    tiles = plan_tiles(h, w, c)
    height, width = h * c.patch_size, w * c.patch_size
    window_frames = chunks.window * c.patch_size_t
    chunk_frames = c.chunk_latents * c.patch_size_t + c.frame_overlap
    f32 = 4

    latents = channels * max(frames, chunks.padded_frames) * h * w * f32
    frames_in_flight = 4 * chunk_frames * height * width * 3

    tile_h, tile_w = tiles.latent_tile_shape
    latent_tiles = tiles.count * channels * chunks.window * tile_h * tile_w * f32
    decoded_tiles = tiles.count * c.out_channels * window_frames * tiles.rows.size * tiles.cols.size * f32
    stitched = 2 * c.out_channels * window_frames * height * width * f32
    to_uint8 = 2 * c.out_channels * chunk_frames * height * width * f32
    tokens = chunks.window * tile_h * tile_w + c.num_register_tokens + 1
    per_tile = tile_bytes(c, compute_bytes, tokens, device)
    # Without a tile batch, the automatic one adapts to the memory there is (decoding.auto_tile_batch).
    calls = min(tile_batch or 1, tiles.count)
    work = weight_bytes + latents + latent_tiles + decoded_tiles + stitched + to_uint8 + calls * per_tile

    host = 3 * latents + frames_in_flight
    if device.type == "cpu":
        return Needs(host + work, 0)
    return Needs(host, work)


def tile_bytes(config: H3DecoderConfig, compute_bytes: int, tokens: int, device: torch.device) -> int:
    """A conservative count of one tile's live activations at the FFN's peak: w1's output and the gate in the
    compute dtype (`compute_bytes` per element), the fp32 residual and its temporaries, the tile's fp32
    pixels, and on the CPU every head's (S, S) attention scores (the math attention materialises them)."""
    c = config
    per_token = (4 * c.ffn_dim + 12 * c.dim) * compute_bytes + 12 * c.dim * 4 + 3 * c.patch_dim * 4
    scores = c.num_heads * tokens * tokens * 4 if device.type == "cpu" else 0
    return tokens * per_token + scores


def available_host() -> int | None:
    """Host memory this process may still use: MemAvailable, capped by a cgroup (container) limit."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            text = Path(limit).read_text().strip()
            if text != "max" and int(text) < 2**60:
                found.append(int(text) - int(Path(usage).read_text()))
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def available_device(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free


def check_fits(needs: Needs, device: torch.device, what: str, device_cap: int | None = None) -> None:
    """ValueError naming the size and the limit when the decode cannot fit in host or GPU memory (or in
    `device_cap` bytes, the user's max_gpu_memory)."""
    on_device = available_device(device)
    if device_cap is not None and on_device is not None:
        on_device = min(on_device, device_cap)
    for need, have, where in (
        (needs.host, available_host(), "host memory"),
        (needs.device, on_device, f"memory on {device}"),
    ):
        if have is not None and need > have:
            raise ValueError(
                f"{what} needs about {format_size(need)} of {where}, {format_size(have)} is available; "
                "decode a shorter clip or smaller frames, or use a larger machine"
            )


def format_size(count: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 2**10:.1f} KiB"
