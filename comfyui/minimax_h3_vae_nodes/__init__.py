"""ComfyUI node pack: link or copy this folder into ComfyUI/custom_nodes/ after installing the package from its
clone into ComfyUI's Python (`/path/to/ComfyUI/python -m pip install -e /path/to/minimax_h3_vae`; it is not on
the package index). The nodes themselves live in the installed package (minimax_h3_vae/comfyui.py)."""

from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
