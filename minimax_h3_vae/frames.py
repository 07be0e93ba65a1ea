"""The decoder's output: ImageNet-normalised RGB to RGB in [0, 1] and to uint8 frames."""

from __future__ import annotations

import torch

# ImageNet statistics: the decoder's output space is `(rgb - mean) / std` with rgb in [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def to_unit_rgb(video: torch.Tensor) -> torch.Tensor:
    """Decoder output (B, 3, F, H, W) or (3, F, H, W), ImageNet-normalised -> RGB in [0, 1], same layout,
    float32."""
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=video.device).view(3, 1, 1, 1)
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=video.device).view(3, 1, 1, 1)
    return (video.float() * std + mean).clamp_(0.0, 1.0)


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """Decoder output of one video (3, F, H, W) or (1, 3, F, H, W) -> uint8 frames (F, H, W, 3), rounded."""
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise ValueError(f"to_uint8_frames takes one video, got a batch of {video.shape[0]}")
        video = video[0]
    return to_unit_rgb(video).mul_(255.0).round_().to(torch.uint8).permute(1, 2, 3, 0).contiguous()
