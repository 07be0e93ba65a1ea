"""3-axis rotary table of the ViT decoder, built once per tile shape and shared by every tile of a batch."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class RotaryTable(NamedTuple):
    """cos and sin, each (S, rope_dim) float32, for the S = t*h*w + suffix tokens of one tile shape.

    There is no batch dimension: every tile of a call has the same shape and tile-local positions, so
    one table serves them all (broadcast, batch stride 0).
    """

    cos: torch.Tensor
    sin: torch.Tensor


def token_positions(
    frames: int, height: int, width: int, num_suffix_tokens: int, device=None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(S, 3) positions (t, y, x) in [-1, 1), tile-local, raster order with x fastest, computed in `dtype`.

    Axis index i of an axis of n steps sits at 2 * (i + 0.5) / n - 1. The suffix tokens (registers and
    the zero token) sit at the origin. The release computes them in its decoder input's dtype: float16 under
    its fp16 autocast, where the conv before the ViT runs in float16 (docs/decoder.md section 4).
    """
    axes = [2.0 * (torch.arange(0.5, n, dtype=dtype, device=device) / n) - 1.0 for n in (frames, height, width)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    return torch.cat([grid, grid.new_zeros(num_suffix_tokens, 3)])


def rotary_table(positions: torch.Tensor, rope_dim: int, theta: float) -> RotaryTable:
    """Angles laid out [t k0..k7, h k0..k7, w k0..k7] then repeated once (NeoX pairing d <-> d + rope_dim/2).

    positions: (S, 3) float32 or float16 (`token_positions`). Returns cos and sin, (S, rope_dim) float32, on its
    device, rounded to the positions' dtype (as the release returns them) and held in float32.
    `inv_freq[k] = 1 / theta ** e_k` with n = rope_dim / 6 frequencies per axis and e_k = k / n, angle =
    2 pi pos inv_freq, the first product in the positions' dtype and the second in float32 (the release's
    order and promotion). The exponents and inv_freq are computed as the release computes them, on the CPU with
    a float step of 6 / rope_dim (its e_k differs from float32 k / n in the last bit at some widths, e.g. 120
    and 144; not at the released 48), and then moved to the positions' device.
    """
    freqs_per_axis = rope_dim // 6
    # [:n]: at a few widths (294, 588, ...) the float step gives one exponent too many, which the release
    # cannot run at all; the first n are still its e_k.
    exponents = torch.arange(0, 1, 6 / rope_dim, dtype=torch.float32)[:freqs_per_axis]
    inv_freq = (1 / theta**exponents).to(positions.device)
    angles = 2.0 * math.pi * positions[:, :, None] * inv_freq
    angles = angles.flatten(1).repeat(1, 2)
    return RotaryTable(*(t.to(positions.dtype).float() for t in (angles.cos(), angles.sin())))
