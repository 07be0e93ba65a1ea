"""The audio decoder decodes with its parameters as they are at the call: SnakeBeta's alpha and beta changed by
`load_state_dict` or in place give the decode of a decoder loaded with those weights (nothing derived from them
is kept from the load)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3AudioDecoder


def _load(path) -> H3AudioDecoder:
    return H3AudioDecoder.from_pretrained(path, device="cpu", fused=False)


def _snake_keys(decoder: H3AudioDecoder) -> list[str]:
    return [key for key in decoder.state_dict() if key.endswith((".act.alpha", ".act.beta"))]


@pytest.fixture
def changed(audio_layouts, tmp_path) -> tuple[dict[str, torch.Tensor], H3AudioDecoder]:
    """Other alpha and beta for every activation, and a decoder loaded from a ComfyUI file holding them."""
    tensors = load_file(str(audio_layouts["comfyui"]))
    generator = torch.Generator().manual_seed(5)
    deltas = {
        key: 0.3 * torch.randn(tensors[key].shape, generator=generator)
        for key in _snake_keys(_load(audio_layouts["comfyui"]))
    }
    assert deltas, "the decoder has SnakeBeta parameters"
    path = tmp_path / "changed.safetensors"
    save_file({key: value + deltas.get(key, 0) for key, value in tensors.items()}, str(path))
    return deltas, _load(path)


def _latents(decoder: H3AudioDecoder) -> torch.Tensor:
    return torch.randn(1, decoder.config.latent_channels, 5, generator=torch.Generator().manual_seed(6))


def test_load_state_dict_changes_the_decode(audio_layouts, changed, one_thread):
    deltas, fresh = changed
    decoder = _load(audio_layouts["comfyui"])
    z = _latents(decoder)
    before = decoder.decode(z)
    state = decoder.state_dict()
    decoder.load_state_dict({key: value + deltas.get(key, 0) for key, value in state.items()})
    after = decoder.decode(z)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh.decode(z))


def test_an_in_place_change_changes_the_decode(audio_layouts, changed, one_thread):
    deltas, fresh = changed
    decoder = _load(audio_layouts["comfyui"])
    z = _latents(decoder)
    before = decoder.decode(z)
    parameters = dict(decoder.named_parameters())
    with torch.no_grad():
        for key, delta in deltas.items():
            parameters[key].add_(delta)
    after = decoder.decode(z)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh.decode(z))
