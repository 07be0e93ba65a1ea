"""The MiniMax-H3 audio VAE decoder's modules: `dec_in_proj` + BigVGAN with anti-aliased SnakeBeta activations,
and the eager forward, the reference of record.

    z (B, 32, N) denormalised latents -> dec_in_proj (1x1 conv 32 -> 2048) -> conv_pre (k7, 2048 -> 1024)
      -> 7 stages: transposed-conv upsampler (rates 5 5 2 2 2 2 2), then the mean of 3 AMP blocks (kernels 3, 7, 11,
         dilations 1, 3, 5); channels halve per stage, 512 -> 8
      -> anti-aliased SnakeBeta -> conv_post (k7, 8 -> 1, no bias) -> clamp to [-1, 1]: (B, 1, 800 N) at 32 kHz

Module names equal the keys of the ComfyUI layout, which are the release's with each weight-normed conv's
`weight_g` / `weight_v` folded into its `weight`: loading is an identity map there and a fold in the other
layouts (audio/loading.py, docs/audio.md section 2). The anti-aliased activation is an op the module receives
(`ops.anti_aliased_snake_beta`): this eager function, or the fused kernel of fused/anti_aliased_snake_beta.py.
Every conv runs in float32 with TF32 off (`conv1d`), on every device.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .config import H3AudioDecoderConfig

# The anti-aliased activations run at twice the rate, through 12-tap Kaiser-windowed sinc filters (fixed by the
# release's code; every stored filter is (1, 1, 12)).
RESAMPLE_RATIO = 2
FILTER_TAPS = 12
# The upsampler pads its input by PAD (replicate) on each side and crops CROP samples off each end of the
# transposed conv's output; the downsampler pads its input by DOWN_PAD (replicate) before the strided conv.
PAD = FILTER_TAPS // RESAMPLE_RATIO - 1  # 5
CROP = PAD * RESAMPLE_RATIO + (FILTER_TAPS - RESAMPLE_RATIO) // 2  # 15 (both ends: the taps are even)
DOWN_PAD = (FILTER_TAPS // 2 - 1, FILTER_TAPS // 2)  # (5, 6)
# SnakeBeta's guard against a zero magnitude, as released.
SNAKE_EPS = 1e-9


def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    transposed: bool = False,
) -> torch.Tensor:
    """`F.conv1d` (or `F.conv_transpose1d` with `transposed`) with TF32 off for this call.

    torch's `F.conv*` run on cuDNN with TF32 unless the process-wide `torch.backends.cudnn.allow_tf32` is off (its
    default is on), ~3 decimal digits; the decoder's recipe is float32. This is the op those functions call
    (`torch._convolution`), with the process's other cuDNN settings (benchmark, deterministic, enabled) read, not
    changed, and allow_tf32=False passed for this call alone. On the CPU it is exactly `F.conv1d`.
    x: (B, C_in, L). weight: (C_out, C_in / groups, k), or (C_in, C_out / groups, k) transposed.
    """
    cudnn = torch.backends.cudnn
    deterministic = cudnn.deterministic or torch.are_deterministic_algorithms_enabled()
    return torch._convolution(
        x, weight, bias, [stride], [padding], [dilation], transposed, [0], groups,
        cudnn.benchmark, deterministic, cudnn.enabled, False,
    )  # fmt: skip


def anti_aliased_snake_beta(
    x: torch.Tensor,
    freq: torch.Tensor,
    inv_mag: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
) -> torch.Tensor:
    """BigVGAN's anti-aliased activation: 2x upsample, SnakeBeta, low-pass 2x downsample.

    x: (B, C, L) float32 -> (B, C, L) float32. freq, inv_mag: (1, C, 1) float32, SnakeBeta's `exp(alpha)` and
    `1 / (exp(beta) + 1e-9)`. up_filter, down_filter: (1, 1, 12) float32 (`kaiser_sinc_filter`).

    Upsample: replicate-pad by 5, depthwise transposed conv with stride 2, times 2, crop 15 off each end (2L
    samples u). SnakeBeta per channel: `u + inv_mag * sin(freq * u)^2`. Downsample: replicate-pad by (5, 6),
    depthwise conv with stride 2 (L samples). The ops and their order are the release's: on the CPU the values
    are bit for bit those of diffusers' modules, and on CUDA too where cuDNN picks the same algorithms.
    """
    channels = x.shape[1]
    h = F.pad(x, (PAD, PAD), mode="replicate")
    up = up_filter.expand(channels, -1, -1)
    h = RESAMPLE_RATIO * conv1d(h, up, None, stride=RESAMPLE_RATIO, groups=channels, transposed=True)
    h = h[..., CROP:-CROP]
    h = h + inv_mag * torch.sin(freq * h).pow(2)
    h = F.pad(h, DOWN_PAD, mode="replicate")
    return conv1d(h, down_filter.expand(channels, -1, -1), None, stride=RESAMPLE_RATIO, groups=channels)


EAGER_OPS = SimpleNamespace(anti_aliased_snake_beta=anti_aliased_snake_beta)


def kaiser_sinc_filter() -> torch.Tensor:
    """The low-pass filter of both resamplers, (1, 1, 12) float32: a Kaiser-windowed sinc with cutoff 0.25 and
    transition half-width 0.3 (cycles per sample at the doubled rate), normalised to sum 1.

    The release stores it in every activation (`upsample.filter`, `downsample.lowpass.filter`), and those stored
    values are what the decoder uses. This computes the same float32 values the same way (the design of the
    alias-free-torch code the model was trained with: Kaiser's formula for the window's beta from the
    attenuation), for a file that leaves the filters out and for the example checkpoint's writer.
    """
    cutoff, half_width = 0.5 / RESAMPLE_RATIO, 0.6 / RESAMPLE_RATIO
    half = FILTER_TAPS // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95  # dB
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(FILTER_TAPS, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5  # the taps sit between samples: FILTER_TAPS is even
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (taps / taps.sum()).view(1, 1, FILTER_TAPS)


class SnakeBeta(nn.Module):
    """SnakeBeta's per-channel parameters, in log scale: frequency `exp(alpha)`, magnitude `exp(beta)`."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(channels))
        self.beta = nn.Parameter(torch.empty(channels))


