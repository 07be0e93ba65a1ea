"""BigVGAN's anti-aliased activation (2x upsample, SnakeBeta, low-pass 2x downsample) in one Triton launch.

The eager op (audio/model.py) makes ~10 passes over a tensor twice the input's size (pad, transposed conv, scale,
crop, four pointwise ops, pad, strided conv); here each output sample is computed from the 12 input samples
around it in registers, so the activation reads its input once and writes its output once.

Per output n the downsampler sums 12 taps of the activated upsampled signal a, at upsampled indices 2n - 5 ..
2n + 6, replicate-padded (clamped to [0, 2L)). Split by parity, that is six even indices 2p and six odd ones
2p + 1, for p within 3 of n. A program computes the activation at both indices of each p of its tile once, one
p per lane, and reads the 12 taps of each output from neighbouring lanes (`tl.gather`). Each upsampled sample is
a 6-tap sum of the input: u[2p] = 2 sum_i f[2i + 1] x[p + 2 - i], u[2p + 1] = 2 sum_i f[2i] x[p + 3 - i], the
input index clamped to [0, L) (the upsampler's replicate padding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from ..audio.model import FILTER_TAPS, anti_aliased_snake_beta_reference
from ._common import count_launch, device_problem, grad_problem, zeros
from ._triton_utils import NO_FMA, built_for_interpreter

__all__ = ["anti_aliased_snake_beta", "anti_aliased_snake_beta_reference", "model_call", "unsupported"]

# Lanes per program; the last HALO lanes only feed their neighbours' taps (outputs reach 6 lanes ahead).
_BLOCK = 1024
_HALO = 8
_MAX_PROGRAMS = 2**31 - 1
_MAX_LENGTH = 2**30 - 16


@triton.jit
def _upsampled(x_row, m, length, up_ptr):
    """u[m] for int32 indices m in [0, 2 length): the six taps of the up-filter that land on m (the odd taps
    on even m, the even taps on odd m), times the upsampling ratio 2."""
    odd = m % 2
    base = m // 2 + 2 + odd
    acc = tl.where(odd == 0, tl.load(up_ptr + 1), tl.load(up_ptr)) * tl.load(
        x_row + tl.minimum(tl.maximum(base, 0), length - 1)
    )
    for i in tl.static_range(1, 6):
        tap = tl.where(odd == 0, tl.load(up_ptr + 2 * i + 1), tl.load(up_ptr + 2 * i))
        acc += tap * tl.load(x_row + tl.minimum(tl.maximum(base - i, 0), length - 1))
    return 2.0 * acc


@triton.jit
def _snake_beta(u, freq, inv_mag, LIBDEVICE_SIN: tl.constexpr):
    """`u + inv_mag * sin(freq * u)^2`, rounded op by op as eager does."""
    t = freq * u
    if LIBDEVICE_SIN:
        s = libdevice.sin(t)
    else:
        s = tl.sin(t)
    return u + inv_mag * (s * s)


@triton.jit
def _anti_aliased_snake_beta_kernel(
    x_ptr,
    freq_ptr,
    inv_mag_ptr,
    up_ptr,
    down_ptr,
    out_ptr,
    channels,
    length,
    tiles,
    BLOCK: tl.constexpr,
    HALO: tl.constexpr,
    LIBDEVICE_SIN: tl.constexpr,
):
    """x, out: (rows, length) float32 contiguous; row r is channel r % channels. freq, inv_mag: (channels,)
    float32. up, down: (12,) float32. Grid: (rows * tiles,); a program writes BLOCK - HALO outputs of one row.

    sin is CUDA's accurate sinf (libdevice's, within 2 ulp), not the faster approximation; the interpreter has
    no libdevice and uses `tl.sin` (numpy's)."""
    pid = tl.program_id(0)
    row = pid // tiles
    start = (pid % tiles) * (BLOCK - HALO)
    x_row = x_ptr + row.to(tl.int64) * length
    freq = tl.load(freq_ptr + row % channels)
    inv_mag = tl.load(inv_mag_ptr + row % channels)
    lanes = tl.arange(0, BLOCK)
    # Lane q: p = start - 3 + q. The upsampled indices are clamped to [0, 2 length): off the left end both read
    # a[0] (even), off the right end both read a[2 length - 1] (odd), as the downsampler's replicate pad does.
    p = start - 3 + lanes
    last = 2 * length - 1
    even = _snake_beta(
        _upsampled(x_row, tl.minimum(tl.maximum(2 * p, 0), last), length, up_ptr), freq, inv_mag, LIBDEVICE_SIN
    )
    odd = _snake_beta(
        _upsampled(x_row, tl.minimum(tl.maximum(2 * p + 1, 0), last), length, up_ptr), freq, inv_mag, LIBDEVICE_SIN
    )
    # Output lane t (n = start + t), tap k reads upsampled index 2n + k - 5: for even k the odd sample of lane
    # t + k / 2, for odd k the even sample of lane t + (k + 1) / 2. Taps summed in order k = 0 .. 11.
    acc = tl.load(down_ptr) * odd
    for k in tl.static_range(1, 12):
        if k % 2 == 0:
            tap = tl.gather(odd, tl.minimum(lanes + k // 2, BLOCK - 1), 0)
        else:
            tap = tl.gather(even, tl.minimum(lanes + (k + 1) // 2, BLOCK - 1), 0)
        acc += tl.load(down_ptr + k) * tap
    n = start + lanes
    tl.store(out_ptr + row.to(tl.int64) * length + n, acc, mask=(lanes < BLOCK - HALO) & (n < length))  # fmt: skip


def model_call(config, device: torch.device, dtype: torch.dtype) -> tuple:
    """The op's arguments as the decoder passes them (zeros): float32 activations of any model (`config` and
    `dtype` change nothing), for `unsupported`."""
    channels = 2
    return (
        zeros(device, 1, channels, 16),
        zeros(device, 1, channels, 1),
        zeros(device, 1, channels, 1),
        zeros(device, 1, 1, FILTER_TAPS),
        zeros(device, 1, 1, FILTER_TAPS),
    )


def _per_channel_problem(name: str, t, channels: int) -> str | None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return f"{name} must be a float32 tensor"
    if t.numel() != channels or not t.is_contiguous():
        return f"{name} must be contiguous with one value per channel ({channels}), got shape {tuple(t.shape)}"
    return None


def unsupported(x, freq, inv_mag, up_filter, down_filter) -> str | None:
    """Why `anti_aliased_snake_beta(x, freq, inv_mag, up_filter, down_filter)` is outside the kernel's contract,
    or None."""
    if not hasattr(tl, "gather"):
        return "needs Triton 3.2 or newer (tl.gather)"
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.dtype != torch.float32:
        return "x must be a (B, C, L) float32 tensor"
    if not x.is_contiguous():
        return "x must be contiguous"
    channels = x.shape[1]
    problem = _per_channel_problem("freq", freq, channels) or _per_channel_problem("inv_mag", inv_mag, channels)
    if problem:
        return problem
    for name, f in (("up_filter", up_filter), ("down_filter", down_filter)):
        if not isinstance(f, torch.Tensor) or f.dtype != torch.float32:
            return f"{name} must be a float32 tensor"
        if f.numel() != FILTER_TAPS or not f.is_contiguous():
            return f"{name} must be contiguous with {FILTER_TAPS} taps, got shape {tuple(f.shape)}"
    rows, length = x.shape[0] * channels, x.shape[2]
    if length > _MAX_LENGTH:
        return f"rows longer than {_MAX_LENGTH} samples are not supported (the upsampled index is int32), got {length}"
    if rows * triton.cdiv(length, _BLOCK - _HALO) > _MAX_PROGRAMS:
        return "too many samples for one launch"
    tensors = (x, freq, inv_mag, up_filter, down_filter)
    return device_problem(tensors, built_for_interpreter(_anti_aliased_snake_beta_kernel)) or grad_problem(tensors)


def anti_aliased_snake_beta(
    x: Tensor, freq: Tensor, inv_mag: Tensor, up_filter: Tensor, down_filter: Tensor, *, launches=None
) -> Tensor:
    """`audio.model.anti_aliased_snake_beta` in one launch.

    x: (B, C, L) float32, contiguous. freq, inv_mag: float32, contiguous, C values ((1, C, 1) as the decoder
    holds them). up_filter, down_filter: float32, contiguous, 12 taps. Returns a new contiguous (B, C, L) float32
    tensor. Raises ValueError outside this contract.
    """
    problem = unsupported(x, freq, inv_mag, up_filter, down_filter)
    if problem:
        raise ValueError(f"anti_aliased_snake_beta: {problem}")
    out = torch.empty_like(x)
    rows, length = x.shape[0] * x.shape[1], x.shape[2]
    if out.numel() == 0:
        return out
    # One block size for every row length, so one compiled kernel serves every stage and clip length (short
    # rows, 5 samples per latent in the first stage of a one-latent decode, leave lanes idle: a tiny cost).
    tiles = triton.cdiv(length, _BLOCK - _HALO)
    _anti_aliased_snake_beta_kernel[(rows * tiles,)](
        x,
        freq,
        inv_mag,
        up_filter,
        down_filter,
        out,
        x.shape[1],
        length,
        tiles,
        BLOCK=_BLOCK,
        HALO=_HALO,
        LIBDEVICE_SIN=not built_for_interpreter(_anti_aliased_snake_beta_kernel),
        num_warps=4,
        **NO_FMA,
    )
    count_launch(launches, "anti_aliased_snake_beta")
    return out
