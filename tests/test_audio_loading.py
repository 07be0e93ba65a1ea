"""Reading the audio VAE from each layout: detection, config mapping, the weight-norm fold, and strict checks
(a missing, unexpected or mis-shaped tensor, or a config that does not describe the weights, is one error
naming it, before any tensor data is read)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from audio_checkpoints import comfyui_state_dict, original_state_dict, write_comfyui
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3AudioDecoder
from minimax_h3_vae.audio import loading
from minimax_h3_vae.audio.config import RELEASED_AUDIO_LATENTS_MEAN, H3AudioDecoderConfig
from minimax_h3_vae.audio.model import kaiser_sinc_filter
from minimax_h3_vae.checkpoints import CheckpointError
from minimax_h3_vae.config import ConfigError

LAYOUTS = ("original", "diffusers", "comfyui")


def load(path, **options) -> H3AudioDecoder:
    return H3AudioDecoder.from_pretrained(path, device="cpu", fused=False, **options)


def load_error(path) -> str:
    with pytest.raises(CheckpointError) as caught:
        loading.load_checkpoint(path)
    message = str(caught.value)
    assert "\n" not in message and "Error" not in message and "NoneType" not in message
    return message


@pytest.fixture(scope="module")
def reference_state(audio_layouts) -> dict[str, torch.Tensor]:
    return load(audio_layouts["original"]).state_dict()


def copy_original(audio_layouts, tmp_path) -> Path:
    folder = tmp_path / "audio_vae"
    shutil.copytree(audio_layouts["original"], folder)
    return folder


def rewrite_weights(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# ---- layouts ------------------------------------------------------------------------------------------------


def test_each_layout_is_detected(audio_layouts, tmp_path):
    root = audio_layouts["original"].parents[1]  # FL2VA/audio_vae, audio_vae and comfyui/ side by side
    assert loading.load_checkpoint(root).layout == "original"  # the release's own layout first
    for layout in LAYOUTS:
        assert loading.load_checkpoint(audio_layouts[layout]).layout == layout
    diffusers_only = tmp_path / "repo"
    shutil.copytree(audio_layouts["diffusers"], diffusers_only / "audio_vae")
    assert loading.load_checkpoint(diffusers_only).layout == "diffusers"
    shutil.copytree(audio_layouts["original"], tmp_path / "example" / "audio_vae")  # as in examples/tiny_h3_vae
    assert loading.load_checkpoint(tmp_path / "example").layout == "original"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_same_decoder(audio_layouts, reference_state, layout):
    decoder = load(audio_layouts[layout])
    state = decoder.state_dict()
    assert state.keys() == reference_state.keys()
    assert all(torch.equal(state[k], reference_state[k]) for k in state)
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in decoder.parameters())
    stats = [torch.tensor(getattr(decoder.config, n), dtype=torch.float32) for n in ("latents_mean", "latents_std")]
    reference = load(audio_layouts["original"]).config
    assert all(
        torch.equal(s, torch.tensor(getattr(reference, n))) for s, n in zip(stats, ("latents_mean", "latents_std"))
    )


def test_config_of_the_oracle(audio_layouts, audio_oracle):
    c = loading.load_checkpoint(audio_layouts["original"]).config
    o = audio_oracle.config
    assert (c.latent_channels, c.latent_dim, c.decoder_dim, c.sample_rate) == (4, 32, 128, 32000)
    assert c.upsample_rates == tuple(o.decoder_rates) and c.upsample_kernel_sizes == tuple(o.decoder_kernel_sizes)
    assert c.resblock_dilations == tuple(map(tuple, o.resblock_dilation_sizes)) and c.hop_length == 800
    assert c.latents_mean == tuple(o.latents_mean) and c.latents_std == tuple(o.latents_std)


def test_weights_are_what_diffusers_computes(audio_layouts, audio_oracle):
    """Each folded weight equals the `weight` diffusers' weight-norm hook computes before its conv runs."""
    z = torch.zeros(1, audio_oracle.config.latent_channels, 1)
    with torch.inference_mode():
        audio_oracle.decode(z)  # runs every hook: each module's `weight` is now g * v / ||v||
    state = load(audio_layouts["diffusers"]).state_dict()
    for name, module in audio_oracle.decoder.named_modules():
        if hasattr(module, "weight_g"):
            assert torch.equal(state[f"decoder.{name}.weight"], module.weight), name