class KaiserSincFilter(nn.Module):
    """Holds one resampler's stored filter, (1, 1, 12)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("filter", torch.empty(1, 1, FILTER_TAPS))


class LowPass(nn.Module):
    """The downsampler: the release keeps its filter one level deeper (`downsample.lowpass.filter`)."""

    def __init__(self):
        super().__init__()
        self.lowpass = KaiserSincFilter()


class AntiAliasedActivation(nn.Module):
    """Upsample 2x -> SnakeBeta -> downsample 2x over (B, C, L) float32, through `ops.anti_aliased_snake_beta`.

    SnakeBeta's factors `freq` and `inv_mag` ((1, C, 1)) are computed from alpha and beta at every call, with
    the release's float32 ops (2 C exponentials): the decode follows the parameters as they are then, after
    `load_state_dict` or an in-place change alike.
    """

    def __init__(self, channels: int):
        super().__init__()
        self.act = SnakeBeta(channels)
        self.upsample = KaiserSincFilter()
        self.downsample = LowPass()

    def forward(self, x: torch.Tensor, ops: SimpleNamespace) -> torch.Tensor:
        freq = torch.exp(self.act.alpha).view(1, -1, 1)
        inv_mag = (torch.exp(self.act.beta) + SNAKE_EPS).reciprocal().view(1, -1, 1)
        return ops.anti_aliased_snake_beta(x, freq, inv_mag, self.upsample.filter, self.downsample.lowpass.filter)


class Conv1d(nn.Module):
    """A float32 conv over (B, C_in, L) that keeps the length (odd kernel, padding (k - 1) * dilation / 2):
    weight (C_out, C_in, k), bias (C_out,) or none."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c_out, c_in, kernel))
        self.bias = nn.Parameter(torch.empty(c_out)) if bias else None
        self.dilation = dilation
        self.padding = (kernel - 1) * dilation // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv1d(x, self.weight, self.bias, padding=self.padding, dilation=self.dilation)


