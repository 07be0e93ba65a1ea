"""ComfyUI nodes: load the H3 video decoder once, or decode with the ComfyUI VAE a workflow already holds.

ComfyUI finds them through `NODE_CLASS_MAPPINGS` / `NODE_DISPLAY_NAME_MAPPINGS`, re-exported by the node
pack in `comfyui/minimax_h3_vae_nodes/` of the source tree. ComfyUI's own modules (`folder_paths`,
`comfy.utils`, `comfy.model_management`) are imported only when a node runs, and only if present: the
nodes work without them.

ComfyUI runs every node under `torch.inference_mode()`, so a VAE it loaded holds inference tensors; the nodes
read such tensors as they are and change nothing process-wide.

The nodes that take a ComfyUI VAE keep nothing of its weights between decodes: each decode asks ComfyUI to
load the VAE where it computes (as ComfyUI's own VAE Decode does), builds our decoder on the VAE's tensors as
they are at that moment (shared where they already have the recipe's dtype and the device, converted for that
decode alone where not) and drops it afterwards. A weight replaced, patched in place (ComfyUI's patcher writes
`param.data.copy_(...)`), moved or cast between two decodes is therefore what the next decode uses, and after
ComfyUI offloads the VAE no second copy of it is left on the GPU.
"""

from __future__ import annotations

import copy
import importlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import memory
from .checkpoints import Checkpoint, CheckpointError, checkpoint_in_memory, load_checkpoint
from .checkpoints.comfyui import comfyui_config
from .config import H3DecoderConfig
from .decoding import H3VideoDecoder
from .frames import NON_FINITE_FRAMES, to_unit_rgb
from .latents import check_latents, denormalize_latents
from .model import H3Decoder
from .runtime import DecodeOptions, Runtime, check_machine, resolve, resolve_call
from .tiling import plan_chunks

DECODER_TYPE = "MINIMAX_H3_DECODER"
CATEGORY = "latent/minimax_h3"
# The loader's file list entry meaning "use the path field instead".
PATH_CHOICE = "(path below)"
FUSED_CHOICES = {"auto": None, "on": True, "off": False}
# The run options every node offers, as ComfyUI widgets; `node_options` turns their values into options.
RUN_INPUTS = {
    "fused": (list(FUSED_CHOICES), {"default": "auto", "tooltip": "Triton kernels; auto: on CUDA"}),
    "tile_batch": (
        "INT",
        {"default": 0, "min": 0, "max": 4096, "tooltip": "tiles per decoder call; 0: as many as fit"},
    ),
    "gemm": (
        ["auto", "cublas", "quack"],
        {"default": "auto", "tooltip": "block GEMMs of the fused fp16 path; auto: quack on Hopper where installed"},
    ),
    "attention": (
        ["auto", "sdpa", "fa4"],
        {
            "default": "auto",
            "tooltip": "attention of the fused fp16 path; auto: FlashAttention 4 on Hopper where installed",
        },
    ),
}
# The ComfyUI versions whose H3 video VAE these nodes were checked against (README, "ComfyUI nodes"): 0.32.0
# (commit bd34f338) in a real server, and the later comfy-kitchen vae.py (commit 2266077b) by its module
# structure. A VAE whose decoder holds other tensors is refused with this in the message.
SUPPORTED_COMFYUI = "ComfyUI 0.32.0 (commit bd34f338) to commit 2266077b"
# Floating-point dtypes an output buffer may have: ComfyUI preallocates it in its intermediate dtype.
BUFFER_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class NodeDecoder:
    """What the loader node outputs: the (shared, cached) decoder and this node's tiles per call, which each
    decode passes as a per-call option (the shared decoder itself is never changed)."""

    decoder: H3VideoDecoder
    tile_batch: int | None

    @property
    def runtime(self) -> Runtime:
        """The run settings a decode through this node uses."""
        return resolve_call(self.decoder.runtime, self.decoder.config, tile_batch=self.tile_batch)


# The last loaded decoder, keyed by the identity of every file it was read from and the load options. One
# entry: a second one would hold another 4.8 GB of weights on the GPU.
_cache: dict[tuple, H3VideoDecoder] = {}


def loaded_decoders() -> int:
    """How many decoders the loader node holds: 0, or 1 after a load."""
    return len(_cache)


def release_decoders() -> None:
    """Forget the loader node's decoder; its memory is freed once nothing else refers to it (a later load reads
    the checkpoint again)."""
    _cache.clear()


