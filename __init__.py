"""ComfyUI node pack: this repository cloned into ComfyUI/custom_nodes/ (by hand, by ComfyUI-Manager from its git
URL, or by the Comfy registry), with `requirements.txt` installed into ComfyUI's Python.

ComfyUI imports this file as a package named after the folder's path, and exports the nodes ComfyUI finds in
`NODE_CLASS_MAPPINGS`. They live in the package `minimax_h3_vae` beside this file, which is imported under its own
name, as an installed copy would be: the decoders pickle, and the package's own messages name it, the same way
through every door. A copy already imported (an installed one, brought in by another node pack) is used as it is.
Nothing is added to sys.path. Outside ComfyUI this file plays no part: the package is `minimax_h3_vae/`.
"""

import importlib.util
import sys
from pathlib import Path


def _package():
    loaded = sys.modules.get("minimax_h3_vae")
    # This file itself holds that name where its folder is named minimax_h3_vae and imported by that name (an
    # older ComfyUI names a node pack's module after its folder; or custom_nodes/ is on sys.path): the package
    # then takes its name back, and an import by that name finds the package.
    if loaded is None or getattr(loaded, "__file__", None) == __file__:
        folder = Path(__file__).resolve().parent / "minimax_h3_vae"
        spec = importlib.util.spec_from_file_location(
            "minimax_h3_vae", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["minimax_h3_vae"] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            sys.modules.pop("minimax_h3_vae", None)
            raise
    return importlib.import_module("minimax_h3_vae.comfyui")


_nodes = _package()
NODE_CLASS_MAPPINGS = _nodes.NODE_CLASS_MAPPINGS
NODE_DISPLAY_NAME_MAPPINGS = _nodes.NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
