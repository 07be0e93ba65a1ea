"""Checkpoints read straight onto a CUDA device (minimax_h3_vae.reader) hold exactly the stored values."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import H3VideoDecoder, reader

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="reads onto a CUDA device")


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
