"""The ranks' side of the distributed tests (gloo, CPU; torchrun_runs.py launches them).

`sweep(CHECKPOINT, DIR, JOBS)` runs the JOBs below, in order, in one process group (a process group cannot be
joined again reliably in one launch): one launch per world size serves every test of that size. Its ranks are
forked as torchrun would set them up (`as_rank`), from a process that imported torch once.

The command, under `torchrun --standalone --nproc_per_node N` (or forked, `cli(MODE, ARGS)`):
distributed_worker.py cli CHECKPOINT ARGS...       runs the CLI, with a missing checkpoint on rank 1 only
distributed_worker.py cli_same CHECKPOINT ARGS...  runs the CLI, the same checkpoint on every rank
distributed_worker.py cli_fail ARGS...             runs the CLI, with rank 1's decoder failing mid-decode
each rank then prints its thread count on stdout ("rank R: N threads").

JOBs (each rank saves what the tests compare with one process's decode):
  disagree  decode() with options that differ between the ranks, a rank whose own decode fails, then a good
          decode of disagree_latents(): what each call raised -> DIR/disagree_rank{r}.json,
          the good decode -> DIR/disagree_rank{r}.pt
  decode  decodes of latents() for several tile batches, output_rank=1, offload="blocks"  -> DIR/rank{r}_*.pt
  auto    latents() with the automatic tile batch, on 2 threads                           -> DIR/rank{r}_auto.pt
  api     decode() per clip length in API_LENGTHS and frame size in SHAPES, tile batches 1 and 3
                                                                           -> DIR/api_{T}_{h}_{w}_{b}_rank{r}.pt
  cli     the command's run (prepare, decode, the per-chunk agreement, write) per T in CLI_LENGTHS:
          DIR/in_{T}.safetensors -> DIR/out_{T}.safetensors
"""

import json
import os
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


def one_process(checkpoint: str, folder: Path) -> None:
    """The `auto` job's reference: one process (no process group) decodes latents() in calls of one tile, on
    AUTO_THREADS threads, started as the ranks are -> DIR/one_process_auto.pt."""
    torch.set_num_threads(AUTO_THREADS)
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu", tile_batch=1)
    torch.save(model.decode(latents()), folder / "one_process_auto.pt")


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


def as_rank(rank: int, world: int, port: int, environ: dict, log: Path, target, *args) -> None:
    """Exit with target(*args) as rank `rank` of `world`, set up as `torchrun --standalone` sets up its ranks: the
    launcher's environment, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for the
    env:// rendezvous, and one thread (torchrun's OMP_NUM_THREADS=1, which a process forked after torch's import
    must be given directly). Its stdout and stderr (a failure's traceback too) go to the file `log`."""
    os.environ.clear()
    os.environ.update(environ)
    sizes = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world}
    os.environ.update({k: str(v) for k, v in sizes.items()}, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    with open(log, "wb") as handle:
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
    sys.exit(target(*args))


def cli(mode: str, args: list[str]) -> int:
    from minimax_h3_vae.command.main import main

    rank = int(os.environ["RANK"])
    if mode in ("cli", "cli_same"):
        checkpoint, *args = args
        args += ["--model", checkpoint if rank == 0 or mode == "cli_same" else checkpoint + ".missing"]
    elif rank == 1:  # cli_fail

        def failing(self, *args, **kwargs):
            raise RuntimeError("injected failure")

        H3VideoDecoder.forward = failing
    code = main(args)
    # One write(2) of a short line to the pipe both ranks share is atomic; print() may write the text and its
    # newline in two writes, and the two ranks' lines can interleave.
    os.write(1, f"rank {rank}: {torch.get_num_threads()} threads\n".encode())
    return code


if __name__ == "__main__":
    assert sys.argv[1] in ("cli", "cli_same", "cli_fail"), sys.argv
    sys.exit(cli(sys.argv[1], sys.argv[2:]))
