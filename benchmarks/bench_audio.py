"""One GPU run: the audio decode of a 10 s clip, diffusers' AutoencoderKLMiniMaxH3Audio against ours.

    PYTHONPATH=. python benchmarks/bench_audio.py --commit $(git rev-parse --short HEAD) [--repeats 7]
        [--cudnn-benchmark] [--cpu]

Released size (diffusers' defaults, which are the release's: dec_in_proj 32 -> 2048, BigVGAN 2048 -> 1024, 7
upsamplers 5 5 2 2 2 2 2 with kernels 9 9 4 4 4 4 4, AMP kernels 3 7 11 with dilations 1 3 5; 64.9 M decoder
parameters), random weights (`randomize_`: weight-norm gains 0.75-1, SnakeBeta's alpha and beta N(0, 0.25), so
that the waveform spreads over (-1, 1) instead of sitting at the clamp; values do not change the cost). The
latents are a 10 s clip's, as the pipeline hands them over: normalised (2, 32, 405) -> 324,000 samples per
channel. Variants, all float32, timed in one run (CUDA events, one warm-up, median of --repeats):
- diffusers, TF32 off: the pipeline's decode step with `torch.backends.cudnn.allow_tf32 = False`;
- diffusers, cuDNN TF32 (torch's default), for reference: not float32-accurate;
- ours, eager: `H3AudioDecoder(fused=False)` (TF32 off per call, whatever the switch says);
- ours, fused: the anti-aliased activations as the Triton kernel.
Per variant: ms, peak GPU memory above the resident weights, max / mean abs error against a float64 decode of
the same weights (our eager model in double). Also checked: ours eager against diffusers TF32 off (bit for bit
where cuDNN picks the same algorithms), and ours eager gives the same bits with the TF32 switch on. With
--cpu, one second of audio (40 latents) on the CPU, diffusers against ours eager (wall time, median of 3).
Prints a table last; writes JSON to $OUT/bench_audio.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import run_info, timed  # noqa: E402

from minimax_h3_vae import H3AudioDecoder  # noqa: E402
from minimax_h3_vae.audio.config import RELEASED_AUDIO_LATENTS_MEAN, RELEASED_AUDIO_LATENTS_STD  # noqa: E402

CLIP_LATENTS = 405  # 243 frames at 24 fps = 10.125 s = 405 audio latents


@torch.no_grad()
def randomize_(vae, generator: torch.Generator) -> None:
    """The decoder side's parameters, in place: see the module docstring."""
    for name, param in vae.named_parameters():
        if not name.startswith(("decoder.", "dec_in_proj.")):
            continue
        device = param.device
        noise = torch.randn(param.shape, generator=generator, device=device)
        if name.endswith("weight_g"):
            gain = 0.05 if "conv_post" in name else 1.0
            param.copy_(gain * (0.75 + 0.25 * torch.rand(param.shape, generator=generator, device=device)))
        elif name.endswith((".alpha", ".beta")):
            param.copy_(0.5 * noise)
        elif param.ndim > 1:
            param.copy_(noise / param[0].numel() ** 0.5)
        else:
            param.copy_(0.1 * noise)


def released_vae(device: str, seed: int = 0):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    with torch.device(device):
        vae = AutoencoderKLMiniMaxH3Audio(
            latents_mean=list(RELEASED_AUDIO_LATENTS_MEAN), latents_std=list(RELEASED_AUDIO_LATENTS_STD)
        )
    randomize_(vae, torch.Generator(device=device).manual_seed(seed))
    return vae.eval().requires_grad_(False)


def diffusers_decode(vae, z: torch.Tensor) -> torch.Tensor:
    """MiniMaxH3AudioDecodeStep's arithmetic: denormalise with float32 statistics, decode, (2, samples)."""
    mean = torch.tensor(vae.config.latents_mean, device=z.device).view(1, -1, 1)
    std = torch.tensor(vae.config.latents_std, device=z.device).view(1, -1, 1)
    with torch.no_grad():
        return vae.decode(z * std + mean, return_dict=False)[0].squeeze(1)


