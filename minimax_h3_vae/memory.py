"""The one memory plan: what a decode holds, from shapes alone, before anything is allocated.

Three decisions read it, so they always agree:
- the preflight (`check_fits`): a clip that cannot fit is refused in a second, with the sizes;
- offload="auto" (`choose_offload`): the weights stay on the GPU only if they and one window fit;
- the automatic tile batch (`auto_tile_batch`): as many tiles per call as the rest of the budget takes.

The plan counts the large buffers (small ones are noise), by what holds them:
- weights on the device: all of them, or with offload="blocks" all but the block linears plus the two
  slots they stream through;
- the latents on the device (padded); per temporal window the latent tiles, the decoded tiles and the
  stitched frames of this window and the previous one (the cross-fade holds its tail). Under
  torch.distributed a rank holds a group of windows at once (distributed.window_group): every window's
  latent tiles, its own share of decoded tiles (and a padded copy for the gather), and on a rank that
  receives the output the gathered tiles (each rank's share, then joined) and the group's stitched frames;
- one decoder call's activations (`tile_bytes` per tile), and with offload="blocks" every tile's residual
  stream and normed input, which stay on the device through the layer-major loop;
- the float32 copies that `to_uint8_frames` or the mp4's `to_yuv420p_frames` makes of one chunk (two at
  most, both in `to_unit_rgb`);
- on the host: the latents as read, denormalised and padded (three float32 copies), and the uint8 frames
  on their way to the writer (the chunk being converted, two queued, one being written).
On the CPU the device is the host: every count lands in `host`. Host memory is shared by the ranks of one
host: `host` counts all of them (the output rank's and the others'), so every rank of a host plans the same
total, and the automatic tile batch on the CPU gives each rank its share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import H3DecoderConfig
from .distributed import host_ranks, plan_tile_calls, rank_and_world, window_group
from .tiling import RELEASE_TILING, Tiling, plan_chunks, plan_tiles

F32 = 4
# With offload="blocks" the automatic tile batch stops at 4: on the H200, 4 tiles per call run within ~5% of
# 28 (benchmarks/RESULTS.md), and the small batch is what keeps the streamed decode's memory small.
STREAMED_TILE_BATCH = 4
# offload="auto" keeps the weights resident only if one window of this size (the release's 1344x768, latent
# 48 x 84) fits beside them at one tile per call.
RESERVE_LATENTS = (48, 84)
# The automatic tile batch on CUDA plans within this share of the free memory (the allocator's slack).
FREE_SHARE = 0.8


def weight_bytes(config: H3DecoderConfig, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of the block linears, held in `dtype`; bytes of everything else, held in float32), counted from
    the config (tests/test_memory.py checks the count against the modules' own state dict)."""
    c = config
    d, f, element = c.dim, c.ffn_dim, torch.finfo(dtype).bits // 8
    linears = (3 * d * d + 3 * d) + (d * d + d) + (2 * f * d + 2 * f) + (f * d + d)
    others = 4 * d * c.num_layers  # per block: norm1, scale1, norm2, scale2
    others += c.latent_channels * (c.latent_channels + 1)  # post_quant_conv
    others += d * (c.latent_channels + 1) + c.num_register_tokens * d + 2 * d  # x_embedder, registers, norm_out
    others += c.patch_dim * (d + 1)  # proj_out
    return linears * c.num_layers * element, others * F32


