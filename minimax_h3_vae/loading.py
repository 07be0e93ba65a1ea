"""The load policy: where each of the decoder's tensors goes (the device, or pinned host memory for streamed
block linears) and in which dtype, read from a located checkpoint (checkpoints/), with the libraries' one-time
set-up in a thread while the weights load.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .blocks import EAGER_OPS, attention
from .checkpoints import Checkpoint
from .config import H3DecoderConfig
from .model import H3Decoder, is_block_linear
from .runtime import Runtime

# ---- the load policy ------------------------------------------------------------------------------------


def load_weights(
    model: H3Decoder, checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype, runtime: Runtime
) -> SimpleNamespace | None:
    """Fill `model` (built on the meta device) with the checkpoint's weights, each read straight to where it
    will live: block linears in `dtype` on the device, or with `runtime.offload == "blocks"` in pinned host
    memory; everything else float32 on the device (casts happen there: the same rounding as on the host).

    On CUDA the libraries' one-time set-up (`LibrarySetUp`) runs in a thread meanwhile; returns the ops it
    selected for `runtime.fused`, or None (CPU, or a failed set-up: the first decode then selects them).
    """
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    streamed = runtime.offload == "blocks"
    linear_home = torch.device("cpu") if streamed else device
    pin = streamed and device.type == "cuda"
    host_keys = {key for key in expected if is_block_linear(key)} if streamed else set()
    set_up = LibrarySetUp(model.config, device, dtype, runtime) if device.type == "cuda" else None
    state_dict = {}
    for key, tensor in checkpoint.tensors(expected, device, host_keys):
        if is_block_linear(key):
            tensor = tensor.to(device=linear_home, dtype=dtype)
            state_dict[key] = tensor.pin_memory() if pin and not tensor.is_pinned() else tensor
        else:
            state_dict[key] = tensor.to(device=device, dtype=torch.float32)
    ops = set_up.join() if set_up is not None else None  # (after a failed load it just ends by itself)
    # Parameters without grad before they are assigned: an inference tensor (ComfyUI loads its VAEs under
    # torch.inference_mode) may become a Parameter only so, outside inference mode too.
    model.eval().requires_grad_(False)
    model.load_state_dict(state_dict, strict=True, assign=True)
    return ops


class LibrarySetUp:
    """The one-time set-up of a process's first decode on a CUDA device, run in a thread while the weights
    load: the ops are selected and each launched once (a process's first Triton launch sets up Triton: about
    0.5 s on an H200; with gemm="quack" or attention="fa4", quack is imported and its GEMMs and flash-attn-4's
    kernel are built: 15-25 s), and cuBLAS, cuDNN and the attention backends each get one small call (about
    0.3 s of library loading and handles).
    Everything runs on two zero tokens; nothing here touches the model.

    `join()` returns the selected ops (the model keeps them, so they are selected once), or None when the
    set-up failed: it is only a head start, and the first decode then meets any real problem itself.
    """

    def __init__(self, config: H3DecoderConfig, device: torch.device, dtype: torch.dtype, runtime: Runtime):
        self.ops: SimpleNamespace | None = None
        self.thread = threading.Thread(
            target=self._run, args=(config, device, dtype, runtime), name="library-set-up", daemon=True
        )
        self.thread.start()

    def _run(self, config: H3DecoderConfig, device: torch.device, dtype: torch.dtype, runtime: Runtime) -> None:
        c = config
        try:
            with torch.cuda.device(device), torch.inference_mode():
                if runtime.fused:
                    from . import fused

                    ops = fused.select_ops(c, device, dtype, runtime.gemm, runtime.attention)
                    fused.warm_up(ops, c, device, dtype, runtime.gemm, runtime.attention)
                else:
                    ops = EAGER_OPS
                tokens = torch.zeros(1, 16, c.dim, device=device, dtype=dtype)
                F.linear(tokens, torch.zeros(c.dim, c.dim, device=device, dtype=dtype))
                channels = c.latent_channels
                kernel = torch.zeros(channels, channels, 1, 1, 1, device=device)
                F.conv3d(torch.zeros(1, channels, 1, 2, 2, device=device), kernel)
                q = tokens.view(1, 16, c.num_heads, -1).transpose(1, 2)
                attention(q, q, q, runtime.attention_backends)  # the run's backends, for this call alone
                torch.cuda.synchronize(device)
            self.ops = ops
        except Exception:  # only a head start: the first decode meets the same problem and reports it
            pass

    def join(self) -> SimpleNamespace | None:
        self.thread.join()
        return self.ops
