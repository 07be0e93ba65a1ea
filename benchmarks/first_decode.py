"""Whether the load's set-up (ops selected, each kernel launched once on two tokens) leaves any build for the
first full-size decode, per attention kernel, with quack's GEMMs (device only).

    PYTHONPATH=. python benchmarks/first_decode.py [sdpa fa4]

For each attention in the order given: the set-up as `loading.LibrarySetUp` runs it (select_ops + warm_up),
timed, then three decodes of one 1344x768 unit, each timed from the host. A process's first full-size decode
also pays one-time costs that no set-up on two tokens covers (new GEMM shapes, the allocator's first large
blocks, cuDNN's plan for the shape): put the variant to check second.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import sharing_weights  # noqa: E402
from common import UNIT_SHAPE, random_latents, random_released_decoder  # noqa: E402

from minimax_h3_vae import fused  # noqa: E402
from minimax_h3_vae.fused import _quack  # noqa: E402


def main() -> None:
    order = sys.argv[1:] or ["sdpa", "fa4"]
    _quack.load()
    cuda = torch.device("cuda")
    base = random_released_decoder(cuda).configure(fused=True)
    z = random_latents(UNIT_SHAPE, seed=1)
    for attention in order:
        model = sharing_weights(base, gemm="quack", attention=attention)
        start = time.perf_counter()
        ops = fused.select_ops(model.config, cuda, torch.float16, "quack", attention)
        fused.warm_up(ops, model.config, cuda, torch.float16, "quack", attention)
        torch.cuda.synchronize()
        print(f"{attention}: set-up {time.perf_counter() - start:.2f} s", flush=True)
        model._ops[model._ops_key(model.runtime)] = ops  # as from_pretrained keeps the set-up's ops
        for i in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.decode(z)
            torch.cuda.synchronize()
            print(f"{attention}: decode {i} {time.perf_counter() - start:.3f} s", flush=True)


if __name__ == "__main__":
    main()
