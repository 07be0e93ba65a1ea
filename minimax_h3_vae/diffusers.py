"""One-line drop-in for diffusers: `swap_decoder(pipe)` makes the pipeline's MiniMax-H3 VAE decode with ours.

    from minimax_h3_vae.diffusers import swap_decoder
    swap_decoder(pipe)  # pipe: MiniMaxH3ModularPipeline (or anything holding the VAE as `.vae`), or the VAE

The VAE keeps every module it had: diffusers' decoder stays `vae.decoder`, with its weights, so saving,
loading, casting, hooks, attention processors and training see the VAE they always saw. The swap adds a child
`vae.decoder.minimax_h3` (a `DecoderSwap`: the run options, and our decoder built from the VAE's decoder
tensors as they are) and makes `vae.decode` ours. Only this module imports diffusers; importing
`minimax_h3_vae` does not. The contract, in full: docs/diffusers.md.
"""

from __future__ import annotations

import functools
import re
import threading

import torch
from torch import nn

from .checkpoints import CheckpointError, checkpoint_in_memory
from .checkpoints.diffusers import diffusers_config
from .config import ConfigError
from .decoding import H3VideoDecoder
from .runtime import OPTION_NAMES, DecodeOptions, check_option_names
from .tiling import Tiling

# The `diffusers` extra: a clone's `pip install -e ".[diffusers]"`, or diffusers itself.
DIFFUSERS_EXTRA = 'pip install -e ".[diffusers]" from a clone of minimax_h3_vae, or pip install "diffusers>=0.42"'
try:
    from diffusers import AutoencoderKLMiniMaxH3
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.autoencoders.vae import DecoderOutput
    from diffusers.models.modeling_utils import get_parameter_dtype
    from diffusers.utils.accelerate_utils import apply_forward_hook
except ImportError as error:  # not installed, or a release without MiniMax-H3 (before 0.42)
    raise ModuleNotFoundError(
        f"minimax_h3_vae.diffusers needs diffusers 0.42 or newer ({error}): {DIFFUSERS_EXTRA}", name=error.name
    ) from None

# The run options swap_decoder takes: the VAE's switches set the tiling, at each decode.
SWAP_OPTIONS = tuple(name for name in OPTION_NAMES if name != "tiling")
# The child of the swapped `vae.decoder` that holds the swap.
SWAP_NAME = "minimax_h3"
# diffusers' hooks our decode honours: layerwise casting stores weights in a narrower dtype, which our decoder
# reads as the values they round to (its recipe casts every weight once, when it is built).
HONOURED_HOOKS = frozenset({"layerwise_casting"})
# What `vae.fuse_qkv_projections()` adds: copies of to_q / to_k / to_v, which stay and are what diffusers'
# MiniMax-H3 attention reads, so they are what ours reads too.
FUSED_COPIES = re.compile(r"decoder\.transformer_blocks\.\d+\.attn\.to_qkv\.(weight|bias)")


class SwapError(ValueError):
    """A target `swap_decoder` cannot swap, or a VAE setting the swapped decoder cannot reproduce."""


class _SwapCheck(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, nn.Module) and isinstance(getattr(obj, SWAP_NAME, None), DecoderSwap)


class SwappedDecoder(metaclass=_SwapCheck):
    """`isinstance(vae.decoder, SwappedDecoder)`: whether `swap_decoder` has swapped that VAE. The decoder itself
    stays diffusers' own module (its class, weights and submodules are unchanged); the swap is its child
    `minimax_h3`, a `DecoderSwap`."""


