"""The decoder's output: ImageNet-normalised RGB to RGB in [0, 1] and to uint8 RGB frames (the command's mp4
planes: command/colour.py)."""

from __future__ import annotations

import functools

import torch

# ImageNet statistics: the decoder's output space is `(rgb - mean) / std` with rgb in [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# What every door says of decoded frames that hold NaN or Inf (the command exits 1, the ComfyUI nodes raise).
NON_FINITE_FRAMES = "the decoded frames hold NaN or Inf (latents or weights out of range)"


def _check_video(video: torch.Tensor, name: str) -> None:
    """ValueError unless `video` is floating-point (B, 3, F, H, W) or (3, F, H, W): channels on dim -4."""
    if not isinstance(video, torch.Tensor) or video.ndim not in (4, 5) or video.shape[-4] != 3:
        shape = tuple(video.shape) if isinstance(video, torch.Tensor) else type(video).__name__
        raise ValueError(f"{name} takes decoder output (B, 3, F, H, W) or (3, F, H, W), got {shape}")
    if not video.is_floating_point() or video.dtype.itemsize == 1:
        raise ValueError(f"{name} takes floating-point decoder output, got {video.dtype}")


@functools.cache
def _imagenet(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(std, mean) as float32 (3, 1, 1, 1) on `device`, made once: building them from Python lists is a
    host-to-device copy that waits for all the work queued on the GPU, which would stall a stream of chunks.
    Ordinary tensors even when first asked for under inference mode, so that autograd may save them."""
    with torch.inference_mode(False):
        std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=device).view(3, 1, 1, 1)
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=device).view(3, 1, 1, 1)
    return std, mean


def to_unit_rgb(video: torch.Tensor) -> torch.Tensor:
    """Decoder output (B, 3, F, H, W) or (3, F, H, W), ImageNet-normalised -> RGB in [0, 1], same layout,
    float32. Other layouts are a ValueError."""
    _check_video(video, "to_unit_rgb")
    std, mean = _imagenet(video.device)
    return (video.float() * std + mean).clamp_(0.0, 1.0)


def one_video(video: torch.Tensor, name: str) -> torch.Tensor:
    """Decoder output of one video, (3, F, H, W) or (1, 3, F, H, W) -> (3, F, H, W); ValueError otherwise."""
    _check_video(video, name)
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise ValueError(f"{name} takes one video, got a batch of {video.shape[0]}")
        video = video[0]
    return video


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """Decoder output of one video (3, F, H, W) or (1, 3, F, H, W) -> uint8 frames (F, H, W, 3), rounded."""
    video = one_video(video, "to_uint8_frames")
    return to_unit_rgb(video).mul_(255.0).round_().to(torch.uint8).permute(1, 2, 3, 0).contiguous()