def test_encoder_tensors_are_not_read(audio_layouts, monkeypatch):
    read = []

    class Spy:
        def __init__(self, *args, **kwargs):
            self.handle = safe_open(*args, **kwargs)

        def get_tensor(self, name):
            read.append(name)
            return self.handle.get_tensor(name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("minimax_h3_vae.checkpoints.stored.safe_open", Spy)
    for layout in LAYOUTS:
        load(audio_layouts[layout])
    assert read and all(
        n.startswith(("decoder.", "dec_in_proj.")) or n in ("latents_mean", "latents_std") for n in read
    )


def test_the_newer_weight_norm_spelling_is_read(audio_layouts, tmp_path, reference_state):
    """torch's parametrizations.weight_norm writes `parametrizations.weight.original0 / original1`."""
    folder = copy_original(audio_layouts, tmp_path)

    def respell(tensors):
        for key in [k for k in tensors if k.endswith(("weight_g", "weight_v"))]:
            part = "original0" if key.endswith("_g") else "original1"
            tensors[f"{key[: -len('.weight_g')]}.parametrizations.weight.{part}"] = tensors.pop(key)

    rewrite_weights(folder / "model.safetensors", respell)
    state = load(folder).state_dict()
    assert all(torch.equal(state[k], reference_state[k]) for k in state)


def test_a_comfyui_file_without_filters_computes_them(audio_layouts, audio_oracle, tmp_path, reference_state):
    """The filters are fixed by the architecture: a single file that leaves them out gets the same values."""
    assert torch.equal(audio_oracle.state_dict()["decoder.activation_post.upsample.filter"], kaiser_sinc_filter())
    path = write_comfyui(tmp_path / "no_filters.safetensors", audio_oracle, filters=False)
    state = load(path).state_dict()
    assert all(torch.equal(state[k], reference_state[k]) for k in state)


def test_a_comfyui_file_without_statistics_takes_the_released_ones(audio_oracle, tmp_path):
    tensors = comfyui_state_dict(audio_oracle)
    del tensors["latents_mean"], tensors["latents_std"]
    save_file(tensors, str(tmp_path / "x.safetensors"))
    # The tiny oracle has 4 latent channels, the released statistics 32: the error says so.
    assert "latents_mean has 32 entries, expected 4" in load_error(tmp_path / "x.safetensors")
    assert loading.H3AudioDecoderConfig().latents_mean == RELEASED_AUDIO_LATENTS_MEAN


# ---- strict checks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout, key",
    [
        ("original", "decoder.resblocks.3.convs2.1.weight_g"),
        ("original", "decoder.resblocks.0.activations.5.downsample.lowpass.filter"),
        ("original", "dec_in_proj.bias"),
        ("comfyui", "decoder.ups.2.0.weight"),
        ("comfyui", "decoder.activation_post.act.beta"),
    ],
)
def test_missing_tensor_is_named(audio_layouts, audio_oracle, tmp_path, layout, key):
    if layout == "original":
        path = copy_original(audio_layouts, tmp_path)
        rewrite_weights(path / "model.safetensors", lambda t: t.pop(key))
    else:
        path = tmp_path / "file.safetensors"
        tensors = comfyui_state_dict(audio_oracle)
        del tensors[key]
        save_file(tensors, str(path))
    assert f"missing tensor {key!r} ({layout} layout)" in load_error(path)


def test_unexpected_decoder_tensor_is_named(audio_layouts, tmp_path):
    folder = copy_original(audio_layouts, tmp_path)
    rewrite_weights(folder / "model.safetensors", lambda t: t.update({"decoder.extra.weight": torch.zeros(2)}))
    assert "unexpected decoder tensor(s) ['decoder.extra.weight']" in load_error(folder)


def test_unexpected_encoder_tensor_is_fine(audio_layouts, tmp_path):
    folder = copy_original(audio_layouts, tmp_path)
    rewrite_weights(folder / "model.safetensors", lambda t: t.update({"encoder.extra.weight": torch.zeros(2)}))
    load(folder)