def tile_bytes(config: H3DecoderConfig, element: int, tokens: int, device_type: str) -> int:
    """A conservative count of one tile's live activations at the FFN's peak: w1's output and the gate in the
    compute dtype (`element` bytes), the fp32 residual and its temporaries, the tile's fp32 pixels, and on the
    CPU every head's (S, S) attention scores (the math attention materialises them)."""
    c = config
    per_token = (4 * c.ffn_dim + 12 * c.dim) * element + 12 * c.dim * F32 + 3 * c.patch_dim * F32
    scores = c.num_heads * tokens * tokens * F32 if device_type == "cpu" else 0
    return tokens * per_token + scores


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of one decode's large buffers (see the module docstring), by what holds them."""

    weights: int  # weights held on the device, the streamed block linears excluded
    streamed_slots: int  # offload="blocks": the two device slots the block linears stream through
    latents: int  # the padded latents on the device
    window: int  # one window on one process: latent tiles, decoded tiles, its stitched frames and the last one's
    per_tile: int  # one tile's activations inside a decoder call
    state_per_tile: int  # offload="blocks": one tile's residual stream and normed input, kept between blocks
    tiles: int  # tiles per window, every video of the batch
    tiles_per_call: int  # as planned: the tile batch, or 1 when it is automatic (it then adapts)
    frames_out: int  # float32 copies `to_uint8_frames` or `to_yuv420p_frames` makes of one chunk
    host_latents: int  # host: the latents as read, denormalised and padded
    host_frames: int  # host: uint8 frames in flight to the writer
    on_cpu: bool
    windows: int = 1  # windows decoded at once: 1 on one process, a group across ranks
    group: int = 0  # this rank's buffers for those windows (`window` on one process)
    decoded_tiles: int = 0  # tiles this rank decodes per group (`tiles` on one process)
    host_ranks: int = 1  # ranks sharing this host's memory
    host_others: int = 0  # host bytes of this host's other ranks

    @property
    def device(self) -> int:
        """Bytes on the GPU (0 for a CPU decode: counted in `host`)."""
        return 0 if self.on_cpu else self._work

    @property
    def host(self) -> int:
        """Bytes of host memory of this rank and the other ranks of its host."""
        own = self.host_latents + self.host_frames + (self._work if self.on_cpu else 0)
        return own + self.host_others

    @property
    def _work(self) -> int:
        calls = self.tiles_per_call * self.per_tile + self.decoded_tiles * self.state_per_tile
        return self.weights + self.streamed_slots + self.latents + self.group + calls + self.frames_out


def plan(
    config: H3DecoderConfig,
    shape: tuple[int, int, int, int],
    *,
    dtype: torch.dtype,
    device_type: str,
    offload: str = "none",
    tiling: Tiling = RELEASE_TILING,
    tile_batch: int | None = None,
    batch: int = 1,
    ranks: int = 1,
    output_rank: int | None = None,
    rank: int = 0,
    host_ranks: int = 1,
) -> MemoryPlan:
    """The plan of decoding `batch` videos of latents `shape` (C, T, h, w) with a decoder of `config` whose
    block linears are `dtype`, on a device of `device_type` ("cpu" or "cuda"); under torch.distributed, for
    `rank` of `ranks` with the output on `output_rank` (None: every rank), `host_ranks` ranks on this
    host (the output rank among them) sharing its memory."""
    args = (config, shape, dtype, device_type, offload, tiling, tile_batch, batch, ranks)
    mine = _plan(*args, receives=output_rank is None or rank == output_rank)
    if host_ranks == 1:
        return mine
    output = _plan(*args, receives=True)
    other = _plan(*args, receives=output_rank is None)  # a rank of this host other than the output rank
    total = output.host + (host_ranks - 1) * other.host
    return dataclasses.replace(mine, host_ranks=host_ranks, host_others=total - mine.host)


def decode_plan(
    config: H3DecoderConfig, shape: tuple[int, ...], dtype: torch.dtype, device_type: str, runtime
) -> MemoryPlan:
    """The plan of one decode on this process (`H3VideoDecoder.memory_plan`): latents `shape` (B, C, T, h,
    w), block linears in `dtype`, on a device of `device_type`, with the run settings `runtime` (a
    runtime.Runtime: its offload, tiling, tile batch and output rank); under torch.distributed, this rank's
    plan beside the other ranks of its host."""
    batch, *latents = shape
    rank, ranks = rank_and_world()
    return plan(
        config,
        tuple(latents),
        dtype=dtype,
        device_type=device_type,
        offload=runtime.offload,
        tiling=runtime.tiling,
        tile_batch=runtime.tile_batch,
        batch=batch,
        ranks=ranks,
        output_rank=runtime.output_rank,
        rank=rank,
        host_ranks=host_ranks(),
    )


