"""The package's comments and docstrings point at things that exist: files, the module's own private names,
benchmark log entries (by their anchors, never by run number); and no code is kept for an op the decoder
no longer runs."""

from __future__ import annotations

import re

import pytest
from repo import REPO

PACKAGE = REPO / "minimax_h3_vae"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# Files of other projects that the package's comments name, and where they are.
OTHER_PROJECTS = {"vae.py": "comfy-kitchen's (ComfyUI's VAE wrapper)"}


def ids(paths):
    return [str(path.relative_to(PACKAGE)) for path in paths]


@pytest.mark.parametrize("source", SOURCES, ids=ids(SOURCES))
def test_no_run_numbers(source):
    """Benchmark runs are named by their LOG.md entry: a run number means nothing outside the log."""
    text = source.read_text()
    assert not re.findall(r"\bruns? \d+", text)
    assert "RESULTS.md, run" not in text


@pytest.mark.parametrize("source", SOURCES, ids=ids(SOURCES))
def test_benchmark_pointers_name_existing_log_entries(source):
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', (REPO / "benchmarks" / "LOG.md").read_text()))
    named = re.findall(r"LOG\.md#([\w-]+)", source.read_text())
    assert set(named) <= anchors, sorted(set(named) - anchors)


@pytest.mark.parametrize("source", SOURCES, ids=ids(SOURCES))
def test_files_named_exist(source):
    """A module's text names files beside it, in the package or in the checkout (`loading.py` was gone)."""
    missing = []
    for name in re.findall(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b", source.read_text()):
        places = (source.parent / name, PACKAGE / name, REPO / name)
        if name not in OTHER_PROJECTS and not any(place.exists() for place in places):
            missing.append(name)
    assert not missing


@pytest.mark.parametrize("source", SOURCES, ids=ids(SOURCES))
def test_private_names_named_exist_in_their_module(source):
    """A `_name` in a module's text is one of that module's own (signals.py named a `_stop` it never had)."""
    text = source.read_text()
    named = set(re.findall(r"`(_[^\W_]\w*)(?:\(\))?`", text))  # not dunders: the formats' names
    missing = [name for name in named if not re.search(rf"(?:def|class) {name}\b|^\s*{name}\s*=", text, re.M)]
    assert not missing
