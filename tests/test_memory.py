"""The one memory plan (minimax_h3_vae.memory), against numbers worked out by hand for the released size."""

from __future__ import annotations

import math

import pytest
import torch

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, Tiling, memory
from minimax_h3_vae.model import is_block_linear

RELEASED = H3DecoderConfig()
UNIT = (24, 7, 48, 84)  # one temporal window of a 1344x768 video: 4 x 7 = 28 tiles of 256 px


def test_weight_bytes_by_hand():
    # d = 2048, f = 8192. Per block: qkv 3d*d + 3d, out d*d + d, w1 2f*d + 2f, w2 f*d + d = 67,135,488 weights.
    assert memory.weight_bytes(RELEASED, torch.float16) == (67_135_488 * 36 * 2, 6_653_528 * 4)
    # The rest: 4d per block (2 norms, 2 scales), post_quant_conv 24*25, x_embedder 2048*25, registers 4*2048,
    # norm_out 2*2048, proj_out 3072*2049.
    assert 4 * 2048 * 36 + 24 * 25 + 2048 * 25 + 4 * 2048 + 2 * 2048 + 3072 * 2049 == 6_653_528
    assert memory.weight_bytes(RELEASED, torch.float32)[0] == 67_135_488 * 36 * 4


@pytest.mark.parametrize(
    "config", [H3DecoderConfig(num_layers=2, num_heads=2), H3DecoderConfig(num_layers=3, num_heads=4, ffn_mult=2)]
)
def test_weight_bytes_equal_the_modules(config):
    """The count from the config equals the modules' own state dict (built on the meta device)."""
    with torch.device("meta"):
        state = H3VideoDecoder(config).state_dict()
    linears = sum(2 * math.prod(t.shape) for k, t in state.items() if is_block_linear(k))
    others = sum(4 * math.prod(t.shape) for k, t in state.items() if not is_block_linear(k))
    assert memory.weight_bytes(config, torch.float16) == (linears, others)


def test_resident_unit_plan_by_hand():
    plan = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda")
    assert plan.tiles == 28 and plan.tiles_per_call == 1
    assert plan.weights == 67_135_488 * 36 * 2 + 6_653_528 * 4 and plan.streamed_slots == 0
    assert plan.latents == 24 * 7 * 48 * 84 * 4
    latent_tiles = 28 * 24 * 7 * 16 * 16 * 4
    decoded_tiles = 28 * 3 * 28 * 256 * 256 * 4  # 28 tiles x 3 channels x 28 frames x 256 x 256, float32
    stitched = 2 * 3 * 28 * 768 * 1344 * 4  # this window's frame and the previous one's
    assert plan.window == latent_tiles + decoded_tiles + stitched == 1_315_012_608
    # 1797 tokens (7 x 16 x 16 + 4 registers + 1); per token: (4f + 12d) fp16 + 12d fp32 + 3 x 3072 fp32.
    assert plan.per_tile == 1797 * ((4 * 8192 + 12 * 2048) * 2 + 12 * 2048 * 4 + 3 * 3072 * 4) == 448_991_232
    assert plan.state_per_tile == 0
    assert plan.frames_out == 2 * 3 * 25 * 768 * 1344 * 4  # a chunk of 17 + 5 frames, two float32 copies
    assert plan.host_latents == 3 * plan.latents and plan.host_frames == 4 * 25 * 768 * 1344 * 3
    assert plan.device == plan.weights + plan.latents + plan.window + plan.per_tile + plan.frames_out
    assert plan.host == plan.host_latents + plan.host_frames


def test_streamed_plan_by_hand():
    plan = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda", offload="blocks", tile_batch=4)
    assert plan.weights == 6_653_528 * 4
    assert plan.streamed_slots == 2 * 67_135_488 * 2  # two blocks' linears in fp16
    assert plan.state_per_tile == 1797 * 2048 * (4 + 2)  # fp32 residual + fp16 normed input, per tile
    assert plan.tiles_per_call == 4
    calls = 4 * plan.per_tile + 28 * plan.state_per_tile
    assert plan.device == plan.weights + plan.streamed_slots + plan.latents + plan.window + calls + plan.frames_out


def test_cpu_plan_counts_everything_on_the_host():
    plan = memory.plan(RELEASED, UNIT, dtype=torch.float32, device_type="cpu", tile_batch=28)
    cuda = memory.plan(RELEASED, UNIT, dtype=torch.float32, device_type="cuda", tile_batch=28)
    assert plan.device == 0 and plan.host > cuda.host + cuda.device, "the CPU's math attention holds its scores"
    assert plan.per_tile - cuda.per_tile == 32 * 1797 * 1797 * 4


def test_tiling_changes_the_plan():
    """One tile covering the frame: 7 x 48 x 84 + 5 tokens instead of 1797 per tile."""
    tiled = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda")
    untiled = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda", tiling=Tiling(None, 0))
    assert untiled.tiles == 1 and untiled.per_tile * 1797 == tiled.per_tile * (7 * 48 * 84 + 5)


