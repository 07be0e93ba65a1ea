"""Hashes and times of released-size GPU decodes, to show that a change leaves the output bit for bit alone.

    PYTHONPATH=OLD_TREE python benchmarks/decode_hashes.py --tag before --dir /tmp/h
    PYTHONPATH=.        python benchmarks/decode_hashes.py --tag after  --dir /tmp/h
    python benchmarks/decode_hashes.py --compare before after --dir /tmp/h

Each run builds the released architecture with the same seeded random weights (common.randomize_) through
the package's public modules only (so it runs against older versions of the package too), decodes one
1344x768 unit in fp32 eager (TF32 off), fp16 eager and fp16 fused, and a two-chunk 1344x768 clip through
`decode_stream` (fp16 eager), prints a SHA-256 of each output and the fused unit's median CUDA-event time,
and saves the outputs. `--device cpu` does the same at a toy size (2 blocks, width 128, a 352x224 unit: 6
tiles), the fused kernels under TRITON_INTERPRET=1 (set it before Python starts).
--compare prints, per variant, whether the two runs are bitwise equal and their max abs difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

UNIT_SHAPE = (1, 24, 7, 48, 84)
TWO_CHUNKS = (1, 24, 12, 48, 84)
CPU_SHAPES = ((1, 24, 7, 14, 22), (1, 24, 12, 14, 22))


def released_model(device: torch.device):
    from common import randomize_

    from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder

    config = H3DecoderConfig() if device.type == "cuda" else H3DecoderConfig(num_layers=2, num_heads=2)
    with device:
        model = H3VideoDecoder(config)
    randomize_(model.named_parameters(), torch.Generator(device=device).manual_seed(0), only=("",))
    return model.eval().requires_grad_(False)


def set_fused(model, fused: bool) -> None:
    if hasattr(model, "configure"):  # 0.3: a frozen runtime, changed through configure
        model.configure(fused=fused)
    elif hasattr(model, "runtime"):  # 0.2: run settings in model.runtime
        model.runtime.fused = fused
    else:  # 0.1: in the config
        model.config = model.config.replace(fused=fused)


def run(tag: str, folder: Path, device: torch.device) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    unit, two = (UNIT_SHAPE, TWO_CHUNKS) if device.type == "cuda" else CPU_SHAPES
    z = torch.randn(unit, device=device, generator=torch.Generator(device).manual_seed(1))
    clip = torch.randn(two, device=device, generator=torch.Generator(device).manual_seed(2))
    model = released_model(device)
    set_fused(model, False)  # 0.3's directly built decoder picks fused on CUDA by itself, as every door does
    outputs = {"fp32 eager": model.decode(z)}
    model.to_release_fp16()
    outputs["fp16 eager"] = model.decode(z)
    outputs["fp16 eager stream 2 chunks"] = torch.cat(list(model.decode_stream(clip)), dim=2)
    set_fused(model, True)
    outputs["fp16 fused"] = model.decode(z)
    report = {name: hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()[:16] for name, out in outputs.items()}
    if device.type == "cuda":
        from gpu_clocks import ClockSampler

        times = []
        with ClockSampler() as clocks:
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model.decode(z)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        report["fused ms per unit (median of 5)"] = round(statistics.median(times), 1)
        report["clocks while timing"] = clocks.summary
        report["peak GPU memory GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(tag, json.dumps(report, indent=1), flush=True)
    torch.save({k: v.cpu() for k, v in outputs.items()}, folder / f"{tag}.pt")


def compare(a: str, b: str, folder: Path) -> None:
    first, second = torch.load(folder / f"{a}.pt"), torch.load(folder / f"{b}.pt")
    reference = second["fp32 eager"]
    print(f"{'variant':28} {'bitwise':>8} {'max abs diff':>13} {a + ' err':>12} {b + ' err':>12}")
    for name in first:
        x, y = first[name], second[name]
        diff = (x - y).abs().max().item()
        errors = ["", ""]
        if name.startswith("fp16") and x.shape == reference.shape:
            errors = [f"{(v - reference).abs().max().item():.3e}" for v in (x, y)]
        print(f"{name:28} {str(torch.equal(x, y)):>8} {diff:13.3e} {errors[0]:>12} {errors[1]:>12}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag")
    parser.add_argument("--compare", nargs=2)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.compare:
        compare(*args.compare, args.dir)
    else:
        run(args.tag, args.dir, torch.device(args.device))


if __name__ == "__main__":
    main()
