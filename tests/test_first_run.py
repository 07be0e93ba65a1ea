"""What a new user meets first: the command's --help, what the README's first command leaves in the
checkout, and what a core install brings."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from repo import REPO

from minimax_h3_vae.command import main as cli


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert exit.value.code == 0
    examples = text[text.index("examples:") :]
    # the README's first command, runnable from the checkout as shown
    assert "minimax-h3-decode examples/latents.safetensors example.mp4 --model examples/tiny_h3_vae" in examples
    assert "minimax-h3-decode latents.safetensors out.mp4" in examples


def test_the_readme_first_output_is_ignored_by_git():
    """The README's first command writes example.mp4 in the checkout: git does not show it as untracked."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    result = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "example.mp4"])
    assert result.returncode == 0, "example.mp4 is not ignored"


def test_numpy_is_a_core_dependency():
    """torch prints "Failed to initialize NumPy" on every run of an install without numpy; the latents reader
    uses it too: it is a core dependency, not only the video extra's."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower() for requirement in project["dependencies"]}
    assert "numpy" in names, project["dependencies"]
