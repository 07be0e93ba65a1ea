"""`minimax_h3_vae.diffusers.swap_decoder` on real diffusers objects (no mocks), fp32 on the CPU.

The stock reference is a second `AutoencoderKLMiniMaxH3` built from the same seed (identical weights), so one
swapped VAE serves every case. Tolerance 1e-5: both sides compute the same fp32 function and differ only in
summation order (tiles batched into one GEMM here, one tile per call in diffusers), ~2e-6 on values of
order 1; a wrong tile plan or blend moves values by 1e-2 and more (checked below: the tiling modes differ).
"""

from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch
from checkpoints import random_diffusers_vae
from diffusers import AutoencoderKL
from diffusers.models.autoencoders.vae import DecoderOutput
from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3VideoDecodeStep

from minimax_h3_vae import H3VideoDecoder, Tiling
from minimax_h3_vae.checkpoints import checkpoint_in_memory
from minimax_h3_vae.checkpoints.diffusers import diffusers_config
from minimax_h3_vae.diffusers import SwapError, SwappedDecoder, swap_decoder

ATOL = 1e-5

# (T, h, w) latents: 1 tile per axis (64 x 96 px) and 2 per axis (288 x 320 px); T = 1, 7 (one temporal
# chunk) and 12 (two chunks, padded tail).
SHAPES = [(1, 4, 6), (1, 18, 20), (7, 4, 6), (7, 18, 20), (12, 4, 6), (12, 18, 20)]


def default_tiling(vae) -> None:
    """The tiling a freshly built VAE has (`enable_tiling()` without arguments keeps earlier sizes)."""
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = 256
    vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = 64


# Tiling switches, applied the same way to both VAEs, with the (tile, overlap) our plan must then use.
TILINGS = {
    "on (default)": (default_tiling, (256, 64)),
    "off": (lambda vae: (default_tiling(vae), vae.disable_tiling()), None),
    "enable_tiling(128, 128, 32, 32)": (
        lambda vae: (default_tiling(vae), vae.enable_tiling(128, 128, 32, 32)),
        (128, 32),
    ),
}


