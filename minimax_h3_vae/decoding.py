"""Decode orchestration: `H3VideoDecoder`, the loops over time and space, tiles per call, progress.

    latents (B, 24, T, h, w) -> chunk windows (tiling.plan_chunks)
      -> per window (per group of windows across ranks): tiles (tiling.plan_tiles, the run's Tiling) ->
         decoder calls of `tile_batch` tiles (model.H3Decoder.forward; with offload="blocks" all of them
         block by block, `_layer_major`), shared across ranks (distributed.share_tiles, gather_tiles) -> stitched frame
         (tiling.stitch)
      -> windows joined and cross-faded (tiling.join_chunks) -> frames, one chunk per window

The model (model.py) is the modules and their forward over a batch of tiles; everything here reads the
run settings (`runtime.Runtime`) it is handed, and never changes them for another call.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import torch

from . import blocks, distributed, fused, memory, tiling
from .checkpoints import DEFAULT_REPO, Checkpoint, load_checkpoint
from .config import H3DecoderConfig
from .latents import check_latents
from .model import H3Decoder
from .offload import BlockStreamer
from .runtime import (
    ATTENTION_BACKENDS,
    OPTION_NAMES,
    DecodeOptions,
    Runtime,
    check_backends_run,
    check_machine,
    check_option_names,
    resolve,
    resolve_call,
)
from .weights import load_weights

Progress = Callable[[int, int], None]


class H3VideoDecoder(H3Decoder):
    """Decodes MiniMax-H3 video latents into ImageNet-normalised RGB video, exactly as released.

    Build it with `H3VideoDecoder.from_pretrained(...)`; `decode(z)` is the whole release pipeline. The
    checkpoint is `self.config`; how it runs is `self.runtime`, frozen, down to the kernel of each op
    (`runtime.kernels`): change it for later calls with `configure(...)`, or for one call with
    `decode(z, tile_batch=..., tiling=...)`. `launch_counts()` counts this decoder's kernel launches.

    Built directly, `H3VideoDecoder(config)` is resolved for the default device it is built on (`with
    torch.device("cuda"):`; the meta device: `Runtime()`), in float32 (`to_release_fp16()` follows the cast),
    resident, with the cuBLAS GEMMs and SDPA; `from_pretrained` and `from_checkpoint` resolve the user's options.
    """

    def __init__(self, config: H3DecoderConfig, runtime: Runtime | None = None):
        runtime = runtime if runtime is not None else _built_directly(config)
        # w_qkv in the chosen projection kernel's row order, from the load on (none gathered per call).
        super().__init__(config, fused.qkv_rows(runtime.kernels, config))
        self._runtime = runtime
        self._ops: dict[fused.Kernels, SimpleNamespace] = {}  # the ops of each set of kernels this decoder ran
        self._launches: dict[str, int] = {}  # kernel launches of those ops (`launch_counts`)
        self._streamer: BlockStreamer | None = None
        self._streamer_made = threading.Lock()  # one streamer, whichever thread asks first

    def __getstate__(self):
        """What a copy or a pickle carries: the weights and run settings. The ops and the block streamer hold
        compiled kernels, CUDA streams and a lock, so a copy makes its own on first use."""
        state = {**self.__dict__, "_ops": {}, "_streamer": None}
        del state["_streamer_made"]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._streamer_made = threading.Lock()

    @classmethod
    def from_pretrained(
        cls,
        source: str | os.PathLike = DEFAULT_REPO,
        *,
        revision: str | None = None,
        options: DecodeOptions | None = None,
        **fields,
    ) -> H3VideoDecoder:
        """Load the decoder from a hub repo id, a local repo root, an original `video_vae/` folder, a
        diffusers `vae/` folder, or a single ComfyUI `.safetensors` file.

        The run options are a `DecodeOptions`, or its fields as keywords (device, dtype, fused, tile_batch,
        offload, max_gpu_memory in GiB, tiling, output_rank, attention_backends, gemm, attention, exact); they are
        checked before the checkpoint is opened. revision: for a hub repo id, a branch, tag or commit; none
        loads a cached copy without asking the hub, a branch or tag asks the hub for its newest commit first.
        """
        options = _options(options, fields, "of from_pretrained")
        check_machine(options)  # what cannot run here is said before the checkpoint is opened
        return cls.from_checkpoint(load_checkpoint(source, revision=revision), options)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, options: DecodeOptions | None = None, **fields) -> H3VideoDecoder:
        """Build the decoder from a located checkpoint (`checkpoints.load_checkpoint` or, for tensors already in
        memory, `checkpoints.checkpoint_in_memory`) with `options` as in `from_pretrained`."""
        options = _options(options, fields, "of from_checkpoint")
        runtime = resolve(options, checkpoint.config, checkpoint.tiling)
        with torch.device("meta"):
            model = cls(checkpoint.config, runtime)
        load_weights(model, checkpoint, runtime, model.ops())
        return model

    # ---- run settings ----------------------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @runtime.setter
    def runtime(self, value) -> None:
        raise ValueError("decoder.runtime is read-only: change run settings with decoder.configure(...)")

    def configure(self, **changes) -> H3VideoDecoder:
        """Change run settings for every later call (fused, exact, tile_batch, tiling, output_rank,
        attention_backends), checked as at load; returns self."""
        runtime = resolve_call(self._runtime, self.config, **changes)
        self._check_backends(runtime)
        self._runtime = runtime
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: the block linears' (torch.float16 for the release's fp16 recipe, else
        torch.float32); every other weight, the residual stream and the output are float32."""
        return self.compute_dtype

    def to_release_fp16(self) -> H3VideoDecoder:
        """Cast the block linears to fp16 in place (the release's fp16 recipe, cast once); the run settings
        follow: dtype float16, the kernels chosen again for it."""
        super().to_release_fp16()
        r, fp16 = self._runtime, torch.float16
        kernels = fused.choose_kernels(self.config, r.device, fp16, r.fused, r.gemm, r.attention, r.exact)
        self._runtime = dataclasses.replace(r, dtype=fp16, kernels=kernels)
        return self

    @property
    def tile_batch(self) -> int | None:
        return self._runtime.tile_batch

    @property
    def output_rank(self) -> int | None:
        return self._runtime.output_rank

    def ops(self, runtime: Runtime | None = None) -> SimpleNamespace:
        """The ops for `runtime` (default: the decoder's): those that run `runtime.kernels` (`fused.ops_for`:
        the eager ops for eager kernels), made once per set of kernels and kept, their launches counted into
        this decoder's `launch_counts()`. SDPA's attention takes `runtime.attention_backends`, bound into these
        ops alone."""
        runtime = runtime or self._runtime
        if runtime.kernels not in self._ops:
            self._ops[runtime.kernels] = fused.ops_for(runtime.kernels, self._launches, self.qkv_rows)
        ops = self._ops[runtime.kernels]
        if runtime.kernels.attention == "sdpa" and runtime.attention_backends != ATTENTION_BACKENDS:
            attention = functools.partial(blocks.attention, backends=runtime.attention_backends)
            ops = SimpleNamespace(**{**vars(ops), "attention": attention})
        return ops

    def launch_counts(self) -> dict[str, int]:
        """This decoder's kernel launches (the load's warm-up included), per kernel of the registry (its module's
        name, `fused.LAUNCH_NAMES`: 'rms_norm', 'tf32x3_linear', quack's 'linear_silu_mul', ...; the audio
        decoder's 'anti_aliased_snake_beta', 0 here)."""
        return fused.launch_counts(self._launches)

    def memory_plan(self, shape: tuple[int, ...], **options) -> memory.MemoryPlan:
        """What `decode` of latents shaped `shape` (B, 24, T, h, w) holds, from shapes alone (a
        memory.MemoryPlan: bytes on the device, `.device`, and in host memory, `.host`), with this decoder's
        run settings and `options` changed as in `decode`; under torch.distributed, this rank's. Nothing is
        allocated; `memory.check_fits(plan, device, what)` refuses what does not fit."""
        runtime = resolve_call(self.runtime, self.config, **options)
        return memory.decode_plan(self.config, tuple(shape), self.compute_dtype, self.device.type, runtime)

    def device_bytes(self) -> int:
        """Bytes of weights this decoder holds on its device, the streaming slots included."""
        tensors = [*self.parameters(), *self.buffers()]
        held = sum(t.numel() * t.element_size() for t in tensors if t.device == self.device)
        streamer = self._streamer
        return held + (2 * streamer.slot_bytes if streamer is not None and streamer.moves else 0)

    def streamer(self) -> BlockStreamer:
        """The block-weight streamer of offload="blocks" (made on first use)."""
        with self._streamer_made:
            if self._streamer is None:
                self._streamer = BlockStreamer(self.decoder.transformer_blocks, self.device)
        return self._streamer

    # ---- decoding --------------------------------------------------------------------------------------

    def decode_stream(self, z: torch.Tensor, progress: Progress | None = None, **options) -> Iterator[torch.Tensor]:
        """Yield the decoded frames of `decode(z)` in order, one chunk per temporal window.

        z: raw (denormalised) latents (B, 24, T, h, w). Each item is (B, 3, f, 16h, 16w) float32 on the
        model's device, in the ImageNet-normalised output space; their concatenation along dim 2 is
        `decode(z)`. progress(done, total) is called with total = tiles x windows x B before the first tile
        and as tiles finish. `options` change run settings for this call only (see `configure`). Under
        torch.distributed, ranks other than `output_rank`, when it is set, yield None per window.
        The latents and options are checked here, before the first chunk is asked for; under
        torch.distributed every rank then checks that all ranks were given the same latents shape, options
        and checkpoint, and all raise the same ValueError when one rank's call is wrong or they differ.
        """
        problem, settings = None, {}
        try:
            runtime = resolve_call(self._runtime, self.config, **options)
            self._check_runnable(runtime)
            check_latents(z, self.config.latent_channels)
            settings = self._call_settings(runtime, z)
        except ValueError as error:
            problem = error
        failed = distributed.agree_call(settings, None if problem is None else str(problem))
        if problem is not None:
            raise problem
        if failed is not None:
            rank, message = failed
            raise ValueError(message if rank < 0 else f"rank {rank}: {message}")
        return _stream(self, runtime, z, progress)

    def _call_settings(self, runtime: Runtime, z: torch.Tensor) -> dict:
        """What every rank of a decode under torch.distributed must share: what sizes its collectives (the
        latents, the tiling, the tile batch, the output rank) and what decides the decoded values."""
        return {
            "latents shape": tuple(z.shape),
            "checkpoint": self.config,
            "dtype": self.compute_dtype,
            "fused": runtime.fused,
            "exact": runtime.exact,
            "gemm": runtime.gemm,
            "attention": runtime.attention,
            "attention_backends": runtime.attention_backends,
            "tiling": runtime.tiling,
            "tile_batch": runtime.tile_batch,
            "output_rank": runtime.output_rank,
        }

    def _check_backends(self, runtime: Runtime) -> None:
        """ValueError when none of the run's attention backends runs here (runtime.check_backends_run)."""
        if runtime.attention_backends != ATTENTION_BACKENDS and self.device.type != "meta":
            check_backends_run(runtime.attention_backends, self.device, self.compute_dtype, self.config.head_dim)

    def _check_runnable(self, runtime: Runtime) -> None:
        """ValueError for a decoder that cannot decode as it stands: weights without values, a recipe broken
        by a cast, an output rank that does not exist."""
        if self.device.type == "meta":
            raise ValueError(
                "the decoder's weights are on the meta device and hold no values: load it with from_pretrained"
            )
        fp32 = (self.post_quant_conv.weight, self.decoder.x_embedder.weight, self.decoder.proj_out.weight)
        if any(weight.dtype != torch.float32 for weight in fp32) or self.compute_dtype not in (
            torch.float32,
            torch.float16,
        ):
            raise ValueError(
                f"the decoder's weights were cast ({self.decoder.x_embedder.weight.dtype}, block linears "
                f"{self.compute_dtype}; decoder.to(dtype)?): the precision recipe is chosen at load, "
                "from_pretrained(dtype='fp16' or 'fp32'), or to_release_fp16() on an fp32 decoder"
            )
        self._check_backends(runtime)
        ranks = distributed.rank_and_world()[1]
        if runtime.output_rank is not None and runtime.output_rank >= ranks:
            raise ValueError(
                f"output_rank {runtime.output_rank}: there are {ranks} process(es) (ranks 0 to {ranks - 1}); "
                "use None (every rank) or an existing rank"
            )

    def decode(self, z: torch.Tensor, progress: Progress | None = None, **options) -> torch.Tensor | None:
        """Raw (denormalised) latents (B, 24, T, h, w) -> video (B, 3, F, 16h, 16w), float32, in the
        ImageNet-normalised space (see `to_unit_rgb`). F = 1 for T = 1, 5 for T = 2, else 17n + 5 for
        T = 5n + 2 (tails padded and cut as released). One video (24, T, h, w) is refused (ValueError): give
        it its batch axis, z[None]. Under torch.distributed every rank must call it with the same latents;
        each gets the whole video, or None on ranks other than `output_rank` when set."""
        chunks = list(self.decode_stream(z, progress, **options))
        return None if chunks[0] is None else torch.cat(chunks, dim=2)