def _optional(module: str):
    """A ComfyUI module when running inside ComfyUI, else None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


class H3DecoderLoader:
    """Loads a MiniMax-H3 video VAE checkpoint (any layout this package reads) as a decoder, once."""

    DESCRIPTION = "Loads the MiniMax-H3 video decoder of minimax_h3_vae from models/vae or any path."
    RETURN_TYPES = (DECODER_TYPE,)
    RETURN_NAMES = ("decoder",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        folder_paths = _optional("folder_paths")
        names = folder_paths.get_filename_list("vae") if folder_paths is not None else []
        return {
            "required": {
                "vae_name": ([*names, PATH_CHOICE], {"tooltip": "a checkpoint in models/vae"}),
                "path": (
                    "STRING",
                    {"default": "", "tooltip": f"used when vae_name is {PATH_CHOICE}: a file or folder"},
                ),
                **RUN_INPUTS,
            }
        }

    def load(
        self, vae_name: str, path: str, fused: str, tile_batch: int, gemm: str = "auto", attention: str = "auto"
    ) -> tuple[NodeDecoder]:
        options = node_options(fused, tile_batch, gemm, attention, _device())
        source = _source(vae_name, path)
        shared = options.replace(tile_batch=None)  # the tile batch is this node's, passed with each decode
        checkpoint = load_checkpoint(source)  # its headers only: which files it is read from
        key = (_identity(source, checkpoint), shared)
        if key not in _cache:
            _cache.clear()  # free the previous decoder before loading the next
            _cache[key] = H3VideoDecoder.from_checkpoint(checkpoint, shared)
        return (NodeDecoder(_cache[key], options.tile_batch),)


class H3Decode:
    """Decodes a MiniMax-H3 LATENT into IMAGE frames with a decoder from the loader node."""

    DESCRIPTION = "Decodes MiniMax-H3 video latents with minimax_h3_vae; frames of every video, in order."
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"decoder": (DECODER_TYPE,), "samples": ("LATENT",)}}

    def decode(self, decoder: NodeDecoder, samples: dict) -> tuple[torch.Tensor]:
        """samples["samples"]: normalised latents (B, 24, T, h, w), as ComfyUI stores H3 latents, or the packed
        audio + video latent of ComfyUI's H3 sampler (its video part is decoded, `video_latents`) -> IMAGE
        (B * F, 16h, 16w, 3) float32 in [0, 1] on the CPU, video b's frames at [b * F, (b + 1) * F).

        The frames are written chunk by chunk into one preallocated CPU tensor, so GPU memory holds one
        temporal chunk of output at a time.
        """
        if not isinstance(decoder, NodeDecoder):
            raise ValueError(f"decoder must be the output of {NODE_DISPLAY_NAME_MAPPINGS['MiniMaxH3DecoderLoader']}")
        z = latent_samples(samples, decoder.decoder.config.latent_channels)
        make_room(decoder.decoder, z, decoder.tile_batch)
        return (decode_to_images(decoder.decoder, z, decoder.tile_batch),)


class H3DecodeWithVAE:
    """Decodes a MiniMax-H3 LATENT with minimax_h3_vae, built from the ComfyUI VAE the workflow already holds
    (no second copy of the weights is read)."""

    DESCRIPTION = (
        "Decodes MiniMax-H3 video latents with minimax_h3_vae, using the weights of the VAE already loaded; "
        "falls back to the VAE's own decode for quantized or partly loaded weights."
    )
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": ("VAE",),
                "samples": ("LATENT",),
                **RUN_INPUTS,
            }
        }

    def decode(
        self,
        vae,
        samples: dict,
        fused: str = "auto",
        tile_batch: int = 0,
        gemm: str = "auto",
        attention: str = "auto",
    ) -> tuple[torch.Tensor]:
        """As `H3Decode.decode`, with the decoder made from `vae.first_stage_model` for this decode
        (`decoder_for_vae`), after ComfyUI has loaded the VAE where it computes."""
        config = _structure(_h3_state(vae))
        options = node_options(fused, tile_batch, gemm, attention, _vae_device(vae))
        z = latent_samples(samples, config.latent_channels)
        _load_vae(vae, config, z, options)
        model = decoder_for_vae(vae, options.replace(tile_batch=None))
        if model is None:
            _warn_own_decode()
            video = vae.decode(z)  # ComfyUI's VAE.decode: (B, F, H, W, 3) frames in [0, 1]
            return (video.reshape(-1, *video.shape[-3:]),)
        return (decode_to_images(model, z, options.tile_batch),)


class H3UseForVAE:
    """VAE -> VAE: the same VAE, whose video decode runs through minimax_h3_vae. Its output plugs into the
    stock VAE Decode and the H3 conditioning nodes (encoding is the VAE's own)."""

    DESCRIPTION = "Makes a MiniMax-H3 VAE decode video with minimax_h3_vae; everything else stays the VAE's own."
    RETURN_TYPES = ("VAE",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",), **RUN_INPUTS}}

    def patch(
        self, vae, fused: str = "auto", tile_batch: int = 0, gemm: str = "auto", attention: str = "auto"
    ) -> tuple:
        """A shallow copy of `vae` whose `first_stage_model` is a shallow copy of the original (the same
        weights, buffers and submodules) with ComfyUI's decode contract served by our decoder:
        `decode(z, output_buffer=None)` takes normalised latents (B, 24, T, h, w) and returns float32
        (B, 3, F, H, W) in [0, 1], written into `output_buffer` when given; `decode_output_shape(shape)`
        and `decode_tiled` match it (tile settings are ignored: the decoder tiles as released, as ComfyUI's
        own H3 VAE does). The VAE given is not changed."""
        # Checks now that it is H3's video VAE, of a known structure (its statistics are read at each decode).
        config = _structure(_h3_state(vae))
        options = node_options(fused, tile_batch, gemm, attention, _vae_device(vae))
        stage = copy.copy(vae.first_stage_model)  # its parameter, buffer and module tables are the original's
        own_decode = getattr(vae.first_stage_model, "decode", None)

        def decode(z, output_buffer=None, **unused):
            _load_vae(vae, config, z, options)
            model = decoder_for_vae(vae, options.replace(tile_batch=None))
            if model is None:
                _warn_own_decode()
                return own_decode(z, output_buffer=output_buffer)
            return decode_into(model, z, options.tile_batch, output_buffer, progress=_progress_bar())

        def decode_output_shape(shape):
            batch, _, frames, h, w = shape
            c = config
            return (batch, c.out_channels, plan_chunks(frames, c).out_frames, h * c.patch_size, w * c.patch_size)

        stage.decode = decode
        stage.decode_tiled = lambda z, *tile_settings, **named: decode(z)
        stage.decode_output_shape = decode_output_shape
        patched = copy.copy(vae)
        patched.first_stage_model = stage
        return (patched,)


def node_options(
    fused: str, tile_batch: int, gemm: str = "auto", attention: str = "auto", device: torch.device | None = None
) -> DecodeOptions:
    """The run options of a node's widgets (RUN_INPUTS), checked, on `device`."""
    if not isinstance(fused, str) or fused not in FUSED_CHOICES:
        raise ValueError(f"fused must be one of {', '.join(map(repr, FUSED_CHOICES))}, got {fused!r}")
    if isinstance(tile_batch, bool) or not isinstance(tile_batch, int) or tile_batch < 0:
        raise ValueError(f"tile_batch must be a whole number of tiles >= 0 (0: as many as fit), got {tile_batch!r}")
    return DecodeOptions(
        device=device, fused=FUSED_CHOICES[fused], tile_batch=tile_batch or None, gemm=gemm, attention=attention
    )


def _describe(value) -> str:
    """What a value is, in words, for messages about wrong inputs."""
    if value is None:
        return "nothing (None)"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if type(value).__module__ == "numpy":
        return "a numpy array"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:5]}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return "a value of another kind"


