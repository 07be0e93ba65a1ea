"""Run under `torchrun --standalone --nproc_per_node N` by the tests (gloo, CPU; torchrun_runs.py launches it).

distributed_worker.py sweep CHECKPOINT DIR JOB...  the JOBs below, in order, in one process group (a process group
                                                   cannot be joined again reliably in one launch): one launch per
                                                   world size serves every test of that size
distributed_worker.py cli CHECKPOINT ARGS...       runs the CLI, with a missing checkpoint on rank 1 only
distributed_worker.py cli_same CHECKPOINT ARGS...  runs the CLI, the same checkpoint on every rank

JOBs (each rank saves what the tests compare with one process's decode):
  disagree  decode() with options that differ between the ranks, a rank whose own decode fails, then a good
          decode of disagree_latents(): what each call raised and the thread count -> DIR/disagree_rank{r}.json,
          the good decode -> DIR/disagree_rank{r}.pt
  decode  decodes of latents() for several tile batches, output_rank=1, offload="blocks"  -> DIR/rank{r}_*.pt
  auto    latents() with the automatic tile batch, on 2 threads                           -> DIR/rank{r}_auto.pt
  api     decode() per clip length in API_LENGTHS and frame size in SHAPES, tile batches 1 and 3
                                                                           -> DIR/api_{T}_{h}_{w}_{b}_rank{r}.pt
  cli     the command's run (prepare, decode, the per-chunk agreement, write) per T in CLI_LENGTHS:
          DIR/in_{T}.safetensors -> DIR/out_{T}.safetensors
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from minimax_h3_vae import H3VideoDecoder, Tiling  # noqa: E402

# The `api` job's latent frame sizes (h, w) and tilings: less than one tile, a row of 3 tiles, and 2 x 2 tiles
# of 4 x 4 latents (a quarter of the release's tile side: the same schedule for 1/16 of the tokens per tile).
SHAPES = ((1, 1, Tiling()), (1, 29, Tiling()), (6, 6, Tiling(64, 16)))
API_LENGTHS = (1, 2, 3, 7, 12, 13)
CLI_LENGTHS = (1, 2, 3, 7, 8, 12, 13)
AUTO_THREADS = 2  # the automatic batch's run: 2 threads per process


def latents() -> torch.Tensor:
    """3 tiles (464 px wide, 16 px high: an odd count) and 2 temporal chunks."""
    return torch.randn(1, 24, 8, 1, 29, generator=torch.Generator().manual_seed(5))


def sweep_latents(length: int, h: int, w: int) -> torch.Tensor:
    """The `api` job's latents for clip length `length` and latent frame size (h, w)."""
    return torch.randn(1, 24, length, h, w, generator=torch.Generator().manual_seed(length * 1000 + h + w))


def disagree_latents() -> torch.Tensor:
    """One window of 3 tiles: the smallest decode that gives both ranks decoder calls."""
    return torch.randn(1, 24, 2, 1, 29, generator=torch.Generator().manual_seed(7))


def outcome(call) -> str:
    try:
        call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


def disagree(checkpoint: str, folder: Path, rank: int) -> None:
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    z = disagree_latents()
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
    (folder / f"disagree_rank{rank}.json").write_text(json.dumps(results))
    torch.save(out, folder / f"disagree_rank{rank}.pt")


def decode(checkpoint: str, out_dir: Path, rank: int) -> None:
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    z = latents()
    for tile_batch in (1, 2, None):
        model.configure(tile_batch=tile_batch)
        torch.save(model.decode(z), out_dir / f"rank{rank}_batch{tile_batch}.pt")
    model.configure(tile_batch=1, output_rank=1)
    torch.save(model.decode(z), out_dir / f"rank{rank}_output_rank1.pt")
    streamed = H3VideoDecoder.from_pretrained(checkpoint, device="cpu", offload="blocks", tile_batch=1)
    torch.save(streamed.decode(z), out_dir / f"rank{rank}_blocks_batch1.pt")


def auto(checkpoint: str, out_dir: Path, rank: int) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(AUTO_THREADS)
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    torch.save(model.decode(latents()), out_dir / f"rank{rank}_auto.pt")
    torch.set_num_threads(threads)


def api(checkpoint: str, folder: Path, rank: int) -> None:
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    for length in API_LENGTHS:
        for h, w, tiling in SHAPES:
            z = sweep_latents(length, h, w)
            for tile_batch in (1, 3):
                out = model.decode(z, tile_batch=tile_batch, tiling=tiling)
                torch.save(out, folder / f"api_{length}_{h}_{w}_{tile_batch}_rank{rank}.pt")


def cli_sweep(checkpoint: str, folder: Path, rank: int) -> None:
    from minimax_h3_vae.command import flags
    from minimax_h3_vae.command import main as cli

    for length in CLI_LENGTHS:
        args = [folder / f"in_{length}.safetensors", folder / f"out_{length}.safetensors", "--model", checkpoint]
        args = flags.parse_args([*map(str, args), "--device", "cpu", "--tile-batch", "1"])
        cli.run(args, rank, dist.get_world_size(), None)


JOBS = {"disagree": disagree, "decode": decode, "auto": auto, "api": api, "cli": cli_sweep}


def sweep(checkpoint: str, folder: Path, jobs: list[str]) -> None:
    dist.init_process_group("gloo")
    for job in jobs:
        JOBS[job](checkpoint, folder, dist.get_rank())
    dist.destroy_process_group()


def cli(checkpoint: str, args: list[str], same: bool = False) -> int:
    from minimax_h3_vae.command.main import main

    rank = int(__import__("os").environ["RANK"])
    return main([*args, "--model", checkpoint if rank == 0 or same else checkpoint + ".missing"])


if __name__ == "__main__":
    if sys.argv[1] == "sweep":
        sweep(sys.argv[2], Path(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit(cli(sys.argv[2], sys.argv[3:], same=sys.argv[1] == "cli_same"))
