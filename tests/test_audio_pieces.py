"""The CPU's anti-aliased activation in pieces against its reference (the release's ops over whole tensors), bit
for bit; the decode's progress per AMP block; the command's spin setting, made at its entry alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from repo import EXAMPLE_LATENTS, REPO, TINY
from safetensors.torch import load_file

from minimax_h3_vae import H3AudioDecoder
from minimax_h3_vae.audio import model
from minimax_h3_vae.command import console

# (batch, channels, samples, values per piece): the example's and the release's stage shapes (shortened), one
# piece and many, pieces of one sample, odd channel counts, and lengths under the filter's.
SHAPES = [
    (2, 512, 405, 1 << 18),
    (2, 256, 2025, 1 << 16),
    (2, 8, 40000, 1 << 18),
    (1, 64, 3000, 5000),
    (2, 3, 50000, 1 << 16),
    (2, 2, 100000, 1 << 18),
    (2, 17, 33, 1),
    (2, 7, 11, 30),
    (1, 2, 3, 4),
    (2, 4, 1, 1 << 18),
]


def _inputs(batch: int, channels: int, samples: int):
    generator = torch.Generator().manual_seed(batch * 1000 + channels + samples)
    x = 3 * torch.randn(batch, channels, samples, generator=generator)
    freq = torch.exp(0.5 * torch.randn(channels, generator=generator)).view(1, -1, 1)
    inv_mag = (torch.exp(0.5 * torch.randn(channels, generator=generator)) + model.SNAKE_EPS).reciprocal()
    return x, freq, inv_mag.view(1, -1, 1), model.kaiser_sinc_filter(), model.kaiser_sinc_filter()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_pieces_are_the_reference_bit_for_bit(shape, threads):
    *size, piece_values = shape
    args = _inputs(*size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        expected = model.anti_aliased_snake_beta_reference(*args)
        got = model.anti_aliased_snake_beta_in_pieces(*args, piece_values=piece_values)
    finally:
        torch.set_num_threads(before)
    assert got.is_contiguous() and torch.equal(got, expected)


def test_the_eager_op_takes_the_pieces_on_the_cpu_only_where_they_hold(monkeypatch):
    """float32, 2 channels or more, nothing recorded by autograd: the pieces; otherwise the reference."""
    taken = []
    monkeypatch.setattr(model, "anti_aliased_snake_beta_in_pieces", lambda *a: taken.append("pieces") or a[0])
    reference = model.anti_aliased_snake_beta_reference
    monkeypatch.setattr(model, "anti_aliased_snake_beta_reference", lambda *a: taken.append("ref") or reference(*a))
    x, *rest = _inputs(2, 4, 20)
    model.anti_aliased_snake_beta(x, *rest)
    model.anti_aliased_snake_beta(x[:, :1], rest[0][:, :1], rest[1][:, :1], *rest[2:])  # one channel
    model.anti_aliased_snake_beta(x.double(), *(t.double() for t in rest))
    model.anti_aliased_snake_beta(x.requires_grad_(), *rest)
    assert taken == ["pieces", "ref", "ref", "ref"]


def test_the_example_decodes_to_the_reference_bits():
    """The example checkpoint's audio: the decode (eager ops, in pieces on the CPU) equals the model run with the
    reference activation, bit for bit."""
    from types import SimpleNamespace

    decoder = H3AudioDecoder.from_pretrained(TINY, device="cpu", fused=False)
    audio = load_file(str(EXAMPLE_LATENTS))["audio_latents"]
    reference = SimpleNamespace(anti_aliased_snake_beta=model.anti_aliased_snake_beta_reference)
    with torch.inference_mode():
        expected = decoder(decoder.denormalize(audio), reference).squeeze(1)
    assert torch.equal(decoder.decode(audio), expected)


def test_progress_is_reported_per_block_from_the_start():
    decoder = H3AudioDecoder.from_pretrained(TINY, device="cpu", fused=False)
    audio = load_file(str(EXAMPLE_LATENTS))["audio_latents"][..., :3]
    calls = []
    samples = decoder.decode(audio, lambda done, total: calls.append((done, total)))
    blocks = len(decoder.config.upsample_rates) * len(decoder.config.resblock_kernel_sizes)
    assert blocks == 21 and calls == [(done, blocks) for done in range(blocks + 1)]
    assert torch.equal(samples, decoder.decode(audio))  # the callback changes nothing


def test_the_spin_setting_is_the_commands_entry_alone(monkeypatch):
    """Set only when the user set neither variable; importing the package or running `main` in-process sets
    nothing (a library changes nothing process-wide)."""
    environ = {}
    console.spin_briefly(environ)
    assert environ == {"GOMP_SPINCOUNT": console.GOMP_SPINCOUNT}
    for mine in ({"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": "active"}):
        environ = dict(mine)
        console.spin_briefly(environ)
        assert environ == mine
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import os, minimax_h3_vae.command.main; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
