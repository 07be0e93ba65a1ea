"""The wheel, as `pip install .` builds it from this checkout, holds the whole package: every file under
minimax_h3_vae/ (each module of each subpackage, and any data file beside them), and the console script. Each
dependency's declared floor is the version .ci/run's wheel venv installs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from repo import REPO

PACKAGE = "minimax_h3_vae"
# What the build backend reads besides the package (pyproject.toml names README.md and LICENSE), and the node
# pack's files at the root, which must stay out of the wheel.
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE", "__init__.py", "requirements.txt")


def package_files(root: Path) -> set[str]:
    """The package's files as paths relative to `root` (bytecode caches left out)."""
    return {
        path.relative_to(root).as_posix()
        for path in (root / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def built_wheel(tmp_path: Path) -> Path:
    """A wheel built by setuptools' PEP 517 backend from a copy of the checkout (the build writes build/ and an
    .egg-info folder where it runs)."""
    source = tmp_path / "source"
    shutil.copytree(REPO / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in PROJECT_FILES:
        shutil.copy(REPO / name, source / name)
    out = tmp_path / "dist"
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    result = subprocess.run(
        [sys.executable, "-c", build, str(out)], capture_output=True, text=True, cwd=source, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out / result.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_every_file_of_the_package(tmp_path):
    wheel = built_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    expected = package_files(REPO)
    assert len(expected) > 50 and f"{PACKAGE}/checkpoints/hub.py" in expected
    missing = sorted(expected - names)
    assert not missing, f"missing from the wheel: {missing}"
    assert not [n for n in names if not n.startswith((f"{PACKAGE}/", f"{PACKAGE}-"))], "only the package"
    assert "[console_scripts]\nminimax-h3-decode = minimax_h3_vae.command.console:console_main" in scripts


def release(version: str) -> tuple[int, ...]:
    """'0.25.0' -> (0, 25): equal releases compare equal however many trailing zeros they are written with."""
    parts = [int(part) for part in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_declared_floor_is_the_one_ci_installs():
    """.ci/run builds the sdist and the wheel, and installs the wheel with `video`, under .ci/floors.txt's
    constraints: a dependency without a floor, or a floor the file does not pin, would be a promise no run tests."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    requirements = [*pyproject["build-system"]["requires"], *project["dependencies"]]
    declared = {}
    for requirement in [*requirements, *project["optional-dependencies"]["video"]]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement.replace(" ", ""))
        assert match, f"{requirement}: no floor (>=)"
        declared[normalized(match[1])] = release(match[2])
    lines = (REPO / ".ci" / "floors.txt").read_text().splitlines()
    pinned = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    assert declared.pop("torch") == (2, 11)  # the GPU suite's torch; CI's index serves 2.13.0 only
    assert {normalized(name): release(version) for name, version in pinned} == declared
