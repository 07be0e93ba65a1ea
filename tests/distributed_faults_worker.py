"""Run under `torchrun --standalone --nproc_per_node N` by tests/test_distributed_faults.py (gloo, CPU).

distributed_faults_worker.py cli_fail ARGS...     the command, with rank 1's decoder failing mid-decode
"""

import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the package of this checkout, unless PYTHONPATH has one

from minimax_h3_vae import H3VideoDecoder  # noqa: E402


def cli_fail(args: list[str]) -> int:
    from minimax_h3_vae.command import main as cli

    if os.environ["RANK"] == "1":

        def failing(self, *args, **kwargs):
            raise RuntimeError("injected failure")

        H3VideoDecoder.forward = failing
    return cli.main(args)


if __name__ == "__main__":
    assert sys.argv[1] == "cli_fail", sys.argv
    sys.exit(cli_fail(sys.argv[2:]))
