"""Reading safetensors tensors straight onto a CUDA device, through two pinned staging buffers.

The usual path (`safe_open(...).get_tensor`, then `.to("cuda")`) copies every byte twice on the host and then
crosses the bus from pageable memory. Here each tensor's bytes are read from the file (the page cache, for a
file read before) by a few threads into a pinned buffer, and copied to the device asynchronously while the
next piece is read into the other buffer. The tensors come out bit for bit as stored.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

# safetensors dtype names -> torch dtypes (those a checkpoint of this model can hold).
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

_PIECE = 64 * 2**20  # bytes per staging buffer
_THREADS = 4  # concurrent reads per piece: one thread copies from the page cache at a few GB/s


def header(path: Path) -> tuple[int, dict]:
    """(offset of the data section, the header's tensor entries) of a safetensors file."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        entries = json.loads(f.read(length))
    entries.pop("__metadata__", None)
    return 8 + length, entries


class DeviceReader:
    """`read(path, name)` -> the stored tensor on `device` (through one pair of staging buffers for all
    reads), or with `pinned=True` in new pinned host memory (read into it directly)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.staging = [torch.empty(_PIECE, dtype=torch.uint8).pin_memory() for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]  # the staging buffer's last copy is done
        self.stream = torch.cuda.Stream(device)
        self.headers: dict[Path, tuple[int, dict]] = {}
        self.files: dict[Path, int] = {}
        self.pool = ThreadPoolExecutor(_THREADS)
        self.turn = 0

    def can_read(self, path: Path, name: str) -> bool:
        return self._entry(path, name)["dtype"] in DTYPES

    def read(self, path: Path, name: str, pinned: bool = False) -> torch.Tensor:
        entry = self._entry(path, name)
        begin, end = entry["data_offsets"]
        start = self.headers[path][0] + begin
        dtype = DTYPES[entry["dtype"]]
        fd = self._fd(path)
        if pinned:
            out = torch.empty(entry["shape"], dtype=dtype, pin_memory=True)
            if out.numel():
                self._read_exact(fd, out.view(-1).view(torch.uint8), start)
            return out
        out = torch.empty(entry["shape"], dtype=dtype, device=self.device)
        flat = out.view(-1).view(torch.uint8) if out.numel() else out.new_empty(0, dtype=torch.uint8)
        for offset in range(0, end - begin, _PIECE):
            size = min(_PIECE, end - begin - offset)
            buffer, copied = self.staging[self.turn], self.copied[self.turn]
            copied.synchronize()  # the buffer's previous piece has reached the device
            self._read_exact(fd, buffer[:size], start + offset)
            with torch.cuda.stream(self.stream):
                flat[offset : offset + size].copy_(buffer[:size], non_blocking=True)
                copied.record(self.stream)
            self.turn ^= 1
        # `out` is used on the current stream: it must see the copies, and its memory belongs to that stream.
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return out

    def close(self) -> None:
        self.stream.synchronize()
        self.pool.shutdown()
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()

    def _entry(self, path: Path, name: str) -> dict:
        if path not in self.headers:
            self.headers[path] = header(path)
        return self.headers[path][1][name]

    def _fd(self, path: Path) -> int:
        if path not in self.files:
            self.files[path] = os.open(path, os.O_RDONLY)
        return self.files[path]

    def _read_exact(self, fd: int, buffer: torch.Tensor, position: int) -> None:
        """Fill `buffer` (pinned uint8) from the file at `position`, in parallel slices."""
        view = memoryview(buffer.numpy())
        step = -(-len(view) // _THREADS)

        def fill(lo: int) -> None:
            hi = min(lo + step, len(view))
            while lo < hi:
                got = os.preadv(fd, [view[lo:hi]], position + lo)
                if got <= 0:
                    raise OSError(f"unexpected end of file at byte {position + lo}")
                lo += got

        for future in [self.pool.submit(fill, lo) for lo in range(0, len(view), step)]:
            future.result()
