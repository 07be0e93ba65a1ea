"""The command's package (minimax_h3_vae/command/): `python -m minimax_h3_vae.command` runs the same `main` as
the `minimax-h3-decode` console script (tests/test_cli.py checks the script's entry point); its modules import
one way, each under 450 lines, and none reaches into another's private names."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import TopologicalSorter
from pathlib import Path

from import_graph import package_imports

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ROOT / "minimax_h3_vae" / "command"
COMMAND_PACKAGE = "minimax_h3_vae.command"
PRIVATE = re.compile(r"_(?!_)")  # `_x`, not a dunder


def test_module_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "minimax_h3_vae.command", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: minimax-h3-decode")


def test_command_modules_import_one_way():
    """The command's modules import one way: their import graph has no cycle, so each module reads on top of the
    ones it imports (TopologicalSorter's CycleError names a cycle)."""
    graph = {
        module: {target for target in targets if target.startswith("command.")}
        for module, targets in package_imports().items()
        if module.startswith("command.")
    }
    TopologicalSorter(graph).prepare()


def test_command_modules_stay_small():
    """Each of the command's modules does one job, in fewer than 450 lines: one that grows past that holds two."""
    lengths = {path.name: len(path.read_text().splitlines()) for path in COMMAND.glob("*.py")}
    assert not {name: lines for name, lines in lengths.items() if lines >= 450}


def _command_module(node: ast.ImportFrom, package: str) -> str | None:
    """The module an import reads from, when it is the command's package or one of its modules."""
    if node.level:
        parts = package.split(".")
        base = parts[: len(parts) - (node.level - 1)]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    return module if module == COMMAND_PACKAGE or module.startswith(COMMAND_PACKAGE + ".") else None


def private_names_reached(path: Path, package: str) -> list[str]:
    """The command's private (`_x`) names that the file at `path` (in `package`) names from outside their module:
    imported, read as a module's attribute, or patched by monkeypatch.setattr(module, "_x", ...)."""
    tree = ast.parse(path.read_text())
    modules, found = set(), []
    for node in ast.walk(tree):
        module = _command_module(node, package) if isinstance(node, ast.ImportFrom) else None
        for alias in node.names if module is not None else ():
            if module == COMMAND_PACKAGE:
                modules.add(alias.asname or alias.name)
            elif PRIVATE.match(alias.name):
                found.append(f"{node.lineno}: from {module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if PRIVATE.match(node.attr):
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Name):
            name = node.args[1]
            if node.args[0].id in modules and isinstance(name, ast.Constant) and PRIVATE.match(str(name.value)):
                found.append(f"{node.lineno}: {node.args[0].id}, {name.value!r}")
    return found


def test_no_module_reaches_into_a_command_module_private_names():
    """What a command module offers the others, and the tests, is public where it lives: no module of the package
    and no test names another command module's private names (tests patch the public names of the module that
    holds the code)."""
    files = [*(ROOT / "minimax_h3_vae").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
    reached = {}
    for path in files:
        relative = path.relative_to(ROOT)
        package = ".".join(relative.parts[:-1]) if relative.parts[0] == "minimax_h3_vae" else ""
        if found := private_names_reached(path, package):
            reached[str(relative)] = found
    assert not reached
