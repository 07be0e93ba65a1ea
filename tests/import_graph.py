"""The package's import graph, read from its source: which of its modules each module imports."""

from __future__ import annotations

import ast

from repo import REPO

PACKAGE = REPO / "minimax_h3_vae"


def package_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports, at the top or inside a function (both count)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__") or "__init__"
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(package[: len(package) - (node.level - 1)]) if node.level > 1 else list(package)
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                for alias in node.names if not node.module else [None]:
                    found.add(target if alias is None else ".".join(filter(None, [target, alias.name])))
        graph[name] = {t for t in found if t and t != name}
    modules = set(graph)
    # `from . import x` names a module; `from .x import y` names x.
    return {m: {t if t in modules else t.rsplit(".", 1)[0] for t in ts} & modules for m, ts in graph.items()}
