"""The MiniMax-H3 video VAE decoder's modules: post_quant_conv + a 36-block ViT, and its pure forward over a
batch of tiles.

Module names equal the original release's keys, so the original checkpoint loads as an identity map
(docs/decoder.md section 2). Nothing here loops over time or space or decides how to run: the decode loops
(windows, tile calls, the layer-major loop) are in decoding.py, and loading the weights in weights.py.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import BLOCK_LINEARS, EAGER_OPS, DecoderBlock
from .config import H3DecoderConfig
from .rope import RotaryTable, rotary_table, token_positions

# A block's fused attention projection, whose rows a kernel may want stored in its own order (`qkv_rows`).
QKV_KEY = re.compile(r"decoder\.transformer_blocks\.\d+\.attn\.to_qkv\.(weight|bias)")


class ViTDecoder(nn.Module):
    """One token per latent voxel -> 36 blocks -> one 4x16x16x3 pixel patch per token."""

    def __init__(self, config: H3DecoderConfig):
        super().__init__()
        c = config
        self.config = c
        self.x_embedder = nn.Linear(c.latent_channels, c.dim)
        self.register_tokens = nn.Parameter(torch.zeros(1, c.num_register_tokens, c.dim))
        self.transformer_blocks = nn.ModuleList(
            DecoderBlock(c.dim, c.num_heads, c.ffn_dim, c.norm_eps) for _ in range(c.num_layers)
        )
        self.norm_out = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.proj_out = nn.Linear(c.dim, c.patch_dim)
        self._rotary_cache: dict[tuple, RotaryTable] = {}

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.transformer_blocks[0].attn.to_qkv.weight.dtype

    def rotary(self, frames: int, height: int, width: int) -> RotaryTable:
        """The rotary table of one tile shape, built once and reused by every call and every tile. Its
        positions are in the compute dtype: the release computes them in its decoder input's dtype, float16
        under its fp16 autocast."""
        device, dtype = self.x_embedder.weight.device, self.compute_dtype
        key = (frames, height, width, device, dtype)
        if key not in self._rotary_cache:
            suffix = self.config.num_register_tokens + 1
            positions = token_positions(frames, height, width, suffix, device, dtype)
            self._rotary_cache[key] = rotary_table(positions, self.config.rope_dim, self.config.rope_theta)
        return self._rotary_cache[key]

    def embed(self, z: torch.Tensor, ops: SimpleNamespace) -> tuple[torch.Tensor, torch.Tensor]:
        """z: (N, C, t, h, w) float32 latents after post_quant_conv -> the first block's input: the residual
        stream (N, S, dim) float32 with the register and zero tokens appended, and its norm1 in the compute
        dtype.

        x_embedder runs in float32 once per tile, straight into the tile's rows of the stream: a library GEMM
        picks its kernel by the row count, so one call over all N tiles could round a tile differently for
        another N. The bias is added after the product, as torch's Linear does for the release's strided input
        (a GEMM with the bias fused may pick another kernel). In the fp16 recipe the tokens are rounded to
        float16, as the release returns them in its (float16) input's dtype before the float32 registers join."""
        c = self.config
        n, _, frames, height, width = z.shape
        tokens = frames * height * width
        residual = z.new_empty(n, tokens + c.num_register_tokens + 1, c.dim)
        weight, bias = self.x_embedder.weight, self.x_embedder.bias
        for tile, rows in zip(z, residual):
            torch.mm(tile.flatten(1).T, weight.T, out=rows[:tokens]).add_(bias)
        if self.compute_dtype != torch.float32:
            residual[:, :tokens] = residual[:, :tokens].to(self.compute_dtype)
        residual[:, tokens:-1] = self.register_tokens
        residual[:, -1] = 0
        norm1 = self.transformer_blocks[0].norm1.weight
        return residual, ops.rms_norm(residual, norm1, c.norm_eps, self.compute_dtype)

    def block(
        self, i: int, residual: torch.Tensor, normed: torch.Tensor, rotary: RotaryTable, ops: SimpleNamespace
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block i on (residual, its normed input); returns the new residual and the next block's normed input
        (None after the last block)."""
        blocks = self.transformer_blocks
        next_norm = blocks[i + 1].norm1.weight if i + 1 < len(blocks) else None
        return blocks[i](residual, normed, rotary, ops, next_norm)

    def head(self, residual: torch.Tensor, shape: tuple[int, int, int], ops: SimpleNamespace, out: torch.Tensor):
        """residual (N, S, dim) after the last block, tiles of latent shape (t, h, w) -> pixels
        (N, 3, 4t, 16h, 16w) float32 written into `out` (un-patchified in the one copy).

        norm_out and proj_out run over every row, the register and zero tokens too, which are dropped after, as
        the release does: a library GEMM picks its kernel by the row count."""
        c = self.config
        frames, height, width = shape
        n = residual.shape[0]
        patches = ops.linear_fp32(self.norm_out(residual), self.proj_out.weight, self.proj_out.bias)
        p, pt = c.patch_size, c.patch_size_t
        patches = patches[:, : frames * height * width].unflatten(1, (frames, height, width))
        patches = patches.unflatten(-1, (c.out_channels, pt, p, p)).permute(0, 4, 1, 5, 2, 6, 3, 7)
        out.view(n, c.out_channels, frames, pt, height, p, width, p).copy_(patches)
        return out

    def forward(
        self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """z: (N, C, t, h, w) float32 latents after post_quant_conv -> (N, 3, 4t, 16h, 16w) float32, written
        into `out` when given."""
        c = self.config
        n, _, frames, height, width = z.shape
        if out is None:
            out = z.new_empty(n, c.out_channels, frames * c.patch_size_t, height * c.patch_size, width * c.patch_size)
        residual, normed = self.embed(z, ops)
        rotary = self.rotary(frames, height, width)
        for i in range(len(self.transformer_blocks)):
            residual, normed = self.block(i, residual, normed, rotary, ops)
        return self.head(residual, (frames, height, width), ops, out)


class H3Decoder(nn.Module):
    """post_quant_conv + the ViT: raw latent tiles in, pixel tiles out. `H3VideoDecoder` (decoding.py) adds the
    run settings and the loops over a whole video."""

    def __init__(self, config: H3DecoderConfig, qkv_rows: torch.Tensor | None = None):
        """qkv_rows: (3 * dim,) int64, the release rows of every block's w_qkv and its bias in the order they are
        stored (a kernel's, prepared once: `fused.qkv_rows`), or None for the release's. Either way
        `state_dict()` gives, and `load_state_dict()` takes, the release's order."""
        super().__init__()
        self.config = config
        self.post_quant_conv = nn.Conv3d(config.latent_channels, config.latent_channels, kernel_size=1)
        self.decoder = ViTDecoder(config)
        self.qkv_rows = qkv_rows
        if qkv_rows is not None:
            self.register_state_dict_post_hook(_qkv_to_release_order)
            self.register_load_state_dict_pre_hook(_qkv_to_stored_order)

    @property
    def device(self) -> torch.device:
        return self.post_quant_conv.weight.device

    @property
    def compute_dtype(self) -> torch.dtype:
        """The block linears' dtype: float16 in the release recipe, else float32."""
        return self.decoder.compute_dtype

    def to_release_fp16(self) -> H3Decoder:
        """Cast the block linears to fp16 in place: the release's fp16-autocast recipe, cast once."""
        for name, module in self.named_modules():
            if is_block_linear(name + ".weight"):
                module.half()
        return self

    def post_quant(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent tiles (N, C, t, h, w), any float dtype -> post_quant_conv's output (N, C, t, h, w), float32.

        Each tile's values depend on that tile alone, whatever N: a library conv chooses its algorithm (cuDNN:
        also TF32) by the batch size, and gave other bits for other tile counts. The float32 recipe runs the
        conv once per tile as the release does (one tile per call), TF32 off for this call alone
        (`conv3d_fp32`), so that its bits are the release's (docs/decoder.md section 10). The fp16 recipe runs
        it as the release's fp16 autocast does, a float16 conv of float16-rounded latents, weight and bias
        (values held in float32 here); on the CPU, where the release has no autocast, likewise."""
        z = z.float()
        weight, bias = self.post_quant_conv.weight, self.post_quant_conv.bias
        out = torch.empty_like(z)
        if self.compute_dtype == torch.float32:
            for tile, rows in zip(z, out):
                rows.copy_(conv3d_fp32(tile[None], weight, bias)[0])
            return out
        weight, bias = weight.to(self.compute_dtype), bias.to(self.compute_dtype)
        for tile, rows in zip(z, out):
            rows.copy_(F.conv3d(tile[None].to(self.compute_dtype), weight, bias)[0])
        return out

    def forward(
        self, z: torch.Tensor, ops: SimpleNamespace = EAGER_OPS, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Raw latent tiles (N, C, t, h, w), all of one shape -> (N, 3, 4t, 16h, 16w) pixels, float32 (written
        into `out` when given). The caller picks the ops and the attention backends."""
        return self.decoder(self.post_quant(z), ops, out)


def conv3d_fp32(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """F.conv3d(z, weight, bias) (stride 1, no padding), as torch runs it under the process's cuDNN settings,
    except TF32, which is off for this call alone: a library inside a host changes no process-wide flag. It is
    the aten op F.conv3d itself calls (`torch._convolution`), given the switches F.conv3d reads but TF32's.

    z: (N, C in, t, h, w) float32. weight: (C out, C in, kt, kh, kw) float32. bias: (C out,) float32.
    Returns (N, C out, t - kt + 1, h - kh + 1, w - kw + 1) float32."""
    cudnn = torch.backends.cudnn
    deterministic = cudnn.deterministic or torch.are_deterministic_algorithms_enabled()
    ones, zeros = [1, 1, 1], [0, 0, 0]
    return torch._convolution(
        z, weight, bias, ones, zeros, ones, False, zeros, 1, cudnn.benchmark, deterministic, cudnn.enabled, False
    )


def _qkv_keys(state_dict: dict, prefix: str) -> list[str]:
    return [key for key in state_dict if key.startswith(prefix) and QKV_KEY.fullmatch(key[len(prefix) :])]


def _reorder(tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """tensor's rows in `rows` order: a new tensor, pinned where `tensor` is (the streamed block linears)."""
    out = tensor.index_select(0, rows.to(tensor.device))
    return out.pin_memory() if tensor.device.type == "cpu" and tensor.is_pinned() else out


def _qkv_to_release_order(module: H3Decoder, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict() of a decoder that stores w_qkv in `qkv_rows` order: the release's rows."""
    inverse = torch.argsort(module.qkv_rows)
    for key in _qkv_keys(state_dict, prefix):
        state_dict[key] = _reorder(state_dict[key], inverse)


def _qkv_to_stored_order(module: H3Decoder, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict() of release-order weights into a decoder that stores w_qkv in `qkv_rows` order."""
    for key in _qkv_keys(state_dict, prefix):
        state_dict[key] = _reorder(state_dict[key], module.qkv_rows)


def is_block_linear(key: str) -> bool:
    """Whether a state-dict key belongs to a block linear (blocks.BLOCK_LINEARS): the part of the weights the
    fp16 recipe casts and offload="blocks" streams."""
    return key.startswith("decoder.transformer_blocks.") and any(f".{m}." in key for m in BLOCK_LINEARS)
