"""A stand-in for the parts of ComfyUI (upstream 0.32.0, commit bd34f338) that our nodes meet, for CI, which has
no ComfyUI. It behaves as ComfyUI does where it matters (read from ComfyUI's comfy/sd.py, comfy/model_management.py
and comfy/ldm/minimax/vae.py; the real server is tools' real-comfyui check, run before a release):

- every node runs under `torch.inference_mode()`, and the VAE Loader's weights are made there too, so they are
  inference tensors (no version counter);
- `VAE.__init__` casts the first stage model to the VAE's dtype (`first_stage_model.to(vae_dtype)`), keeps
  `device`, `vae_dtype` and a `patcher` whose model is loaded onto the device before a decode
  (`model_management.load_models_gpu`) and may be offloaded afterwards (its tensors then live elsewhere: here
  on the meta device, with the values kept aside, and come back as new tensors);
- `VAE.decode(samples)` loads the model, preallocates a float32 output from `decode_output_shape` on the
  intermediate device (the CPU), calls `first_stage_model.decode(samples.to(device, vae_dtype),
  output_buffer=...)` and returns the frames with the channels last: (B, F, H, W, 3);
- the first stage model has the release's module names (decoder.x_embedder, decoder.transformer_blocks.N...,
  decoder.mask_token, post_quant_conv), the latent statistics as buffers, non-persistent buffers as ComfyUI
  has them, and its own `decode` (here a recorder that fills zeros).
"""

from __future__ import annotations

import sys
import types

import torch
from repo import TINY
from safetensors.torch import load_file

from minimax_h3_vae import H3VideoDecoder
from minimax_h3_vae.model import H3Decoder
from minimax_h3_vae.tiling import plan_chunks


class FirstStage(H3Decoder):
    """ComfyUI's MiniMaxH3VideoVAE, as far as our nodes see it: its parameters and buffers (names, shapes,
    which are persistent) and its decode contract."""

    comfy_has_chunked_io = True

    def __init__(self, config):
        super().__init__(config)
        self.decoder.register_buffer("mask_token", torch.zeros(1, 1, config.dim))
        self.register_buffer("latents_mean", torch.tensor(config.latents_mean))
        self.register_buffer("latents_std", torch.tensor(config.latents_std))
        # Non-persistent, as in ComfyUI: not in its state_dict.
        self.register_buffer("pixel_mean", torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1, 1), persistent=False)
        self.decoder.register_buffer("rope_inv_freq", torch.ones(8), persistent=False)
        self.own_decodes = []

    def decode_output_shape(self, shape):
        """ComfyUI's frame plan, which equals ours (tests/test_comfyui.py checks it against worked examples)."""
        batch, _, frames, h, w = shape
        return (batch, 3, plan_chunks(frames, self.config).out_frames, 16 * h, 16 * w)

    def decode(self, z, output_buffer=None):
        """ComfyUI's own decode, recorded: zeros in ComfyUI's contract."""
        self.own_decodes.append(tuple(z.shape))
        out = torch.zeros(self.decode_output_shape(z.shape))
        if output_buffer is None:
            return out
        return output_buffer.copy_(out)


class Patcher:
    """ComfyUI's ModelPatcher, as far as loading and offloading go: `load()` puts the model's tensors on the
    load device, `offload()` moves them away (to the meta device here, their values kept aside; a move across
    devices gives new tensors)."""

    def __init__(self, model: torch.nn.Module, load_device: torch.device):
        self.model, self.load_device = model, load_device
        self.kept: dict[tuple[int, str], torch.Tensor] | None = None
        self.loads = 0

    def _place(self, where) -> None:
        # As ComfyUI's set_attr_param / set_attr_buffer (comfy/utils.py): each tensor is replaced, a parameter by a
        # new Parameter, a buffer keeping its persistence (setattr on a registered buffer's name keeps it).
        for module in self.model.modules():
            tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            for name, tensor in tensors:
                moved = where(module, name, tensor.detach())
                setattr(
                    module, name, torch.nn.Parameter(moved, False) if isinstance(tensor, torch.nn.Parameter) else moved
                )

    @torch.inference_mode()
    def offload(self) -> None:
        self.kept = {}

        def away(module, name, tensor):
            self.kept[id(module), name] = tensor.clone()
            return torch.empty_like(tensor, device="meta")

        self._place(away)

    @torch.inference_mode()
    def load(self) -> None:
        self.loads += 1
        if self.kept is not None:
            self._place(lambda module, name, tensor: self.kept[id(module), name].to(self.load_device).clone())
            self.kept = None


class VAE:
    """ComfyUI's `comfy.sd.VAE` holding the H3 video VAE (see the module docstring)."""

    def __init__(self, state: dict[str, torch.Tensor], config, dtype=torch.float32, device="cpu"):
        with torch.inference_mode():  # ComfyUI's VAE Loader runs inside inference mode
            stage = FirstStage(config).eval()
            names = stage.state_dict().keys()
            stage.load_state_dict({k: v for k, v in state.items() if k in names}, strict=False)
            stage.to(dtype)
        self.first_stage_model = stage
        self.device = torch.device(device)
        self.vae_dtype = dtype
        self.patcher = Patcher(stage, self.device)

    def decode(self, samples_in: torch.Tensor) -> torch.Tensor:
        """comfy/sd.py `VAE.decode` for a model with chunked output: (B, F, H, W, 3) float32."""
        management = sys.modules["comfy.model_management"]
        management.load_models_gpu([self.patcher], memory_required=1, force_full_load=False)
        stage = self.first_stage_model
        out = torch.empty(stage.decode_output_shape(samples_in.shape), dtype=torch.float32)
        stage.decode(samples_in.to(device=self.device, dtype=self.vae_dtype), output_buffer=out)
        return out.movedim(1, -1)


def tiny_state() -> tuple[dict[str, torch.Tensor], object]:
    """The tiny checkpoint's tensors (release names) and its config."""
    state = load_file(str(TINY / "video_vae" / "source" / "model.safetensors"))
    return state, H3VideoDecoder.from_pretrained(TINY, device="cpu", fused=False).config


def tiny_vae(dtype=torch.float32) -> VAE:
    state, config = tiny_state()
    return VAE(state, config, dtype)


def install(monkeypatch) -> types.SimpleNamespace:
    """ComfyUI's `comfy.model_management` and `comfy.utils` as modules, recording what the nodes ask of them."""
    calls = types.SimpleNamespace(loads=[], frees=[], progress=[])
    management = types.ModuleType("comfy.model_management")

    def load_models_gpu(models, memory_required=0, force_full_load=False, **unused):
        calls.loads.append((len(models), memory_required, force_full_load))
        for patcher in models:
            patcher.load()

    management.load_models_gpu = load_models_gpu
    management.free_memory = lambda need, device, **unused: calls.frees.append((need, device))
    management.get_torch_device = lambda: torch.device("cpu")
    management.vae_device = lambda: torch.device("cpu")
    management.intermediate_device = lambda: torch.device("cpu")
    utils = types.ModuleType("comfy.utils")

    class ProgressBar:
        def __init__(self, total):
            self.total = total

        def update_absolute(self, value, total=None):
            calls.progress.append((value, total))

    utils.ProgressBar = ProgressBar
    monkeypatch.setitem(sys.modules, "comfy", types.ModuleType("comfy"))
    monkeypatch.setitem(sys.modules, "comfy.model_management", management)
    monkeypatch.setitem(sys.modules, "comfy.utils", utils)
    return calls
