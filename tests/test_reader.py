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


# Issue 30, row 23: the header faults that only the safetensors library caught, once the weights were being read.
# Each raw header (the JSON text, so that a name can appear twice) with its data bytes and extra bytes after them.
_A, _B = '"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}', '"b": {"dtype": "F32", "shape": [2], '
HEADER_FAULTS = {
    "duplicate_key": ("{" + _A + ', "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', 16, b"", "twice"),
    "overlap": ("{" + _A + ", " + _B + '"data_offsets": [4, 12]}}', 16, b"", "overlap"),
    "same_bytes": ("{" + _A + ", " + _B + '"data_offsets": [0, 8]}}', 8, b"", "overlap"),
    "gap": ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', 16, b"", "gap"),
    "trailing_bytes": ("{" + _A + "}", 8, b"xx", "2 bytes after"),
    **{
        f"metadata_{name}": ('{"__metadata__": ' + value + ", " + _A + "}", 8, b"", "metadata")
        for name, value in {"list": "[]", "string": '""', "zero": "0", "false": "false", "number": '{"x": 1}'}.items()
    },
}
HEADERS_THAT_READ = {
    "metadata_null": '{"__metadata__": null, ' + _A + "}",
    "leading_space": " {" + _A + "}",
    "empty_tensor_first": '{"e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, ' + _A + "}",
    "f4_beside": "{" + _A + ', "q": {"dtype": "F4", "shape": [4], "data_offsets": [8, 10]}}',
}


def write_text_header(path, text: str, data_bytes: int, extra: bytes = b"") -> None:
    raw = text.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(data_bytes) + extra)


@pytest.mark.parametrize("name", HEADER_FAULTS)
def test_read_header_refuses_what_safetensors_refuses(tmp_path, name):
    """Each fault is refused by our header reader (before any tensor is read) and by the library itself: the
    reference that says it is a fault."""
    from safetensors import safe_open

    text, data_bytes, extra, words = HEADER_FAULTS[name]
    path = tmp_path / "bad.safetensors"
    write_text_header(path, text, data_bytes, extra)
    with pytest.raises(Exception):  # noqa: B017 (safetensors raises its own error type)
        with safe_open(str(path), framework="pt") as handle:
            [handle.get_tensor(key) for key in handle.keys()]
    with pytest.raises(ValueError, match=words):
        reader.read_header(path)


@pytest.mark.parametrize("name", HEADERS_THAT_READ)
def test_read_header_takes_what_safetensors_takes(tmp_path, name):
    from safetensors import safe_open

    path = tmp_path / "good.safetensors"
    write_text_header(path, HEADERS_THAT_READ[name], 10 if name == "f4_beside" else 8)
    with safe_open(str(path), framework="pt") as handle:
        keys = set(handle.keys())
    header = reader.read_header(path)
    assert set(header.tensors) == keys and header.data_end == path.stat().st_size
    assert torch.equal(reader.read_tensor(path, header, "a"), torch.zeros(2))


@pytest.mark.parametrize("name", ["duplicate_key", "overlap", "trailing_bytes", "metadata_list"])
def test_checkpoint_header_faults_are_found_with_the_headers(layouts, tmp_path, name, monkeypatch):
    """A weights file with one of the faults is refused when the checkpoint is located (headers only), before
    any weight is read; the message names the file."""
    import shutil

    from minimax_h3_vae.checkpoints import CheckpointError, load_checkpoint

    folder = tmp_path / "video_vae"
    shutil.copytree(layouts["original"], folder)
    weights = folder / "source" / "model.safetensors"
    header = reader.read_header(weights)
    text = json.loads(weights.read_bytes()[8 : header.data_start])
    data = weights.read_bytes()[header.data_start :]
    raw = json.dumps(text)
    if name == "duplicate_key":
        first = next(iter(text))
        raw = raw[:-1] + f", {json.dumps(first)}: {json.dumps(text[first])}}}"
    elif name == "overlap":
        first, second = list(text)[:2]
        text[second]["data_offsets"] = [0, text[second]["data_offsets"][1] - text[second]["data_offsets"][0]]
        raw = json.dumps(text)
    elif name == "metadata_list":
        raw = json.dumps({"__metadata__": [], **text})
    write_text_header(weights, raw, 0, data + (b"xx" if name == "trailing_bytes" else b""))
    monkeypatch.setattr("minimax_h3_vae.checkpoints.stored.safe_open", lambda *a, **k: pytest.fail("a weight was read"))
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_checkpoint(folder)


# ---- reading onto a CUDA device ----------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="reads onto a CUDA device")
@pytest.mark.parametrize("layout", ["original", "diffusers", "comfyui"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("piece", [64 * 2**20, 4096 + 8])  # one piece per tensor / many, both buffers in turn
def test_device_load_equals_host_load(layouts, layout, dtype, piece, monkeypatch):
    monkeypatch.setattr(reader, "PIECE_BYTES", piece)
    host = H3VideoDecoder.from_pretrained(layouts[layout], device="cpu", dtype=dtype, offload="none")
    reads = []
    read = reader.DeviceReader.read
    monkeypatch.setattr(reader.DeviceReader, "read", lambda self, *a: reads.append(a) or read(self, *a))
    direct = H3VideoDecoder.from_pretrained(layouts[layout], device="cuda", dtype=dtype, offload="none")
    assert reads, "the device reader was used"
    direct_state = direct.state_dict()
    for key, value in host.state_dict().items():
        got = direct_state[key]
        assert got.device.type == "cuda" and got.dtype == value.dtype, key
        assert torch.equal(got.cpu(), value), key