class DecoderSwap(nn.Module):
    """The swap, a child of the swapped `vae.decoder`: the run options, and our decoder built from the VAE's
    decoder tensors as they are (`decoder_for`).

    It holds no parameters or buffers, so the VAE's state_dict, save, load and casts see diffusers' decoder
    alone. Our decoder is built again when a tensor it was built from changed: replaced, moved, cast, or
    changed in place through torch (load_state_dict, an optimizer step). A change torch does not count (through
    `.data`, as EMAModel.copy_to writes) is not seen: call `refresh()` after it. Any move or cast of the VAE
    drops our decoder at once, freeing its memory where the VAE leaves. Copies and pickles carry the options.
    """

    def __init__(self, options: DecodeOptions):
        super().__init__()
        self.options = options
        self._built: tuple[tuple, H3VideoDecoder] | None = None  # (the tensors' fingerprint, our decoder)
        self._building = threading.Lock()

    def _apply(self, fn, recurse=True):
        self.refresh()
        return self

    def refresh(self) -> None:
        """Drop our decoder: the next decode builds it from the VAE's tensors as they are then."""
        self._built = None

    def __getstate__(self):
        state = {**self.__dict__, "_built": None}
        del state["_building"]
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._building = threading.Lock()

    def decoder_for(self, vae: AutoencoderKLMiniMaxH3) -> H3VideoDecoder:
        """Our decoder for `vae`'s decoder tensors as they are now, on the options' device or else theirs
        (built, or the one built from the same tensors before). Raises SwapError for tensors it cannot be built from."""
        stored = vae.decoder.state_dict(prefix="decoder.")
        stored.update(vae.post_quant_conv.state_dict(prefix="post_quant_conv."))
        tensors = {name: tensor for name, tensor in stored.items() if not FUSED_COPIES.fullmatch(name)}
        fingerprint = _fingerprint(tensors)
        with self._building:
            if self._built is None or fingerprint is None or self._built[0] != fingerprint:
                self._built = None  # the old decoder's memory is free before the new one is built
                self._built = (fingerprint, build_decoder(vae, tensors, self.options))
            return self._built[1]


def _fingerprint(tensors: dict[str, torch.Tensor]) -> tuple | None:
    """What identifies `tensors` as they are: each one's storage, torch's count of its in-place changes, dtype
    and device; None for inference tensors, which torch does not count (then our decoder is built per decode)."""
    if any(t.is_inference() for t in tensors.values()):
        return None
    return tuple((name, t.data_ptr(), t._version, t.dtype, t.device, t.shape) for name, t in tensors.items())


def build_decoder(
    vae: AutoencoderKLMiniMaxH3, tensors: dict[str, torch.Tensor], options: DecodeOptions
) -> H3VideoDecoder:
    """Our decoder from the VAE's decoder and post_quant_conv tensors (diffusers' names) with `options`, on
    their device when `options.device` is None; tensors already in the recipe's dtype and place are shared."""
    first = tensors["decoder.proj_in.weight"]
    if any(t.is_meta for t in tensors.values()):
        raise SwapError("the VAE's decoder weights are not loaded (meta device): load them before decoding")
    config = diffusers_config(dict(vae.config))
    checkpoint = checkpoint_in_memory(tensors, config, "diffusers", "the VAE's decoder")
    try:
        device = first.device if options.device is None else options.device
        return H3VideoDecoder.from_checkpoint(checkpoint, options.replace(device=device))
    except CheckpointError as error:
        raise SwapError(f"this AutoencoderKLMiniMaxH3 cannot be decoded by minimax_h3_vae: {error}") from None