def latent_samples(samples, channels: int) -> torch.Tensor:
    """The normalised video latents (B, channels, T, h, w) of a ComfyUI LATENT (a dict holding them under
    "samples"), checked as the command checks latents: floating point, finite, within range. ValueError naming
    what is wrong otherwise."""
    if not isinstance(samples, dict):
        raise ValueError(f"samples must be a ComfyUI LATENT (a dict with 'samples'), got {_describe(samples)}")
    if "samples" not in samples:
        raise ValueError(f"this LATENT holds no 'samples' (it has {sorted(map(str, samples))[:5]})")
    z = video_latents(samples["samples"])
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"the LATENT's samples must be latents (B, 24, T, h, w), got {_describe(z)}")
    check_latents(z, channels)
    return z


def video_latents(samples):
    """The video part of a LATENT's samples: a plain (B, 24, T, h, w) tensor as it is, or, for the packed
    audio + video latent that ComfyUI's H3 sampler outputs (a ComfyUI NestedTensor: not a torch.Tensor,
    `is_nested` True, `unbind()` giving (video, audio)), its first part, as ComfyUI's VAE Decode takes it."""
    if not isinstance(samples, torch.Tensor) and getattr(samples, "is_nested", False) and hasattr(samples, "unbind"):
        parts = list(samples.unbind())
        if not parts:
            raise ValueError("the packed LATENT holds no latents: give the (B, 24, T, h, w) video latents")
        if not isinstance(parts[0], torch.Tensor) or parts[0].is_nested:
            raise ValueError("the packed LATENT's video part is itself packed: give the (B, 24, T, h, w) video latents")
        return parts[0]
    if isinstance(samples, torch.Tensor) and samples.is_nested:
        raise ValueError("a torch nested tensor is not an H3 LATENT: give the (B, 24, T, h, w) video latents")
    return samples