class ConvTranspose1d(nn.Module):
    """A float32 transposed conv that upsamples (B, C_in, L) to (B, C_out, rate * L): weight (C_in, C_out, k),
    bias (C_out,), padding (k - rate) / 2."""

    def __init__(self, c_in: int, c_out: int, kernel: int, rate: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c_in, c_out, kernel))
        self.bias = nn.Parameter(torch.empty(c_out))
        self.rate = rate
        self.padding = (kernel - rate) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv1d(x, self.weight, self.bias, stride=self.rate, padding=self.padding, transposed=True)


class AMPBlock(nn.Module):
    """BigVGAN's anti-aliased multi-periodicity block: per dilation d, `x += conv2(act(conv1_d(act(x))))`, where
    conv1_d is dilated by d, conv2 is not, and each activation has its own parameters (activations 2i and 2i + 1
    for dilation i)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(Conv1d(channels, channels, kernel, dilation) for dilation in dilations)
        self.convs2 = nn.ModuleList(Conv1d(channels, channels, kernel) for _ in dilations)
        self.activations = nn.ModuleList(AntiAliasedActivation(channels) for _ in range(2 * len(dilations)))

    def forward(self, x: torch.Tensor, ops: SimpleNamespace) -> torch.Tensor:
        """x: (B, C, L) float32, left untouched (the stage's AMP blocks share it) -> a new (B, C, L) tensor."""
        for i, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2)):
            h = conv1(self.activations[2 * i](x, ops))
            h = conv2(self.activations[2 * i + 1](h, ops))
            x = h.add_(x)  # into conv2's fresh output: the same sum as `h + x`, without another buffer
        return x


class BigVGAN(nn.Module):
    """conv_pre -> per stage: upsampler, then the mean of the stage's AMP blocks -> activation_post -> conv_post
    -> clamp. The upsamplers sit one level deep (`ups.<i>.0`), as released."""

    def __init__(self, config: H3AudioDecoderConfig):
        super().__init__()
        c = config
        self.blocks_per_stage = len(c.resblock_kernel_sizes)
        self.conv_pre = Conv1d(c.latent_dim, c.decoder_dim, 7)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes)):
            channels = c.stage_channels(i)
            self.ups.append(nn.ModuleList([ConvTranspose1d(c.decoder_dim // 2**i, channels, kernel, rate)]))
            for block_kernel, dilations in zip(c.resblock_kernel_sizes, c.resblock_dilations):
                self.resblocks.append(AMPBlock(channels, block_kernel, dilations))
        last = c.stage_channels(len(c.upsample_rates) - 1)
        self.activation_post = AntiAliasedActivation(last)
        self.conv_post = Conv1d(last, 1, 7, bias=False)

    def forward(self, x: torch.Tensor, ops: SimpleNamespace) -> torch.Tensor:
        """x: (B, latent_dim, N) float32 -> (B, 1, N * hop_length) float32 in [-1, 1]."""
        x = self.conv_pre(x)
        per = self.blocks_per_stage
        for i, (up,) in enumerate(self.ups):
            x = up(x)
            blocks = self.resblocks[i * per : (i + 1) * per]
            total = blocks[0](x, ops)
            for block in blocks[1:]:
                total = total.add_(block(x, ops))
            x = total.div_(per)  # the sum in block order, then one division: the release's mean
        x = self.conv_post(self.activation_post(x, ops))
        return x.clamp_(-1.0, 1.0)


class AudioDecoder(nn.Module):
    """dec_in_proj + BigVGAN: denormalised audio latents in, a mono waveform per batch item out.
    `H3AudioDecoder` (audio/decoder.py) adds the loading, the ops and the latents' normalisation."""

    def __init__(self, config: H3AudioDecoderConfig):
        super().__init__()
        self.config = config
        self.dec_in_proj = Conv1d(config.latent_channels, config.latent_dim, 1)
        self.decoder = BigVGAN(config)

    @property
    def device(self) -> torch.device:
        return self.dec_in_proj.weight.device

    def activations(self) -> list[AntiAliasedActivation]:
        return [module for module in self.modules() if isinstance(module, AntiAliasedActivation)]

    def forward(self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS) -> torch.Tensor:
        """z: (B, latent_channels, N) float32 denormalised latents, one mono channel per batch item ->
        (B, 1, N * hop_length) float32 waveform in [-1, 1] at `config.sample_rate`."""
        return self.decoder(self.dec_in_proj(z), ops)
