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
from collections.abc import Callable
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

# progress(done, total): called as a decode's AMP blocks finish.
Progress = Callable[[int, int], None]


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


def anti_aliased_snake_beta_reference(
    x: torch.Tensor,
    freq: torch.Tensor,
    inv_mag: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
) -> torch.Tensor:
    """BigVGAN's anti-aliased activation as released, over whole tensors: 2x upsample, SnakeBeta, low-pass 2x
    downsample. The reference of record, and the eager op off the CPU.

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


def anti_aliased_snake_beta(
    x: torch.Tensor,
    freq: torch.Tensor,
    inv_mag: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
) -> torch.Tensor:
    """The eager anti-aliased activation: `anti_aliased_snake_beta_reference`'s values bit for bit, computed in
    pieces along time on the CPU (`anti_aliased_snake_beta_in_pieces`) for float32 and at least 2 channels, as
    whole tensors elsewhere. Tensor contract: the reference's.

    Whole tensors for one channel: its convs are not depthwise (groups 1), and oneDNN's kernels for those
    (brgemm-based) block the sums by length and thread count. And wherever autograd records: the pieces write
    into buffers."""
    records = torch.is_grad_enabled() and any(t.requires_grad for t in (x, freq, inv_mag, up_filter, down_filter))
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.shape[1] > 1 and not records:
        return anti_aliased_snake_beta_in_pieces(x, freq, inv_mag, up_filter, down_filter)
    return anti_aliased_snake_beta_reference(x, freq, inv_mag, up_filter, down_filter)


# Input values (B x C x samples) per piece of `anti_aliased_snake_beta_in_pieces`: 4 MiB of float32, buffers the
# allocator reuses (no page faults). Smaller pieces (2^18, the L2 cache) measured about the same on idle cores, but
# each op is a parallel region, and with 4x as many of them a decode on busy cores under libgomp's default
# spin-wait took 47 s instead of 8 (released size, 2 threads, benchmarks/LOG.md 2026-12-03 CPU sound).
PIECE_VALUES = 1 << 20


def anti_aliased_snake_beta_in_pieces(
    x: torch.Tensor,
    freq: torch.Tensor,
    inv_mag: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
    piece_values: int = PIECE_VALUES,
) -> torch.Tensor:
    """`anti_aliased_snake_beta_reference` computed piece by piece along time: the same ops on the same values,
    in the same order, so the same float32 results, with every intermediate a few MiB instead of 2 x |x|.

    Tensor contract: the reference's (x (B, C, L) float32; freq, inv_mag (1, C, 1); filters (1, 1, 12)); the
    result is a new contiguous (B, C, L) tensor. piece_values: about B x C x samples of x per piece.

    Why: over whole tensors each of the 127 activations of a decode makes ~10 passes over fresh buffers of up to
    2 x |x| (40 MB at the released size), and on the CPU the time goes to the kernel handing out and zeroing
    those pages (120,000 page faults per activation at stage 1 of a 10 s clip) and to cache misses, more than
    to the arithmetic. A piece's buffers are small enough for the allocator to reuse and for the cache to hold.

    Why the values are the reference's: each output sample of a conv (transposed or not) is a sum over the
    filter taps in an order fixed by the kernel, whatever the output's position or the tensor's length, and the
    pointwise ops are elementwise; a piece is given every input its outputs read (the halo), and the replicate
    padding only where the reference pads, at the ends of x. The convs are the reference's calls (`conv1d` on
    (B, C, time) tensors: the same oneDNN kernels on the CPU), the x2 gain and SnakeBeta are the same ops in the
    same order (in place into the padded buffer: `h + t` and `t + h` are the same IEEE sum), so only the order
    in which output samples are computed differs. tests/test_audio_pieces.py compares it with the reference.
    """
    batch, channels, length = x.shape
    up = up_filter.expand(channels, -1, -1)
    down = down_filter.expand(channels, -1, -1)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    step = max(1, piece_values // max(1, batch * channels))
    for start in range(0, length, step):
        end = min(length, start + step)
        # Output samples [start, end) read the padded upsampled signal at [2 start, 2 end + 10) (12 taps, stride
        # 2), that is SnakeBeta's u at [2 start - 5, 2 end + 5): computed over [first, last] inside [0, 2L), the
        # rest being the reference's replicate padding at the ends.
        first, last = max(2 * start - PAD, 0), min(2 * end + PAD - 1, 2 * length - 1)
        # u[j] is the transposed conv's full output at j + CROP, a sum over x padded by PAD at [(j + CROP - 11) / 2,
        # (j + CROP) / 2]: padded inputs [lo, hi] cover every sample of [first, last].
        lo, hi = (first + CROP - FILTER_TAPS + 2) // 2, (last + CROP) // 2
        upsampled = _transposed_piece(x, up, lo, hi)[..., first + CROP - 2 * lo : last + CROP + 1 - 2 * lo]
        upsampled.mul_(RESAMPLE_RATIO)
        left, right = first - (2 * start - PAD), (2 * end + PAD - 1) - last
        padded = x.new_empty(batch, channels, left + (last - first + 1) + right)
        snake = padded[..., left : padded.shape[-1] - right]
        # The reference's `h + inv_mag * sin(freq * h).pow(2)`, op by op, into the padded buffer.
        torch.mul(upsampled, freq, out=snake).sin_().pow_(2).mul_(inv_mag).add_(upsampled)
        _replicate(padded, left, right)
        out[..., start:end] = conv1d(padded, down, None, stride=RESAMPLE_RATIO, groups=channels)
    return out


def _transposed_piece(x: torch.Tensor, up: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The upsampler's transposed conv (without the x2 gain) over samples [lo, hi] of x replicate-padded by PAD:
    (B, C, L) -> (B, C, 2 (hi - lo) + FILTER_TAPS), the full output, output q being the reference's 2 lo + q."""
    length = x.shape[-1]
    begin, stop = max(lo - PAD, 0), min(hi - PAD, length - 1)  # the samples of x itself
    left, right = begin - (lo - PAD), (hi - PAD) - stop
    padded = x.new_empty(*x.shape[:-1], left + (stop - begin + 1) + right)
    padded[..., left : padded.shape[-1] - right] = x[..., begin : stop + 1]
    _replicate(padded, left, right)
    return conv1d(padded, up, None, stride=RESAMPLE_RATIO, groups=x.shape[1], transposed=True)