def decode_into(
    model: H3VideoDecoder,
    z: torch.Tensor,
    tile_batch: int | None,
    output_buffer: torch.Tensor | None = None,
    progress=None,
    channels_last: bool = False,
) -> torch.Tensor:
    """ComfyUI's decode contract: normalised latents (B, 24, T, h, w), any float dtype -> float32 frames
    (B, 3, F, 16h, 16w) in [0, 1], written chunk by chunk into `output_buffer` (a floating-point tensor of
    that shape on any device with data, any strides) when given, else into a new CPU tensor (with
    `channels_last`, a (B, 3, F, H, W) view of a contiguous (B, F, H, W, 3) one: ComfyUI's IMAGE layout).
    Frames holding NaN or Inf are a ValueError, as they are to the command. progress(done, total) as in
    `decode_stream`."""
    c = model.config
    if not isinstance(z, torch.Tensor):
        raise ValueError(f"latents must be a (B, {c.latent_channels}, T, h, w) tensor, got {_describe(z)}")
    check_latents(z, c.latent_channels)
    z = denormalize_latents(z.float().to(model.device), c)
    batch, _, latent_frames, height, width = z.shape
    shape = (
        batch,
        c.out_channels,
        plan_chunks(latent_frames, c).out_frames,
        height * c.patch_size,
        width * c.patch_size,
    )
    if output_buffer is None and channels_last:
        output_buffer = torch.empty(shape[0], *shape[2:], shape[1]).permute(0, 4, 1, 2, 3)
    elif output_buffer is None:
        output_buffer = torch.empty(shape)
    elif not isinstance(output_buffer, torch.Tensor) or output_buffer.dtype not in BUFFER_DTYPES:
        got = output_buffer.dtype if isinstance(output_buffer, torch.Tensor) else _describe(output_buffer)
        raise ValueError(f"output_buffer must be a float32 (or float16 / bfloat16) tensor, got {got}")
    elif output_buffer.is_meta:
        raise ValueError("output_buffer is on the meta device and holds no data: give a buffer on 'cpu' or 'cuda'")
    elif tuple(output_buffer.shape) != shape:
        raise ValueError(f"output_buffer is {tuple(output_buffer.shape)}, the decode gives {shape}")
    start = 0
    for chunk in model.decode_stream(z, progress, tile_batch=tile_batch):
        if not torch.isfinite(chunk).all():
            raise ValueError(f"MiniMax-H3 decode: {NON_FINITE_FRAMES}")
        count = chunk.shape[2]
        output_buffer[:, :, start : start + count].copy_(to_unit_rgb(chunk))
        start += count
    return output_buffer


def decode_to_images(model: H3VideoDecoder, z: torch.Tensor, tile_batch: int | None) -> torch.Tensor:
    """Normalised latents (B, 24, T, h, w) -> IMAGE (B * F, 16h, 16w, 3) float32 in [0, 1] on the CPU, video
    b's frames at [b * F, (b + 1) * F): `decode_into` one preallocated CPU tensor in ComfyUI's layout, so GPU
    memory holds one temporal chunk of output at a time; ComfyUI's progress bar follows the tiles."""
    video = decode_into(model, z, tile_batch, progress=_progress_bar(), channels_last=True)
    return video.permute(0, 2, 3, 4, 1).flatten(0, 1)  # a view: the buffer is (B, F, H, W, 3) already


