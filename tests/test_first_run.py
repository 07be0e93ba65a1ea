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


def test_help_speaks_to_users(capsys):
    """--help opens with what the command does, in a user's words: no developer notes, no internal names."""
    from minimax_h3_vae.command import flags

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    description = text[text.index("\n\n") : text.index("positional arguments:")].strip()
    assert description.startswith("Decode MiniMax-H3 latents"), description
    assert "`" not in text
    internal = [name for name, value in vars(flags).items() if callable(value) and name in text]
    assert not internal, internal


def test_the_command_docs_show_the_torchrun_launch():
    """The torchrun launch is where a user of the command looks: docs/command.md, and a line in the README's
    section on the command, the same command line as docs/performance.md's."""
    launches = re.findall(r"^torchrun .*$", (REPO / "docs" / "performance.md").read_text(), re.M)
    assert launches
    command_doc = (REPO / "docs" / "command.md").read_text()
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## The command") :]
    section = section[: section.index("\n## ", 1)]
    for launch in launches:
        assert launch in command_doc, launch
    assert "torchrun --standalone --nproc_per_node" in section, section


def test_the_docs_date_changes_by_an_earlier_version():
    """A change dated "up to version X" names a version before this one: this one has what the docs describe."""
    from minimax_h3_vae import __version__

    current = tuple(int(part) for part in __version__.split("."))
    for doc in sorted((REPO / "docs").glob("*.md")):
        for version in re.findall(r"[Uu]p to (?:version )?(\d+\.\d+\.\d+)", doc.read_text()):
            assert tuple(int(part) for part in version.split(".")) < current, (doc.name, version)


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
