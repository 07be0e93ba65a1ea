"""One-line drop-in for diffusers: `swap_decoder(pipe)` makes the pipeline's MiniMax-H3 VAE decode with ours.

    from minimax_h3_vae.diffusers import swap_decoder
    swap_decoder(pipe)  # pipe: MiniMaxH3ModularPipeline (or anything holding the VAE as `.vae`), or the VAE

The VAE object is changed in place, so every holder of it (the pipeline, a components manager) sees the
change: `vae.decoder` becomes a placeholder holding our decoder, built from the stock decoder's tensors in
memory, and `vae.decode` is ours. The encoder, `quant_conv`, `post_quant_conv`, `config`, `encode`, and what
`vae.device` / `vae.dtype` report stay as they were. Only this module imports diffusers; importing
`minimax_h3_vae` does not.
"""

from __future__ import annotations

import types

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
    from diffusers.models.autoencoders.vae import DecoderOutput
    from diffusers.utils.accelerate_utils import apply_forward_hook
except ImportError as error:  # not installed, or a release without MiniMax-H3 (before 0.42)
    raise ModuleNotFoundError(
        f"minimax_h3_vae.diffusers needs diffusers 0.42 or newer ({error}): {DIFFUSERS_EXTRA}", name=error.name
    ) from None

# The run options swap_decoder takes: the VAE sets the device and, at each decode, the tiling.
SWAP_OPTIONS = tuple(name for name in OPTION_NAMES if name not in ("device", "tiling"))


class SwapError(ValueError):
    """A target `swap_decoder` cannot swap, or a VAE setting the swapped decoder cannot reproduce."""


class SwappedDecoder(nn.Module):
    """What `vae.decoder` is after `swap_decoder`: our decoder (`.h3`), kept out of the VAE's module tree.

    Out of the tree, our weights are invisible to diffusers' dtype casts (`vae.to(torch.bfloat16)` would
    break the precision recipe) and to `vae.dtype`, which reads the first decoder parameter. Device moves
    of the VAE (`pipe.to("cuda")`, offload hooks) still reach it through `_apply`. The empty buffer has the
    stock decoder's dtype and follows every cast, so `vae.dtype` reports what it did before the swap.
    """

    def __init__(self, h3: H3VideoDecoder, stock_dtype: torch.dtype):
        super().__init__()
        object.__setattr__(self, "h3", h3)  # not registered: see the class docstring
        self.register_buffer("dtype_marker", torch.empty(0, dtype=stock_dtype, device=h3.device), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.dtype_marker.device != self.h3.device:
            self.h3.to(self.dtype_marker.device)  # device only: the recipe's dtypes stay
        return self

    def forward(self, *args, **kwargs):
        raise RuntimeError("the swapped MiniMax-H3 decoder runs through vae.decode(z), not vae.decoder(...)")


def swap_decoder(target, *, options: DecodeOptions | None = None, **fields):
    """Make `target`'s MiniMax-H3 VAE decode with this package's decoder; returns `target`.

    target: an `AutoencoderKLMiniMaxH3`, or an object holding one as `.vae` (e.g. `MiniMaxH3ModularPipeline`).
    The run options are a `DecodeOptions` or its fields as keywords, as for `H3VideoDecoder.from_pretrained`:
    dtype is our precision recipe, `"fp16"` (default on CUDA: block linears fp16, the rest fp32) or `"fp32"`
    (default on CPU), whatever dtype the VAE was loaded in; fused, tile_batch, offload, max_gpu_memory (GiB),
    output_rank, attention_backends, gemm, attention. The device is the stock decoder's, and the tiling follows
    the VAE's own switches at each decode: giving either here is a SwapError (an `options.device` is replaced
    by the VAE's).

    Our decoder is built on the stock decoder's device from its tensors in memory; the stock decoder is then
    dropped, so its parameters are freed (both copies exist only while converting). Afterwards
    `vae.decode(z, return_dict=True)` takes denormalised latents (B, 24, T, h, w) and returns a
    `DecoderOutput` (`return_dict=False`: a 1-tuple) whose `sample` is (B, 3, F, 16h, 16w) float32 in the
    same ImageNet-normalised space, on our decoder's device. It honours `vae.use_tiling`, `enable_tiling(...)`
    and `disable_tiling()` at each call, as that call's tiling (a setting we cannot reproduce exactly raises
    `SwapError`), and also decodes T = 1 and T = 2, which the stock VAE cannot. `vae.use_slicing` is not
    needed: `tile_batch` bounds memory. `vae.state_dict()` no longer holds the decoder: save the VAE before
    swapping.

    Raises SwapError for a target holding no H3 VAE, a VAE already swapped, or a config this package
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
    set_by_vae = sorted({"device", "tiling"} & set(fields)) + (["tiling"] if options and options.tiling else [])
    if set_by_vae:
        raise SwapError(
            f"{', '.join(set_by_vae)}: set by the VAE (its device, and enable_tiling / disable_tiling at each decode)"
        )
    first = next(vae.decoder.parameters())
    if first.is_meta:
        raise SwapError("the VAE's decoder weights are not loaded (meta device): load them before swapping")
    if options is not None and fields:
        raise SwapError(f"give either options= or the option fields {sorted(fields)}, not both")
    options = (options or DecodeOptions(device=first.device, **fields)).replace(device=first.device)
    try:
        config = diffusers_config(dict(vae.config))
    except ConfigError as error:
        raise SwapError(f"this AutoencoderKLMiniMaxH3 cannot be swapped: {error}") from None
    stock_dtype = vae.dtype
    # Detached views of the stock tensors: converting reads them one by one, copying only what changes.
    stock = {**vae.decoder.state_dict(prefix="decoder."), **vae.post_quant_conv.state_dict(prefix="post_quant_conv.")}
    try:
        h3 = H3VideoDecoder.from_checkpoint(
            checkpoint_in_memory(stock, config, "diffusers", "the VAE's decoder"), options
        )
    except CheckpointError as error:
        raise SwapError(f"this AutoencoderKLMiniMaxH3 cannot be swapped: {error}") from None
    del stock, first
    vae.decoder = SwappedDecoder(h3, stock_dtype)
    vae.decode = types.MethodType(_decode, vae)
    return target


@apply_forward_hook  # lets accelerate's offload hooks move the VAE first, as for the stock decode
def _decode(vae, z: torch.Tensor, return_dict: bool = True):
    """The swapped `vae.decode` (see `swap_decoder`): the VAE's tiling switches are this call's tiling."""
    h3 = vae.decoder.h3
    video = h3.decode(z, tiling=vae_tiling(vae, h3.config.patch_size))
    return DecoderOutput(sample=video) if return_dict else (video,)


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
