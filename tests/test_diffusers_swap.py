"""`minimax_h3_vae.diffusers.swap_decoder` on real diffusers objects (no mocks), fp32 on the CPU.

The stock reference is a second `AutoencoderKLMiniMaxH3` built from the same seed (identical weights), so one
swapped VAE serves every case. The outputs are equal bit for bit: both sides compute the same fp32 function in
the same op order, the release's (docs/decoder.md section 10; tests/test_parity.py); a wrong tile plan or blend
moves values by 1e-2 and more (checked below: the tiling modes differ).
"""

from __future__ import annotations

import copy
import gc
import pickle
import types
import weakref

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from checkpoints import random_diffusers_vae
from diffusers import AutoencoderKL
from diffusers.models.attention_processor import AttnProcessor
from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import MiniMaxH3VideoAttnProcessor
from diffusers.models.autoencoders.vae import DecoderOutput
from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3VideoDecodeStep

from minimax_h3_vae import H3VideoDecoder, Tiling
from minimax_h3_vae.checkpoints import checkpoint_in_memory
from minimax_h3_vae.checkpoints.diffusers import diffusers_config
from minimax_h3_vae.diffusers import SwapError, SwappedDecoder, decoder_of, swap_decoder

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


def assert_equal(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.shape == expected.shape
    assert torch.equal(out, expected), f"max abs difference {(out - expected).abs().max().item():.3g}"


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
    assert_equal(out.sample, expected)


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
    assert_equal(after, before)


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


def test_the_vae_keeps_its_modules():
    """Bug: the swap dropped diffusers' decoder, so state_dict, save_pretrained, processors and hooks found none."""
    stock, vae = random_diffusers_vae(seed=0), swap_decoder(random_diffusers_vae(seed=0))
    assert isinstance(vae.decoder, SwappedDecoder) and not isinstance(stock.decoder, SwappedDecoder)
    assert type(vae.decoder) is type(stock.decoder)
    expected, got = stock.state_dict(), vae.state_dict()
    assert list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
    assert len(vae.attn_processors) == len(stock.attn_processors) == 2
    assert not any(p.requires_grad for p in (*vae.decoder.parameters(), *vae.post_quant_conv.parameters()))
    assert all(p.requires_grad for p in vae.encoder.parameters())


def test_save_pretrained_reloads_to_the_same_decode(tmp_path):
    """Bug: save_pretrained of a swapped VAE wrote none of the decoder's tensors, silently."""
    vae = swap_decoder(random_diffusers_vae(seed=0))
    vae.save_pretrained(tmp_path)
    reloaded = type(vae).from_pretrained(tmp_path)
    assert set(reloaded.state_dict()) == set(random_diffusers_vae(seed=0).state_dict())
    z = latents((7, 18, 20), seed=5)
    assert torch.equal(swap_decoder(reloaded).decode(z).sample, vae.decode(z).sample)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_copies_and_pickles(tmp_path, how):
    """Bug: deepcopy, pickle and torch.save of a swapped VAE (and of H3VideoDecoder) raised on a thread lock."""
    vae = swap_decoder(random_diffusers_vae(seed=0), tile_batch=2)

    def copied(obj):
        if how == "deepcopy":
            return copy.deepcopy(obj)
        if how == "pickle":
            return pickle.loads(pickle.dumps(obj))
        torch.save(obj, tmp_path / "saved.pt")
        return torch.load(tmp_path / "saved.pt", weights_only=False)

    z = latents((7, 18, 20), seed=6)
    twin = copied(vae)
    assert isinstance(twin.decoder, SwappedDecoder) and decoder_of(twin).tile_batch == 2
    assert torch.equal(twin.decode(z).sample, vae.decode(z).sample)
    ours = decoder_of(vae)
    assert torch.equal(copied(ours).decode(z), ours.decode(z))


def test_weights_changed_after_the_swap_are_decoded():
    """A load_state_dict or an optimizer-style in-place change is what the next decode uses; a change through
    .data (which torch does not count) after refresh()."""
    vae, other = swap_decoder(random_diffusers_vae(seed=0)), random_diffusers_vae(seed=1)
    z = latents((7, 4, 6), seed=7)
    vae.load_state_dict(other.state_dict())
    with torch.no_grad():
        expected = other.decode(z).sample
    assert_equal(vae.decode(z).sample, expected)
    with torch.no_grad():
        vae.decoder.transformer_blocks[0].attn.to_q.weight.mul_(2)
        other.decoder.transformer_blocks[0].attn.to_q.weight.mul_(2)
        expected = other.decode(z).sample
    assert_equal(vae.decode(z).sample, expected)
    vae.decoder.transformer_blocks[1].ff.net[0].proj.weight.data.mul_(2)
    other.decoder.transformer_blocks[1].ff.net[0].proj.weight.data.mul_(2)
    with torch.no_grad():
        expected = other.decode(z).sample
    vae.decoder.minimax_h3.refresh()
    assert_equal(vae.decode(z).sample, expected)


def test_a_move_or_cast_frees_our_decoder():
    vae = swap_decoder(random_diffusers_vae(seed=0))
    built = weakref.ref(decoder_of(vae))
    vae.float()
    gc.collect()
    assert built() is None
    vae.to(torch.bfloat16)  # a cast changes what vae.dtype reports and the weights read, not the recipe
    assert vae.dtype == torch.bfloat16 and decoder_of(vae).compute_dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_moving_the_vae_off_the_gpu_frees_our_decoder():
    """Measured as a drop of at least the bytes ours and diffusers' decoder held (cuBLAS keeps its workspaces)."""
    vae = swap_decoder(random_diffusers_vae(seed=0).to("cuda"))
    vae.decode(latents((7, 4, 6)).cuda())
    ours = weakref.ref(decoder_of(vae))
    tensors = [*ours().parameters(), *ours().buffers(), *vae.decoder.parameters()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}  # ours shares some
    held = sum(storages.values())
    del tensors  # the list would keep ours' storages alive
    gc.collect()
    before = torch.cuda.memory_allocated()
    vae.to("cpu")
    gc.collect()
    assert ours() is None
    assert torch.cuda.memory_allocated() <= before - held


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_vae_on_the_cpu_decodes_on_the_gpu_given():
    """swap_decoder(vae, device="cuda") with the VAE on the CPU: the GPU holds ours alone, and it decodes as a
    swap of the VAE on the GPU does."""
    vae = swap_decoder(random_diffusers_vae(seed=0), device="cuda")
    ours = decoder_of(vae)
    assert all(t.device.type == "cuda" for t in (*ours.parameters(), *ours.buffers()))
    assert all(p.device.type == "cpu" for p in vae.parameters())
    z = latents((7, 18, 20))
    expected = swap_decoder(random_diffusers_vae(seed=0).to("cuda")).decode(z.cuda()).sample
    assert torch.equal(vae.decode(z).sample, expected)


def test_the_sample_has_the_dtype_diffusers_decoder_gives():
    """Bug: a bf16 VAE's swapped decode gave float32 where diffusers' decoder gives bf16 (its proj_out's dtype);
    the values are ours, rounded once."""
    vae = swap_decoder(random_diffusers_vae(seed=0))
    z = latents((7, 4, 6))
    vae.to(torch.bfloat16)
    sample = vae.decode(z).sample
    assert sample.dtype == torch.bfloat16
    assert torch.equal(sample, decoder_of(vae).decode(z).to(torch.bfloat16))


def test_accelerate_hooks_on_decoder_modules_are_refused_at_the_swap():
    """accelerate's device_map offload leaves hooks (and meta weights) on the decoder's modules: refused at the
    swap, naming the module and the fix, the VAE unchanged."""
    vae = random_diffusers_vae(seed=0)
    add_hook_to_module(vae.decoder.transformer_blocks[1], ModelHook())
    with pytest.raises(SwapError, match=r"decoder.transformer_blocks.1 has diffusers' or accelerate's hooks"):
        swap_decoder(vae)
    assert not isinstance(vae.decoder, SwappedDecoder)


def test_precision_recipe_and_runtime_options():
    vae = swap_decoder(random_diffusers_vae(seed=0), tile_batch=2, attention_backends=("MATH",))
    h3 = decoder_of(vae)
    assert h3.compute_dtype == torch.float32 and h3.tile_batch == 2 and h3.runtime.attention_backends == ("MATH",)
    assert decoder_of(swap_decoder(random_diffusers_vae(seed=0), dtype="fp16")).compute_dtype == torch.float16
    assert decoder_of(swap_decoder(random_diffusers_vae(seed=0), exact=True)).runtime.exact


@pytest.mark.parametrize("trainable", ["latents", "decoder"])
def test_differentiable_decodes_run_diffusers_modules(trainable):
    """Bug: the decode never required grad, so loss.backward() failed far from the cause. With grad enabled,
    latents that require grad or a decoder made trainable again decode through diffusers' modules: the
    gradients are the stock VAE's."""
    stock, vae = random_diffusers_vae(seed=0), swap_decoder(random_diffusers_vae(seed=0))
    z = latents((7, 4, 6), seed=8)
    grads = []
    for model in (stock, vae):
        model.zero_grad()
        if trainable == "decoder":
            model.decoder.requires_grad_(True)
        x = z.clone().requires_grad_(trainable == "latents")
        model.decode(x).sample.square().mean().backward()
        weight = model.decoder.transformer_blocks[0].attn.to_q.weight
        grads.append(x.grad if trainable == "latents" else weight.grad)
    assert grads[0].abs().max() > 0
    assert torch.equal(grads[1], grads[0])


def test_hooks_and_processors_it_cannot_honour_are_refused():
    """Bug: a forward hook on vae.decoder never fired and set_attention_backend was accepted and did nothing."""
    vae = swap_decoder(random_diffusers_vae(seed=0))
    z = latents((7, 4, 6))
    expected = vae.decode(z).sample
    handle = vae.decoder.transformer_blocks[0].register_forward_hook(lambda *args: None)
    with pytest.raises(SwapError, match="decoder.transformer_blocks.0 has a forward or backward hook"):
        vae.decode(z)
    handle.remove()
    vae.set_attention_backend("native")
    with pytest.raises(SwapError, match="attention processor or backend"):
        vae.decode(z)
    vae.reset_attention_backend()
    vae.set_attn_processor(AttnProcessor())
    with pytest.raises(SwapError, match=r"reset_attention_backend\(\)"):
        vae.decode(z)
    vae.set_attn_processor(MiniMaxH3VideoAttnProcessor())
    assert torch.equal(vae.decode(z).sample, expected)


def test_layerwise_casting_is_honoured():
    """enable_layerwise_casting stores the decoder's weights in float8; ours decodes the values they round to,
    as diffusers' decoder does (its hooks cast them up to float32 for each forward)."""
    stock, vae = random_diffusers_vae(seed=0), swap_decoder(random_diffusers_vae(seed=0))
    for model in (stock, vae):
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    assert vae.decoder.transformer_blocks[0].attn.to_q.weight.dtype == torch.float8_e4m3fn
    z = latents((7, 18, 20), seed=9)
    with torch.no_grad():
        expected = stock.decode(z).sample
    unrounded = random_diffusers_vae(seed=0).decode(z).sample
    assert (unrounded - expected).abs().max() > 1e-3, "float8 storage must change the decode"
    assert_equal(vae.decode(z).sample, expected)


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
