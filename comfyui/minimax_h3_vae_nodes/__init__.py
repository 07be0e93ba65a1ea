"""ComfyUI node pack: link or copy this folder into ComfyUI/custom_nodes/ after `pip install minimax-h3-vae`
into ComfyUI's Python. The nodes themselves live in the installed package (minimax_h3_vae/comfyui.py)."""

from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
