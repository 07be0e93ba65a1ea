"""One latent input, one output: the decoded bits do not depend on how the tiles are grouped into decoder
calls (docs/decoder.md §9).

What varies: the tile batch (every value, and the automatic one under any memory budget), offload="blocks",
B videos decoded together or each alone, decode vs decode_stream, and the ranks of a process group. The CPU tests
pin torch's thread count (to 1 and to 2: a CPU GEMM splits its work by threads, which is out of scope; at 2
threads oneDNN's conv picked its blocking by the batch, which was the bug there). The CUDA tests use the
released widths with 2 blocks: every op sees the released shapes and row counts, so the libraries choose the
kernels they choose at full size; more blocks would only repeat the same ops.
"""

from __future__ import annotations

import importlib.util

import distributed_worker
import pytest
import torch
from repo import TINY
from torchrun_runs import forked_ranks, sweep_sizes

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, memory
from minimax_h3_vae.checkpoints import checkpoint_in_memory

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture
def threads(request):
    """A fixed CPU thread count for the whole test: `request.param` (indirect), else 2."""
    before = torch.get_num_threads()
    torch.set_num_threads(getattr(request, "param", 2))
    yield
    torch.set_num_threads(before)


THREADS = pytest.mark.parametrize("threads", [1, 2], indirect=True, ids=["1-thread", "2-threads"])


def latents(batch=1, frames=8, height=2, width=30, seed=0) -> torch.Tensor:
    """Two temporal windows of 3 tiles of 2 x 16 latents each (464 px wide)."""
    return torch.randn(batch, 24, frames, height, width, generator=torch.Generator().manual_seed(seed))


def call_sizes(model) -> list[int]:
    """The tile count of every decoder call the model makes from now on (resident or layer-major)."""
    sizes = []
    post_quant = model.post_quant
    model.post_quant = lambda z: sizes.append(z.shape[0]) or post_quant(z)
    return sizes


# ---- CPU: the tiny checkpoint -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, threads", [("fp32", 1), ("fp32", 2), ("fp16", 1)], indirect=["threads"], ids=["fp32-1", "fp32-2", "fp16-1"]
)
def test_every_grouping_gives_one_output(dtype, threads):
    """Every tile batch (1, 2, 3 and automatic: each window holds 3 tiles), resident and blocks, decode and
    decode_stream: one output."""
    z = latents()
    expected = H3VideoDecoder.from_pretrained(TINY, device="cpu", dtype=dtype, tile_batch=1).decode(z)
    for offload in ("none", "blocks"):
        model = H3VideoDecoder.from_pretrained(TINY, device="cpu", dtype=dtype, offload=offload)
        sizes = call_sizes(model)
        for tile_batch in (2, 3, None):
            assert torch.equal(model.decode(z, tile_batch=tile_batch), expected), (offload, tile_batch)
        assert set(sizes) == {1, 2, 3}, "calls of 1, 2 and 3 tiles all ran"
        streamed = torch.cat(list(model.decode_stream(z, tile_batch=2)), dim=2)
        assert torch.equal(streamed, expected), offload


def test_a_decode_changes_no_weight():
    """A one-voxel latent (one tile of 1 x 1 x 1): post_quant_conv's sum starts from a copy of its bias, never
    the bias itself."""
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.decode(latents(frames=1, height=1, width=1))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@THREADS
@pytest.mark.parametrize("tile_batch", [None, 4])
def test_videos_together_equal_each_alone(threads, tile_batch):
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu", tile_batch=tile_batch)
    z = torch.cat([latents(seed=1), latents(seed=2)])
    alone = torch.cat([model.decode(z[:1], tile_batch=1), model.decode(z[1:], tile_batch=1)])
    assert torch.equal(model.decode(z), alone)


