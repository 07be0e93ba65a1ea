"""The safetensors format's header, read one way for every file the package opens, and reading tensors
straight onto a CUDA device, through two pinned staging buffers.

The usual path (`safe_open(...).get_tensor`, then `.to("cuda")`) copies every byte twice on the host and then
crosses the bus from pageable memory. Here each tensor's bytes are read from the file (the page cache, for a
file read before) by a few threads into a pinned buffer, and copied to the device asynchronously while the
next piece is read into the other buffer. The tensors come out bit for bit as stored.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

# safetensors dtype names -> (the torch dtype's name, bytes per element).
DTYPE_NAMES = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
# The floating-point dtypes a checkpoint's weights may have, which the device reader copies as they are.
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# The safetensors library refuses headers above 100 MB; so do we, before reading one.
MAX_HEADER_BYTES = 100_000_000

_PIECE = 64 * 2**20  # bytes per staging buffer
_THREADS = 4  # concurrent reads per piece: one thread copies from the page cache at a few GB/s


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # the safetensors name: F32, F16, BF16, I8, ...
    shape: tuple[int, ...]
    begin: int  # byte offsets in the data section
    end: int

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype of `dtype`, or None when torch has none."""
        return getattr(torch, DTYPE_NAMES[self.dtype][0], None)


@dataclass(frozen=True)
class Header:
    """A safetensors file's header: where the data starts, each tensor's entry, the string metadata."""

    data_start: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]

    @property
    def data_end(self) -> int:
        """Bytes the file must hold: the header and the data of every tensor."""
        return self.data_start + max((entry.end for entry in self.tensors.values()), default=0)


def read_header(path: str | os.PathLike) -> Header:
    """The header of a safetensors file, checked: size-capped, a JSON object of tensor entries whose dtype,
    shape and byte range agree, and a file long enough for the data. ValueError says what is wrong."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError("shorter than a safetensors header")
        length = int.from_bytes(prefix, "little")
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"header of {length} bytes (the format allows {MAX_HEADER_BYTES})")
        raw = f.read(length)
        size = os.fstat(f.fileno()).st_size
    if len(raw) < length:
        raise ValueError(f"file is truncated inside its header ({size} bytes)")
    try:
        entries = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"header is not JSON ({error})") from None
    if not isinstance(entries, dict):
        raise ValueError("header is not a JSON object")
    metadata = entries.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("header metadata must map names to strings")
    tensors = {name: _entry(name, value) for name, value in entries.items()}
    header = Header(8 + length, tensors, metadata)
    if size < header.data_end:
        raise ValueError(f"file is truncated ({size} bytes, its header describes {header.data_end})")
    return header


def _entry(name: str, value) -> TensorEntry:
    try:
        dtype, shape, (begin, end) = value["dtype"], tuple(value["shape"]), value["data_offsets"]
        whole = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (*shape, begin, end))
    except (TypeError, KeyError, ValueError):
        whole = False
    if not whole or dtype not in DTYPE_NAMES:
        raise ValueError(f"tensor {name!r}: not a valid header entry")
    if end - begin != math.prod(shape) * DTYPE_NAMES[dtype][1]:
        raise ValueError(f"tensor {name!r}: its byte range does not match its shape {list(shape)} and dtype {dtype}")
    return TensorEntry(dtype, shape, begin, end)


class DeviceReader:
    """`read(path, name)` -> the stored tensor on `device` (through one pair of staging buffers for all
    reads), or with `pinned=True` in new pinned host memory (read into it directly)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.staging = [torch.empty(_PIECE, dtype=torch.uint8).pin_memory() for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]  # the staging buffer's last copy is done
        self.stream = torch.cuda.Stream(device)
        self.headers: dict[Path, Header] = {}
        self.files: dict[Path, int] = {}
        self.pool = ThreadPoolExecutor(_THREADS)
        self.turn = 0

    def can_read(self, path: Path, name: str) -> bool:
        return self._entry(path, name).dtype in DTYPES

    def read(self, path: Path, name: str, pinned: bool = False) -> torch.Tensor:
        entry = self._entry(path, name)
        begin, end = entry.begin, entry.end
        start = self.headers[path].data_start + begin
        dtype = DTYPES[entry.dtype]
        fd = self._fd(path)
        if pinned:
            out = torch.empty(entry.shape, dtype=dtype, pin_memory=True)
            if out.numel():
                read_exact(fd, out.view(-1).view(torch.uint8), start, self.pool)
            return out
        out = torch.empty(entry.shape, dtype=dtype, device=self.device)
        flat = out.view(-1).view(torch.uint8) if out.numel() else out.new_empty(0, dtype=torch.uint8)
        for offset in range(0, end - begin, _PIECE):
            size = min(_PIECE, end - begin - offset)
            buffer, copied = self.staging[self.turn], self.copied[self.turn]
            copied.synchronize()  # the buffer's previous piece has reached the device
            read_exact(fd, buffer[:size], start + offset, self.pool)
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

    def _entry(self, path: Path, name: str) -> TensorEntry:
        if path not in self.headers:
            self.headers[path] = read_header(path)
        return self.headers[path].tensors[name]

    def _fd(self, path: Path) -> int:
        if path not in self.files:
            self.files[path] = os.open(path, os.O_RDONLY)
        return self.files[path]


def read_exact(
    fd: int, buffer: torch.Tensor, position: int, pool: ThreadPoolExecutor, pread: Callable = os.preadv
) -> None:
    """Fill `buffer` (a CPU uint8 tensor, pinned or not) from file `fd` at `position`, in `_THREADS` parallel
    slices; each slice reads again after a short read, and an end of file before the buffer is full is an
    OSError. `pread` is os.preadv's signature (tests inject short reads through it)."""
    view = memoryview(buffer.numpy())
    step = -(-len(view) // _THREADS)

    def fill(lo: int) -> None:
        hi = min(lo + step, len(view))
        while lo < hi:
            got = pread(fd, [view[lo:hi]], position + lo)
            if got <= 0:
                raise OSError(f"unexpected end of file at byte {position + lo}")
            lo += got

    for future in [pool.submit(fill, lo) for lo in range(0, len(view), step)]:
        future.result()