def _built_directly(config: H3DecoderConfig) -> Runtime:
    """The run settings of `H3VideoDecoder(config)` (see the class docstring)."""
    device = torch.get_default_device()
    if device.type == "meta":
        return Runtime()
    options = DecodeOptions(device=device, dtype="fp32", offload="none", gemm="cublas", attention="sdpa")
    return resolve(options, config)


def _options(options: DecodeOptions | None, fields: dict, door: str) -> DecodeOptions:
    """The run options of a loading door: `options`, or DecodeOptions(**fields), with a clear error for a
    misspelt field (naming the nearest) and for options of another type."""
    check_option_names(fields, OPTION_NAMES, door)
    if options is not None and not isinstance(options, DecodeOptions):
        raise ValueError(
            f"options must be a minimax_h3_vae.DecodeOptions, got {type(options).__name__}; or give its "
            "fields as keywords (from_pretrained(path, tile_batch=4))"
        )
    if options is not None and fields:
        raise ValueError(f"give either options= or the option fields {sorted(fields)}, not both")
    return options if options is not None else DecodeOptions(**fields)


class _Tally:
    """Tiles decoded so far, of `total`, reported to progress(done, total) as they finish."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0
        if progress is not None:
            progress(0, total)

    def advance(self, tiles: int) -> None:
        if tiles:
            self.done += tiles
            if self.progress is not None:
                self.progress(self.done, self.total)


@torch.inference_mode()
def _stream(
    model: H3VideoDecoder, runtime: Runtime, z: torch.Tensor, progress: Progress | None
) -> Iterator[torch.Tensor | None]:
    c = model.config
    plan = memory.decode_plan(c, tuple(z.shape), model.compute_dtype, model.device.type, runtime)
    z = z.to(model.device)
    chunks = tiling.plan_chunks(z.shape[2], c)
    if chunks.padded_frames > z.shape[2]:
        z = torch.cat([z, z[:, :, -1:].expand(-1, -1, chunks.padded_frames - z.shape[2], -1, -1)], dim=2)
    tally = _Tally(progress, plan.tiles * len(chunks.starts))
    group = plan.windows  # decoded together: one window on one process, a group across ranks
    windows = (
        window
        for first in range(0, len(chunks.starts), group)
        for window in _decode_windows(
            model, runtime, plan, [z[:, :, s : s + chunks.window] for s in chunks.starts[first : first + group]], tally
        )
    )
    if not distributed.receives_output(runtime.output_rank):
        for _ in windows:  # this rank only decodes its share of the tiles; one None per window, as elsewhere
            yield None
        return
    yield from tiling.join_chunks(windows, chunks, c)


def _decode_windows(
    model: H3VideoDecoder, runtime: Runtime, plan: memory.MemoryPlan, windows: list[torch.Tensor], tally: _Tally
) -> list[torch.Tensor | None]:
    """Consecutive temporal windows, each (B, C, t, h, w) -> (B, 3, 4t, 16h, 16w), spatially tiled and
    stitched; one window at a time on one process, a group of them (distributed.window_group) across ranks.

    The tiles of all B videos of all the windows go through the decoder together, `tile_batch` at a time
    within each window (default: as many as the memory plan lets fit, memory.auto_tile_batch); under
    torch.distributed each rank decodes its share of the calls (distributed.share_tiles) and the shares are
    gathered (distributed.gather_tiles). With offload="blocks", layer-major over all of this rank's tiles.
    Returns one stitched window each, or Nones on a rank that does not receive the output.
    """
    c = model.config
    batch = windows[0].shape[0]
    tiles_plan = tiling.plan_tiles(windows[0].shape[-2], windows[0].shape[-1], c, runtime.tiling)
    tiles = torch.cat([z[..., rows, cols] for z in windows for rows, cols in tiles_plan.latent_windows()])
    per_window = tiles.shape[0] // len(windows)
    tile_shape = (c.out_channels, windows[0].shape[2] * c.patch_size_t, tiles_plan.rows.size, tiles_plan.cols.size)
    calls, counts = distributed.share_tiles(tiles.shape[0], runtime.tile_batch, per_window)
    mine = sum(end - start for start, end in calls)
    decoded = tiles.new_empty(mine, *tile_shape, dtype=torch.float32)
    failure = None
    try:
        if calls:
            _decode_calls(model, runtime, plan, tiles, calls, decoded, tally)
    except Exception as error:  # told to the other ranks at the gather, so that none waits there for it
        failure = error
    decoded = distributed.gather_tiles(decoded, counts, runtime.output_rank, failure)
    if decoded is None:
        return [None] * len(windows)
    tally.advance(tiles.shape[0] - mine)  # the tiles other ranks decoded
    return [tiling.stitch(part.split(batch), tiles_plan) for part in decoded.split(per_window)]


def _decode_calls(
    model: H3VideoDecoder,
    runtime: Runtime,
    plan: memory.MemoryPlan,
    tiles: torch.Tensor,
    calls: list[tuple[int, int]],
    out: torch.Tensor,
    tally: _Tally,
) -> None:
    """This rank's decoder calls, consecutive tile ranges (start, end) of `tiles`, decoded into `out`, whose
    first row is tile calls[0][0]; without a tile batch each range is cut into calls that fit in memory."""
    first, count = calls[0][0], calls[-1][1] - calls[0][0]
    step = runtime.tile_batch
    if step is None:  # what the decoder holds on the device: its weights and these windows' buffers
        held = model.device_bytes() + plan.group
        step = memory.auto_tile_batch(plan, count, model.device, runtime.max_gpu_memory, held)
    parts = [(a, min(a + step, end)) for start, end in calls for a in range(start, end, step)]
    inputs = [tiles[a:b] for a, b in parts]
    outputs = [out[a - first : b - first] for a, b in parts]
    ops = model.ops(runtime)
    if runtime.offload == "blocks":
        _layer_major(model, ops, inputs, outputs, tally.advance)
    else:
        for tile_input, tile_output in zip(inputs, outputs):
            model(tile_input, ops, tile_output)
            tally.advance(tile_input.shape[0])


def _layer_major(
    model: H3VideoDecoder,
    ops: SimpleNamespace,
    parts: list[torch.Tensor],
    outs: list[torch.Tensor],
    advance: Callable[[int], None],
) -> None:
    """`model(parts[k], ops, outs[k])` for every k, block by block instead of call by call: every part's
    residual stream stays on the device while each block's weights are brought in once (offload="blocks").
    The same GEMM shapes as the calls one by one, so the same values bit for bit. advance(n) is called as a
    part of n tiles finishes. One layer-major decode at a time goes through the streamer's slots."""
    vit, streamer = model.decoder, model.streamer()
    shape = tuple(parts[0].shape[2:])
    with streamer.in_use:
        streamer.prefetch(0)
        streamer.prefetch(1)
        rotary = vit.rotary(*shape)
        states = [vit.embed(model.post_quant(part), ops) for part in parts]
        for i in range(len(vit.transformer_blocks)):
            with streamer.on_device(i):
                for k, (residual, normed) in enumerate(states):
                    states[k] = vit.block(i, residual, normed, rotary, ops)
        for k, out in enumerate(outs):
            vit.head(states[k][0], shape, ops, out)
            states[k] = None  # its memory goes to the next part's head
            advance(out.shape[0])
