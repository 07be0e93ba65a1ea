"""Hashes of decodes through every path, to show that a change leaves the output bit for bit alone.

    PYTHONPATH=OLD_TREE python benchmarks/decode_hashes.py --tag before --dir /tmp/h
    PYTHONPATH=.        python benchmarks/decode_hashes.py --tag after  --dir /tmp/h
    python benchmarks/decode_hashes.py --compare before after --dir /tmp/h

Each run makes one set of seeded random weights (common.randomize_ on the released architecture, or on a toy
one with `--device cpu`: 2 blocks, width 128, a 352x224 unit of 6 tiles) and loads them through the public
loading door (`H3VideoDecoder.from_checkpoint` on an in-memory checkpoint of the original layout) once per
path: eager / fused / fused with exact=True, fp32 / fp16, cuBLAS / quack, SDPA / fa4, resident /
offload="blocks"; plus a two-chunk clip through `decode_stream`. The eager and exact paths of one dtype should
hash alike (the release's bits). A path this machine cannot run (quack or fa4 off Hopper) is listed as skipped.
It prints a SHA-256 of each output and saves the outputs; on CUDA also the fused paths' median CUDA-event
time per unit with the SM clock and power (not with --no-time). On the CPU the fused kernels run under
TRITON_INTERPRET=1 (set it before Python starts). --compare prints, per path, whether the two runs are bitwise equal.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

UNIT_SHAPE = (1, 24, 7, 48, 84)
TWO_CHUNKS = (1, 24, 12, 48, 84)
CPU_SHAPES = ((1, 24, 7, 14, 22), (1, 24, 12, 14, 22))
# (name, dtype, fused, gemm, attention, offload, exact); the stream variants decode the two-chunk clip. A tree
# whose package has no `exact` option lists the exact paths as skipped.
PATHS = (
    ("fp32 eager", "fp32", False, "cublas", "sdpa", "none", False),
    ("fp32 eager blocks", "fp32", False, "cublas", "sdpa", "blocks", False),
    ("fp32 fused", "fp32", True, "cublas", "sdpa", "none", False),
    ("fp32 fused exact", "fp32", True, "cublas", "sdpa", "none", True),
    ("fp16 eager", "fp16", False, "cublas", "sdpa", "none", False),
    ("fp16 eager blocks", "fp16", False, "cublas", "sdpa", "blocks", False),
    ("fp16 eager stream 2 chunks", "fp16", False, "cublas", "sdpa", "none", False),
    ("fp16 fused cublas sdpa", "fp16", True, "cublas", "sdpa", "none", False),
    ("fp16 fused cublas sdpa blocks", "fp16", True, "cublas", "sdpa", "blocks", False),
    ("fp16 fused exact", "fp16", True, "cublas", "sdpa", "none", True),
    ("fp16 fused exact blocks", "fp16", True, "cublas", "sdpa", "blocks", True),
    ("fp16 fused exact stream 2 chunks", "fp16", True, "cublas", "sdpa", "none", True),
    ("fp16 fused quack sdpa", "fp16", True, "quack", "sdpa", "none", False),
    ("fp16 fused cublas fa4", "fp16", True, "cublas", "fa4", "none", False),
    ("fp16 fused quack fa4", "fp16", True, "quack", "fa4", "none", False),
    ("fp16 fused quack fa4 blocks", "fp16", True, "quack", "fa4", "blocks", False),
)


def checkpoint_in_memory():
    """The in-memory checkpoint door, wherever this version of the package keeps it."""
    for module in ("minimax_h3_vae.checkpoints", "minimax_h3_vae.loading"):
        try:
            return importlib.import_module(module).checkpoint_in_memory
        except (ImportError, AttributeError):
            continue
    raise ImportError("no checkpoint_in_memory in this version of the package")


def released_weights(device: torch.device):
    """The released (or toy) architecture's config and seeded random float32 weights, original key names."""
    from common import randomize_

    from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder

    config = H3DecoderConfig() if device.type == "cuda" else H3DecoderConfig(num_layers=2, num_heads=2)
    with torch.device("meta"):
        names = [name for name, _ in H3VideoDecoder(config).named_parameters()]
    with device:
        model = H3VideoDecoder(config)
    randomize_(model.named_parameters(), torch.Generator(device=device).manual_seed(0), only=("",))
    # Kept in host memory, copied for each load: no load can share (or change) another's tensors.
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items() if name in names}
    return config, state


def run(tag: str, folder: Path, device: torch.device, timed: bool = True) -> None:
    # Imported before `common` (which puts this tree first on the path), so PYTHONPATH picks the package.
    import minimax_h3_vae
    from minimax_h3_vae import H3VideoDecoder

    print(tag, "package:", Path(minimax_h3_vae.__file__).parent, flush=True)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    unit, two = (UNIT_SHAPE, TWO_CHUNKS) if device.type == "cuda" else CPU_SHAPES
    z = torch.randn(unit, device=device, generator=torch.Generator(device).manual_seed(1))
    clip = torch.randn(two, device=device, generator=torch.Generator(device).manual_seed(2))
    config, state = released_weights(device)
    in_memory = checkpoint_in_memory()
    outputs, report, times = {}, {}, {}
    for name, dtype, fused, gemm, attention, offload, exact in PATHS:
        options = dict(device=str(device), dtype=dtype, fused=fused, gemm=gemm, attention=attention, offload=offload)
        if exact:
            options["exact"] = True
        try:
            copy = {name: tensor.clone() for name, tensor in state.items()}
            model = H3VideoDecoder.from_checkpoint(in_memory(copy, config, "original"), **options)
        except ValueError as error:
            report[name] = f"skipped: {error}"
            continue
        if "stream" in name:
            outputs[name] = torch.cat(list(model.decode_stream(clip)), dim=2).cpu()
        else:
            outputs[name] = model.decode(z).cpu()
            if device.type == "cuda" and fused and timed:
                times[name] = time_decode(model, z)
        report[name] = hashlib.sha256(outputs[name].numpy().tobytes()).hexdigest()[:16]
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(tag, json.dumps(report, indent=1), flush=True)
    if times:
        print(json.dumps(times, indent=1), flush=True)
    torch.save(outputs, folder / f"{tag}.pt")


def time_decode(model, z: torch.Tensor) -> dict:
    """Median CUDA-event ms of 5 unit decodes after one warm-up, with the SM clock and power meanwhile."""
    from gpu_clocks import ClockSampler

    model.decode(z)
    torch.cuda.reset_peak_memory_stats()
    times = []
    with ClockSampler() as clocks:
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model.decode(z)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return {"ms per unit": round(statistics.median(times), 1), "clocks": clocks.summary, "peak GiB": peak}


def compare(a: str, b: str, folder: Path) -> None:
    first, second = torch.load(folder / f"{a}.pt"), torch.load(folder / f"{b}.pt")
    print(f"| path | {a} | {b} | bitwise |\n| --- | --- | --- | --- |")
    for name, *_ in PATHS:
        x, y = first.get(name), second.get(name)
        if x is None or y is None:
            print(f"| {name} | {'-' if x is None else 'ran'} | {'-' if y is None else 'ran'} | not compared |")
            continue
        hashes = [hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16] for t in (x, y)]
        print(f"| {name} | {hashes[0]} | {hashes[1]} | {torch.equal(x, y)} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag")
    parser.add_argument("--compare", nargs=2)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--no-time", action="store_true", help="hashes only: no timed decodes")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.compare:
        compare(*args.compare, args.dir)
    else:
        run(args.tag, args.dir, torch.device(args.device), timed=not args.no_time)


if __name__ == "__main__":
    main()