def float64_reference(ours: H3AudioDecoder, z: torch.Tensor) -> torch.Tensor:
    exact = H3AudioDecoder(ours.config).to(ours.device)
    exact.load_state_dict(ours.state_dict())
    exact.double()
    with torch.inference_mode():
        return exact(ours.denormalize(z).double()).squeeze(1)


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (out.double() - ref).abs()
    return {"max_abs": diff.max().item(), "mean_abs": diff.mean().item()}


def cpu_seconds(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--cpu", action="store_true", help="also time 1 s of audio on the CPU")
    args = parser.parse_args()
    import diffusers

    info = run_info(args.commit, diffusers=diffusers.__version__, cudnn_benchmark=args.cudnn_benchmark)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    vae = released_vae("cuda")
    with tempfile.TemporaryDirectory() as folder:
        vae.save_pretrained(folder)
        eager = H3AudioDecoder.from_pretrained(folder, device="cuda", fused=False)
        fused = H3AudioDecoder.from_pretrained(folder, device="cuda", fused=True)
    params = sum(p.numel() for p in eager.parameters())
    z = torch.randn(2, 32, CLIP_LATENTS, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    reference = float64_reference(eager, z)
    print(f"decoder parameters {params / 1e6:.1f} M; output {tuple(reference.shape)}", flush=True)

    def with_tf32(fn):
        def run():
            torch.backends.cudnn.allow_tf32 = True
            try:
                return fn()
            finally:
                torch.backends.cudnn.allow_tf32 = False

        return run

    variants = {
        "diffusers, TF32 off": lambda: diffusers_decode(vae, z),
        "diffusers, cuDNN TF32": with_tf32(lambda: diffusers_decode(vae, z)),
        "ours, eager": lambda: eager.decode(z),
        "ours, fused": lambda: fused.decode(z),
    }
    results = info["results"]
    outs = {}
    for name, fn in variants.items():
        timing = timed(fn, args.repeats)
        outs[name] = timing.out
        results[name] = {"ms": timing.ms, "peak_gib": timing.peak_bytes / 2**30, **errors(timing.out, reference)}
        results[name].update(timing.clocks)
        print(name, json.dumps(results[name]), flush=True)
    baseline = results["diffusers, TF32 off"]["ms"]
    same_as_diffusers = torch.equal(outs["ours, eager"], outs["diffusers, TF32 off"])
    switch_ignored = torch.equal(with_tf32(lambda: eager.decode(z))(), outs["ours, eager"])
    info["checks"] = {
        "ours eager == diffusers TF32 off (bitwise)": same_as_diffusers,
        "ours eager vs diffusers TF32 off, max abs": (outs["ours, eager"] - outs["diffusers, TF32 off"])
        .abs()
        .max()
        .item(),
        "ours eager, same bits with cudnn.allow_tf32 on": switch_ignored,
        "fused vs eager, max abs": (outs["ours, fused"] - outs["ours, eager"]).abs().max().item(),
        "output std": outs["ours, eager"].std().item(),
        "clamped share": (outs["ours, eager"].abs() >= 1).float().mean().item(),
    }

    if args.cpu:
        cpu_vae = released_vae("cpu")
        with tempfile.TemporaryDirectory() as folder:
            cpu_vae.save_pretrained(folder)
            cpu_ours = H3AudioDecoder.from_pretrained(folder, device="cpu", fused=False)
        second = torch.randn(2, 32, 40, generator=torch.Generator().manual_seed(2))
        info["cpu_seconds_per_second_of_audio"] = {
            "threads": torch.get_num_threads(),
            "diffusers": cpu_seconds(lambda: diffusers_decode(cpu_vae, second)),
            "ours, eager": cpu_seconds(lambda: cpu_ours.decode(second)),
        }

    print()
    print(f"{'variant':<24} {'ms':>8} {'vs diffusers':>13} {'peak GiB':>9} {'max abs err':>12} {'mean abs err':>13}")
    for name, r in results.items():
        ratio = r["ms"] / baseline
        print(
            f"{name:<24} {r['ms']:8.2f} {ratio:12.3f}x {r['peak_gib']:9.3f} {r['max_abs']:12.3e} {r['mean_abs']:13.3e}"
        )
    for name, value in info["checks"].items():
        print(f"{name}: {value}")
    if args.cpu:
        print("CPU, seconds per second of audio:", json.dumps(info["cpu_seconds_per_second_of_audio"]))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "bench_audio.json").write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
