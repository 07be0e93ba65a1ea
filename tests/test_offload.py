"""offload="blocks": block linears in host memory, the decode layer-major over each window's tiles.

On the CPU nothing moves, but the layer-major order runs: its output must equal the resident decode bit for
bit with the same tile batch (the same GEMM shapes). The CUDA tests check that the weights really stream.
"""

from __future__ import annotations

import functools

import pytest
import torch
from repo import TINY

from minimax_h3_vae import DecodeOptions, H3DecoderConfig, H3VideoDecoder, Tiling, memory
from minimax_h3_vae.runtime import GIB

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]


def latents(seed=0, frames=8, height=2, width=70):
    """Two temporal windows of 6 tiles in a row, 2 x 16 latents each (the fewest tokens that give a tile batch
    of 4 two parts per window)."""
    return torch.randn(1, 24, frames, height, width, generator=torch.Generator().manual_seed(seed))


def record_block_order(model) -> list[int]:
    """The block index of every block call the model makes from now on."""
    order = []
    block = model.decoder.block
    model.decoder.block = lambda i, *args: order.append(i) or block(i, *args)
    return order


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("tile_batch", [1, 4, None])
def test_blocks_equal_resident_bit_for_bit(one_thread, device, dtype, tile_batch):
    resident = H3VideoDecoder.from_pretrained(TINY, device=device, dtype=dtype, tile_batch=tile_batch, offload="none")
    streamed = H3VideoDecoder.from_pretrained(TINY, device=device, dtype=dtype, tile_batch=tile_batch, offload="blocks")
    assert (resident.runtime.offload, streamed.runtime.offload) == ("none", "blocks")
    if tile_batch is None:  # the automatic batch differs between the two paths: pin the resident one to it
        resident.configure(tile_batch=memory.STREAMED_TILE_BATCH)
        streamed.configure(tile_batch=memory.STREAMED_TILE_BATCH)
    z = latents()
    order = record_block_order(streamed)
    expected = resident.decode(z)
    out = streamed.decode(z)
    assert torch.equal(out, expected)
    # Layer-major: within a window every part runs block 0 before any part runs block 1.
    layers = len(streamed.decoder.transformer_blocks)
    parts = -(-6 // (tile_batch or memory.STREAMED_TILE_BATCH))
    assert order[: parts * layers] == [i for i in range(layers) for _ in range(parts)]
    assert len(order) == 2 * parts * layers, "two windows, each block once per part"


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_keeps_the_linears_in_host_memory(device):
    resident = H3VideoDecoder.from_pretrained(TINY, device=device, offload="none")
    streamed = H3VideoDecoder.from_pretrained(TINY, device=device, offload="blocks")
    linears = {
        k: v for k, v in streamed.state_dict().items() if ".transformer_blocks." in k and ".attn." in k or ".ff." in k
    }
    assert linears and all(v.device.type == "cpu" for v in linears.values())
    if device == "cuda":
        assert all(v.is_pinned() for v in linears.values()), "pinned, for fast asynchronous copies"
        assert streamed.device_bytes() < resident.device_bytes()
    streamed_state = streamed.state_dict()
    for key, value in resident.state_dict().items():
        assert torch.equal(streamed_state[key].to(value.device), value), key


def test_progress_counts_every_tile_once():
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", offload="blocks", tile_batch=4)
    seen = []
    model.decode(latents(), progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (12, 12) and [d for d, _ in seen] == sorted(d for d, _ in seen)


# ---- choosing ---------------------------------------------------------------------------------------------


def test_auto_on_cpu_is_resident():
    assert H3VideoDecoder.from_pretrained(TINY, device="cpu").runtime.offload == "none"


@pytest.mark.parametrize("cap_gib, expected", [(8, "none"), (6.2, "none"), (6.1, "blocks"), (2.5, "blocks")])
def test_auto_chooses_by_the_budget(cap_gib, expected):
    """The released size in fp16: 4.86 GB of weights, and a reserve of one 1344x768 window at one tile per
    call (1.64 GiB, tests/test_memory.py): 6.17 GiB in all."""
    cuda = torch.device("cuda")  # with a cap, the free memory is not asked for: no GPU needed
    assert memory.choose_offload(H3DecoderConfig(), torch.float16, cuda, Tiling(), int(cap_gib * GIB)) == expected
    assert memory.choose_offload(H3DecoderConfig(), torch.float16, torch.device("cpu"), Tiling(), 1) == "none"


@pytest.mark.parametrize("value", ["yes", "layers", None, 1])
def test_offload_names_are_checked(value):
    with pytest.raises(ValueError, match="offload"):
        DecodeOptions(device="cpu", offload=value)
    with pytest.raises(ValueError, match="offload"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu", offload=value)


@pytest.mark.parametrize("gib", [0, -1, float("nan"), float("inf"), "4", True, 1e300, 1e-300])
def test_max_gpu_memory_is_checked(gib):
    with pytest.raises(ValueError, match="max_gpu_memory"):
        H3VideoDecoder.from_pretrained(TINY, device="cpu", max_gpu_memory=gib)
    with pytest.raises(ValueError, match="max_gpu_memory"):
        DecodeOptions(device="cpu", max_gpu_memory=gib)


# ---- the automatic tile batch ---------------------------------------------------------------------------


def call_sizes(model, z) -> list[int]:
    sizes = []
    forward = model.forward
    model.forward = lambda tiles, ops, out=None: sizes.append(tiles.shape[0]) or forward(tiles, ops, out)
    model.decode(z)
    return sizes


def test_cpu_tile_batch_respects_available_memory(monkeypatch):
    """On the CPU the tiles of a window go in calls that fit in half the available host memory."""
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    z = latents(frames=3, height=17, width=30)  # 2 x 3 tiles of 16 x 16 latents
    per_tile = memory.tile_bytes(model.config, 4, 7 * 16 * 16 + 5, "cpu")
    monkeypatch.setattr(memory, "available_host", lambda: 2**40)
    assert call_sizes(model, z) == [6], "plenty of memory: the whole window in one call"
    monkeypatch.setattr(memory, "available_host", lambda: 2 * (2 * per_tile + per_tile // 2))
    assert call_sizes(model, z) == [2, 2, 2]
    monkeypatch.setattr(memory, "available_host", lambda: 1000)
    assert call_sizes(model, z) == [1] * 6, "never less than one tile"


def test_blocks_auto_tile_batch_is_small():
    """The layer-major decode's automatic parts: 4 tiles (STREAMED_TILE_BATCH), then the window's other 2."""
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", offload="blocks")
    sizes = []
    post_quant = model.post_quant
    model.post_quant = lambda z: sizes.append(z.shape[0]) or post_quant(z)  # once per part
    model.decode(latents(frames=3))
    assert sizes == [4, 2]


def test_host_memory_reading():
    assert memory.available_host() > 0


# ---- the command ----------------------------------------------------------------------------------------


def test_cli_offload_blocks_writes_the_resident_frames(tmp_path, capsys, one_thread, monkeypatch):
    """--offload blocks --tile-batch 2 writes exactly the frames of the resident decode with tile batch 2."""
    from safetensors.torch import load_file, save_file

    from minimax_h3_vae.command import main as cli

    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")
    save_file({"latents": latents()[0]}, str(tmp_path / "in.safetensors"))
    outputs = {}
    for offload in ("none", "blocks"):
        out = tmp_path / f"{offload}.safetensors"
        args = [tmp_path / "in.safetensors", out, "--model", TINY, "--device", "cpu", "--tile-batch", "2"]
        assert cli.main([str(a) for a in [*args, "--offload", offload]]) == 0
        outputs[offload] = load_file(str(out))["video"]
    assert torch.equal(outputs["none"], outputs["blocks"])


@pytest.mark.parametrize("value", ["0", "-2", "nan", "inf", "lots", "1e300", "1e-300"])
def test_cli_rejects_a_bad_memory_cap(tmp_path, capsys, value):
    from safetensors.torch import save_file

    from minimax_h3_vae.command import main as cli

    save_file({"latents": latents()[0]}, str(tmp_path / "in.safetensors"))
    args = [tmp_path / "in.safetensors", tmp_path / "o.safetensors", "--model", TINY, "--device", "cpu"]
    try:  # argparse's own refusals (not a number) exit from inside main, also with 2
        code = cli.main([str(a) for a in [*args, "--max-gpu-memory", value]])
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith("error:") and "max-gpu-memory" in err
    assert not (tmp_path / "o.safetensors").exists()


# ---- the streamer's slot order, on the CPU ----------------------------------------------------------------


class RecordingStreams:
    """The streamer's stream and event calls, recorded on the CPU (the copies themselves run at once)."""

    def __init__(self):
        self.log: list[tuple[str, str, str]] = []
        self.events = 0
        self.compute = self.Stream("compute", self.log)

    class Stream:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def wait_event(self, event):
            self.log.append(("wait", self.name, event.name))

    class Event:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def record(self, stream):
            self.log.append(("record", self.name, stream.name))

    def stream(self):
        return self.Stream("copy", self.log)

    def event(self):
        # BlockStreamer makes the two `landed` events, the two `released` ones, then `allocated`.
        name = ("landed0", "landed1", "released0", "released1", "allocated")[self.events]
        self.events += 1
        return self.Event(name, self.log)

    def use(self, stream):
        import contextlib

        return contextlib.nullcontext()

    def current(self):
        return self.compute


def test_streamer_slot_order():
    """Block i computes from slot i % 2 after its copy landed; block i + 2's copy into that slot waits until
    block i released it."""
    from minimax_h3_vae.offload import BlockStreamer, streamed_linears

    blocks = H3VideoDecoder(H3DecoderConfig(num_layers=3, num_heads=2)).decoder.transformer_blocks
    streams = RecordingStreams()
    streamer = BlockStreamer(blocks, torch.device("cpu"), streams)
    assert streamer.moves and streamer.slot_bytes > 0
    streamer.prefetch(0)
    streamer.prefetch(1)
    for i in range(3):
        host = [linear.weight for linear in streamed_linears(blocks[i])]
        with streamer.on_device(i):
            inside = [linear.weight for linear in streamed_linears(blocks[i])]
            assert inside[0] is streamer.slots[i % 2][0], "block i reads slot i % 2"
            assert all(torch.equal(a, b) for a, b in zip(inside, host)), "the slot holds block i's weights"
        assert [linear.weight for linear in streamed_linears(blocks[i])] == host, "host weights back after"
    assert streams.log == [
        ("record", "allocated", "compute"),  # the slots' memory is free of queued compute work ...
        ("wait", "copy", "allocated"),  # ... before the first copy into them
        ("wait", "copy", "released0"),  # prefetch(0)
        ("record", "landed0", "copy"),
        ("wait", "copy", "released1"),  # prefetch(1)
        ("record", "landed1", "copy"),
        ("wait", "compute", "landed0"),  # block 0 computes once its copy landed ...
        ("record", "released0", "compute"),  # ... and releases slot 0
        ("wait", "copy", "released0"),  # block 2's copy into slot 0 waits for that
        ("record", "landed0", "copy"),
        ("wait", "compute", "landed1"),  # block 1
        ("record", "released1", "compute"),
        ("wait", "compute", "landed0"),  # block 2, from slot 0
        ("record", "released0", "compute"),
    ]


def test_decode_through_a_moving_streamer_equals_resident(one_thread, monkeypatch):
    """The layer-major decode with slots that really swap in (recorded streams on the CPU) gives the resident
    decode's values, bit for bit."""
    from minimax_h3_vae import decoding
    from minimax_h3_vae.offload import BlockStreamer

    monkeypatch.setattr(decoding, "BlockStreamer", functools.partial(BlockStreamer, streams=RecordingStreams()))
    resident = H3VideoDecoder.from_pretrained(TINY, device="cpu", offload="none", tile_batch=2)
    streamed = H3VideoDecoder.from_pretrained(TINY, device="cpu", offload="blocks", tile_batch=2)
    z = latents(frames=3)
    assert torch.equal(streamed.decode(z), resident.decode(z))
    assert streamed.streamer().streams.log, "the slots were used"
