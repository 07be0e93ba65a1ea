"""The command's mp4 writer on natural-looking frames and on noise: x264's cost depends on the content, and
random weights decode to noise, its worst case.

    PYTHONPATH=. python benchmarks/bench_encoder.py [--frames 243] [--chunk 22] [--runs 2] [--work /tmp/enc]

Frames of the 10 s clip's size (1344x768, 24 fps), made on the CPU before any timing, go through the command's
own writer (`command.output.open_sink`, mp4 with AAC, the default crf and preset) as the decode hands them over:
chunk by chunk, `convert` then `write`, then `commit` (ffmpeg's tail, the read-back, the rename). Natural-looking:
a smooth scene panned across the frame (gradients, soft shapes, a textured band, light grain); noise: uniform
random pixels. The sound is a 10.125 s sine pair. Prints per content the seconds of writing and of the tail and
the file's size; JSON to $OUT/encoder.json when OUT is set. The encoder runs on the CPU, so the numbers belong
to the machine's cores: say which.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from minimax_h3_vae.command.formats import Soundtrack, VideoFormat
from minimax_h3_vae.command.output import open_sink
from minimax_h3_vae.frames import IMAGENET_MEAN, IMAGENET_STD

HEIGHT, WIDTH, FPS = 768, 1344, 24
SAMPLE_RATE, SOUND_SECONDS = 32000, 10.125


def scene(frames: int) -> torch.Tensor:
    """Natural-looking RGB in [0, 1], (3, frames, H, W): a scene twice the frame's width panned across it."""
    generator = torch.Generator().manual_seed(0)
    y = torch.linspace(0, 1, HEIGHT)[:, None]
    x = torch.linspace(0, 2, 2 * WIDTH)[None, :]
    sky = torch.stack([0.35 + 0.3 * y, 0.55 + 0.2 * y, 0.85 - 0.2 * y]).expand(3, HEIGHT, 2 * WIDTH).clone()
    for _ in range(12):  # soft shapes
        cy, cx, r = torch.rand(3, generator=generator) * torch.tensor([1.0, 2.0, 0.25]) + torch.tensor([0, 0, 0.05])
        colour = torch.rand(3, 1, 1, generator=generator)
        weight = torch.sigmoid((r - ((y - cy) ** 2 + ((x - cx) * WIDTH / HEIGHT) ** 2).sqrt()) * 60)
        sky = sky * (1 - weight) + colour * weight
    band = (y > 0.7).float() * (0.5 + 0.5 * torch.sin(40 * x + 25 * y) * torch.sin(7 * x))  # a textured ground
    sky = sky * (1 - 0.6 * band) + 0.6 * band * torch.tensor([0.3, 0.45, 0.2])[:, None, None]
    video = torch.empty(3, frames, HEIGHT, WIDTH)
    for f in range(frames):
        shift = round(f * WIDTH / max(frames - 1, 1))
        grain = 0.015 * torch.randn(3, HEIGHT, WIDTH, generator=generator)
        video[:, f] = (sky[:, :, shift : shift + WIDTH] + grain).clamp(0, 1)
    return video


def noise(frames: int) -> torch.Tensor:
    return torch.rand(3, frames, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(1))


def decoder_output(rgb: torch.Tensor) -> torch.Tensor:
    """RGB in [0, 1] -> what the decoder hands the writer: ImageNet-normalised, (1, 3, F, H, W)."""
    mean, std = (torch.tensor(v).view(3, 1, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    return ((rgb - mean) / std)[None]


def sound() -> Soundtrack:
    t = torch.arange(round(SAMPLE_RATE * SOUND_SECONDS)) / SAMPLE_RATE
    tones = torch.stack([torch.sin(2 * math.pi * 220 * t), torch.sin(2 * math.pi * 330 * t)])
    return Soundtrack(0.3 * tones, SAMPLE_RATE)


def encode(video: torch.Tensor, chunk: int, out: Path, soundtrack: Soundtrack) -> dict:
    """One mp4 through the command's writer: seconds writing the chunks, seconds of the tail, bytes."""
    frames = video.shape[2]
    sink = open_sink(out, VideoFormat(frames, HEIGHT, WIDTH, FPS), soundtrack)
    start = time.perf_counter()
    try:
        for first in range(0, frames, chunk):
            sink.write(sink.convert(video[:, :, first : first + chunk]))
        written = time.perf_counter()
        sink.commit()
    except BaseException:
        sink.discard()
        raise
    done = time.perf_counter()
    return {"write_s": written - start, "tail_s": done - written, "total_s": done - start, "bytes": out.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=243)
    parser.add_argument("--chunk", type=int, default=22, help="frames per decode chunk (22: one temporal unit)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/enc"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    soundtrack = sound()
    contents = {"natural": decoder_output(scene(args.frames)), "noise": decoder_output(noise(args.frames))}
    results = {"cpus": os.cpu_count(), "frames": args.frames, "size": f"{WIDTH}x{HEIGHT}", "runs": {}}
    for run in range(args.runs):  # contents interleaved
        for name, video in contents.items():
            row = encode(video, args.chunk, args.work / f"{name}.mp4", soundtrack)
            results["runs"].setdefault(name, []).append(row)
            print(f"{name} run {run + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "bytes"))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "encoder.json").write_text(json.dumps(results, indent=2))
    print(f"\n{os.cpu_count()} CPUs, {args.frames} frames of {WIDTH}x{HEIGHT}, chunks of {args.chunk}, medians:")
    print(f"{'content':8} {'write s':>8} {'tail s':>7} {'total s':>8} {'frames/s':>9} {'MB':>7}")
    for name, rows in results["runs"].items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        fps = args.frames / med["total_s"]
        cells = f"{med['write_s']:8.2f} {med['tail_s']:7.2f} {med['total_s']:8.2f} {fps:9.1f} {med['bytes'] / 1e6:7.1f}"
        print(f"{name:8} {cells}")


if __name__ == "__main__":
    main()
