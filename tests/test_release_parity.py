"""Bit for bit the release: this package's eager float32 decode against the MiniMax release's own decoder code
(`tests/release_code.py`, read from MINIMAX_H3_RELEASE_VIDEO_VAE; skipped without it), fed the same weights and
the same latents, for T >= 3 (the release returns nothing for T = 2 and decodes T = 1 as an image; docs/decoder.md
section 6 says what this package does there).

Every test runs on the CPU and on CUDA (skipped without a GPU), TF32 off there for both sides. On the CPU the
claim holds at any thread count for one video; a batch of videos equals the release decoding each video alone,
and the release's batch decode only at one thread (docs/decoder.md section 10).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import random_diffusers_vae, write_original
from release_code import release_folder, release_vae

from minimax_h3_vae import H3VideoDecoder, fused

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]


@pytest.fixture(autouse=True)
def release_code():
    """Skips every test here, before it builds anything, when the release's code is not given."""
    return release_folder()


@pytest.fixture(params=DEVICES)
def device(request):
    """The device of both decodes; on CUDA with TF32 off for matmuls and cuDNN while the test runs: both sides'
    GEMMs follow the process's matmul switch, and the release's post_quant_conv cuDNN's, on by default (this
    package's conv never takes TF32)."""
    if request.param == "cpu":
        yield torch.device("cpu")
        return
    switches = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield torch.device("cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = switches


@pytest.fixture(scope="module")
def release(layouts):
    """The release's VAE with the session's weights (the original layout's file), float32, on the CPU."""
    return release_vae(layouts["original"])


@pytest.fixture(scope="module")
def expected(release):
    """expected(z, device): the release's decode of z (kept: several tests ask for the same)."""
    outputs = {}

    def decode(z: torch.Tensor, device: torch.device) -> torch.Tensor:
        key = (tuple(z.shape), z.numpy().tobytes(), device.type)
        if key not in outputs:
            outputs[key] = release_decode(release, z, device)
        return outputs[key]

    return decode


@pytest.fixture(scope="module")
def ours(layouts):
    """ours(layout, z, device, **options): this package's eager float32 decode of z (decoders kept per layout)."""
    decoders = {}

    def decode(layout: str, z: torch.Tensor, device: torch.device, **options) -> torch.Tensor:
        if (layout, device) not in decoders:
            decoders[layout, device] = load(layouts[layout], device)
        return decoders[layout, device].decode(z.to(device), **options).cpu()

    return decode


def release_decode(vae, z: torch.Tensor, device: torch.device) -> torch.Tensor:
    with torch.no_grad():
        return vae.to(device).decode_base(z.to(device)).cpu()


def load(path, device: torch.device) -> H3VideoDecoder:
    return H3VideoDecoder.from_pretrained(path, device=device, dtype=torch.float32, fused=False)


def latents(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", ["original", "diffusers", "comfyui"])
def test_every_layout_is_the_release(expected, ours, layout, device):
    """T = 8: two temporal windows; 272 x 48 px: 2 tiles."""
    z = latents(1, 24, 8, 17, 3, seed=1)
    release = expected(z, device)
    assert release.shape == (1, 3, 26, 272, 48) and release.std() > 0.1
    out = ours(layout, z, device)
    assert torch.equal(out, release), f"max abs difference {(out - release).abs().max().item():.3g}"


@pytest.mark.parametrize("frames", [3, 4, 5, 6, 7, 12, 13])
def test_every_frame_count_is_the_release(expected, ours, frames, device):
    """T >= 3: one to three windows, padded tails; one 32 x 48 px tile keeps it cheap."""
    z = latents(1, 24, frames, 2, 3, seed=frames)
    assert torch.equal(ours("original", z, device), expected(z, device))


@pytest.mark.parametrize("tile_batch", [1, 2, None])
def test_every_tile_grouping_is_the_release(expected, ours, tile_batch, device):
    """The release decodes one tile per call; here tiles are grouped into calls (1 + 1 + 1 + 1, 2 + 2, all 4),
    which changes no bit. 272 x 272 px: 2 x 2 tiles, both overlaps blended."""
    z = latents(1, 24, 3, 17, 17, seed=5)
    assert torch.equal(ours("original", z, device, tile_batch=tile_batch), expected(z, device))


def test_a_batch_is_each_video_as_the_release_decodes_it(expected, ours, device):
    """Two videos decoded together: each is the release's decode of that video alone."""
    z = latents(2, 24, 8, 2, 3, seed=2)
    each = torch.cat([expected(video[None], device) for video in z])
    assert torch.equal(ours("diffusers", z, device), each)


def test_a_batch_is_the_release_batch_on_one_thread(release, ours, one_thread):
    """On one CPU thread the release's batch decode is its decode of each video alone, so this package's too."""
    z = latents(2, 24, 8, 2, 3, seed=2)
    cpu = torch.device("cpu")
    assert torch.equal(ours("original", z, cpu), release_decode(release, z, cpu))


@pytest.mark.parametrize("head_dim", [160, 192])
def test_wider_rotary_tables_are_the_release(tmp_path, head_dim, device):
    """RoPE over 120 and 144 dims (head dims 160 and 192, ratio 0.75), where the release's exponents are not
    float32 k / n."""
    vae = random_diffusers_vae(seed=3, decoder_attention_head_dim=head_dim)
    folder = write_original(tmp_path, vae)
    z = latents(1, 24, 3, 2, 3, seed=3)
    release = release_decode(release_vae(folder), z, device)
    assert torch.equal(load(folder, device).decode(z.to(device)).cpu(), release)


def overflowing_attention(root) -> Path:
    """The original layout of a VAE whose first block's attention outputs +inf in one channel: that channel's v
    is +inf for every token (its to_v row zero, its bias inf, as an overflow of to_qkv leaves it), and to_out
    reads nothing of it (its weight column zero). The release replaces inf in attention outputs by the dtype's
    largest value, so the channel adds `largest * 0 = 0` and the decode stays finite; a scrub that left inf
    would give `inf * 0 = NaN` everywhere after it."""
    vae = random_diffusers_vae(seed=6)
    attn, channel = vae.decoder.transformer_blocks[0].attn, 5
    with torch.no_grad():
        attn.to_v.weight[channel] = 0.0
        attn.to_v.bias[channel] = float("inf")
        attn.to_out[0].weight[:, channel] = 0.0
    return write_original(root, vae)


def test_an_attention_overflow_is_scrubbed_as_the_release_scrubs_it(tmp_path, device):
    folder = overflowing_attention(tmp_path)
    z = latents(1, 24, 3, 2, 3, seed=6)
    release = release_decode(release_vae(folder), z, device)
    assert release.isfinite().all()
    assert_same(load(folder, device).decode(z.to(device)).cpu(), release)


# ---- the fp16 recipe: the release's eager decode under fp16 autocast, on CUDA ------------------------------------

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="the release's fp16 autocast needs a CUDA GPU")
HOPPER_EXTRA = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and fused.quack_installed()
# The fp16 paths that give the release's bits: the eager ops, and the fused path with exact=True, with cuBLAS's
# GEMMs and with quack's (w1 and the gate in one epilogue; where the hopper extra runs), and where the hopper extra
# runs the fused path as every option defaults (exact is on there: it costs nothing).
needs_hopper_extra = pytest.mark.skipif(not HOPPER_EXTRA, reason="needs a Hopper GPU with the hopper extra")
FP16_PATHS = [
    dict(fused=False),
    dict(fused=True, exact=True, gemm="cublas"),
    pytest.param(dict(fused=True, exact=True, gemm="quack"), marks=needs_hopper_extra),
    pytest.param(dict(fused=True), marks=needs_hopper_extra),
]
FP16_IDS = ["eager", "fused-exact", "fused-exact-quack", "fused-default-hopper-extra"]


@pytest.fixture(scope="module")
def expected_fp16(release):
    """expected_fp16(z): the release's decode of z on CUDA under fp16 autocast (kept per latents)."""
    outputs = {}

    def decode(z: torch.Tensor) -> torch.Tensor:
        key = (tuple(z.shape), z.numpy().tobytes())
        if key not in outputs:
            outputs[key] = release_decode_fp16(release, z)
        return outputs[key]

    return decode


def release_decode_fp16(vae, z: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cuda", torch.float16):
        return vae.to("cuda").decode_base(z.to("cuda")).float().cpu()


@pytest.fixture(scope="module")
def ours_fp16(layouts):
    """ours_fp16(layout, z, offload="none", **options): this package's fp16 decode of z on CUDA."""
    decoders = {}

    def decode(
        layout: str, z: torch.Tensor, offload: str = "none", exact: bool | None = None, gemm: str = "auto", **options
    ) -> torch.Tensor:
        key = layout, offload, exact, gemm
        if key not in decoders:  # exact=True loads SDPA where the hopper extra would take flash-attn-4
            decoders[key] = H3VideoDecoder.from_pretrained(
                layouts[layout], device="cuda", dtype="fp16", offload=offload, exact=exact, gemm=gemm
            )
        return decoders[key].decode(z.to("cuda"), **options).cpu()

    return decode


def assert_same(out: torch.Tensor, want: torch.Tensor) -> None:
    assert out.shape == want.shape
    assert torch.equal(out, want), f"max abs difference {(out - want).abs().max().item():.3g}"


@cuda_only
@pytest.mark.parametrize("path", FP16_PATHS, ids=FP16_IDS)
@pytest.mark.parametrize("layout", ["original", "diffusers", "comfyui"])
def test_fp16_is_the_release_autocast_decode(expected_fp16, ours_fp16, layout, path):
    """T = 8 (two windows), 272 x 48 px (2 tiles), every layout."""
    z = latents(1, 24, 8, 17, 3, seed=1)
    assert_same(ours_fp16(layout, z, **path), expected_fp16(z))


@cuda_only
@pytest.mark.parametrize("path", FP16_PATHS, ids=FP16_IDS)
def test_fp16_every_tile_batch_is_the_release_autocast_decode(expected_fp16, ours_fp16, path):
    """768 x 1344 px, the released unit's 4 x 7 = 28 tiles, in calls of 1 to 28 tiles and as many as fit."""
    z = latents(1, 24, 3, 48, 84, seed=7)
    want = expected_fp16(z)
    for tile_batch in [*range(1, 29), None]:
        out = ours_fp16("original", z, tile_batch=tile_batch, **path)
        assert torch.equal(out, want), f"tile_batch={tile_batch}: max abs {(out - want).abs().max().item():.3g}"


@cuda_only
@pytest.mark.parametrize("path", FP16_PATHS, ids=FP16_IDS)
def test_fp16_a_batch_of_two_is_the_release_autocast_decode(expected_fp16, ours_fp16, path):
    """Two videos decoded together, as the release decodes them together."""
    z = latents(2, 24, 8, 2, 3, seed=2)
    assert_same(ours_fp16("diffusers", z, **path), expected_fp16(z))


@cuda_only
@pytest.mark.parametrize("path", FP16_PATHS, ids=FP16_IDS)
def test_fp16_streamed_blocks_are_the_release_autocast_decode(expected_fp16, ours_fp16, path):
    """offload="blocks": the block weights streamed from host memory, the decode layer-major."""
    z = latents(1, 24, 8, 17, 17, seed=4)
    assert_same(ours_fp16("original", z, offload="blocks", **path), expected_fp16(z))


@cuda_only
@pytest.mark.parametrize("path", FP16_PATHS, ids=FP16_IDS)
def test_fp16_the_two_chunk_stream_is_the_release_autocast_decode(expected_fp16, layouts, path):
    """decode_stream over two windows: each chunk is the release's frames, in order."""
    z = latents(1, 24, 8, 17, 3, seed=1)
    decoder = H3VideoDecoder.from_pretrained(layouts["comfyui"], device="cuda", dtype="fp16", **path)
    chunks = [chunk.cpu() for chunk in decoder.decode_stream(z.to("cuda"))]
    assert len(chunks) == 2
    assert_same(torch.cat(chunks, dim=2), expected_fp16(z))


@cuda_only
@pytest.mark.parametrize("path", [*FP16_PATHS, dict(fused=True, exact=False)], ids=[*FP16_IDS, "fused-not-exact"])
def test_fp16_an_attention_overflow_is_scrubbed_as_the_release_scrubs_it(tmp_path, path):
    """The overflow of `overflowing_attention` under fp16 autocast: the exact paths give the release's bits, and
    the fused path with exact=False, within fp16 noise of them, stays as finite as they are."""
    folder = overflowing_attention(tmp_path)
    z = latents(1, 24, 3, 2, 3, seed=6)
    release = release_decode_fp16(release_vae(folder), z)
    assert release.isfinite().all()
    decoder = H3VideoDecoder.from_pretrained(folder, device="cuda", dtype="fp16", **path)
    out = decoder.decode(z.to("cuda")).cpu()
    assert decoder.runtime.exact == (path.get("exact") is not False and path["fused"])
    if decoder.runtime.exact or not path["fused"]:
        assert_same(out, release)
    else:
        assert out.isfinite().all()


@cuda_only
@pytest.mark.parametrize("path", FP16_PATHS[1:], ids=FP16_IDS[1:])
def test_fp16_fused_exact_runs_its_kernels(layouts, path):
    """exact=True on the fused path launches the exact kernels (the norms summed in torch's order, the gate, or
    with quack's GEMMs w1 and the gate in one), not the default's norms or proj_out's tf32x3."""
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", **path)
    assert decoder.runtime.fused and decoder.runtime.exact and decoder.runtime.gemm == path.get("gemm", "quack")
    before = decoder.launch_counts()
    decoder.decode(latents(1, 24, 3, 2, 3).to("cuda"))
    ran = {name for name, count in decoder.launch_counts().items() if count > before[name]}
    gate = "linear_silu_mul_exact" if decoder.runtime.gemm == "quack" else "silu_mul"
    assert ran == {"rms_norm_exact", "scale_add_rms_norm_exact", "qk_rms_norm_rope_exact", gate}


@cuda_only
def test_fp32_fused_exact_is_the_release(expected, layouts):
    """exact=True in float32: the fused kernels give the release's float32 decode too (TF32 off, as for the
    eager tests), in calls of 1, 2 and all 4 tiles."""
    switches = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        z = latents(1, 24, 3, 17, 17, seed=5)
        want = expected(z, torch.device("cuda"))
        decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp32", exact=True)
        assert decoder.runtime.fused
        for tile_batch in (1, 2, None):
            assert_same(decoder.decode(z.to("cuda"), tile_batch=tile_batch).cpu(), want)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = switches
