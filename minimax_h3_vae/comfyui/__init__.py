"""ComfyUI nodes: load the H3 video decoder once, or decode with the ComfyUI VAE a workflow already holds.

ComfyUI finds them through `NODE_CLASS_MAPPINGS` / `NODE_DISPLAY_NAME_MAPPINGS`, re-exported by the node packs of
the source tree: its root (a clone in custom_nodes/) and `comfyui/minimax_h3_vae_nodes/` (linked). ComfyUI's own
modules (`folder_paths`, `comfy.utils`, `comfy.model_management`) are imported only when a node runs, and only if
present: the nodes work without them.

ComfyUI runs every node under `torch.inference_mode()`, so a VAE it loaded holds inference tensors; the nodes
read such tensors as they are and change nothing process-wide.

The nodes that take a ComfyUI VAE keep nothing of its weights between decodes: each decode asks ComfyUI to
load the VAE where it computes (as ComfyUI's own VAE Decode does), builds our decoder on the VAE's tensors as
they are at that moment (shared where they already have the recipe's dtype and the device, converted for that
decode alone where not) and drops it afterwards. A weight replaced, patched in place (ComfyUI's patcher writes
`param.data.copy_(...)`), moved or cast between two decodes is therefore what the next decode uses, and after
ComfyUI offloads the VAE no second copy of it is left on the GPU.

The rooms: `nodes` (the four nodes and the loader's cache), `inputs` (widgets, options, LATENT checks), `vae` (a
ComfyUI VAE's H3 tensors, our decoder on them), `frames` (ComfyUI's decode contract and IMAGE layout) and `host`
(ComfyUI's own modules, when present).
"""

from .frames import decode_into, decode_to_images
from .host import make_room
from .inputs import PATH_CHOICE, latent_samples, node_options
from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, NodeDecoder, loaded_decoders, release_decoders
from .vae import decoder_for_vae

__all__ = [
    "NODE_CLASS_MAPPINGS",
    "NODE_DISPLAY_NAME_MAPPINGS",
    "PATH_CHOICE",
    "NodeDecoder",
    "decode_into",
    "decode_to_images",
    "decoder_for_vae",
    "latent_samples",
    "loaded_decoders",
    "make_room",
    "node_options",
    "release_decoders",
]
