"""attention="fa4": the block's attention through FlashAttention 4's Hopper kernel (fused/flash_attention.py), and
the option at the doors; how the option is decided, with gemm's, is tests/test_kernel_options.py.

The kernel tests need a Hopper GPU with flash-attn-4, quack-kernels and NVIDIA's CuTe DSL installed (the
`hopper` extra) and skip elsewhere; CI (CPU) runs the option's checks, the launcher's contract, the fallback
and the block's use of the op.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
import torch
import torch.nn.functional as F
from checkpoints import random_diffusers_vae

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, blocks, comfyui, fused
from minimax_h3_vae.diffusers import decoder_of, swap_decoder
from minimax_h3_vae.fused import flash_attention, quack_common
from minimax_h3_vae.runtime import check_machine, resolve_attention

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_fa4 = pytest.mark.skipif(
    not (HOPPER and flash_attention.installed()), reason="needs a Hopper GPU with the hopper extra"
)
CUDA = torch.device("cuda")
# Unit roundoff of the kernel's dtypes.
ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


# ---- not installed ----------------------------------------------------------------------------------------------


def test_fa4_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(flash_attention, "installed", lambda: False)
    with pytest.raises(ValueError, match=r'needs flash-attn-4.*pip install -e "\.\[hopper\]" in the checkout'):
        resolve_attention("fa4", CUDA, torch.float16, True)
    assert resolve_attention("auto", CUDA, torch.float16, True) == "sdpa"


def test_installed_needs_flash_attn_4_and_quack(monkeypatch):
    """Whether it is installed is read from the distributions, importing nothing."""
    real = importlib.metadata.distribution

    def only(present):
        def distribution(name):
            if name == flash_attention.DISTRIBUTION and not present:
                raise importlib.metadata.PackageNotFoundError(name)
            return real(name) if name != flash_attention.DISTRIBUTION else object()

        return distribution

    monkeypatch.setattr(quack_common, "installed", lambda: True)
    monkeypatch.setattr(importlib.metadata, "distribution", only(False))
    assert not flash_attention.installed()
    monkeypatch.setattr(importlib.metadata, "distribution", only(True))
    assert flash_attention.installed()
    monkeypatch.setattr(quack_common, "installed", lambda: False)
    assert not flash_attention.installed(), "flash-attn-4 imports quack"


def test_nodes_and_swap_take_the_option_through_decode_options():
    """The ComfyUI widget's value and the swap's keyword reach the same check: fa4 on the eager path (the node)
    or on the CPU (the swap: the VAE's device) is refused with the same words, and sdpa is taken."""
    assert comfyui.node_options("auto", 0, "auto", "sdpa").attention == "sdpa"
    refused = r"attention 'fa4' (needs a Hopper GPU|runs on the fused path, not the eager one)"
    with pytest.raises(ValueError, match=refused):  # the options are plain data: resolve's machine check
        check_machine(comfyui.node_options("off", 0, "auto", "fa4"))
    with pytest.raises(ValueError, match="attention 'fa4' needs a Hopper GPU"):
        swap_decoder(random_diffusers_vae(seed=0), attention="fa4")
    vae = swap_decoder(random_diffusers_vae(seed=0), attention="sdpa")
    assert decoder_of(vae).runtime.attention == "sdpa"


# ---- the launcher's contract, the fallback and the block ------------------------------------------------


def projection_views(batch, seq, heads, head_dim, dtype, device, seed=0):
    """q, k, v as the attention's projection returns them: (B, H, S, D) strided views of one (B, S, H, 3, D)
    tensor; q and k with unit RMS per head (as the QK norm leaves them, norm weights 1 +- 0.1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(batch, seq, heads, 3, head_dim, device=device, generator=g)
    qk = qkv[..., :2, :]
    weight = 1 + 0.1 * torch.randn(head_dim, device=device, generator=g)
    qkv[..., :2, :] = qk * torch.rsqrt(qk.square().mean(-1, keepdim=True)) * weight
    return qkv.to(dtype).transpose(1, 2).unbind(3)


def test_contract_is_checked_before_flash_attn_is_touched():
    q, k, v = projection_views(1, 5, 2, 64, torch.float16, "cpu")
    assert "CUDA device" in flash_attention.unsupported(q, k, v)
    assert "must share one of" in flash_attention.unsupported(q.float(), k.float(), v.float())
    assert "one (B, H, S, D) shape" in flash_attention.unsupported(q, k[:, :, :3], v)
    assert "head dim must be a multiple of 8" in flash_attention.unsupported(*(t[..., :60] for t in (q, k, v)))
    assert "tensors" in flash_attention.unsupported(q, k, None)
    with pytest.raises(ValueError, match="attention: q, k and v must be on one CUDA device"):
        flash_attention.attention(q, k, v)


def test_reference_is_softmax_attention():
    """The oracle is the textbook formula: torch's SDPA in float64 agrees with it."""
    q, k, v = (t.double() for t in projection_views(2, 9, 3, 16, torch.float32, "cpu"))
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(flash_attention.attention_reference(q, k, v), expected, rtol=1e-12, atol=1e-12)


def test_select_ops_without_fa4_here_keeps_sdpa(recwarn):
    """Asked for fa4 where it cannot run (here: the CPU), select_ops warns, naming it, and the attention stays
    torch's SDPA."""
    kernels = fused.choose_kernels(
        H3DecoderConfig(num_layers=1, num_heads=2), torch.device("cpu"), torch.float32, True, "cublas", "fa4"
    )
    assert "flash_attention (" in " ".join(str(w.message) for w in recwarn)
    assert "torch's SDPA runs instead" in " ".join(str(w.message) for w in recwarn)
    assert fused.ops_for(kernels).attention is blocks.EAGER_OPS.attention and not fused.uses_fa4(kernels)


def test_sdpa_never_imports_the_fa4_module(monkeypatch):
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ops = fused.select_ops(H3DecoderConfig(num_layers=1, num_heads=2), device, torch.float16, "cublas", "sdpa")
    assert imported and not any(name.endswith("flash_attention") for name in imported)
    assert ops.attention is blocks.EAGER_OPS.attention


def test_every_block_attends_through_the_ops(layouts):
    """The block's attention is `ops.attention`: a decoder call (the model's forward over tiles, which takes its
    ops) with the op swapped for a counting wrapper calls it once per block, and gives the same output."""
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cpu", dtype="fp32", fused=False)
    tiles = torch.randn(2, 24, 2, 3, 4, generator=torch.Generator().manual_seed(1))
    calls = []
    model = decoder.decoder
    ops = decoder.ops()
    counting = type(ops)(**{**vars(ops), "attention": lambda q, k, v: calls.append(q.shape) or ops.attention(q, k, v)})
    with torch.inference_mode():
        expected = decoder(tiles, ops)
        assert torch.equal(decoder(tiles, counting), expected)
    assert calls and len(calls) == len(model.transformer_blocks)


# ---- on a Hopper GPU with flash-attn-4 -----------------------------------------------------------------


@needs_fa4
@pytest.mark.parametrize(
    ("batch", "seq", "heads", "dtype"),
    [(2, 1797, 32, torch.float16), (3, 37, 4, torch.float16), (1, 300, 8, torch.bfloat16)],
)
def test_fa4_is_attention_within_its_roundings(batch, seq, heads, dtype):
    """Against float64 attention: the output is rounded once (u |o|) and the probabilities are rounded to the
    input dtype before the second product (u sum_j p_j |v_j| <= u max |v|); the float32 scores and sums add
    far less. So |o - ref| <= 2u (|ref| + max_j |v_j|) per row, twice the two roundings. The output is a view
    of a (B, S, H, D)-contiguous tensor, and the kernel ran."""
    q, k, v = projection_views(batch, seq, heads, 64, dtype, "cuda", seed=seq)
    launches = {}  # counted by the launcher, after its launch
    out = flash_attention.attention(q, k, v, launches=launches)
    assert launches == {"flash_attention": 1}
    assert out.shape == q.shape and out.dtype == dtype and out.transpose(1, 2).is_contiguous()
    ref = flash_attention.attention_reference(q, k, v)
    bound = 2 * ROUNDOFF[dtype] * (ref.abs() + v.double().abs().amax(dim=(-2, -1), keepdim=True))
    excess = (out.double() - ref).abs() - bound
    assert excess.max() <= 0, f"{excess.max().item():.3g} over the bound"
    cudnn = F.scaled_dot_product_attention(q, k, v)
    assert (out.double() - ref).abs().mean() <= (cudnn.double() - ref).abs().mean() * 1.1


@needs_fa4
def test_decoder_on_fa4_is_as_close_to_fp32_as_sdpa(layouts):
    """The whole decode with attention="fa4" against an fp32 eager decode of the same weights: no further from
    it than SDPA's fused path, and flash-attn-4 ran once per block of every decoder call."""
    z = torch.randn(1, 24, 8, 17, 9, generator=torch.Generator().manual_seed(5))
    reference = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp32", fused=False).decode(z)
    outs, launches = {}, {}
    for attention in ("sdpa", "fa4"):
        decoder = H3VideoDecoder.from_pretrained(
            layouts["original"], device="cuda", dtype="fp16", gemm="cublas", attention=attention
        )
        assert decoder.runtime.attention == attention and fused.uses_fa4(decoder.runtime.kernels) == (
            attention == "fa4"
        )
        before = decoder.launch_counts()
        outs[attention] = decoder.decode(z)
        launches[attention] = {k: v - before[k] for k, v in decoder.launch_counts().items()}
    layers = len(decoder.decoder.transformer_blocks)
    assert launches["fa4"]["flash_attention"] == launches["fa4"]["qk_rms_norm_rope"] > 0
    assert launches["fa4"]["flash_attention"] % layers == 0 and launches["sdpa"]["flash_attention"] == 0
    errors = {attention: (out - reference).abs() for attention, out in outs.items()}
    assert errors["fa4"].mean() <= errors["sdpa"].mean() * 1.1
    assert errors["fa4"].max() <= errors["sdpa"].max() * 1.5
    assert not torch.equal(outs["fa4"], outs["sdpa"]), "the fa4 path ran"


@needs_fa4
def test_load_builds_fa4_beside_the_weights(layouts):
    """The set-up thread imports flash-attn-4 and builds its kernel at load: one launch, none left over."""
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", attention="fa4")
    assert decoder.launch_counts()["flash_attention"] == 1
