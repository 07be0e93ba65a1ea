"""The repository as a ComfyUI node pack, installed the usual ways: cloned into `custom_nodes/` (by hand or by
ComfyUI-Manager, which then installs `requirements.txt`), and the linked pack (`comfyui/minimax_h3_vae_nodes`)
beside an installed package. Each is loaded in a fresh process the way ComfyUI's `nodes.load_custom_node` loads a
folder (ComfyUI commit bd34f338): `importlib.util.spec_from_file_location` on the folder's `__init__.py`, under
the folder's path with "." written "_x_" as the module name, registered in `sys.modules`, then executed. Older
ComfyUI (nodes.py at commit 01094316) named the module after the folder alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from repo import REPO

NODES = {
    "MiniMaxH3DecoderLoader",
    "MiniMaxH3Decode",
    "MiniMaxH3DecodeWithVAE",
    "MiniMaxH3UseForVAE",
}

# ComfyUI's import of one custom node folder (argv[1]), then what the test reads of it, as JSON.
LOAD_LIKE_COMFYUI = """
import importlib.util, json, os, sys
preloaded = sys.argv[2] == "preloaded"
if preloaded:
    import minimax_h3_vae.comfyui
module_path = sys.argv[1]
sys_module_name = os.path.basename(module_path) if sys.argv[3] == "old" else module_path.replace(".", "_x_")
spec = importlib.util.spec_from_file_location(sys_module_name, os.path.join(module_path, "__init__.py"))
module = importlib.util.module_from_spec(spec)
sys.modules[sys_module_name] = module
path_before = list(sys.path)
spec.loader.exec_module(module)
import minimax_h3_vae
nodes = module.NODE_CLASS_MAPPINGS
print(json.dumps({
    "nodes": sorted(nodes),
    "names": sorted(module.NODE_DISPLAY_NAME_MAPPINGS),
    "package": minimax_h3_vae.__file__,
    "same_objects": nodes is minimax_h3_vae.comfyui.NODE_CLASS_MAPPINGS,
    "inputs": sorted(nodes["MiniMaxH3DecoderLoader"].INPUT_TYPES()["required"]),
    "path_unchanged": sys.path == path_before,
}))
"""


def load_like_comfyui(folder: Path, preloaded: bool = False, old_naming: bool = False) -> dict:
    loader = "old" if old_naming else "bd34f338"
    # The child runs in ComfyUI's folder: a relative PYTHONPATH entry (a checkout run as `PYTHONPATH=.` rather than
    # installed) is made absolute, so the installed package stays importable there, as an install makes it.
    paths = [str(Path(entry).resolve()) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)} if paths else None
    result = subprocess.run(
        [sys.executable, "-c", LOAD_LIKE_COMFYUI, str(folder), "preloaded" if preloaded else "fresh", loader],
        capture_output=True,
        text=True,
        cwd=folder.parents[1],  # ComfyUI's own folder, where main.py runs
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# What a clone holds that loading the pack reads: the root's files and the two folders of code.
PACK = ("__init__.py", "requirements.txt", "pyproject.toml", "README.md", "LICENSE", "minimax_h3_vae", "comfyui")


def clone(tmp_path: Path, name: str) -> Path:
    """The repository's files as a clone leaves them in ComfyUI/custom_nodes/<name>/ (caches left out)."""
    folder = tmp_path / "ComfyUI" / "custom_nodes" / name
    for entry in PACK:
        if (REPO / entry).is_dir():
            shutil.copytree(REPO / entry, folder / entry, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / entry, folder / entry)
    return folder


@pytest.mark.parametrize("name", ["minimax_h3_vae", "ComfyUI-MiniMax-H3.vae"])
def test_a_clone_in_custom_nodes_loads_the_nodes_from_itself(tmp_path, name):
    """Bug: the repository root was no node pack, so a clone in custom_nodes/ loaded nothing. The clone's own
    package is imported (also when the folder is named like the package, or holds a dot), under its own name, and
    sys.path is left alone."""
    folder = clone(tmp_path, name)
    loaded = load_like_comfyui(folder)
    assert set(loaded["nodes"]) == set(loaded["names"]) == NODES
    assert Path(loaded["package"]).resolve() == (folder / "minimax_h3_vae" / "__init__.py").resolve()
    assert loaded["same_objects"] and loaded["path_unchanged"]
    assert {"fused", "tile_batch", "gemm", "attention"} <= set(loaded["inputs"])


def test_a_package_already_imported_is_the_one_used(tmp_path):
    """Another node pack (the linked one, say) imported the installed package first: the clone uses that copy
    rather than importing a second one under the same name."""
    folder = clone(tmp_path, "minimax_h3_vae")
    loaded = load_like_comfyui(folder, preloaded=True)
    assert set(loaded["nodes"]) == NODES and loaded["same_objects"]
    assert Path(loaded["package"]).resolve() == (REPO / "minimax_h3_vae" / "__init__.py").resolve()


def test_a_clone_imported_by_the_package_name_gives_the_package(tmp_path):
    """Where a clone folder named minimax_h3_vae is imported by that name (custom_nodes/ on sys.path, or an older
    ComfyUI that names a pack's module after its folder), the import gives the package, not the folder."""
    folder = clone(tmp_path, "minimax_h3_vae")
    script = (
        "import minimax_h3_vae, minimax_h3_vae.comfyui as c; print(minimax_h3_vae.__file__, len(c.NODE_CLASS_MAPPINGS))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=folder.parent, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    package, count = result.stdout.split()
    assert Path(package).resolve() == (folder / "minimax_h3_vae" / "__init__.py").resolve() and count == "4"


def test_a_clone_named_like_the_package_in_an_older_comfyui(tmp_path):
    """An older ComfyUI registers the clone folder minimax_h3_vae as the module minimax_h3_vae before running it:
    the pack loads its nodes, and the name is the package's again."""
    folder = clone(tmp_path, "minimax_h3_vae")
    loaded = load_like_comfyui(folder, old_naming=True)
    assert set(loaded["nodes"]) == set(loaded["names"]) == NODES and loaded["same_objects"]
    assert Path(loaded["package"]).resolve() == (folder / "minimax_h3_vae" / "__init__.py").resolve()


def test_the_linked_pack_loads_the_installed_package():
    loaded = load_like_comfyui(REPO / "comfyui" / "minimax_h3_vae_nodes")
    assert set(loaded["nodes"]) == NODES
    assert Path(loaded["package"]).resolve() == (REPO / "minimax_h3_vae" / "__init__.py").resolve()


def test_requirements_txt_is_the_package_dependencies_less_torch():
    """What ComfyUI-Manager installs for a clone is what pyproject.toml declares, at the same floors; torch is
    ComfyUI's own."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (REPO / "requirements.txt").read_text().splitlines()
    required = [line for line in lines if line.strip() and not line.startswith("#")]
    assert required == [d.split(";")[0].split("#")[0].strip() for d in declared if not d.startswith("torch")]


def test_the_registry_metadata():
    """pyproject.toml carries the Comfy registry's [tool.comfy] table (read by ComfyUI's comfy_config too)."""
    comfy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["comfy"]
    assert {"PublisherId", "DisplayName", "Icon", "includes"} <= set(comfy)
    assert comfy["DisplayName"] and isinstance(comfy["includes"], list)
