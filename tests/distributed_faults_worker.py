"""Run under `torchrun --standalone --nproc_per_node N` by tests/test_distributed_faults.py (gloo, CPU).

distributed_faults_worker.py api CHECKPOINT DIR   decode() with options that differ between the ranks, a
    rank whose own decode fails, then a good decode: each rank writes DIR/rank{r}.json (what each call
    raised, the thread count) and DIR/rank{r}.pt (the good decode's output)
distributed_faults_worker.py cli_fail ARGS...     the command, with rank 1's decoder failing mid-decode
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the package of this checkout, unless PYTHONPATH has one

from minimax_h3_vae import H3VideoDecoder  # noqa: E402


def latents() -> torch.Tensor:
    """One window of 3 tiles: the smallest decode that gives both ranks decoder calls."""
    return torch.randn(1, 24, 2, 1, 29, generator=torch.Generator().manual_seed(7))


def outcome(call) -> str:
    try:
        call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


def api(checkpoint: str, folder: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    z = latents()
    results = {
        "tile_batch": outcome(lambda: model.decode(z, tile_batch=1 + rank)),
        "output_rank": outcome(lambda: model.decode(z, output_rank=rank)),
        "latents": outcome(lambda: model.decode(z[..., : 29 - rank], tile_batch=1)),
        "own_problem": outcome(lambda: model.decode(z, tile_batch=0 if rank == 1 else 1)),
    }

    def failing(*args, **kwargs):
        raise RuntimeError("injected failure")

    forward = model.forward
    if rank == 1:
        model.forward = failing
    results["own_failure"] = outcome(lambda: model.decode(z, tile_batch=1))
    model.forward = forward
    out = model.decode(z, tile_batch=1)  # the process group still works
    results["threads"] = torch.get_num_threads()
    (folder / f"rank{rank}.json").write_text(json.dumps(results))
    torch.save(out, folder / f"rank{rank}.pt")
    dist.destroy_process_group()


def cli_fail(args: list[str]) -> int:
    import os

    from minimax_h3_vae.command import main as cli

    if os.environ["RANK"] == "1":

        def failing(self, *args, **kwargs):
            raise RuntimeError("injected failure")

        H3VideoDecoder.forward = failing
    return cli.main(args)


if __name__ == "__main__":
    if sys.argv[1] == "api":
        api(sys.argv[2], Path(sys.argv[3]))
    else:
        sys.exit(cli_fail(sys.argv[2:]))