def swap_decoder(target, *, options: DecodeOptions | None = None, **fields):
    """Make `target`'s MiniMax-H3 VAE decode with this package's decoder; returns `target`.

    target: an `AutoencoderKLMiniMaxH3`, or an object holding one as `.vae` (e.g. `MiniMaxH3ModularPipeline`).
    The run options are a `DecodeOptions` or its fields as keywords, as for `H3VideoDecoder.from_pretrained`:
    dtype is our precision recipe, `"fp16"` (default on CUDA: block linears fp16, the rest fp32) or `"fp32"`
    (default on CPU), whatever dtype the VAE was loaded in; fused, tile_batch, offload, max_gpu_memory (GiB),
    output_rank, attention_backends, gemm, attention; and device, where ours decodes: by default (None) the
    device of the VAE's decoder at each decode; given, ours lives there wherever the VAE is (a VAE kept on the
    CPU with device="cuda" leaves only ours on the GPU). The tiling follows the VAE's own switches at each
    decode: giving it here is a SwapError.

    The VAE keeps diffusers' decoder and its weights (see the module docstring). The swap freezes them
    (`requires_grad_(False)` on `vae.decoder` and `vae.post_quant_conv`), so that a decode outside
    `torch.no_grad()` is still ours. Afterwards `vae.decode(z, return_dict=True)` takes denormalised latents
    (B, 24, T, h, w) and returns a `DecoderOutput` (`return_dict=False`: a 1-tuple) whose `sample` is
    (B, 3, F, 16h, 16w) in the same ImageNet-normalised space, on our decoder's device, in the dtype diffusers'
    decoder gives (its proj_out's: float32 for an fp32 VAE; our float32 output rounded once). It honours
    `vae.use_tiling`, `enable_tiling(...)` and `disable_tiling()` at each call, as that call's tiling (a setting
    we cannot reproduce exactly raises `SwapError`), and also decodes T = 1 and T = 2, which the stock VAE
    cannot. When the decode must be differentiable (grad enabled, and the latents require grad or a weight of
    the decoder was made trainable again), it runs through diffusers' own modules instead, as unswapped.

    Raises SwapError for a target holding no H3 VAE, a VAE already swapped, a decoder without weights (meta:
    accelerate's device_map offload), hooks or processors our decode would not honour, or a config this package
    cannot decode; the target is then left unchanged.
    """
    vae = _find_vae(target)
    if isinstance(vae.decoder, SwappedDecoder):
        raise SwapError("this VAE's decoder is already swapped for minimax_h3_vae's")
    check_option_names(fields, SWAP_OPTIONS, "of swap_decoder")
    if options is not None and not isinstance(options, DecodeOptions):
        raise SwapError(
            f"options must be a minimax_h3_vae.DecodeOptions, got {type(options).__name__}; or give its fields "
            "as keywords (swap_decoder(pipe, tile_batch=4))"
        )
    if "tiling" in fields or (options is not None and options.tiling):
        raise SwapError("tiling: set by the VAE's own switches (enable_tiling / disable_tiling) at each decode")
    if options is not None and fields:
        raise SwapError(f"give either options= or the option fields {sorted(fields)}, not both")
    try:
        diffusers_config(dict(vae.config))
    except ConfigError as error:
        raise SwapError(f"this AutoencoderKLMiniMaxH3 cannot be swapped: {error}") from None
    options = options or DecodeOptions(**fields)
    _check_honoured(vae)
    swap = DecoderSwap(options)
    swap.decoder_for(vae)  # built now: what cannot be decoded is said at the swap, and the first decode is warm
    vae.decoder.requires_grad_(False)
    vae.post_quant_conv.requires_grad_(False)
    vae.decoder.add_module(SWAP_NAME, swap)
    vae.decode = functools.partial(swapped_decode, vae)  # a partial, unlike a bound method, survives pickling
    return target


def decoder_of(vae: AutoencoderKLMiniMaxH3) -> H3VideoDecoder:
    """The H3VideoDecoder a swapped VAE decodes with now (built from its tensors if they changed)."""
    return _swap_of(vae).decoder_for(vae)


@apply_forward_hook  # lets accelerate's offload hooks move the VAE first, as for the stock decode
def swapped_decode(vae: AutoencoderKLMiniMaxH3, z: torch.Tensor, return_dict: bool = True):
    """The swapped `vae.decode` (see `swap_decoder`): the VAE's tiling switches are this call's tiling."""
    swap = _swap_of(vae)
    if _differentiable(vae, z):
        return AutoencoderKLMiniMaxH3.decode(vae, z, return_dict=return_dict)
    _check_honoured(vae)
    h3 = swap.decoder_for(vae)
    video = h3.decode(z, tiling=vae_tiling(vae, h3.config.patch_size))
    # In the dtype diffusers' decoder gives (its proj_out's; float32 for an fp32 VAE): the values are ours.
    video = video.to(get_parameter_dtype(vae.decoder.proj_out))
    return DecoderOutput(sample=video) if return_dict else (video,)


def _swap_of(vae) -> DecoderSwap:
    swap = getattr(vae.decoder, SWAP_NAME, None)
    if not isinstance(swap, DecoderSwap):
        raise SwapError("vae.decoder was replaced after swap_decoder(vae): swap the VAE again")
    return swap


def _differentiable(vae: AutoencoderKLMiniMaxH3, z: torch.Tensor) -> bool:
    """Whether this decode must carry gradients: to the latents, or to a decoder weight made trainable."""
    if not torch.is_grad_enabled():
        return False
    weights = (*vae.decoder.parameters(), *vae.post_quant_conv.parameters())
    return z.requires_grad or any(w.requires_grad for w in weights)


