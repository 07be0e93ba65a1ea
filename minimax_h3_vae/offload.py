"""Block-streamed weights: the block linears live in pinned host memory and visit the GPU one block at a time.

The decode runs layer-major over a chunk's tiles (decoding.py keeps every tile's residual stream on the GPU),
so each block's weights cross the bus once per chunk, not once per tile call. Two GPU slots alternate: while
block i computes from one slot, a side stream copies block i + 1 into the other; events order the two
streams both ways (a copy waits until the slot's last reader is done, a block waits until its copy landed).

On the CPU nothing moves: the slots are the host tensors themselves, so the same layer-major order runs (and
is tested) without a GPU. The streamer's CUDA calls go through one small object (`CudaStreams`), so that a
test can give it a recorder and check the slot order on the CPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn

from .blocks import BLOCK_LINEARS


def streamed_linears(block: nn.Module) -> list[nn.Linear]:
    """The block's linears (blocks.BLOCK_LINEARS); its norm weights and layer scales are tiny and stay on the
    device."""
    return [block.get_submodule(name) for name in BLOCK_LINEARS]


class CudaStreams:
    """The CUDA stream and event calls the streamer makes, on one device."""

    def __init__(self, device: torch.device):
        self.device = device

    def stream(self):
        return torch.cuda.Stream(self.device)

    def event(self):
        return torch.cuda.Event()

    def use(self, stream):
        """A context in which work is queued on `stream`."""
        return torch.cuda.stream(stream)

    def current(self):
        return torch.cuda.current_stream(self.device)


class BlockStreamer:
    """Moves each block's linears between their host copies and two device slots.

    blocks: the decoder's blocks, whose linears hold host tensors (pinned when the device is CUDA), all of
    one layout across blocks. `on_device(i)` is a context in which block i's linears hold device tensors.
    `in_use` is held by the one layer-major decode that goes through the slots at a time.
    streams: the stream and event calls (default: CUDA's on `device`; nothing moves on a CPU device unless
    a test passes its own).
    """

    def __init__(self, blocks: nn.ModuleList, device: torch.device, streams: CudaStreams | None = None):
        self.blocks = blocks
        self.device = device
        self.in_use = threading.Lock()
        self.moves = device.type == "cuda" or streams is not None
        self.slot_bytes = 0
        if not self.moves:
            return
        self.streams = streams if streams is not None else CudaStreams(device)
        host = [param for linear in streamed_linears(blocks[0]) for param in linear.parameters()]
        self.slots = [[torch.empty_like(t, device=device) for t in host] for _ in range(2)]
        self.copy_stream = self.streams.stream()
        self.landed = [self.streams.event() for _ in range(2)]  # slot's copy finished
        self.released = [self.streams.event() for _ in range(2)]  # slot's last reader finished
        # The slots may hold memory that work still queued on the compute stream uses (the allocator reuses a
        # block freed there at once): the side stream's first copies wait for that work.
        allocated = self.streams.event()
        allocated.record(self.streams.current())
        self.copy_stream.wait_event(allocated)
        self.slot_bytes = sum(t.numel() * t.element_size() for t in host)

    def prefetch(self, i: int) -> None:
        """Start copying block i's linears into its slot on the side stream (no-op on the CPU)."""
        if not self.moves or i >= len(self.blocks):
            return
        slot = i % 2
        host = [param for linear in streamed_linears(self.blocks[i]) for param in linear.parameters()]
        with self.streams.use(self.copy_stream):
            self.copy_stream.wait_event(self.released[slot])
            for target, source in zip(self.slots[slot], host):
                target.copy_(source, non_blocking=True)
            self.landed[slot].record(self.copy_stream)

    @contextlib.contextmanager
    def on_device(self, i: int) -> Iterator[None]:
        """Block i computes from its slot inside this context; on exit the slot is released and block i + 2,
        which takes the same slot, starts to copy. Call `prefetch(0)` and `prefetch(1)` first."""
        if not self.moves:
            yield
            return
        slot = i % 2
        linears = streamed_linears(self.blocks[i])
        host = [(linear, name, getattr(linear, name)) for linear in linears for name in ("weight", "bias")]
        self.streams.current().wait_event(self.landed[slot])
        for (linear, name, _), tensor in zip(host, self.slots[slot]):
            linear._parameters[name] = tensor  # a plain view swap: F.linear reads the slot
        try:
            yield
        finally:
            for linear, name, param in host:
                linear._parameters[name] = param
            self.released[slot].record(self.streams.current())
            self.prefetch(i + 2)
