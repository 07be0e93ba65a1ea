"""R'G'B' to the Y'CbCr an H.264 player expects from HD video: BT.709, limited range, 4:2:0, left siting.

Players read an untagged HD stream as BT.709 and a tagged one by its tags, so the mp4 is converted here with
BT.709's matrix and tagged bt709 / tv (encoder.py); `to_yuv420p_frames` takes the decoder's output. Doing it
in torch, where the frames are (on the GPU for a CUDA decode), halves the bytes that cross to the host and
to ffmpeg, and takes the conversion off ffmpeg's single-threaded scaler.

The formula (ITU-R BT.709: Kr = 0.2126, Kb = 0.0722, Kg = 1 - Kr - Kb; 8-bit limited range: Y' 16-235 and
Cb, Cr 16-240 for R'G'B' in [0, 1]):

    E  = Kr R' + Kg G' + Kb B'
    Y' = 16  + 219 E
    Cb = 128 + 224 (B' - E) / (2 (1 - Kb))
    Cr = 128 + 224 (R' - E) / (2 (1 - Kr))

Chroma siting: "left", the MPEG-2 / H.264 default for 4:2:0 (x264's --chromaloc 0, FFmpeg's
AVCHROMA_LOC_LEFT, which its pixfmt.h calls "H.264 default for 4:2:0"; a stream that signals no chroma
location is decoded this way). Chroma sample (i, j) sits on luma column 2j, midway between luma rows 2i and
2i + 1. Each chroma plane is therefore the full-resolution plane filtered with weights 1/2, 1/2 on rows 2i,
2i + 1 and 1/4, 1/2, 1/4 on columns 2j - 1, 2j, 2j + 1 (column -1 repeats column 0), a symmetric filter
centred on the sample's own position.
"""

from __future__ import annotations

import torch

from ..frames import one_video, to_unit_rgb

KR, KB = 0.2126, 0.0722
KG = 1.0 - KR - KB
# Rows of the matrix from R'G'B' in [0, 1] to 8-bit Y', Cb, Cr (before the offsets 16, 128, 128).
LUMA = (219 * KR, 219 * KG, 219 * KB)
CB = (-224 * KR / (2 * (1 - KB)), -224 * KG / (2 * (1 - KB)), 224 / 2)
CR = (224 / 2, -224 * KG / (2 * (1 - KR)), -224 * KB / (2 * (1 - KR)))


def yuv420p_bytes(height: int, width: int) -> int:
    """Bytes of one yuv420p frame: a full-size Y' plane and two quarter-size chroma planes."""
    return height * width * 3 // 2


def _weighted(rgb: torch.Tensor, weights: tuple[float, float, float], offset: float) -> torch.Tensor:
    """offset + w0 R + w1 G + w2 B, float32, rounded to the nearest integer (halves to even)."""
    out = torch.mul(rgb[0], weights[0])
    out.add_(rgb[1], alpha=weights[1]).add_(rgb[2], alpha=weights[2])
    return out.add_(offset).round_()


def rgb_to_yuv420p(rgb: torch.Tensor) -> torch.Tensor:
    """R'G'B' frames -> BT.709 limited-range Y'CbCr 4:2:0 planes, in ffmpeg's yuv420p rawvideo layout.

    rgb: floating-point (3, F, H, W), R'G'B' in [0, 1] (the decoder's gamma-encoded output, `to_unit_rgb`),
    on any device. H and W must be even (the decoder's are multiples of its patch size, 16), else ValueError.
    Returns uint8 (F, H * W * 3 // 2) on rgb's device: each row one frame, its Y' plane (H, W), then Cb
    (H / 2, W / 2), then Cr (H / 2, W / 2), each row-major.

    The module docstring gives the formula and the siting. It is evaluated in float32 and each value is
    rounded once, to the nearest integer with halves to even (torch.round); the results lie in 16-235 (Y')
    and 16-240 (Cb, Cr). The chroma filter is applied to R'G'B' before the matrix (the same linear map, on a
    quarter of the pixels).

    Input outside [0, 1] is clamped to it per component first (so 1.5 is 1.0 and -inf is 0.0), and NaN is
    taken as 0.0 (black in that component), so no value wraps around the uint8 range; input in [0, 1] is
    converted exactly as without the clamp. This costs one float32 copy of rgb; the decoder's own path
    (`to_yuv420p_frames`) has clamped already and skips it.
    """
    if not isinstance(rgb, torch.Tensor) or rgb.ndim != 4 or rgb.shape[0] != 3 or not rgb.is_floating_point():
        shape = tuple(rgb.shape) if isinstance(rgb, torch.Tensor) else type(rgb).__name__
        raise ValueError(f"rgb_to_yuv420p takes floating-point R'G'B' (3, F, H, W), got {shape}")
    _check_even(rgb)
    return _in_range_to_yuv420p(torch.nan_to_num(rgb.float(), nan=0.0).clamp_(0.0, 1.0))


def _check_even(rgb: torch.Tensor) -> None:
    if rgb.shape[2] % 2 or rgb.shape[3] % 2:
        raise ValueError(f"4:2:0 needs an even frame height and width, got {rgb.shape[3]}x{rgb.shape[2]}")


def _in_range_to_yuv420p(rgb: torch.Tensor) -> torch.Tensor:
    """`rgb_to_yuv420p` for float32 rgb already in [0, 1] (values outside wrap around uint8)."""
    frames, height, width = rgb.shape[1:]
    pixels = height * width
    out = torch.empty(frames, yuv420p_bytes(height, width), dtype=torch.uint8, device=rgb.device)
    luma, cb, cr = out.split([pixels, pixels // 4, pixels // 4], dim=1)
    luma.view(frames, height, width).copy_(_weighted(rgb, LUMA, 16.0))

    rows = rgb[:, :, 0::2].add(rgb[:, :, 1::2])  # rows 2i + 2i+1: (3, F, H/2, W)
    even, odd = rows[..., 0::2], rows[..., 1::2]  # columns 2j and 2j+1
    sub = torch.add(odd, even, alpha=2.0)  # 2 x column 2j + column 2j+1 ...
    sub[..., 1:] += odd[..., :-1]  # ... + column 2j-1,
    sub[..., :1] += even[..., :1]  # which for j = 0 is column 0 again
    sub.mul_(0.125)  # 1/2 per row times 1/4, 1/2, 1/4 per column
    cb.view(frames, height // 2, width // 2).copy_(_weighted(sub, CB, 128.0))
    cr.view(frames, height // 2, width // 2).copy_(_weighted(sub, CR, 128.0))
    return out


def to_yuv420p_frames(video: torch.Tensor) -> torch.Tensor:
    """Decoder output of one video (3, F, H, W) or (1, 3, F, H, W), H and W even -> uint8 (F, H * W * 3 // 2) on
    the same device: per frame BT.709 limited-range Y'CbCr 4:2:0 planes, Y' then Cb then Cr, converted from
    the float RGB in [0, 1] with one rounding (`rgb_to_yuv420p`)."""
    rgb = to_unit_rgb(one_video(video, "to_yuv420p_frames"))  # float32, clamped to [0, 1]; NaN stays NaN
    _check_even(rgb)
    return _in_range_to_yuv420p(rgb)
