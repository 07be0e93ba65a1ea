"""Run settings (minimax_h3_vae.runtime): validated where they are set, resolved once at load."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import H3VideoDecoder, Runtime
from minimax_h3_vae.runtime import resolve_device, resolve_dtype

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


# ---- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, "4", True])
def test_tile_batch_rejects_what_is_not_a_count(value):
    with pytest.raises(ValueError, match="tile_batch"):
        Runtime(tile_batch=value)
    runtime = Runtime()
    with pytest.raises(ValueError, match="tile_batch"):
        runtime.tile_batch = value
    assert runtime.tile_batch is None


def test_tile_batch_through_the_model_and_from_pretrained(layouts):
    model = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", tile_batch=3)
    assert model.tile_batch == model.runtime.tile_batch == 3
    model.tile_batch = None
    assert model.runtime.tile_batch is None
    with pytest.raises(ValueError, match="tile_batch"):
        model.tile_batch = 0
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
    ],
)
def test_other_settings_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        Runtime(**{field: value})


def test_runtime_is_per_model(layouts):
    a = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", tile_batch=2)
    b = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu")
    assert a.runtime is not b.runtime and b.tile_batch is None


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
