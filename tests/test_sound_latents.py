"""Latents files that carry audio: what `save_latents` writes beside the video latents, what
`load_latents` and the command's header reader take, the durations rule, and the recipe of docs/diffusers.md run
on diffusers' own H3 pipeline blocks."""

from __future__ import annotations

import copy
import math
import re
from fractions import Fraction

import pytest
import torch
from audio_checkpoints import random_diffusers_audio_vae
from audio_checkpoints import write_diffusers as write_diffusers_audio
from checkpoints import random_diffusers_vae, write_diffusers
from safetensors.torch import load_file, save_file

from minimax_h3_vae import load_latents, save_latents
from minimax_h3_vae.command import main as cli
from minimax_h3_vae.latents import check_durations, read_latents_header

FORTY = Fraction(40)  # H3's audio latents per second: 32 kHz / 800 samples per latent


def noise(*shape, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ---- save_latents / load_latents -----------------------------------------------------------------------------------


def test_save_latents_writes_the_audio_latents_and_their_rate(tmp_path):
    z, audio = noise(24, 3, 2, 2), noise(2, 32, 15, seed=1).to(torch.bfloat16)  # 9 frames at 24 fps: 15 latents
    path = save_latents(tmp_path / "z.safetensors", z, fps=24, audio_latents=audio)
    stored = load_file(str(path))
    assert set(stored) == {"latents", "audio_latents"}
    assert stored["audio_latents"].dtype == torch.float32 and torch.equal(stored["audio_latents"], audio.float())
    header = read_latents_header(path)
    assert header.audio.shape == (2, 32, 15) and header.audio.sample_rate == 32000
    latents, fps, audio_back = load_latents(path)
    assert torch.equal(latents, z[None]) and fps == 24 and torch.equal(audio_back, audio.float())
    assert load_latents(save_latents(tmp_path / "silent.safetensors", z))[2] is None


@pytest.mark.parametrize(
    "audio, words",
    [
        (noise(32, 15), "(2, 32, N) as H3's pipeline makes them"),
        (noise(1, 2, 32, 15), "got shape (1, 2, 32, 15)"),
        (noise(1, 32, 15), "got shape (1, 32, 15)"),
        (noise(2, 4, 15), "got shape (2, 4, 15)"),
        (noise(32, 2, 15), "ComfyUI's audio layout (B, 32, 2, N): pass latents.transpose(0, 1)"),
        (noise(1, 32, 2, 15), "pass latents[0].transpose(0, 1)"),
        ([[0.0]], "got list"),
        (torch.full((2, 32, 15), float("nan")), "NaN"),
        (torch.zeros(2, 32, 15, dtype=torch.int32), "floating point"),
    ],
)
def test_save_latents_refuses_other_audio_layouts(tmp_path, audio, words):
    path = tmp_path / "z.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match=re.escape(words)):
        save_latents(path, noise(24, 3, 2, 2), audio_latents=audio)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["z.safetensors"]


def test_save_latents_refuses_audio_of_another_duration(tmp_path):
    """9 frames at 24 fps (0.375 s) go with 15 audio latents; 14 or 16 are another clip's. At 12 fps, 30."""
    z = noise(24, 3, 2, 2)
    with pytest.raises(ValueError, match=r"the audio lasts 0\.4 s .* 9 frames at 24 fps go with 15 audio latents"):
        save_latents(tmp_path / "z.safetensors", z, audio_latents=noise(2, 32, 16))
    with pytest.raises(ValueError, match="go with 15 audio latents"):
        save_latents(tmp_path / "z.safetensors", z, fps=24, audio_latents=noise(2, 32, 14))
    save_latents(tmp_path / "z.safetensors", z, fps=12, audio_latents=noise(2, 32, 30))
    assert not [p for p in tmp_path.iterdir() if p.name != "z.safetensors"]


# ---- the durations rule --------------------------------------------------------------------------------------------


def test_the_release_pairs_pass_and_nothing_else():
    """Every clip H3 makes, 17n + 5 frames at 24 fps from 5 s to 15 s (diffusers' audio_latent_num_frames:
    N = round(F / 24 * 40)), passes with its N and with no other; 243 frames go with 405 latents (10.125 s)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import audio_latent_num_frames

    check_durations(243, 24.0, 405, FORTY)
    for n in range(7, 22):
        frames = 17 * n + 5
        latents = audio_latent_num_frames(frames)
        check_durations(frames, 24.0, latents, FORTY)
        assert abs(Fraction(latents, 40) - Fraction(frames, 24)) <= Fraction(1, 120)  # a third of a latent at most
        for other in (latents - 1, latents + 1):
            with pytest.raises(ValueError, match=f"{frames} frames at 24 fps go with {latents} audio latents"):
                check_durations(frames, 24.0, other, FORTY)


def test_the_boundary_is_half_a_latent_exactly():
    """|N / 40 - F / fps| <= 1 / 80 s, in exact arithmetic: 1 frame at 80 fps (1/80 s) and 1 latent (1/40 s) are
    exactly half a latent apart and pass, as do 3 frames (3/80 s) on the other side; at a rate a billionth off,
    they do not."""
    check_durations(1, 80.0, 1, FORTY)
    check_durations(3, 80.0, 1, FORTY)
    with pytest.raises(ValueError, match="1 frames at 80 fps go with 0 audio latents"):
        check_durations(1, 80.0 + 1e-9, 1, FORTY)
    with pytest.raises(ValueError, match="and 1 audio latents with 3 frames at 120 fps"):
        check_durations(3, 80.0 - 1e-9, 1, FORTY)


# ---- the README's recipe, on diffusers' own blocks -----------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline_latents():
    """The recipe of docs/diffusers.md on diffusers 0.42.1's H3 blocks: a copy of MiniMaxH3Blocks with its decode
    block popped ends with the latents as the decode block takes them. The run keeps the t2va core's own blocks
    that make and unpack the rows (prepare_latents, after_denoise) and skips those that need the transformer and
    the text: its output has the layout and normalisation of a real run's, noise for values."""
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3Blocks, MiniMaxH3DecodeStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import audio_latent_num_frames, video_latent_num_frames

    blocks = copy.deepcopy(MiniMaxH3Blocks())
    decode = blocks.sub_blocks.pop("decode")
    assert isinstance(decode, MiniMaxH3DecodeStep)
    outputs = [output.name for output in blocks.intermediate_outputs]
    assert "latents" in outputs and "audio_latents" in outputs
    core = blocks.sub_blocks["denoise"].sub_blocks["t2va"]
    assert list(core.sub_blocks)[-1] == "after_denoise"
    for name in ("no_keyframe_anchors", "prepare_layout", "set_timesteps", "denoise"):
        core.sub_blocks.pop(name)
    pipe = core.init_pipeline()
    frames = 22
    out = pipe(
        num_latent_frames=video_latent_num_frames(frames, 17, 5),
        latent_height=4,
        latent_width=4,
        num_audio_latents=audio_latent_num_frames(frames),
        generator=torch.Generator().manual_seed(5),
        output=["latents", "audio_latents"],
    )
    assert out["latents"].shape == (1, 24, 7, 4, 4) and out["audio_latents"].shape == (2, 32, 37)
    return decode, out, pipe.fps


def test_the_recipe_saves_what_diffusers_decodes(tmp_path, no_network, monkeypatch, pipeline_latents):
    """save_latents takes both tensors as the blocks give them; the command decodes the file with the same VAEs
    (written in diffusers' layout, one repo root) to the sound diffusers' own decode block makes, bit for bit
    (CPU, eager, float32: docs/audio.md section 4), and to its frames within one uint8 level."""
    monkeypatch.setenv("MINIMAX_H3_VAE_FUSED", "0")
    decode, out, fps = pipeline_latents
    path = save_latents(tmp_path / "latents.safetensors", out["latents"], fps=fps, audio_latents=out["audio_latents"])

    vae, audio_vae = random_diffusers_vae(seed=0), random_diffusers_audio_vae(seed=2, latent_channels=32)
    write_diffusers(tmp_path / "repo", vae)
    write_diffusers_audio(tmp_path / "repo" / "audio_vae", audio_vae)
    stock = decode.init_pipeline()
    stock.update_components(vae=vae, audio_vae=audio_vae)
    want = stock(
        latents=out["latents"], audio_latents=out["audio_latents"], output_type="pt", output=["videos", "audio"]
    )
    assert want["audio"].shape == (1, 2, 37 * 800) and want["audio"].std() > 0.05

    result = tmp_path / "out.safetensors"
    assert cli.main([str(path), str(result), "--model", str(tmp_path / "repo"), "--device", "cpu"]) == 0
    got = load_file(str(result))
    assert torch.equal(got["audio"], want["audio"][0])
    expected = torch.round(want["videos"][0].permute(0, 2, 3, 1) * 255)
    assert got["video"].shape == expected.shape and (got["video"].float() - expected).abs().max() <= 1


def test_a_file_without_audio_metadata_is_taken_as_h3s(tmp_path):
    """audio_latents saved by other code, without audio_sample_rate: read, the rate left to the audio VAE."""
    path = tmp_path / "z.safetensors"
    save_file({"latents": noise(24, 3, 2, 2), "audio_latents": noise(2, 32, 15)}, str(path))
    assert read_latents_header(path).audio.sample_rate is None
    assert load_latents(path)[2].shape == (2, 32, 15)


@pytest.mark.parametrize(
    "tensors, metadata, words",
    [
        ({"audio_latents": noise(2, 32, 15)}, None, "no video latents ('latents') to decode"),
        ({"latents": noise(24, 3, 2, 2), "audio_latents": noise(32, 2, 15)}, None, "ComfyUI's audio layout"),
        ({"latents": noise(24, 3, 2, 2), "audio_latents": noise(2, 32, 0)}, None, "are empty"),
        ({"latents": noise(24, 3, 2, 2), "audio_latents": torch.zeros(2, 32, 3, dtype=torch.int8)}, None, "int8"),
        ({"latents": noise(24, 3, 2, 2), "audio_latents": noise(2, 32, 15)}, {"audio_sample_rate": "32k"}, "32k"),
        ({"latents": noise(24, 3, 2, 2), "audio_latents": noise(2, 32, 15)}, {"audio_sample_rate": "0"}, "Hz"),
    ],
)
def test_bad_audio_entries_are_named_from_the_header(tmp_path, tensors, metadata, words):
    path = tmp_path / "z.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(ValueError, match=re.escape(words)):
        read_latents_header(path)
    if "latents" in tensors:  # the video alone is read when the audio is left out
        assert read_latents_header(path, audio=False).audio is None


def test_only_the_audio_latents_bytes_are_read(tmp_path, monkeypatch):
    """load_latents reads each tensor by its own byte range: a NaN in the audio latents is named as theirs."""
    path = tmp_path / "z.safetensors"
    audio = noise(2, 32, 15)
    audio[1, 3, 4] = math.nan
    save_file({"latents": noise(24, 3, 2, 2), "audio_latents": audio}, str(path))
    with pytest.raises(ValueError, match="audio latents contain NaN"):
        load_latents(path)
