"""ComfyUI node pack for an installed package: link or copy this folder into ComfyUI/custom_nodes/ after installing
the package from its clone into ComfyUI's Python (`/path/to/ComfyUI/python -m pip install /path/to/minimax_h3_vae`;
it is not on the package index). The nodes live in the package (minimax_h3_vae/comfyui/). A clone of the whole
repository in custom_nodes/ is a node pack itself (its root __init__.py); docs/comfyui.md."""

from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
