"""What the GPU benchmarks share: the random-weight recipe at the released size, and CUDA-event timing.

Random weights (docs/decoder.md section 7): matrices and biases N(0, 0.02), norm weights 1 +- 0.1,
layer scales N(0, 0.1), never zeros (zero layer scales would skip every block). Values do not change the
cost, but zeros can make kernels look faster than they are.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_clocks import ClockSampler  # noqa: E402

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder  # noqa: E402
from minimax_h3_vae.config import RELEASED_LATENTS_MEAN, RELEASED_LATENTS_STD  # noqa: E402

UNIT_SHAPE = (1, 24, 7, 48, 84)  # one temporal unit at 1344x768: 28 tiles
CLIP_SHAPE = (1, 24, 72, 48, 84)  # a 10 s clip at 1344x768: 243 frames, 14 units


@torch.no_grad()
def randomize_(named_parameters, generator: torch.Generator, only: tuple[str, ...] = ("decoder.", "post_quant_conv.")):
    """Fill the decoder's parameters with the recipe above, in place (diffusers' or our names alike)."""
    for name, param in named_parameters:
        if not name.startswith(only):
            continue
        noise = torch.randn(param.shape, generator=generator, device=param.device)
        if name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
            param.copy_(1.0 + 0.1 * noise.clamp(-1, 1))
        elif name.endswith(("scale1", "scale2")):
            param.copy_(0.1 * noise)
        else:
            param.copy_(0.02 * noise)


def random_released_decoder(device: torch.device, seed: int = 0) -> H3VideoDecoder:
    """Our decoder at the released size, random weights, fp16 recipe (block linears cast once)."""
    with device:
        model = H3VideoDecoder(H3DecoderConfig())
    randomize_(model.named_parameters(), torch.Generator(device=device).manual_seed(seed), only=("",))
    return model.to_release_fp16().eval().requires_grad_(False)


def fp32_reference(z: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The eager fp32 decode of `z` by `random_released_decoder(seed)`'s weights before their fp16 cast: the
    reference the fused paths' errors are measured against. The fp32 model is freed before returning."""
    device = z.device
    with device:
        model = H3VideoDecoder(H3DecoderConfig())
    randomize_(model.named_parameters(), torch.Generator(device=device).manual_seed(seed), only=("",))
    reference = model.eval().requires_grad_(False).configure(fused=False).decode(z)
    del model
    torch.cuda.empty_cache()
    return reference


def random_released_vae(seed: int = 0):
    """diffusers' AutoencoderKLMiniMaxH3 at the released size on CUDA, decoder weights random, fp32."""
    from diffusers import AutoencoderKLMiniMaxH3

    with torch.device("cuda"):
        vae = AutoencoderKLMiniMaxH3(latents_mean=RELEASED_LATENTS_MEAN, latents_std=RELEASED_LATENTS_STD)
    randomize_(vae.named_parameters(), torch.Generator(device="cuda").manual_seed(seed))
    return vae.eval().requires_grad_(False)


def ours_from(vae, dtype: str = "fp32") -> H3VideoDecoder:
    """Our decoder holding the diffusers VAE's weights (converted by the package's key table), on its device."""
    from minimax_h3_vae.checkpoints import checkpoint_in_memory
    from minimax_h3_vae.checkpoints.diffusers import diffusers_config

    config = diffusers_config(dict(vae.config))
    checkpoint = checkpoint_in_memory(
        {k: v.detach() for k, v in vae.state_dict().items()}, config, "diffusers", "diffusers VAE"
    )
    return H3VideoDecoder.from_checkpoint(checkpoint, device=vae.device, dtype=dtype, fused=False)


def random_latents(shape, seed: int, device="cuda") -> torch.Tensor:
    """Raw latents as the decoder sees them: `randn * latents_std + latents_mean`."""
    mean = torch.tensor(RELEASED_LATENTS_MEAN, device=device).view(1, 24, 1, 1, 1)
    std = torch.tensor(RELEASED_LATENTS_STD, device=device).view(1, 24, 1, 1, 1)
    return torch.randn(shape, device=device, generator=torch.Generator(device).manual_seed(seed)) * std + mean


def run_info(commit: str, **extra) -> dict:
    """The header of a benchmark run (card, versions, commit), printed once; turns TF32 off, so that float32
    references are true float32."""
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    info = {
        "commit": commit,
        "card": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        **extra,
    }
    print("  ".join(f"{key} {value}" for key, value in info.items()), flush=True)
    return {**info, "results": {}}


@dataclass
class Timing:
    ms: float  # median over the repeats
    peak_bytes: int  # max_memory_allocated above what was allocated before the timed calls
    out: object  # the last call's result
    clocks: dict = field(default_factory=dict)  # SM clock and board power while timing


def timed(fn: Callable[[], object], repeats: int, before_each: Callable[[], None] | None = None) -> Timing:
    """CUDA-event time of `fn()`: one warm-up call, then the median of `repeats` calls."""
    out = fn()
    torch.cuda.synchronize()
    del out
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    with ClockSampler() as clocks:
        for _ in range(repeats):
            if before_each is not None:
                before_each()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return Timing(statistics.median(times), torch.cuda.max_memory_allocated() - base, out, clocks.summary)
