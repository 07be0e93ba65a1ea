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

# Every dtype the safetensors format names -> (the torch dtype's name, or None where torch has none that reads
# the stored bytes element for element; bits per element). A tensor of any of them may sit in a file beside the
# ones we read: its entry is checked like any other, and only the tensors read must have a dtype we take.
DTYPE_NAMES = {
    "F64": ("float64", 64),
    "F32": ("float32", 32),
    "F16": ("float16", 16),
    "BF16": ("bfloat16", 16),
    "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E5M2": ("float8_e5m2", 8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8),
    "F6_E2M3": (None, 6),
    "F6_E3M2": (None, 6),
    "F4": (None, 4),  # torch's float4_e2m1fn_x2 packs two per element: not the stored shape
    "C64": ("complex64", 64),
    "I64": ("int64", 64),
    "I32": ("int32", 32),
    "I16": ("int16", 16),
    "I8": ("int8", 8),
    "U64": ("uint64", 64),
    "U32": ("uint32", 32),
    "U16": ("uint16", 16),
    "U8": ("uint8", 8),
    "BOOL": ("bool", 8),
}
# The floating-point dtypes a checkpoint's weights may have, which the device reader copies as they are.
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# The safetensors library refuses headers above 100 MB; so do we, before reading one.
MAX_HEADER_BYTES = 100_000_000

# Bytes per pinned staging buffer of `DeviceReader` (two of them): reads onto a GPU go through in pieces this big.
PIECE_BYTES = 64 * 2**20
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
        name = DTYPE_NAMES[self.dtype][0]
        return getattr(torch, name, None) if name else None


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


class NotSafetensors(ValueError):
    """A file that is not in the safetensors format at all (a pickle, a zip, text), as opposed to a damaged one."""


class _Twice(ValueError):
    pass


def _unique(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; a name given twice is an error (json.loads would keep the last)."""
    names = [name for name, _ in pairs]
    if len(set(names)) < len(names):
        raise _Twice(next(name for name in names if names.count(name) > 1))
    return dict(pairs)


def read_header(path: str | os.PathLike) -> Header:
    """The header of a safetensors file, checked as the safetensors library checks it, and before any tensor
    is read: size-capped, a JSON object with no name twice, `__metadata__` (if any) mapping names to strings,
    tensor entries whose dtype, shape and byte range agree, byte ranges that tile the data section with no
    gap or overlap, and a file exactly as long as the header says. NotSafetensors for a file of another
    format; ValueError says what is wrong with a damaged one."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise NotSafetensors("not a safetensors file (shorter than the 8 bytes that begin one)")
        length = int.from_bytes(prefix, "little")
        if length > MAX_HEADER_BYTES:
            raise NotSafetensors(
                f"not a safetensors file (its first 8 bytes, read as the length of its header, give {length} "
                f"bytes; the format allows {MAX_HEADER_BYTES})"
            )
        raw = f.read(length)
        size = os.fstat(f.fileno()).st_size
    if raw.lstrip()[:1] != b"{":
        raise NotSafetensors("not a safetensors file (no JSON header follows its first 8 bytes)")
    if len(raw) < length:
        raise ValueError(f"file is truncated inside its header ({size} bytes)")
    try:
        entries = json.loads(raw, object_pairs_hook=_unique)
    except _Twice as error:
        raise ValueError(f"header names {str(error)!r} twice") from None
    except (ValueError, RecursionError) as error:
        raise ValueError(f"header is not JSON ({error})") from None
    if not isinstance(entries, dict):
        raise ValueError("header is not a JSON object")
    metadata = entries.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("header metadata must map names to strings")
    tensors = {name: _entry(name, value) for name, value in entries.items()}
    end = 0  # the tensors' bytes, in file order, must follow one another from the start of the data section
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != end:
            where = "overlap the tensor before it" if entry.begin < end else "leave a gap after the tensor before it"
            raise ValueError(f"tensor {name!r}: its bytes {entry.begin}..{entry.end} {where}")
        end = entry.end
    header = Header(8 + length, tensors, metadata)
    if size < header.data_end:
        raise ValueError(f"file is truncated ({size} bytes, its header describes {header.data_end})")
    if size > header.data_end:
        raise ValueError(f"file has {size - header.data_end} bytes after the data its header describes")
    return header


def read_checked_header(
    path: str | os.PathLike, name: str, error: type[Exception], other_format: str, damaged: str = ""
) -> Header:
    """`read_header`, each way it fails raised as `error(message)`: the message names the file (`name`), why,
    and what to do: `other_format` for a file of another format, `damaged` after the reason for a damaged one."""
    try:
        return read_header(path)
    except OSError as problem:
        raise error(f"{name}: cannot read it ({problem.strerror})") from None
    except NotSafetensors as problem:
        raise error(f"{name}: {problem}; {other_format}") from None
    except ValueError as problem:
        raise error(f"{name}: not a readable safetensors file ({problem}){damaged}") from None


def _entry(name: str, value) -> TensorEntry:
    try:
        dtype, shape, (begin, end) = value["dtype"], tuple(value["shape"]), value["data_offsets"]
        whole = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (*shape, begin, end))
    except (TypeError, KeyError, ValueError):
        whole = False
    if not whole or dtype not in DTYPE_NAMES:
        raise ValueError(f"tensor {name!r}: not a valid header entry")
    bits = math.prod(shape) * DTYPE_NAMES[dtype][1]
    if bits % 8 or end - begin != bits // 8:
        raise ValueError(f"tensor {name!r}: its byte range does not match its shape {list(shape)} and dtype {dtype}")
    return TensorEntry(dtype, shape, begin, end)


def read_tensor(path: str | os.PathLike, header: Header, name: str) -> torch.Tensor:
    """Tensor `name` of the file whose header is `header`, on the CPU, bit for bit as stored. Its dtype must
    have a torch dtype (`TensorEntry.torch_dtype`); the file's other tensors are not looked at. OSError for
    a file that ends early (it changed since its header was read)."""
    entry = header.tensors[name]
    out = torch.empty(entry.shape, dtype=entry.torch_dtype)
    if out.numel():
        view = memoryview(out.view(-1).view(torch.uint8).numpy())
        with open(path, "rb") as f:
            f.seek(header.data_start + entry.begin)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise OSError(f"unexpected end of file at byte {header.data_start + entry.begin + done}")
                done += got
    return out


class DeviceReader:
    """`read(path, name)` -> the stored tensor on `device` (through one pair of staging buffers for all
    reads), or with `pinned=True` in new pinned host memory (read into it directly)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.staging = [torch.empty(PIECE_BYTES, dtype=torch.uint8).pin_memory() for _ in range(2)]
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
        # The caching allocator may hand `out` memory that work still queued on the current stream uses (a
        # temporary freed there): the copies on the side stream wait for that work, or it would overwrite them.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        flat = out.view(-1).view(torch.uint8) if out.numel() else out.new_empty(0, dtype=torch.uint8)
        for offset in range(0, end - begin, PIECE_BYTES):
            size = min(PIECE_BYTES, end - begin - offset)
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