def _progress_bar():
    """progress(done, total) that moves ComfyUI's progress bar (in the browser, per tile), or None outside it."""
    utils = _optional("comfy.utils")
    if utils is None:
        return None
    bar = utils.ProgressBar(1)
    return lambda done, total: bar.update_absolute(done, total)


def _working_set(plan: memory.MemoryPlan) -> int:
    """Bytes of GPU memory a decode of this memory plan needs besides the weights."""
    return plan.device - plan.weights - plan.streamed_slots


def make_room(model: H3VideoDecoder, z: torch.Tensor, tile_batch: int | None) -> None:
    """Inside ComfyUI on CUDA, for the loader's own decoder: ask ComfyUI's model management to make room for
    this decode's memory plan."""
    management = _optional("comfy.model_management")
    if management is None or model.device.type != "cuda" or not hasattr(management, "free_memory"):
        return
    management.free_memory(_working_set(model.memory_plan(tuple(z.shape), tile_batch=tile_batch)), model.device)


def _load_vae(vae, config: H3DecoderConfig, z: torch.Tensor, options: DecodeOptions) -> None:
    """Inside ComfyUI: have it load the whole VAE where it computes, with room for this decode's memory plan,
    as its own VAE Decode does before decoding (a VAE it offloaded comes back; other models make room)."""
    management = _optional("comfy.model_management")
    patcher = getattr(vae, "patcher", None)
    if management is None or patcher is None or not hasattr(management, "load_models_gpu"):
        return
    need = 0
    if check_machine(options)[0].type == "cuda":  # the whole VAE loaded: the decoder built on it holds every weight
        runtime = resolve(options.replace(offload="none"), config)
        need = _working_set(memory.decode_plan(config, tuple(z.shape), runtime.dtype, "cuda", runtime))
        if runtime.kernels.linear_qk_rms_norm_rope == "quack":  # its w_qkv: a copy in the GEMM's row order
            qkv = config.num_layers * 3 * config.dim * (config.dim + 1)
            need += qkv * torch.empty(0, dtype=runtime.dtype).element_size()
    management.load_models_gpu([patcher], memory_required=need, force_full_load=True)


def _warn_own_decode() -> None:
    warnings.warn(
        "minimax_h3_vae: this VAE's weights are quantized, or not all on its device (a partial load); "
        "decoding with the VAE's own decode",
        stacklevel=3,
    )


# The parts of an H3 video VAE's first_stage_model our decoder is made from (ComfyUI names them as the release).
_H3_VIDEO_PARTS = ("decoder.x_embedder", "decoder.transformer_blocks", "decoder.proj_out", "post_quant_conv")


def decoder_for_vae(vae, options: DecodeOptions) -> H3VideoDecoder | None:
    """Our decoder on the tensors of a ComfyUI VAE holding MiniMax-H3's video VAE, as they are now, on
    `options.device`: the VAE's tensors themselves where they already have the recipe's dtype there, copies
    for this decoder alone where not (it is made for one decode and dropped). None when its weights are
    quantized, not loaded (meta), or not all on `options.device` (ComfyUI loaded part of it); ValueError for
    another VAE, or an H3 VAE of a structure these nodes do not know."""
    state = _h3_state(vae)
    _structure(state)  # before anything is read
    if any(type(t) is not torch.Tensor or t.is_meta or not t.is_floating_point() for t in state.values()):
        return None
    if any(t.device != options.device for t in state.values()):
        return None
    checkpoint = checkpoint_in_memory(state, _read_config(state), "original", "the ComfyUI VAE")
    return H3VideoDecoder.from_checkpoint(checkpoint, options)


def _h3_state(vae) -> dict[str, torch.Tensor]:
    """The tensors our decoder is made from (decoder, post_quant_conv, latent statistics) of a ComfyUI VAE
    holding H3's video VAE, as they are now; ValueError for another VAE. Detached views: a quantized weight
    stays its own tensor type."""
    stage = getattr(vae, "first_stage_model", None)
    if not isinstance(stage, torch.nn.Module) or not all(_has(stage, part) for part in _H3_VIDEO_PARTS):
        raise ValueError("this VAE is not MiniMax-H3's video VAE (its model has no ViT decoder): use VAE Decode")
    everything = stage.state_dict(keep_vars=True)
    stats = ("latents_mean", "latents_std")
    names = [k for k in everything if k.startswith(("decoder.", "post_quant_conv.")) or k in stats]
    return {k: everything[k].detach() for k in names}