def _replicate(padded: torch.Tensor, left: int, right: int) -> None:
    """Fill the first `left` and last `right` samples of (B, C, n) `padded` with the samples next to them."""
    end = padded.shape[-1] - right
    if left:
        padded[..., :left] = padded[..., left : left + 1]
    if right:
        padded[..., end:] = padded[..., end - 1 : end]


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

    def forward(self, x: torch.Tensor, ops: SimpleNamespace, progress: Progress | None = None) -> torch.Tensor:
        """x: (B, latent_dim, N) float32 -> (B, 1, N * hop_length) float32 in [-1, 1]. progress(done, total) is
        called with total = the AMP blocks (21 in the release) before the first, and after each."""
        total_blocks = len(self.resblocks)
        if progress is not None:
            progress(0, total_blocks)
        x = self.conv_pre(x)
        per = self.blocks_per_stage
        for i, (up,) in enumerate(self.ups):
            x = up(x)
            total = None
            for j, block in enumerate(self.resblocks[i * per : (i + 1) * per]):
                out = block(x, ops)
                total = out if total is None else total.add_(out)
                if progress is not None:
                    progress(i * per + j + 1, total_blocks)
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

    def forward(
        self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS, progress: Progress | None = None
    ) -> torch.Tensor:
        """z: (B, latent_channels, N) float32 denormalised latents, one mono channel per batch item ->
        (B, 1, N * hop_length) float32 waveform in [-1, 1] at `config.sample_rate`. progress: as `BigVGAN`'s."""
        return self.decoder(self.dec_in_proj(z), ops, progress)