@THREADS
def test_automatic_tile_batch_follows_memory_not_the_output(threads, monkeypatch):
    """The automatic tile batch plans within half the available host memory: less memory, smaller calls,
    the same output."""
    model = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    z = latents(frames=3)  # one window of 3 tiles
    per_tile = memory.tile_bytes(model.config, 4, 7 * 2 * 16 + 5, "cpu")
    sizes = call_sizes(model)
    outputs = []
    for host in (2**40, 2 * (2 * per_tile + per_tile // 2), 1000):
        monkeypatch.setattr(memory, "available_host", lambda host=host: host)
        outputs.append(model.decode(z))
    assert sizes == [3, 2, 1, 1, 1, 1], "3 tiles in one call, then calls of 2 and 1, then of 1"
    assert all(torch.equal(out, outputs[0]) for out in outputs)


@pytest.fixture(scope="module")
def one_process_auto(tmp_path_factory) -> torch.Tensor:
    """One process's decode of the `auto` job's latents in calls of one tile on 2 threads, in a process started
    as the ranks are (forked from the same server, one thread until the job sets two). Not this test process:
    CPU float32 bits depend on the thread count and, on the H200 machine's CPU, on what the process ran
    before: in a pytest process that had decoded on 16 threads, this decode on 2 differed from the ranks'."""
    folder = tmp_path_factory.mktemp("one_process")
    (one,) = forked_ranks(1, distributed_worker.one_process, str(TINY), folder, timeout=120)
    assert one.code == 0, one.output[-3000:]
    return torch.load(folder / "one_process_auto.pt")


@pytest.mark.parametrize("ranks", sweep_sizes(1, 2, 3, 4))
def test_ranks_with_the_automatic_batch_equal_one_process(rank_sweep, one_process_auto, ranks):
    """Ranks (gloo) with the automatic tile batch: each rank decodes its own share of the tiles in calls of
    its own size, and every rank returns one process's output bit for bit (2 threads per process)."""
    folder = rank_sweep(ranks)
    for rank in range(ranks):
        assert torch.equal(torch.load(folder / f"rank{rank}_auto.pt"), one_process_auto), rank


# ---- CUDA: released widths, 2 blocks ----------------------------------------------------------------------

UNIT = (1, 24, 7, 48, 84)  # one 1344x768 unit: 28 tiles of 7 x 16 x 16 latents


def gpu_paths() -> list:
    """(dtype, fused, gemm, attention) of every path this machine runs."""
    paths = [("fp32", False, "cublas", "sdpa"), ("fp16", False, "cublas", "sdpa")]
    paths += [("fp32", True, "cublas", "sdpa"), ("fp16", True, "cublas", "sdpa")]
    hopper = CUDA and torch.cuda.get_device_capability() == (9, 0)
    if hopper and all(importlib.util.find_spec(name) for name in ("quack", "cutlass", "flash_attn")):
        paths.append(("fp16", True, "quack", "fa4"))
    return [pytest.param(*path, id="-".join(map(str, path))) for path in paths]


@pytest.fixture(scope="module")
def released_widths():
    """A state dict of the released architecture with 2 blocks, random weights (docs/decoder.md section 7),
    and its config."""
    config = H3DecoderConfig(num_layers=2)
    with torch.device("cuda"):
        model = H3VideoDecoder(config)
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, device="cuda")
            if name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
                param.copy_(1.0 + 0.1 * noise.clamp(-1, 1))
            elif name.endswith(("scale1", "scale2")):
                param.copy_(0.1 * noise)
            else:
                param.copy_(0.02 * noise)
    return {k: v.cpu() for k, v in model.state_dict().items()}, config


def released_decoder(released_widths, dtype, fused, gemm, attention, **options) -> H3VideoDecoder:
    state, config = released_widths
    checkpoint = checkpoint_in_memory(state, config, "original", "random weights")
    options = dict(device="cuda", dtype=dtype, fused=fused, gemm=gemm, attention=attention, **options)
    return H3VideoDecoder.from_checkpoint(checkpoint, **options)


@needs_cuda
@pytest.mark.parametrize("dtype, fused, gemm, attention", gpu_paths())
def test_gpu_every_tile_batch_gives_one_output(released_widths, dtype, fused, gemm, attention):
    """One unit at tile batches 1..28, resident and blocks, and B = 2 against two single decodes."""
    model = released_decoder(released_widths, dtype, fused, gemm, attention, offload="none")
    z = torch.randn(UNIT, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    expected = model.decode(z, tile_batch=1)
    differ = [n for n in range(2, 29) if not torch.equal(model.decode(z, tile_batch=n), expected)]
    assert differ == [], f"tile batches whose output differs from tile batch 1: {differ}"
    other = torch.randn(UNIT, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    pair = model.decode(torch.cat([z, other]))
    assert torch.equal(pair[:1], expected) and torch.equal(pair[1:], model.decode(other, tile_batch=7))
    del model
    streamed = released_decoder(released_widths, dtype, fused, gemm, attention, offload="blocks")
    for tile_batch in (None, 3, 28):
        assert torch.equal(streamed.decode(z, tile_batch=tile_batch), expected), tile_batch


@needs_cuda
def test_gpu_automatic_tile_batch_follows_the_budget_not_the_output(released_widths, monkeypatch):
    """Less free memory (or a max_gpu_memory cap) makes smaller calls, with the same output."""
    model = released_decoder(released_widths, "fp16", True, "cublas", "sdpa", offload="none")
    z = torch.randn(UNIT, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    expected = model.decode(z, tile_batch=1)
    sizes = call_sizes(model)
    total = torch.cuda.mem_get_info()[1]
    for free in (total, 12 * 2**30, 6 * 2**30):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, total))
        assert torch.equal(model.decode(z), expected), free
    assert len(set(sizes)) >= 3, f"the automatic batch followed the free memory: calls of {sorted(set(sizes))}"
    monkeypatch.undo()
    capped = released_decoder(released_widths, "fp16", True, "cublas", "sdpa", offload="none", max_gpu_memory=5)
    sizes = call_sizes(capped)
    assert torch.equal(capped.decode(z), expected)
    assert max(sizes) < 28, "the cap made smaller calls"
