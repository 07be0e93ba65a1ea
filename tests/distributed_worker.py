"""Run under `torchrun --standalone --nproc_per_node N` by tests/test_distributed.py (gloo, CPU).

distributed_worker.py decode CHECKPOINT OUT_DIR   each rank saves its decodes for several tile batches
distributed_worker.py auto CHECKPOINT OUT_DIR     each rank saves its decode with the automatic tile batch
distributed_worker.py cli CHECKPOINT ARGS...      runs the CLI, with a missing checkpoint on rank 1 only
distributed_worker.py cli_same CHECKPOINT ARGS... runs the CLI, the same checkpoint on every rank
distributed_worker.py api_sweep CHECKPOINT DIR T...   decode() per T and frame size, every rank's output saved
distributed_worker.py cli_sweep CHECKPOINT DIR T...  the CLI's run once per T: DIR/in_T.safetensors -> out_T
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from minimax_h3_vae import H3VideoDecoder  # noqa: E402


def latents() -> torch.Tensor:
    """3 tiles (464 px wide, 16 px high: an odd count) and 2 temporal chunks."""
    return torch.randn(1, 24, 8, 1, 29, generator=torch.Generator().manual_seed(5))


def decode(checkpoint: str, out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    z = latents()
    for tile_batch in (1, 2, None):
        model.tile_batch = tile_batch
        torch.save(model.decode(z), out_dir / f"rank{rank}_batch{tile_batch}.pt")
    model.tile_batch, model.output_rank = 1, 1
    torch.save(model.decode(z), out_dir / f"rank{rank}_output_rank1.pt")
    streamed = H3VideoDecoder.from_pretrained(checkpoint, device="cpu", offload="blocks", tile_batch=1)
    torch.save(streamed.decode(z), out_dir / f"rank{rank}_blocks_batch1.pt")
    dist.destroy_process_group()


def auto(checkpoint: str, out_dir: Path) -> None:
    dist.init_process_group("gloo")
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    torch.save(model.decode(latents()), out_dir / f"rank{dist.get_rank()}_auto.pt")
    dist.destroy_process_group()


def cli(checkpoint: str, args: list[str], same: bool = False) -> int:
    from minimax_h3_vae.command.main import main

    rank = int(__import__("os").environ["RANK"])
    return main([*args, "--model", checkpoint if rank == 0 or same else checkpoint + ".missing"])


def cli_sweep(checkpoint: str, folder: Path, lengths: list[str]) -> None:
    """The command's run (prepare, decode, the per-chunk agreement, write) once per clip length, in one
    process group (a process group cannot be joined again reliably in one launch)."""
    from minimax_h3_vae.command import flags
    from minimax_h3_vae.command import main as cli

    dist.init_process_group("gloo")
    for length in lengths:
        args = [folder / f"in_{length}.safetensors", folder / f"out_{length}.safetensors", "--model", checkpoint]
        args = flags.parse_args([*map(str, args), "--device", "cpu", "--tile-batch", "1"])
        cli.run(args, dist.get_rank(), dist.get_world_size(), None)
    dist.destroy_process_group()


SHAPES = ((1, 1), (1, 29), (20, 20))  # latent (h, w): less than one tile, a row of 3 tiles, 2 x 2 tiles


def api_sweep(checkpoint: str, folder: Path, lengths: list[str]) -> None:
    """decode() on every rank for each clip length and frame size, tile batches 1 and 3; the output rank's
    results saved as DIR/api_T_h_w_b.pt (rank 0 keeps every rank's output to compare them too)."""
    dist.init_process_group("gloo")
    model = H3VideoDecoder.from_pretrained(checkpoint, device="cpu")
    for length in map(int, lengths):
        for h, w in SHAPES:
            z = torch.randn(1, 24, length, h, w, generator=torch.Generator().manual_seed(length * 1000 + h + w))
            for tile_batch in (1, 3):
                out = model.decode(z, tile_batch=tile_batch)
                torch.save(out, folder / f"api_{length}_{h}_{w}_{tile_batch}_rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "api_sweep":
        api_sweep(sys.argv[2], Path(sys.argv[3]), sys.argv[4:])
        sys.exit()
    if sys.argv[1] == "cli_sweep":
        cli_sweep(sys.argv[2], Path(sys.argv[3]), sys.argv[4:])
        sys.exit()
    if sys.argv[1] == "decode":
        decode(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1] == "auto":
        auto(sys.argv[2], Path(sys.argv[3]))
    else:
        sys.exit(cli(sys.argv[2], sys.argv[3:], same=sys.argv[1] == "cli_same"))