@pytest.mark.parametrize(
    "key, shape",
    [
        ("decoder.resblocks.0.activations.1.act.beta", (63,)),
        ("decoder.conv_pre.weight_g", (128, 1)),
        ("decoder.ups.0.0.weight_v", (128, 64, 8)),
    ],
)
def test_misshaped_tensor_is_named(audio_layouts, tmp_path, key, shape):
    folder = copy_original(audio_layouts, tmp_path)
    rewrite_weights(folder / "model.safetensors", lambda t: t.update({key: torch.zeros(shape)}))
    assert f"tensor {key!r} has shape {list(shape)}" in load_error(folder)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("decoder_dim", 256, "decoder_dim 256 (the tensors say 128)"),
        ("vae_latent_channels", 8, "disagree on the latent channels"),
    ],
)
def test_config_that_does_not_describe_the_weights(audio_layouts, tmp_path, field, value, words):
    folder = copy_original(audio_layouts, tmp_path)
    edit_json(folder / "metadata.json", lambda d: d["metadata"]["kwargs"].update({field: value}))
    assert words in load_error(folder)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda k: k.update(decoder_type="hifigan"), "decoder_type='hifigan' is not supported (only 'bigvgan')"),
        (lambda k: k.update(sample_rate=16000), "sample_rate=16000 is not supported (only 32000)"),
        (lambda k: k.update(decoder_rates=[8, 5, 5, 4]), "decoder_rates=[8, 5, 5, 4] is not supported"),
        (lambda k: k.update(latent_dim=1024), "latent_dim=1024 is not supported (only 32)"),
        (lambda k: k.update(snake_logscale=False), "settings this decoder does not implement: ['snake_logscale']"),
        (lambda k: k.update(encoder_dim="64"), "encoder_dim must be a whole number from 1 to 65536"),
    ],
)
def test_original_settings_we_do_not_reproduce(audio_layouts, tmp_path, edit, words):
    folder = copy_original(audio_layouts, tmp_path)
    edit_json(folder / "metadata.json", lambda d: edit(d["metadata"]["kwargs"]))
    assert words in load_error(folder)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda c: c.update(use_tanh_at_final=True), "does not implement: ['use_tanh_at_final']"),
        (lambda c: c.update(sample_rate=16000), "sample_rate and sampling_rate disagree"),
        (lambda c: c.update(decoder_kernel_sizes=[9, 9, 4, 4, 4, 4, 5]), "kernel 5 with rate 2"),
        (lambda c: c.update(resblock_kernel_sizes=[3, 7, 12]), "resblock_kernel_sizes must be odd"),
        (lambda c: c.update(latents_std=[1.0, 1.0, 1.0, 0.0]), "latents_std must be positive"),
        (
            lambda c: c.update(_class_name="AutoencoderKLMiniMaxH3"),
            "describes AutoencoderKLMiniMaxH3, not the audio VAE",
        ),
    ],
)
def test_diffusers_settings_we_do_not_reproduce(audio_layouts, tmp_path, edit, words):
    folder = tmp_path / "audio_vae"
    shutil.copytree(audio_layouts["diffusers"], folder)
    edit_json(folder / "config.json", edit)
    assert words in load_error(folder)


def test_files_that_are_not_an_audio_vae(layouts, tmp_path, audio_layouts):
    assert "not a MiniMax-H3 audio VAE file" in load_error(layouts["comfyui"])  # the video VAE's single file
    assert "missing file" in load_error(layouts["original"]) and "metadata.json" in load_error(layouts["original"])
    assert "describes AutoencoderKLMiniMaxH3, not the audio VAE" in load_error(layouts["diffusers"])
    assert "not an audio VAE checkpoint folder" in load_error(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert "must be a .safetensors file" in load_error(tmp_path / "weights.bin")


def test_truncated_weights(audio_layouts, tmp_path):
    folder = copy_original(audio_layouts, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    assert "truncated or corrupt" in load_error(folder)


def test_metadata_names_a_file_outside_the_folder(audio_layouts, tmp_path):
    folder = copy_original(audio_layouts, tmp_path)
    edit_json(folder / "config.json", lambda c: c.update(source_safetensors_path="../model.safetensors"))
    assert "outside its folder" in load_error(folder)


def test_config_values_are_checked():
    with pytest.raises(ConfigError, match="decoder_dim 4 cannot be halved 7 times"):
        H3AudioDecoderConfig(decoder_dim=4)
    with pytest.raises(ConfigError, match="upsample_rates .* must pair up"):
        H3AudioDecoderConfig(upsample_rates=(5, 5))
    with pytest.raises(ConfigError, match="latent_channels must be a whole number from 1 to 1024, got True"):
        H3AudioDecoderConfig(latent_channels=True)
    assert H3AudioDecoderConfig().hop_length == 800 and H3AudioDecoderConfig().latents_per_second == 40


def test_original_state_dict_is_the_diffusers_one(audio_oracle):
    """The test helper's premise, checked: the release's names are diffusers' (weight norm as weight_g/v)."""
    keys = set(original_state_dict(audio_oracle))
    assert "decoder.conv_pre.weight_g" in keys and "decoder.conv_post.weight_v" in keys
    assert "decoder.conv_post.bias" not in keys and "dec_in_proj.weight" in keys
