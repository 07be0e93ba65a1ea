"""`H3AudioDecoder`'s public contract: what `decode` takes and returns, the options it is built with (checked
as the video decoder checks them, with the same messages), and the promises it keeps (float32 only, no
process-wide switch touched)."""

from __future__ import annotations

import pytest
import torch

from minimax_h3_vae import H3AudioDecoder, H3VideoDecoder
from minimax_h3_vae.audio.decoder import check_audio_latents
from minimax_h3_vae.checkpoints import CheckpointError


@pytest.fixture(scope="module")
def decoder(audio_layouts) -> H3AudioDecoder:
    return H3AudioDecoder.from_pretrained(audio_layouts["original"], device="cpu", fused=False)


def normalised(frames: int = 3, channels: int = 4, stereo: int = 2) -> torch.Tensor:
    return torch.randn(stereo, channels, frames, generator=torch.Generator().manual_seed(frames))


def test_decode_returns_one_waveform_per_channel(decoder):
    z = normalised(3)
    audio = decoder.decode(z)
    assert audio.shape == (2, 3 * 800) and audio.dtype == torch.float32 and audio.device == decoder.device
    assert audio.abs().max() <= 1 and not audio.requires_grad
    assert decoder.sample_rate == 32000 and decoder.hop_length == 800


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_are_upcast_first(decoder, dtype):
    z = normalised(2).to(dtype)
    assert torch.equal(decoder.decode(z), decoder.decode(z.float()))


def test_denormalisation_is_the_pipelines(decoder):
    """z * std + mean with float32 statistics, the arithmetic of diffusers' H3 audio decode step."""
    z = normalised(2)
    std = torch.tensor(decoder.config.latents_std).view(1, -1, 1)
    mean = torch.tensor(decoder.config.latents_mean).view(1, -1, 1)
    assert torch.equal(decoder.denormalize(z), z * std + mean)


@pytest.mark.parametrize(
    "z, words",
    [
        ([[0.0]], "audio latents must be a torch.Tensor, got list"),
        (torch.zeros(4, 3), "audio latents must be (2, 4, N): the stereo channels, 4 latent channels, N latents"),
        (torch.zeros(1, 4, 2, 3), "got shape (1, 4, 2, 3)"),  # ComfyUI's (B, 32, 2, T)
        (torch.zeros(2, 32, 3), "got shape (2, 32, 3)"),
        (torch.zeros(2, 4, 0), "audio latents are empty: shape (2, 4, 0)"),
        (torch.zeros(2, 4, 3, dtype=torch.int64), "latents must be floating point"),
        (torch.full((2, 4, 3), float("nan")), "audio latents contain NaN or Inf"),
        (torch.full((2, 4, 3), 1e6), "beyond +-10000: not H3 audio latents"),
        (torch.zeros(2, 4, 3, device="meta"), "on the meta device"),
    ],
)
def test_bad_latents_are_refused_with_the_reason(decoder, z, words):
    with pytest.raises(ValueError) as caught:
        decoder.decode(z)
    assert words in str(caught.value)
    assert "Error" not in str(caught.value)


def test_the_check_is_public(decoder):
    check_audio_latents(normalised(1), 4)
    with pytest.raises(ValueError, match="must be"):
        check_audio_latents(normalised(1, channels=32), 4)


@pytest.mark.parametrize("options", [dict(device="tpu"), dict(device="mps"), dict(device="cpu", fused="yes")])
def test_options_are_checked_as_for_the_video_decoder(audio_layouts, layouts, options):
    """The same run options get the same messages at both decoders (runtime.py decides them once)."""
    with pytest.raises(ValueError) as video:
        H3VideoDecoder.from_pretrained(layouts["original"], **options)
    with pytest.raises(ValueError) as audio:
        H3AudioDecoder.from_pretrained(audio_layouts["original"], **options)
    assert str(audio.value) == str(video.value)


def test_a_revision_applies_to_hub_repo_ids_only(audio_layouts):
    with pytest.raises(CheckpointError, match=r"is a local path; a revision \('main'\) applies to hub repo ids only"):
        H3AudioDecoder.from_pretrained(audio_layouts["original"], revision="main")


def test_a_cast_decoder_refuses_to_decode(audio_layouts):
    decoder = H3AudioDecoder.from_pretrained(audio_layouts["original"], device="cpu", fused=False).half()
    with pytest.raises(ValueError, match="runs in float32 only"):
        decoder.decode(normalised(1))


def test_a_decoder_without_weights_refuses_to_decode(decoder):
    with torch.device("meta"):
        empty = H3AudioDecoder(decoder.config)
    with pytest.raises(ValueError, match="load it with from_pretrained"):
        empty.decode(normalised(1))


def test_decode_leaves_the_process_wide_switches_alone(decoder, monkeypatch):
    """The convolutions choose float32 per call: torch's cuDNN and matmul switches are never written."""
    writes = []
    for module in (torch.backends.cudnn, torch.backends.cuda.matmul):
        kind = type(module)
        setattr_ = kind.__setattr__
        monkeypatch.setattr(
            kind, "__setattr__", lambda self, name, value, s=setattr_: writes.append(name) or s(self, name, value)
        )
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda *a: writes.append("precision"))
    decoder.decode(normalised(1))
    assert writes == []


def test_the_fused_option_selects_the_kernel_on_a_device_that_runs_it(audio_layouts):
    """fused=False is the eager op everywhere; on the CPU the default is eager (the reference)."""
    eager = H3AudioDecoder.from_pretrained(audio_layouts["original"], device="cpu")
    assert eager.fused is False and eager.ops().anti_aliased_snake_beta.__module__ == "minimax_h3_vae.audio.model"


def test_the_audio_model_never_imports_the_loaders_or_the_runtime():
    """audio/model.py is the reference of record: modules and ops only (the fused kernel imports it)."""
    from import_graph import package_imports

    graph = package_imports()
    reached, todo = set(), ["audio.model"]
    while todo:
        for target in graph[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    assert reached <= {"audio", "audio.config", "config", "__init__"}, reached