def test_offload_choice_reads_the_plan():
    reserve = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda")
    need = reserve.weights + reserve.window + reserve.per_tile
    cuda = torch.device("cuda")
    assert memory.choose_offload(RELEASED, torch.float16, cuda, Tiling(), need) == "none"
    assert memory.choose_offload(RELEASED, torch.float16, cuda, Tiling(), need - 1) == "blocks"


def test_auto_tile_batch_on_the_cpu(monkeypatch):
    plan = memory.plan(RELEASED, UNIT, dtype=torch.float32, device_type="cpu")
    monkeypatch.setattr(memory, "available_host", lambda: 2 * 5 * plan.per_tile + 7)
    assert memory.auto_tile_batch(plan, 28, torch.device("cpu"), None, 0) == 5
    monkeypatch.setattr(memory, "available_host", lambda: 100)
    assert memory.auto_tile_batch(plan, 28, torch.device("cpu"), None, 0) == 1, "never less than one tile"
    streamed = memory.plan(RELEASED, UNIT, dtype=torch.float32, device_type="cpu", offload="blocks")
    monkeypatch.setattr(memory, "available_host", lambda: 2**50)
    assert memory.auto_tile_batch(streamed, 28, torch.device("cpu"), None, 0) == memory.STREAMED_TILE_BATCH


def test_check_fits_names_the_size_and_the_limit(monkeypatch):
    plan = memory.plan(RELEASED, (24, 72, 48, 84), dtype=torch.float32, device_type="cpu")
    monkeypatch.setattr(memory, "available_host", lambda: 2**30)
    with pytest.raises(ValueError, match=r"needs about .* GiB of host memory, 1\.0 GiB is available"):
        memory.check_fits(plan, torch.device("cpu"), "decoding")
    monkeypatch.setattr(memory, "available_host", lambda: 2**50)
    memory.check_fits(plan, torch.device("cpu"), "decoding")


def test_fits_beside_counts_the_load_against_the_free_memory(monkeypatch):
    """Work beside the weights' load (the command's sound) fits when the load's bytes (weights, streamed slots,
    latents) and the work's fit in the free memory and under the cap; never on the CPU."""
    cuda = torch.device("cuda")
    for offload in ("none", "blocks"):
        plan = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda", offload=offload, tile_batch=4)
        load = plan.weights + plan.streamed_slots + plan.latents
        assert load < plan.device, "the load alone is less than the decode's peak"
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=load + 2**30: (free, 2 * free))
        assert memory.fits_beside(plan, 2**30, cuda)
        assert not memory.fits_beside(plan, 2**30 + 1, cuda)
        assert not memory.fits_beside(plan, 2**30, cuda, cap=load + 2**30 - 1), "the cap, when less than free"
        assert memory.fits_beside(plan, 2**30, cuda, cap=2**50)
    on_cpu = memory.plan(RELEASED, UNIT, dtype=torch.float32, device_type="cpu")
    assert not memory.fits_beside(on_cpu, 0, torch.device("cpu"))


def test_fits_beside_the_decode_counts_its_widest_call(monkeypatch):
    """Work beside the decode too (`decode=True`: the command's sound) fits when the decode's whole working set
    with every tile of a window in one call (the widest automatic tile batch) and the work's fit in the free
    memory and under the cap."""
    cuda = torch.device("cuda")
    for offload in ("none", "blocks"):
        plan = memory.plan(RELEASED, UNIT, dtype=torch.float16, device_type="cuda", offload=offload)
        widest = memory.plan(
            RELEASED, UNIT, dtype=torch.float16, device_type="cuda", offload=offload, tile_batch=plan.tiles
        ).device
        assert widest > plan.device > plan.weights + plan.streamed_slots + plan.latents
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=widest + 2**30: (free, 2 * free))
        assert memory.fits_beside(plan, 2**30, cuda, decode=True)
        assert not memory.fits_beside(plan, 2**30 + 1, cuda, decode=True)
        assert not memory.fits_beside(plan, 2**30, cuda, cap=widest + 2**30 - 1, decode=True)
        assert memory.fits_beside(plan, 2**30 + 1, cuda), "beside the load alone it fits"
    on_cpu = memory.plan(RELEASED, UNIT, dtype=torch.float32, device_type="cpu")
    assert not memory.fits_beside(on_cpu, 0, torch.device("cpu"), decode=True)


def test_available_host_reads_this_machine():
    assert memory.available_host() > 0


@pytest.mark.parametrize(
    "count, text", [(5 * 2**40, "5.0 TiB"), (3 * 2**29, "1.5 GiB"), (2**20, "1.0 MiB"), (512, "0.5 KiB")]
)
def test_format_size(count, text):
    assert memory.format_size(count) == text