def _plan(config, shape, dtype, device_type, offload, tiling, tile_batch, batch, ranks, *, receives) -> MemoryPlan:
    c = config
    channels, frames, h, w = shape
    chunks = plan_chunks(frames, c)
    tiles = plan_tiles(h, w, c, tiling)
    height, width = h * c.patch_size, w * c.patch_size
    window_frames = chunks.window * c.patch_size_t
    chunk_frames = c.chunk_latents * c.patch_size_t + c.frame_overlap
    element = torch.finfo(dtype).bits // 8
    count = batch * tiles.count

    linears, others = weight_bytes(c, dtype)
    streamed = offload == "blocks"
    latents = batch * channels * max(frames, chunks.padded_frames) * h * w * F32
    tile_h, tile_w = tiles.latent_tile_shape
    tokens = chunks.window * tile_h * tile_w + c.num_register_tokens + 1
    latent_tile = channels * chunks.window * tile_h * tile_w * F32
    decoded_tile = c.out_channels * window_frames * tiles.rows.size * tiles.cols.size * F32
    stitched = batch * c.out_channels * window_frames * height * width * F32
    window = count * (latent_tile + decoded_tile) + 2 * stitched  # this window's frames and the last one's
    windows, group, share = 1, window, count
    if ranks > 1:  # distributed.share_tiles over a group of windows
        units = count if tile_batch is None else -(-count // tile_batch)
        windows = window_group(units, len(chunks.starts), ranks)
        calls = plan_tile_calls(windows * count, tile_batch, ranks, count)
        share = max(sum(end - start for start, end in rank_calls) for rank_calls in calls)
        group = windows * count * latent_tile + 2 * share * decoded_tile  # its share, and the padded copy
        if receives:  # every rank's share gathered, then joined; the group's frames and the last one's
            group += (ranks * share + windows * count) * decoded_tile + (windows + 1) * stitched
    return MemoryPlan(
        windows=windows,
        group=group,
        decoded_tiles=share,
        weights=others if streamed else linears + others,
        streamed_slots=2 * linears // c.num_layers if streamed else 0,
        latents=latents,
        window=window,
        per_tile=tile_bytes(c, element, tokens, device_type),
        state_per_tile=tokens * c.dim * (F32 + element) if streamed else 0,
        tiles=count,
        tiles_per_call=min(tile_batch or 1, count),
        frames_out=2 * batch * c.out_channels * chunk_frames * height * width * F32 if receives else 0,
        host_latents=3 * latents,
        host_frames=4 * chunk_frames * height * width * 3 if receives else 0,
        on_cpu=device_type == "cpu",
    )


def choose_offload(
    config: H3DecoderConfig, dtype: torch.dtype, device: torch.device, tiling: Tiling, cap: int | None
) -> str:
    """offload="auto": "none" when the weights and one 1344x768 window at one tile per call fit in `cap`
    bytes, or without a cap in the free GPU memory; else "blocks". On the CPU always "none"."""
    if device.type != "cuda":
        return "none"
    window = config.chunk_latents + config.chunk_overlap_latents
    reserve = plan(
        config, (config.latent_channels, window, *RESERVE_LATENTS), dtype=dtype, device_type="cuda", tiling=tiling
    )
    need = reserve.weights + reserve.window + reserve.per_tile
    budget = cap if cap is not None else torch.cuda.mem_get_info(device)[0]
    return "none" if need <= budget else "blocks"


def auto_tile_batch(memory: MemoryPlan, tiles: int, device: torch.device, cap: int | None, held: int) -> int:
    """Tiles per decoder call for this rank's `tiles` tiles of a window, when no tile batch is set.

    CUDA: what fits in FREE_SHARE of the free memory and, with a `cap`, in the cap less `held` (the bytes the
    decoder holds there: its weights and this window's buffers). CPU: half the available host memory, shared
    by the ranks of the host (`memory.host_ranks`). With
    offload="blocks" every tile's residual stream stays on the device too, and the batch stops at
    STREAMED_TILE_BATCH.
    """
    state = tiles * memory.state_per_tile
    if device.type == "cuda":
        budget = int(FREE_SHARE * torch.cuda.mem_get_info(device)[0]) - state
        if cap is not None:
            budget = min(budget, cap - held - state)
    else:  # this rank's share of the host's ranks
        host = available_host()
        budget = (host if host is not None else 2**62) // (2 * memory.host_ranks) - state
    batch = max(1, budget // memory.per_tile)
    return min(batch, STREAMED_TILE_BATCH) if memory.state_per_tile else batch


def available_host(root: Path = Path("/")) -> int | None:
    """Host memory this process may still use: MemAvailable, capped by the limit of the process's own cgroup
    and of each cgroup above it (a container's, a systemd slice's), never negative. `root`: where /proc and
    /sys are found (tests give a folder of fake files)."""
    found = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    found += cgroup_room(root)
    return max(0, min(found)) if found else None


# cgroup v2 and v1: where the memory controller is mounted, its limit, usage and statistics files, and the
# statistic of page cache the kernel reclaims before it fails an allocation (the kubelet's working set,
# usage - inactive file pages, counts the same way; v1's total_ counts the cgroups below too, as its usage).
CGROUP_MEMORY = {
    "v2": ("sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
    "v1": ("sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
}
# v1 writes "no limit" as the largest page-aligned counter (about 2^63); anything this large is no limit.
NO_LIMIT = 2**60


def cgroup_room(root: Path = Path("/")) -> list[int]:
    """For the memory cgroup of this process (/proc/self/cgroup) and each one above it that has a limit:
    limit - (usage - reclaimable page cache), in bytes (negative when over the limit)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    room = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version is None:
            continue
        mount, limit_name, usage_name, cache_name = CGROUP_MEMORY[version]
        base = root / mount
        folder = base / path.strip().lstrip("/")
        # The folder and every one above it up to the mount; a path that is not visible here (a container
        # without its own cgroup namespace) leaves the ones that are, down from the container's root.
        folders = [folder, *folder.parents]
        for cgroup in folders[: folders.index(base) + 1] if base in folders else [base]:
            try:
                text = (cgroup / limit_name).read_text().strip()
                if text == "max" or int(text) >= NO_LIMIT:
                    continue
                usage = int((cgroup / usage_name).read_text())
                cache = _stat(cgroup / "memory.stat", cache_name)
            except (OSError, ValueError):
                continue
            room.append(int(text) - max(0, usage - cache))
    return room


def _stat(path: Path, name: str) -> int:
    """One value of a cgroup's memory.stat (0 when it is not there)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def check_fits(memory: MemoryPlan, device: torch.device, what: str, cap: int | None = None) -> None:
    """ValueError naming the size and the limit when the plan does not fit in host memory or on the device
    (its free memory, or `cap` bytes, the user's max_gpu_memory, if smaller)."""
    check_bytes(memory.host, memory.device, device, what, cap)


def check_bytes(host: int, on_device: int, device: torch.device, what: str, cap: int | None = None) -> None:
    """check_fits for `host` bytes of host memory and `on_device` bytes on a CUDA `device`."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    if cap is not None and free is not None:
        free = min(free, cap)
    for need, have, where in (
        (host, available_host(), "host memory"),
        (on_device, free, f"memory on {device}"),
    ):
        if have is not None and need > have:
            raise ValueError(
                f"{what} needs about {format_size(need)} of {where}, {format_size(have)} is available; "
                "decode a shorter clip or smaller frames, or use a larger machine"
            )


def fits_beside(
    memory: MemoryPlan, on_device: int, device: torch.device, cap: int | None = None, decode: bool = False
) -> bool:
    """Whether `on_device` more bytes fit on a CUDA `device` beside the plan's weights being loaded onto it (its
    weights, streamed slots and latents): work run beside the load. With `decode`, beside the decode too: its
    whole working set with every tile of a window in one call (the most an automatic tile batch takes), so that
    neither the work nor the decode can run out of memory whatever order their allocations come in. Without
    `decode` the work must be done before the decode, which then meets the free memory `check_fits` checked.
    False on the CPU (the load and the work would share its cores)."""
    if memory.on_cpu or device.type != "cuda":
        return False
    free = torch.cuda.mem_get_info(device)[0]
    if cap is not None:
        free = min(free, cap)
    held = memory.weights + memory.streamed_slots + memory.latents
    if decode:
        held = dataclasses.replace(memory, tiles_per_call=max(memory.tiles_per_call, memory.decoded_tiles)).device
    return held + on_device <= free


# The audio decode's peak working memory, in bytes per value of its largest intermediate (a stage's output,
# every stereo channel): the anti-aliased activations' upsampled copies, the AMP blocks' sums and the convs'
# buffers. Measured about 46 (float32 on the CPU, the example's audio VAE, 100 s of sound; peak RSS) and about
# 40 at the released size on the H200 (1.04 GiB for a 10 s clip, issue 32); counted with a margin.
AUDIO_WORK_PER_VALUE = 64 * F32


def audio_decode_bytes(config, weights: int, channels: int, latents: int, device_type: str) -> tuple[int, int]:
    """(host bytes, device bytes) of decoding `channels` x `latents` audio latents with the audio decoder of
    `config` (an H3AudioDecoderConfig) and `weights` bytes of float32 weights: the weights, the working memory
    (AUDIO_WORK_PER_VALUE) and the float32 waveform; on the CPU all of it is host memory."""
    length, largest = latents, max(config.latent_dim, config.decoder_dim) * latents
    for stage, rate in enumerate(config.upsample_rates):
        length *= rate
        largest = max(largest, config.stage_channels(stage) * length)
    waveform = channels * length * F32
    work = weights + channels * largest * AUDIO_WORK_PER_VALUE + waveform
    return (work + waveform, 0) if device_type == "cpu" else (waveform, work)


def format_size(count: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 2**10:.1f} KiB"