def latents(shape, seed=0) -> torch.Tensor:
    return torch.randn(1, 24, *shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def stock():
    return random_diffusers_vae(seed=0)


@pytest.fixture(scope="module")
def swapped():
    return swap_decoder(random_diffusers_vae(seed=0))


@pytest.fixture(scope="module")
def unswapped_ours(stock):
    """Our decoder from the stock VAE's tensors, without the swap: the reference where diffusers cannot decode."""
    config = diffusers_config(dict(stock.config))
    checkpoint = checkpoint_in_memory({k: v.detach() for k, v in stock.state_dict().items()}, config, "diffusers")
    return H3VideoDecoder.from_checkpoint(checkpoint, device="cpu", dtype="fp32", fused=False)


@pytest.mark.parametrize("tiling", TILINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}_{}x{}".format(*s))
def test_swap_decodes_as_stock(stock, swapped, unswapped_ours, shape, tiling):
    switch, plan = TILINGS[tiling]
    switch(stock)
    switch(swapped)
    z = latents(shape)
    out = swapped.decode(z)
    assert isinstance(out, DecoderOutput) and out.sample.dtype == torch.float32
    if shape[0] == 1:
        # diffusers 0.42.1 cannot decode T = 1 (nor T = 2): compare with our own decode, unswapped, under the
        # tile plan the switch stands for.
        with pytest.raises((ValueError, RuntimeError)), torch.no_grad():
            stock.decode(z)
        expected = unswapped_ours.decode(z, tiling=Tiling(*plan) if plan else Tiling(None, 0))
    else:
        with torch.no_grad():
            expected = stock.decode(z).sample
    assert out.sample.shape == expected.shape
    assert expected.std() > 0.1
    assert (out.sample - expected).abs().max() <= ATOL


def test_tiling_modes_change_the_output(stock):
    """The tiling comparisons above can fail: on this shape every mode gives a clearly different video."""
    z = latents((7, 18, 20))
    outputs = []
    for switch, _ in TILINGS.values():
        switch(stock)
        with torch.no_grad():
            outputs.append(stock.decode(z).sample)
    default_tiling(stock)
    for i in range(len(outputs)):
        for j in range(i):
            assert (outputs[i] - outputs[j]).abs().max() > 1e-2


def test_return_dict_false(swapped):
    z = latents((7, 4, 6))
    out = swapped.decode(z, return_dict=False)
    assert isinstance(out, tuple) and len(out) == 1
    torch.testing.assert_close(out[0], swapped.decode(z).sample, atol=0, rtol=0)


@pytest.mark.parametrize("output_type", ["pt", "np"])
def test_modular_decode_step(output_type):
    """diffusers' own MiniMaxH3VideoDecodeStep gives the same `videos` before and after swapping its pipeline."""
    pipe = MiniMaxH3VideoDecodeStep().init_pipeline()
    vae = random_diffusers_vae(seed=0)
    pipe.update_components(vae=vae)
    z = latents((7, 18, 20), seed=3)  # the pipeline's normalised latents: the step denormalises them
    before = pipe(latents=z, output_type=output_type, output="videos")
    assert swap_decoder(pipe) is pipe and pipe.vae is vae
    assert isinstance(vae.decoder, SwappedDecoder)
    after = pipe(latents=z, output_type=output_type, output="videos")
    before, after = torch.as_tensor(before), torch.as_tensor(after)
    assert after.shape == before.shape == ((1, 22, 3, 288, 320) if output_type == "pt" else (1, 22, 288, 320, 3))
    assert ((before > 0) & (before < 1)).float().mean() > 0.5, "mostly clamped: the comparison would prove little"
    assert (after - before).abs().max() <= ATOL


def test_encode_and_the_rest_untouched():
    stock, vae = random_diffusers_vae(seed=0), random_diffusers_vae(seed=0)
    encoder_params = dict(vae.encoder.named_parameters())
    before = (vae.config, vae.device, vae.dtype, vae.use_tiling)
    swap_decoder(vae)
    assert (vae.config, vae.device, vae.dtype, vae.use_tiling) == before
    assert all(p is encoder_params[n] for n, p in vae.encoder.named_parameters())
    x = torch.randn(1, 3, 17, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected, got = stock.encode(x).latent_dist, vae.encode(x).latent_dist
    assert torch.equal(got.mean, expected.mean) and torch.equal(got.std, expected.std)
    assert vae.post_quant_conv.weight.shape == (24, 24, 1, 1, 1)


def test_stock_decoder_parameters_released():
    vae = random_diffusers_vae(seed=0)
    total = sum(p.numel() for p in vae.parameters())
    stock_decoder = sum(p.numel() for p in vae.decoder.parameters())
    post_quant_conv = sum(p.numel() for p in vae.post_quant_conv.parameters())
    alive = [weakref.ref(p) for p in vae.decoder.parameters()]
    swap_decoder(vae)
    gc.collect()
    assert stock_decoder > 0.9 * total  # the count below would notice a decoder left in place
    assert sum(p.numel() for p in vae.parameters()) == total - stock_decoder
    assert not any(True for _ in vae.decoder.parameters())
    assert [r for r in alive if r() is not None] == []
    ours = vae.decoder.h3
    assert sum(p.numel() for p in ours.parameters()) == stock_decoder + post_quant_conv


def test_precision_recipe_and_runtime_options():
    vae = swap_decoder(random_diffusers_vae(seed=0), tile_batch=2, attention_backends=("MATH",))
    h3 = vae.decoder.h3
    assert h3.compute_dtype == torch.float32 and h3.tile_batch == 2 and h3.runtime.attention_backends == ("MATH",)
    vae.to(torch.bfloat16)  # a later cast changes what vae.dtype reports, not the recipe
    assert vae.dtype == torch.bfloat16 and h3.compute_dtype == torch.float32
    assert swap_decoder(random_diffusers_vae(seed=0), dtype="fp16").decoder.h3.compute_dtype == torch.float16


def test_not_an_h3_vae():
    kl = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=4)
    for target in (object(), kl, types.SimpleNamespace(vae=kl), MiniMaxH3VideoDecodeStep().init_pipeline()):
        with pytest.raises(SwapError, match="AutoencoderKLMiniMaxH3 or a pipeline holding one"):
            swap_decoder(target)


def test_already_swapped(swapped):
    with pytest.raises(SwapError, match="already swapped"):
        swap_decoder(types.SimpleNamespace(vae=swapped))


def test_incompatible_config_leaves_the_vae_alone():
    vae = random_diffusers_vae(seed=0, out_channels=4)
    decoder, decode = vae.decoder, vae.decode
    with pytest.raises(SwapError, match="out_channels=4"):
        swap_decoder(vae)
    assert vae.decoder is decoder and vae.decode == decode


def test_bad_settings_fail_before_the_swap():
    vae = random_diffusers_vae(seed=0)
    decoder = vae.decoder
    for bad in (dict(tile_batch=0), dict(dtype=torch.bfloat16), dict(output_rank=-1), dict(tile_size=128)):
        with pytest.raises((ValueError, TypeError)):
            swap_decoder(vae, **bad)
    assert vae.decoder is decoder


@pytest.mark.parametrize(
    "args, message",
    [((128, 256, 32, 32), "equal height and width"), ((136, 136, 32, 32), "multiples of 16")],
)
def test_unsupported_tiling_refused(swapped, args, message):
    swapped.enable_tiling(*args)
    try:
        with pytest.raises(SwapError, match=message):
            swapped.decode(latents((7, 4, 6)))
    finally:
        default_tiling(swapped)
