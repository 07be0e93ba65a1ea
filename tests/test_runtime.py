"""Run options (minimax_h3_vae.runtime): checked once where they are given, resolved once, frozen after."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minimax_h3_vae import DecodeOptions, H3DecoderConfig, H3VideoDecoder, Runtime, Tiling
from minimax_h3_vae.runtime import resolve, resolve_call, resolve_device, resolve_dtype

# ---- fused flag ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_fused_argument_is_stored(layouts, monkeypatch, fused):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0" if fused else "1")  # the argument wins over the env
    model = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", fused=fused)
    assert model.runtime.fused is fused


@pytest.mark.parametrize("env, expected", [("0", False), ("1", True), (" 1 ", True)])
def test_fused_env_var(layouts, monkeypatch, env, expected):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", env)
    model = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu")
    assert model.runtime.fused is expected


@pytest.mark.parametrize("env", ["yes", "true", "2"])
def test_fused_env_var_invalid(layouts, monkeypatch, env):
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", env)
    with pytest.raises(ValueError, match="MINIMAX_H3_VAE_FUSED") as info:
        H3VideoDecoder.from_pretrained(layouts["original"], device="cpu")
    assert repr(env) in str(info.value)


def test_fused_default_on_cpu_is_off(layouts, monkeypatch):
    monkeypatch.delenv("MINIMAX_H3_VAE_FUSED", raising=False)
    assert H3VideoDecoder.from_pretrained(layouts["original"], device="cpu").runtime.fused is False


def test_a_decoder_built_directly_follows_the_same_default(monkeypatch):
    """Bug: Runtime() said fused=False while the resolver turns fused on for CUDA, so a decoder built
    directly (as the benchmarks build it) ran eager. Now it is resolved like every door's, once, when it is
    built (for the default device it is built on): nothing is read again later."""
    config = H3DecoderConfig(num_layers=1, num_heads=2)
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "1")
    model = H3VideoDecoder(config)
    assert model.runtime.fused is True
    monkeypatch.delenv("MINIMAX_H3_VAE_FUSED")
    on_cuda = torch.cuda.is_available()
    assert H3VideoDecoder(config).runtime.fused is False, "on the CPU: eager"
    assert model.runtime.fused is True, "decided when it was built: the environment is not read again"
    if on_cuda:
        with torch.device("cuda"):
            assert H3VideoDecoder(config).runtime.fused is True


# ---- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, "4", True])
def test_tile_batch_rejects_what_is_not_a_count(value, layouts):
    with pytest.raises(ValueError, match="tile_batch"):
        DecodeOptions(tile_batch=value)
    model = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", tile_batch=2)
    with pytest.raises(ValueError, match="tile_batch"):
        model.configure(tile_batch=value)
    with pytest.raises(ValueError, match="tile_batch"):
        model.decode(torch.zeros(1, 24, 1, 2, 2), tile_batch=value)
    assert model.tile_batch == 2


def test_tile_batch_through_the_model_and_from_pretrained(layouts):
    model = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", tile_batch=3)
    assert model.tile_batch == model.runtime.tile_batch == 3
    model.configure(tile_batch=None)
    assert model.runtime.tile_batch is None
    with pytest.raises(ValueError, match="tile_batch"):
        H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", tile_batch=1.5)


@pytest.mark.parametrize(
    "field, value",
    [
        ("output_rank", -1),
        ("output_rank", 0.5),
        ("fused", 1),
        ("attention_backends", ("NO_SUCH_BACKEND",)),
        ("attention_backends", ()),
        ("tiling", (256, 64)),
    ],
)
def test_other_settings_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        DecodeOptions(**{field: value})


def test_runtime_is_frozen_and_per_model(layouts):
    a = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", tile_batch=2)
    b = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu")
    assert b.tile_batch is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.runtime.tile_batch = 5
    for value in (Runtime(), None):
        with pytest.raises(ValueError, match="read-only: change run settings with decoder.configure"):
            a.runtime = value


@pytest.mark.parametrize(
    "size, overlap, words",
    [(0, 0, "size"), (256, 256, "smaller"), (256, -16, "overlap"), (None, 16, "no overlap"), (True, 0, "size")],
)
def test_tiling_is_checked(size, overlap, words):
    with pytest.raises(ValueError, match=words):
        Tiling(size, overlap)


def test_tiling_on_the_latent_grid():
    config = H3DecoderConfig()
    assert Tiling(320, 80).check(config) == Tiling(320, 80)
    with pytest.raises(ValueError, match="multiples of the patch size"):
        Tiling(250, 64).check(config)
    with pytest.raises(ValueError, match="multiples of the patch size"):
        resolve(DecodeOptions(device="cpu", tiling=Tiling(256, 60)), config)


def test_resolve_converts_once():
    """GiB -> bytes, the checkpoint's tiling as the default, offload chosen (the CPU: resident)."""
    options = DecodeOptions(device="cpu", max_gpu_memory=1.5, tile_batch=3)
    runtime = resolve(options, H3DecoderConfig(), default_tiling=Tiling(512, 128))
    assert runtime == Runtime(
        fused=False, tile_batch=3, tiling=Tiling(512, 128), offload="none", max_gpu_memory=3 * 2**29
    )


def test_per_call_options_leave_the_decoder_alone():
    config = H3DecoderConfig()
    runtime = Runtime(fused=False, tile_batch=2)
    changed = resolve_call(runtime, config, tile_batch=None, tiling=Tiling(None, 0), output_rank=1)
    assert changed == Runtime(fused=False, tile_batch=None, tiling=Tiling(None, 0), output_rank=1)
    assert runtime.tile_batch == 2
    for fixed in ("device", "dtype", "offload", "max_gpu_memory"):
        with pytest.raises(ValueError, match="fixed when the decoder is loaded"):
            resolve_call(runtime, config, **{fixed: None})
    with pytest.raises(ValueError, match="tiling=None"):
        resolve_call(runtime, config, tiling=None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_cuda_without_cuda_is_a_clear_error(layouts):
    with pytest.raises(ValueError, match="no CUDA device"):
        H3VideoDecoder.from_pretrained(layouts["original"], device="cuda")


@pytest.mark.parametrize("device", ["tpu", "not a device", 3.5])
def test_unknown_device_is_a_clear_error(device):
    with pytest.raises(ValueError, match="device"):
        resolve_device(device)


@pytest.mark.parametrize("dtype", ["bf16", torch.bfloat16, "half-ish"])
def test_unsupported_dtype_is_a_clear_error(dtype):
    with pytest.raises(ValueError, match="not supported"):
        resolve_dtype(dtype, torch.device("cpu"))
