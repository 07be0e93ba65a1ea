"""The anti-aliased SnakeBeta kernel (fused/anti_aliased_snake_beta.py) against the eager op of audio/model.py,
and the audio decoder's fused path against its eager one.

Each kernel test runs where the kernel can: the CPU through Triton's interpreter (TRITON_INTERPRET=1, set below
when there is no GPU) and CUDA when present. Sizes are small but cover the edges: rows of 1 to 12 samples (the
replicate padding reaches across the whole row), rows that end inside a program's halo or just past one
program, several rows of different channels.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

# triton.jit picks compiled or interpreted when a kernel is defined, so this must precede the kernel imports.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from audio_checkpoints import OTHER_GEOMETRY, random_diffusers_audio_vae, write_diffusers  # noqa: E402

from minimax_h3_vae import H3AudioDecoder  # noqa: E402
from minimax_h3_vae.audio import model as audio_model  # noqa: E402
from minimax_h3_vae.audio.config import H3AudioDecoderConfig  # noqa: E402
from minimax_h3_vae.fused import choose_audio_kernels, interpreting, ops_for  # noqa: E402
from minimax_h3_vae.fused.anti_aliased_snake_beta import (  # noqa: E402
    anti_aliased_snake_beta,
    anti_aliased_snake_beta_reference,
)

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not interpreting(), reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
U = 2.0**-24  # float32's unit roundoff


def gamma(n: int) -> float:
    """The bound on the relative error of an n-term float32 dot product (Higham's gamma_n)."""
    return n * U / (1 - n * U)


def activation_inputs(batch: int, channels: int, length: int, device: str, seed: int = 0):
    """x ~ N(0, 4) and the decoder's per-channel factors and filters: freq = exp(alpha), inv_mag =
    1 / (exp(beta) + 1e-9) with alpha, beta ~ N(0, 0.25), the released filter plus noise (a wrong tap shows)."""
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(batch, channels, length, generator=g)
    freq = torch.exp(0.5 * torch.randn(1, channels, 1, generator=g))
    inv_mag = (torch.exp(0.5 * torch.randn(1, channels, 1, generator=g)) + 1e-9).reciprocal()
    up = audio_model.kaiser_sinc_filter() + 0.01 * torch.randn(1, 1, 12, generator=g)
    down = audio_model.kaiser_sinc_filter() + 0.01 * torch.randn(1, 1, 12, generator=g)
    return [t.to(device) for t in (x, freq, inv_mag, up, down)]


def error_bound(x, freq, inv_mag, up, down) -> torch.Tensor:
    """Per output sample, a bound on |kernel - eager|: twice the bound on either one's distance from the exact
    result, propagated op by op from float32 rounding (unit roundoff u), computed in float64:

      upsampled u_m = 2 sum of 6 products (12 if a transposed conv sums the zero taps):   du <= gamma_12 U_m,
          U_m the same sum over |f| |x|;
      t = freq u:         dt <= freq du + u |t|;
      s = sin t:          ds <= dt + 4u  (each sinf within 2 ulp of a result in [-1, 1]);
      a = u + inv_mag s^2:  da <= du + inv_mag (2 ds + u) + u inv_mag + u |a|;
      y = sum of 12 products g_k a_k:   dy <= gamma_12 sum |g_k| |a_k| + sum |g_k| da_k.
    """
    x, freq, inv_mag, up, down = (t.double().cpu() for t in (x, freq, inv_mag, up, down))
    channels = x.shape[1]

    def upsample(v, f):
        h = F.pad(v, (5, 5), mode="replicate")
        return (2 * F.conv_transpose1d(h, f.expand(channels, -1, -1), stride=2, groups=channels))[..., 15:-15]

    def downsample(v, g):
        return F.conv1d(F.pad(v, (5, 6), mode="replicate"), g.expand(channels, -1, -1), stride=2, groups=channels)

    u_exact, u_abs = upsample(x, up), upsample(x.abs(), up.abs())
    a_exact = u_exact + inv_mag * torch.sin(freq * u_exact) ** 2
    du = gamma(12) * u_abs
    dt = freq * du + U * (freq * u_exact).abs()
    ds = dt + 4 * U
    da = du + inv_mag * (2 * ds + U) + U * inv_mag + U * a_exact.abs()
    dy = gamma(12) * downsample(a_exact.abs(), down.abs()) + downsample(da, down.abs())
    return 2 * dy


SIZES = [(1, 1, 1), (1, 2, 2), (2, 3, 3), (1, 1, 7), (2, 2, 12), (1, 3, 100), (1, 2, 1016), (1, 1, 1017), (2, 1, 1030)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch, channels, length", SIZES)
def test_kernel_matches_the_eager_op(device, batch, channels, length):
    args = activation_inputs(batch, channels, length, device, seed=length)
    launches = {}  # counted by the launcher, after its launch
    out = anti_aliased_snake_beta(*args, launches=launches)
    assert launches == {"anti_aliased_snake_beta": 1}
    expected = anti_aliased_snake_beta_reference(*args)
    assert out.shape == expected.shape == (batch, channels, length) and out.dtype == torch.float32
    bound = error_bound(*args)
    excess = ((out - expected).abs().double().cpu() - bound).max().item()
    assert excess <= 0, f"beyond the float32 bound by {excess:.3g}"


@pytest.mark.parametrize("device", DEVICES)
def test_the_bound_catches_a_wrong_tap(device):
    """The bound is tight enough to fail: the same op with two downsampling taps swapped is far outside it."""
    x, freq, inv_mag, up, down = activation_inputs(2, 3, 40, device, seed=7)
    swapped = down.clone()
    swapped[..., [3, 4]] = down[..., [4, 3]]
    wrong = anti_aliased_snake_beta_reference(x, freq, inv_mag, up, swapped)
    out = anti_aliased_snake_beta(x, freq, inv_mag, up, down)
    assert ((out - wrong).abs().double().cpu() > error_bound(x, freq, inv_mag, up, down)).float().mean() > 0.5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "change, words",
    [
        (lambda a: [a[0].double(), *a[1:]], "x must be a (B, C, L) float32 tensor"),
        (lambda a: [a[0][0], *a[1:]], "x must be a (B, C, L) float32 tensor"),
        (lambda a: [a[0].transpose(0, 1), *a[1:]], "x must be contiguous"),
        (lambda a: [a[0], a[1][:, :2], *a[2:]], "freq must be contiguous with one value per channel (3)"),
        (lambda a: [*a[:2], a[2].half(), *a[3:]], "inv_mag must be a float32 tensor"),
        (lambda a: [*a[:3], a[3][..., :11], a[4]], "up_filter must be contiguous with 12 taps"),
        (lambda a: [*a[:4], a[4].cpu() if a[4].is_cuda else a[4].to("meta")], "one device"),
    ],
)
def test_kernel_refuses_calls_outside_its_contract(device, change, words):
    args = change(activation_inputs(2, 3, 10, device))
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        anti_aliased_snake_beta(*args)


def test_select_falls_back_to_eager_with_a_warning(monkeypatch):
    """Where the kernel cannot run (the CPU without the interpreter), the fused path runs the eager op, and says
    so once."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.warns(UserWarning, match=r"anti_aliased_snake_beta \(tensors on cpu need a CUDA device"):
        ops = ops_for(choose_audio_kernels(H3AudioDecoderConfig(), torch.device("cpu")))
    assert ops.anti_aliased_snake_beta is audio_model.anti_aliased_snake_beta


def float64_decode(decoder: H3AudioDecoder, raw: torch.Tensor) -> torch.Tensor:
    """The eager forward in float64: the same weights, every op in double (the activations' factors recomputed
    in double from alpha and beta at the call)."""
    exact = H3AudioDecoder(decoder.config).to(decoder.device)
    exact.load_state_dict(decoder.state_dict())
    exact.double()
    with torch.inference_mode():
        return exact(raw.double().to(decoder.device)).squeeze(1)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_decode_is_as_accurate_as_eager(tmp_path, device):
    """A whole decode on the fused path: every activation runs the kernel (the launch count), and its distance
    from a float64 decode of the same weights is of the eager float32 decode's order (within 4x, as any other
    float32 evaluation order would be)."""
    vae = random_diffusers_audio_vae(seed=11, **OTHER_GEOMETRY)
    folder = write_diffusers(tmp_path / "audio_vae", vae)
    eager = H3AudioDecoder.from_pretrained(folder, device=device, fused=False)
    fused = H3AudioDecoder.from_pretrained(folder, device=device, fused=True)
    z = torch.randn(2, 2, 9, generator=torch.Generator().manual_seed(12)).to(device)
    before = fused.launch_counts()["anti_aliased_snake_beta"]
    got = fused.decode(z)
    assert fused.launch_counts()["anti_aliased_snake_beta"] - before == len(fused.activations())
    reference, exact = eager.decode(z), float64_decode(eager, eager.denormalize(z))
    fused_error = (got.double() - exact).abs().max().item()
    eager_error = (reference.double() - exact).abs().max().item()
    assert got.shape == reference.shape and 0 < fused_error <= 4 * eager_error + 1e-7, (fused_error, eager_error)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_decode_follows_changed_snake_parameters(tmp_path, device):
    """The kernel gets SnakeBeta's factors from the parameters as they are at the call: alpha and beta changed
    in place give the fused decode of a decoder loaded with the changed weights."""
    vae = random_diffusers_audio_vae(seed=11, **OTHER_GEOMETRY)
    fused = H3AudioDecoder.from_pretrained(write_diffusers(tmp_path / "a", vae), device=device, fused=True)
    z = torch.randn(1, 2, 6, generator=torch.Generator().manual_seed(13)).to(device)
    before = fused.decode(z)
    with torch.no_grad():
        for module in (vae, fused):
            for name, parameter in module.named_parameters():
                if name.endswith((".alpha", ".beta")):
                    parameter.add_(0.3)
    fresh = H3AudioDecoder.from_pretrained(write_diffusers(tmp_path / "b", vae), device=device, fused=True)
    after = fused.decode(z)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh.decode(z))
