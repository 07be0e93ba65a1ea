"""Putting a located checkpoint's tensors into a decoder: each weight read straight to where it will live
(`load_weights`), with the libraries' one-time set-up in a thread beside it on CUDA (`LibrarySetUp`).

Which kernels run is decided before this (`runtime.resolve`, `fused.choose_kernels`); here the model's ops for
them are launched once each, so that the first decode does not pay for Triton's, quack's and flash-attn-4's
set-up.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from . import fused
from .blocks import attention
from .checkpoints import Checkpoint
from .config import H3DecoderConfig
from .model import H3Decoder, conv3d_fp32, is_block_linear
from .runtime import Runtime


def load_weights(model: H3Decoder, checkpoint: Checkpoint, runtime: Runtime, ops: SimpleNamespace) -> None:
    """Fill `model` (built on the meta device) with the checkpoint's weights, each read straight to where it
    will live: block linears in `runtime.dtype` on `runtime.device`, or with `runtime.offload == "blocks"` in
    pinned host memory; everything else float32 on the device (casts happen there: the same rounding as on the
    host). A tensor that no cast copied is copied once if it is still a view of the file
    (`StoredCheckpoint.owned`): the decoder owns its weights; a checkpoint in memory shares them.

    On CUDA the libraries' one-time set-up (`LibrarySetUp`) runs in a thread meanwhile, launching `ops` (the
    model's, for `runtime.kernels`) once each.
    """
    device, dtype = runtime.device, runtime.dtype
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    streamed = runtime.offload == "blocks"
    linear_home = torch.device("cpu") if streamed else device
    pin = streamed and device.type == "cuda"
    host_keys = {key for key in expected if is_block_linear(key)} if streamed else set()
    set_up = LibrarySetUp(model.config, runtime, ops) if device.type == "cuda" else None
    state_dict = {}
    for key, tensor in checkpoint.tensors(expected, device, host_keys):
        if is_block_linear(key):
            tensor = checkpoint.owned(tensor.to(device=linear_home, dtype=dtype))
            state_dict[key] = tensor.pin_memory() if pin and not tensor.is_pinned() else tensor
        else:
            state_dict[key] = checkpoint.owned(tensor.to(device=device, dtype=torch.float32))
    if set_up is not None:
        set_up.join()  # (after a failed load it just ends by itself)
    # Parameters without grad before they are assigned: an inference tensor (ComfyUI loads its VAEs under
    # torch.inference_mode) may become a Parameter only so, outside inference mode too.
    model.eval().requires_grad_(False)
    model.load_state_dict(state_dict, strict=True, assign=True)


class LibrarySetUp:
    """The one-time set-up of a process's first decode on a CUDA device, run in a thread while the weights
    load: each kernel of the model's ops is launched once (`fused.warm_up`: a process's first Triton launch
    sets up Triton, about 0.5 s on an H200; with gemm="quack" or attention="fa4", quack's GEMMs and
    flash-attn-4's kernel are built, 15-25 s, quack having been imported when the kernels were chosen), and
    cuBLAS, the attention backends (cuDNN's first) and, in the float32 recipe, post_quant_conv's cuDNN conv
    (`model.conv3d_fp32`) each get one small call (about 0.3 s of library loading and handles). Everything runs
    on zeros (two tokens, one voxel); nothing here touches the model's weights.

    A set-up that fails is only a lost head start: the first decode then meets any real problem itself.
    """

    def __init__(self, config: H3DecoderConfig, runtime: Runtime, ops: SimpleNamespace):
        self.thread = threading.Thread(
            target=self._run, args=(config, runtime, ops), name="library-set-up", daemon=True
        )
        self.thread.start()

    def _run(self, config: H3DecoderConfig, runtime: Runtime, ops: SimpleNamespace) -> None:
        c, device, dtype = config, runtime.device, runtime.dtype
        try:
            with torch.cuda.device(device), torch.inference_mode():
                fused.warm_up(ops, runtime.kernels, c, device, dtype)
                tokens = torch.zeros(1, 16, c.dim, device=device, dtype=dtype)
                F.linear(tokens, torch.zeros(c.dim, c.dim, device=device, dtype=dtype))
                q = tokens.view(1, 16, c.num_heads, -1).transpose(1, 2)
                attention(q, q, q, runtime.attention_backends)  # the run's backends, for this call alone
                if dtype == torch.float32:  # H3Decoder.post_quant's conv
                    channels = c.latent_channels
                    conv3d_fp32(
                        torch.zeros(1, channels, 1, 1, 1, device=device),
                        torch.zeros(channels, channels, 1, 1, 1, device=device),
                        torch.zeros(channels, device=device),
                    )
                torch.cuda.synchronize(device)
        except Exception:  # only a head start: the first decode meets the same problem and reports it
            pass

    def join(self) -> None:
        self.thread.join()
