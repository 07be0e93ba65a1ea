"""minimax_h3_vae.reader: the one safetensors header reader, reads that survive short reads, and checkpoints
read straight onto a CUDA device holding exactly the stored values."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import save_file

from minimax_h3_vae import H3VideoDecoder, reader

# ---- read_exact (host code: runs on the CPU with injected short reads) ------------------------------------


@pytest.fixture
def data_file(tmp_path):
    data = bytes(range(256)) * 41 + b"tail"  # 10500 bytes, none of them in a pattern a slice could hide
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


@pytest.mark.parametrize("most", [1, 7, 1000])
def test_read_exact_survives_short_reads(data_file, most):
    """Each pread returns at most `most` bytes: every slice reads again until it is full."""
    fd, data = data_file
    calls = []

    def short(fd, buffers, position):
        view = buffers[0][:most]
        calls.append(position)
        return os.preadv(fd, [view], position)

    buffer = torch.zeros(10000, dtype=torch.uint8)
    with ThreadPoolExecutor(4) as pool:
        reader.read_exact(fd, buffer, 300, pool, pread=short)
    assert bytes(buffer.numpy()) == data[300:10300]
    assert len(calls) >= 10000 // most, "short reads were read again"


def test_read_exact_end_of_file_is_an_error(data_file):
    fd, data = data_file
    buffer = torch.zeros(200, dtype=torch.uint8)
    with ThreadPoolExecutor(4) as pool, pytest.raises(OSError, match="unexpected end of file"):
        reader.read_exact(fd, buffer, len(data) - 100, pool)


# ---- read_header -------------------------------------------------------------------------------------------


def test_read_header_matches_safetensors(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(4, dtype=torch.float16)}, str(path), metadata={"fps": "24.0"})
    header = reader.read_header(path)
    assert {k: (e.dtype, e.shape) for k, e in header.tensors.items()} == {"a": ("F32", (2, 3)), "b": ("F16", (4,))}
    assert header.metadata == {"fps": "24.0"} and header.data_end == path.stat().st_size
    assert header.tensors["b"].torch_dtype == torch.float16


def write_raw(path, header: dict, data_bytes: int = 0, length: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes((length or len(raw)).to_bytes(8, "little") + raw + bytes(data_bytes))


@pytest.mark.parametrize(
    "header, data_bytes, length, words",
    [
        ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8, None, "truncated"),
        ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, 12, None, "byte range"),
        ({"x": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, 16, None, "not a valid header entry"),
        ({"x": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, 16, None, "not a valid header entry"),
        ({"x": [1, 2]}, 0, None, "not a valid header entry"),
        ({}, 0, 2**40, "not a safetensors file"),
        ({}, 0, 10**6, "truncated inside its header"),
    ],
)
def test_read_header_refuses_a_bad_header(tmp_path, header, data_bytes, length, words):
    path = tmp_path / "bad.safetensors"
    write_raw(path, header, data_bytes, length)
    with pytest.raises(ValueError, match=words):
        reader.read_header(path)


# ---- reading onto a CUDA device ----------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="reads onto a CUDA device")
@pytest.mark.parametrize("layout", ["original", "diffusers", "comfyui"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("piece", [64 * 2**20, 4096 + 8])  # one piece per tensor / many, both buffers in turn
def test_device_load_equals_host_load(layouts, layout, dtype, piece, monkeypatch):
    monkeypatch.setattr(reader, "_PIECE", piece)
    host = H3VideoDecoder.from_pretrained(layouts[layout], device="cpu", dtype=dtype, offload="none")
    reads = []
    read = reader.DeviceReader.read
    monkeypatch.setattr(reader.DeviceReader, "read", lambda self, *a: reads.append(a) or read(self, *a))
    direct = H3VideoDecoder.from_pretrained(layouts[layout], device="cuda", dtype=dtype, offload="none")
    assert reads, "the device reader was used"
    for key, value in host.state_dict().items():
        got = direct.state_dict()[key]
        assert got.device.type == "cuda" and got.dtype == value.dtype, key
        assert torch.equal(got.cpu(), value), key