def _check_honoured(vae: AutoencoderKLMiniMaxH3) -> None:
    """SwapError for what the VAE's modules were given that our decode cannot honour: it computes the
    decoder's functions itself, so a hook on a module or an attention processor or backend would be skipped."""
    modules = [("post_quant_conv", vae.post_quant_conv)] + [
        (f"decoder.{name}" if name else "decoder", module)
        for name, module in vae.decoder.named_modules()
        if not isinstance(module, DecoderSwap)
    ]
    for name, module in modules:
        if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks:
            raise SwapError(
                f"{name} has a forward or backward hook, which minimax_h3_vae's decode would not run (it computes "
                "the decoder itself, without calling diffusers' modules): remove the hook before decoding"
            )
        offload = set(getattr(getattr(module, "_diffusers_hook", None), "hooks", {})) - HONOURED_HOOKS
        if offload or hasattr(module, "_hf_hook"):
            raise SwapError(
                f"{name} has diffusers' or accelerate's hooks ({', '.join(sorted(offload)) or 'accelerate'}), "
                "which minimax_h3_vae's decode would not run: offload the whole VAE (enable_model_cpu_offload) "
                "rather than the decoder's modules, or choose ours with swap_decoder(vae, offload='blocks')"
            )
        if isinstance(module, AttentionModuleMixin):
            processor = module.get_processor()
            backend = getattr(processor, "_attention_backend", None)
            if type(processor) is not module._default_processor_cls or backend is not None:
                raise SwapError(
                    f"{name} has another attention processor or backend ({type(processor).__name__}, "
                    f"backend {backend}), which minimax_h3_vae's decode would not use: choose ours with "
                    "swap_decoder(vae, attention=...), and put diffusers' back with vae.reset_attention_backend() "
                    "and vae.set_attn_processor(MiniMaxH3VideoAttnProcessor())"
                )


def vae_tiling(vae, patch_size: int) -> Tiling:
    """The `Tiling` of the VAE's switches.

    Untiled (`use_tiling` False), diffusers runs the decoder on the whole frame: that is one tile covering
    the frame. Tiled, diffusers' plan equals ours when the tile and overlap are the same for height and
    width, multiples of the patch size, with 0 < overlap < tile; other settings raise SwapError (diffusers
    decodes them with misaligned tiles, drops pixels at overlap 0, or never finishes planning).
    """
    p = patch_size
    if not vae.use_tiling:
        return Tiling(size=None, overlap=0)
    size = (vae.tile_sample_min_height, vae.tile_sample_min_width)
    overlap = (vae.tile_sample_min_overlap_height, vae.tile_sample_min_overlap_width)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (*size, *overlap)):
        raise SwapError(
            f"enable_tiling with tile {size[0]!r}x{size[1]!r} px and overlap {overlap[0]!r}/{overlap[1]!r} px: give "
            f"whole numbers of pixels, multiples of {p} px (one latent), with 0 < overlap < tile"
        )
    if size[0] != size[1] or overlap[0] != overlap[1]:
        raise SwapError(
            f"enable_tiling with tile {size[0]}x{size[1]} px and overlap {overlap[0]}/{overlap[1]} px: minimax_h3_vae "
            "plans one tile size and overlap for both axes; give equal height and width values"
        )
    if size[0] % p or overlap[0] % p or not 0 < overlap[0] < size[0]:
        raise SwapError(
            f"enable_tiling with tile {size[0]} px and overlap {overlap[0]} px: both must be multiples of {p} px "
            "(one latent), with 0 < overlap < tile"
        )
    return Tiling(size=size[0], overlap=overlap[0])


def _find_vae(target) -> AutoencoderKLMiniMaxH3:
    if isinstance(target, AutoencoderKLMiniMaxH3):
        return target
    vae = getattr(target, "vae", None)
    if isinstance(vae, AutoencoderKLMiniMaxH3):
        return vae
    held = "no .vae" if vae is None else f"a .vae of type {type(vae).__name__}"
    raise SwapError(
        f"swap_decoder takes an AutoencoderKLMiniMaxH3 or a pipeline holding one as .vae; "
        f"got a {type(target).__name__} with {held}"
    )
