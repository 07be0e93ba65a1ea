"""torchrun launches of tests/distributed_worker.py: gloo ranks on the CPU, one thread each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repo import REPO

WORKER = Path(__file__).with_name("distributed_worker.py")


def torchrun(*args, ranks=2, timeout=240) -> subprocess.CompletedProcess:
    """distributed_worker.py ARGS under `torchrun --standalone` on `ranks` ranks; its output captured as text."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        str(WORKER),
        *map(str, args),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
