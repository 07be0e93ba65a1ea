"""Running the command in process and reading what it leaves: its exit code and stderr, the one error line, the
files under a folder, the streams ffmpeg reads in a file; latents files to give it, a copy of the tiny checkpoint
to break; a real tmpfs, and a way to fill a disk."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from repo import TINY
from safetensors.torch import save_file

from minimax_h3_vae.command import encoder
from minimax_h3_vae.command import main as cli_module

OLD = b"an older output that must survive" * 64  # an existing output, which a failed run must leave as it was


def run_cli(capsys, *args) -> tuple[int, str]:
    """main(argv) in process -> (exit code, stderr); on the CPU and the tiny decoder unless the arguments say."""
    capsys.readouterr()
    args = [str(a) for a in args]
    if "--device" not in args:
        args += ["--device", "cpu"]
    if "--model" not in args:
        args += ["--model", str(TINY)]
    code = cli_module.main(args)
    return code, capsys.readouterr().err


def run_cli_or_parser(capsys, *args) -> tuple[int, str]:
    """run_cli, counting a value the argument parser refuses (one line, SystemExit(2)) as its exit code."""
    try:
        return run_cli(capsys, *args)
    except SystemExit as exit:
        return exit.code, capsys.readouterr().err


def one_error_line(err: str) -> str:
    """The stderr's last line, checked to be its one 'error:' line, with no traceback anywhere."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error:"), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    assert "Traceback" not in err and "Error:" not in lines[-1].replace("error:", "", 1), err
    return lines[-1]


def latents_file(path: Path, z=None, metadata=None) -> Path:
    """`z` (default: random (24, 3, 2, 2), seed 0) saved as the command's input at `path`; a dict of tensors is
    saved as it is."""
    z = torch.randn(24, 3, 2, 2, generator=torch.Generator().manual_seed(0)) if z is None else z
    tensors = z if isinstance(z, dict) else {"latents": z}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def tree(folder: Path) -> set[str]:
    """Every file and folder under `folder`, hidden ones included."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, read_only: bool = False):
    """A real tmpfs of `size` at `folder` (root only; the test is skipped elsewhere)."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)]).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Fill the filesystem of `folder` to the last block."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(2**16)):
            pass
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)


def ffmpeg(*args: str) -> subprocess.CompletedProcess:
    """imageio-ffmpeg's ffmpeg with these arguments, its output captured (bytes)."""
    return subprocess.run([encoder.ffmpeg_exe(), "-nostdin", *args], capture_output=True)


def streams(path: Path) -> list[str]:
    """The `Stream #0:N` lines of `ffmpeg -v verbose -i`."""
    return [
        line.strip()
        for line in ffmpeg("-v", "verbose", "-i", str(path)).stderr.decode().splitlines()
        if line.strip().startswith("Stream #0:")
    ]


def stream_seconds(path: Path, stream: str) -> float:
    """Where the last packet of `stream` ends, in seconds, from ffmpeg's framecrc (pts + duration, time base)."""
    lines = ffmpeg("-v", "error", "-i", str(path), "-map", stream, "-c", "copy", "-f", "framecrc", "-").stdout
    lines = lines.decode().splitlines()
    num, den = next(line for line in lines if line.startswith("#tb 0:")).split(":")[1].strip().split("/")
    last = [line for line in lines if line and not line.startswith("#")][-1].split(",")
    return (int(last[2]) + int(last[3])) * int(num) / int(den)


def tensor_bytes_in(fd: int) -> int:
    """Bytes of tensor data (after the 8-byte length and the header) in the safetensors file open as `fd`."""
    return os.fstat(fd).st_size - 8 - int.from_bytes(os.pread(fd, 8, 0), "little")


def small_latents(tmp_path: Path, value=None, dtype=torch.float32) -> Path:
    """`value` (default: random (24, 3, 4, 4), seed 0: 9 frames of 64x64 px) as tmp_path/s.safetensors."""
    z = torch.randn(24, 3, 4, 4, generator=torch.Generator().manual_seed(0)) if value is None else value
    return latents_file(tmp_path / "s.safetensors", z.to(dtype))


def refused(capsys, *args) -> str:
    """The command run on `args`, checked to exit 2 (bad input): its one error line."""
    code, err = run_cli(capsys, *args)
    assert code == 2, err
    return one_error_line(err)


def tiny_copy(tmp_path: Path) -> Path:
    """A copy of the tiny checkpoint (examples/tiny_h3_vae) at tmp_path/ckpt, for a test to break."""
    shutil.copytree(TINY, tmp_path / "ckpt")
    return tmp_path / "ckpt"