def _structure(state: dict[str, torch.Tensor]) -> H3DecoderConfig:
    """The config of a ComfyUI VAE's H3 tensors (the released latent statistics: the VAE's own may not hold
    values yet), after checking that they are exactly the tensors of an H3 decoder, by names and shapes;
    ValueError naming the supported ComfyUI versions otherwise. Reads no tensor."""
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    unread = {k: v for k, v in shapes.items() if k not in ("latents_mean", "latents_std")}
    try:
        config = comfyui_config(unread, None, "the ComfyUI VAE")  # no statistics given: none is read
        with torch.device("meta"):
            expected = {k: tuple(t.shape) for k, t in H3Decoder(config).state_dict().items()}
        Checkpoint("original", config, {}, shapes, "the ComfyUI VAE").check(expected)
    except CheckpointError as error:
        raise ValueError(
            f"{error}. These nodes read the MiniMax-H3 VAE of {SUPPORTED_COMFYUI}; with another ComfyUI, use VAE "
            "Decode, or Load MiniMax-H3 Decoder on the checkpoint file"
        ) from None
    return config


def _read_config(state: dict[str, torch.Tensor]) -> H3DecoderConfig:
    """The config of a ComfyUI VAE's H3 tensors whose structure `_structure` checked, with the VAE's own latent
    statistics (read from its tensors, which must hold values)."""
    shapes = {k: tuple(t.shape) for k, t in state.items()}
    return comfyui_config(shapes, lambda name: tuple(state[name].float().tolist()), "the ComfyUI VAE")


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False


def _identity(source: str, checkpoint: Checkpoint) -> tuple:
    """(path, size, mtime, inode) of every file the checkpoint is read from, its weights and its configs: a
    file rewritten in place, or swapped for another, is a different checkpoint."""
    files = set(checkpoint.files.values())
    if os.path.isdir(source):
        files.update(Path(source).rglob("*.json"))
    identity = []
    for path in sorted(files):
        stat = os.stat(path)
        identity.append((os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return tuple(identity)


def _source(vae_name: str, path: str) -> str:
    if not isinstance(vae_name, str) or not isinstance(path, str):
        raise ValueError("vae_name and path must be text: a file in models/vae, or a path to a checkpoint")
    if vae_name == PATH_CHOICE:
        if not path.strip():
            raise ValueError(f"vae_name is {PATH_CHOICE}: give the checkpoint's path")
        return os.path.expanduser(path.strip())
    folder_paths = _optional("folder_paths")
    full = folder_paths.get_full_path("vae", vae_name) if folder_paths is not None else None
    if full is None:
        raise ValueError(f"{vae_name!r} is not in ComfyUI's models/vae folder")
    return full


def _device() -> torch.device | None:
    """Where ComfyUI runs VAEs (its --cpu-vae honoured) when running inside ComfyUI, else None (CUDA when
    available)."""
    management = _optional("comfy.model_management")
    if management is None:
        return None
    return management.vae_device() if hasattr(management, "vae_device") else management.get_torch_device()


def _vae_device(vae) -> torch.device | None:
    """Where a ComfyUI VAE computes (`VAE.device`, set by ComfyUI at load), else where ComfyUI runs VAEs."""
    device = getattr(vae, "device", None)
    return torch.device(device) if isinstance(device, (str, torch.device)) else _device()


NODE_CLASS_MAPPINGS = {
    "MiniMaxH3DecoderLoader": H3DecoderLoader,
    "MiniMaxH3Decode": H3Decode,
    "MiniMaxH3DecodeWithVAE": H3DecodeWithVAE,
    "MiniMaxH3UseForVAE": H3UseForVAE,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "MiniMaxH3DecoderLoader": "Load MiniMax-H3 Decoder (minimax_h3_vae)",
    "MiniMaxH3Decode": "MiniMax-H3 Decode (minimax_h3_vae)",
    "MiniMaxH3DecodeWithVAE": "MiniMax-H3 Decode with VAE (minimax_h3_vae)",
    "MiniMaxH3UseForVAE": "Use minimax_h3_vae for this MiniMax-H3 VAE",
}
