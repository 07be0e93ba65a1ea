"""gemm="quack": w1 and its gate as one quack GEMM (fused/linear_silu_mul.py), and the option at every door.

The kernel tests need a Hopper GPU with quack-kernels and NVIDIA's CuTe DSL installed (the `hopper` extra)
and skip elsewhere; CI (CPU) runs the option's checks, the launcher's contract and the fallbacks.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, blocks, cli, fused
from minimax_h3_vae.fused.linear_silu_mul import linear_silu_mul, linear_silu_mul_reference, unsupported
from minimax_h3_vae.runtime import DecodeOptions, Runtime, resolve_call, resolve_gemm

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
QUACK = importlib.util.find_spec("quack") is not None and importlib.util.find_spec("cutlass") is not None
needs_quack = pytest.mark.skipif(not (HOPPER and QUACK), reason="needs a Hopper GPU with the hopper extra")
CUDA = torch.device("cuda")


# ---- the option ------------------------------------------------------------------------------------------


@pytest.fixture
def hopper_with_quack(monkeypatch):
    """resolve_gemm on a machine that has everything quack needs (the CPU stands in for it)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in ("quack", "cutlass") else find_spec(name, *a)
    )


def test_auto_picks_quack_only_where_all_of_it_runs(hopper_with_quack, monkeypatch):
    assert resolve_gemm("auto", CUDA, torch.float16, True) == "quack"
    assert resolve_gemm("auto", CUDA, torch.float32, True) == "cublas"
    assert resolve_gemm("auto", CUDA, torch.float16, False) == "cublas"
    assert resolve_gemm("auto", torch.device("cpu"), torch.float16, True) == "cublas"
    assert resolve_gemm("cublas", CUDA, torch.float16, True) == "cublas"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert resolve_gemm("auto", CUDA, torch.float16, True) == "cublas", "measured on Hopper only"


@pytest.mark.parametrize(
    ("device", "dtype", "fused", "message"),
    [
        ("cpu", torch.float16, True, "needs a Hopper GPU"),
        ("cuda", torch.float32, True, "fp16 recipe's GEMMs, not fp32"),
        ("cuda", torch.float16, False, "runs on the fused path"),
    ],
)
def test_quack_where_it_cannot_run_says_why(hopper_with_quack, device, dtype, fused, message):
    with pytest.raises(ValueError, match=message) as caught:
        resolve_gemm("quack", torch.device(device), dtype, fused)
    assert "'cublas'" in str(caught.value), "names the way out"


def test_quack_not_installed_names_the_extra(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "quack" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"minimax-h3-vae\[hopper\]"):
        resolve_gemm("quack", CUDA, torch.float16, True)
    assert resolve_gemm("auto", CUDA, torch.float16, True) == "cublas"


def test_gemm_option_is_checked_and_fixed_at_load():
    with pytest.raises(ValueError, match="gemm must be 'auto', 'cublas' or 'quack'"):
        DecodeOptions(device="cpu", gemm="cutlass")
    assert DecodeOptions(device="cpu").gemm == "cublas", "auto on the CPU"
    assert Runtime().gemm == "cublas", "a decoder built directly imports nothing"
    with pytest.raises(ValueError, match="gemm: fixed when the decoder is loaded"):
        resolve_call(Runtime(), H3DecoderConfig(), gemm="quack")


def test_command_defaults_to_cublas_and_names_its_flag(layouts, tmp_path, capsys):
    """The command pays no quack import unless asked (--gemm), and a --gemm it cannot honour is one error line
    naming the flag, exit code 2, before anything is loaded."""
    args = cli.parse_args(["in.safetensors", "out.mp4"])
    assert args.gemm == "cublas" and cli.decode_options(args).gemm == "cublas"
    out = tmp_path / "out.safetensors"
    latents = tmp_path / "in.safetensors"
    from safetensors.torch import save_file

    save_file({"latents": torch.randn(24, 1, 2, 2)}, str(latents))
    code = cli.main([str(latents), str(out), "--model", str(layouts["original"]), "--device", "cpu", "--gemm", "quack"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    needs = "needs a Hopper GPU (compute capability 9.0); cpu is not one; or choose the 'cublas' GEMMs"
    assert err == [f"error: --gemm 'quack' {needs}"]


# ---- the launcher's contract and the fallback ---------------------------------------------------------------


def test_contract_is_checked_before_quack_is_touched():
    x, w = torch.zeros(2, 16), torch.zeros(32, 16)
    assert "must share one of" in unsupported(x, w, None), "float32 is not a quack dtype here"
    assert "CUDA device" in unsupported(x.half(), w.half(), None)
    with pytest.raises(ValueError, match="linear_silu_mul: x, weight and bias must share"):
        linear_silu_mul(x, w, None)


def test_select_ops_without_quack_here_keeps_cublas_and_the_gate(recwarn):
    """Asked for quack where it cannot run (here: the CPU), select_ops warns, naming it, and w1 runs as
    torch's linear followed by the gate op, so the decode is the cuBLAS path's."""
    config = H3DecoderConfig(num_layers=1, num_heads=2)
    ops = fused.select_ops(config, torch.device("cpu"), torch.float32, "quack")
    assert any("torch's linear and the gate run instead" in str(w.message) for w in recwarn)
    assert not fused.uses_quack(ops)
    x = torch.randn(3, 5, config.dim)
    weight, bias = torch.randn(2 * config.ffn_dim, config.dim), torch.randn(2 * config.ffn_dim)
    assert torch.equal(ops.linear_silu_mul(x, weight, bias), ops.silu_mul(F.linear(x, weight, bias)))


def test_cublas_never_imports_the_quack_module(monkeypatch):
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU runs the interpreter here
    fused.select_ops(H3DecoderConfig(num_layers=1, num_heads=2), device, torch.float16, "cublas")
    assert imported and not any(name.endswith("linear_silu_mul") for name in imported)


def test_eager_op_is_linear_then_gate():
    """The block's w1 op is the release's two steps, w1's output rounded to fp16 before the gate."""
    x, w, b = torch.randn(4, 16).half(), torch.randn(32, 16).half(), torch.randn(32).half()
    h = F.linear(x.float(), w.float(), b.float()).half()
    expected = (F.silu(h[:, :16].float()).half().float() * h[:, 16:].float()).half()
    assert torch.equal(blocks.linear_silu_mul(x, w, b), expected)


# ---- the kernel on the GPU ------------------------------------------------------------------------------------


def exact_and_allowance(x, weight, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(gate) * value of the float64 product and bias (what the kernel rounds once), and per value what
    a float32 sum over K may lose on the way, carried through the gate.

    A GEMM sums K products in float32 in blocks (tensor-core steps inside a k-tile, then k-tiles one after
    another), so each output has at most about K / 64 + 6 roundings at the scale of sum |x_k w_k| (2^-23
    each: tensor cores may truncate). Through `silu(g) * v` that error is scaled by at most
    |v| * max silu' (1.1) + |silu(g)|.
    """
    b64 = None if bias is None else bias.double()
    h = F.linear(x.double(), weight.double(), b64)
    scale = F.linear(x.double().abs(), weight.double().abs(), None if b64 is None else b64.abs())
    gate, value = h.chunk(2, dim=-1)
    slack_g, slack_v = ((x.shape[-1] / 64 + 6) * 2.0**-23 * scale).chunk(2, dim=-1)
    return F.silu(gate) * value, 1.1 * value.abs() * slack_g + F.silu(gate).abs() * slack_v


def assert_one_rounding(out: torch.Tensor, exact: torch.Tensor, allowance: torch.Tensor) -> None:
    """out is within one rounding step of its dtype from the exact value, plus the float32 sum's allowance
    (exact_and_allowance). A wrong pairing of gate and value, a lost bias or a wrong scale is O(1) off and
    fails this by far."""
    eps = torch.finfo(out.dtype).eps  # one step at the value's scale is at most eps * |value|
    subnormal_step = torch.finfo(out.dtype).smallest_normal * eps
    bound = eps * exact.abs() + subnormal_step + allowance
    excess = (out.double() - exact).abs() - bound
    assert excess.max() <= 0, f"{int((excess > 0).sum())} values beyond the bound, worst by {excess.max().item():.3e}"


@needs_quack
@pytest.mark.parametrize(("rows", "bias"), [(28 * 1797, True), (2 * 1797 + 5, True), (3, False)])
def test_kernel_at_released_width_is_one_rounding_from_exact(rows, bias):
    """The released w1 (2048 -> 2 x 8192) at a whole unit's 28 tiles, at an odd row count, and without bias;
    more accurate on average than the release's three roundings."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 2048, device="cuda", generator=g).half()
    weight = (torch.randn(16384, 2048, device="cuda", generator=g) / 2048**0.5).half()
    b = (torch.randn(16384, device="cuda", generator=g) * 0.1).half() if bias else None
    before = fused.launch_counts()["linear_silu_mul"]
    out = linear_silu_mul(x, weight, b)
    assert fused.launch_counts()["linear_silu_mul"] == before + 1
    assert out.shape == (rows, 8192) and out.dtype == torch.float16
    exact, allowance = exact_and_allowance(x, weight, b)
    assert_one_rounding(out, exact, allowance)
    assert_one_rounding(linear_silu_mul_reference(x, weight, b), exact, allowance)
    eager = blocks.linear_silu_mul(x, weight, b)
    assert (out.double() - exact).abs().mean() < (eager.double() - exact).abs().mean()


@needs_quack
def test_kernel_takes_the_blocks_layout_and_bf16():
    """A (B, S, K) batch of tiles as the block passes it (rows flatten), in bf16 too."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(3, 37, 64, device="cuda", generator=g).to(dtype)
        weight = (torch.randn(256, 64, device="cuda", generator=g) / 8).to(dtype)
        b = torch.randn(256, device="cuda", generator=g).to(dtype)
        out = linear_silu_mul(x, weight, b)
        assert out.shape == (3, 37, 128)
        assert_one_rounding(out, *exact_and_allowance(x, weight, b))


@needs_quack
def test_decoder_on_quack_is_as_close_to_fp32_as_cublas(layouts):
    """The whole decode with gemm="quack" against an fp32 eager decode of the same weights: no further from it
    than the cuBLAS fused path (the gate reads the float32 accumulator), and quack's op ran for every block
    of every call, the Triton gate for none."""
    z = torch.randn(1, 24, 8, 17, 9, generator=torch.Generator().manual_seed(5))
    reference = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp32", fused=False).decode(z)
    outs, launches = {}, {}
    for gemm in ("cublas", "quack"):
        decoder = H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", gemm=gemm)
        assert decoder.runtime.gemm == gemm and fused.uses_quack(decoder.ops()) == (gemm == "quack")
        before = fused.launch_counts()
        outs[gemm] = decoder.decode(z)
        launches[gemm] = {k: v - before[k] for k, v in fused.launch_counts().items()}
    layers = len(decoder.decoder.transformer_blocks)
    assert launches["quack"]["linear_silu_mul"] == launches["cublas"]["silu_mul"] > 0
    assert launches["quack"]["linear_silu_mul"] % layers == 0 and launches["quack"]["silu_mul"] == 0
    errors = {gemm: (out - reference).abs() for gemm, out in outs.items()}
    assert errors["quack"].mean() <= errors["cublas"].mean() * 1.1
    assert errors["quack"].max() <= errors["cublas"].max() * 1.5
    assert not torch.equal(outs["quack"], outs["cublas"]), "the quack path ran"


@needs_quack
def test_load_builds_quack_beside_the_weights(layouts):
    """The set-up thread imports quack and builds its GEMM at load: one launch, none left for the first decode."""
    before = fused.launch_counts()["linear_silu_mul"]
    H3VideoDecoder.from_pretrained(layouts["original"], device="cuda", dtype="fp16", gemm="quack")
    assert fused.launch_counts()["linear_silu_mul"] == before + 1


@needs_quack
def test_command_with_gemm_quack_writes_what_the_api_decodes(layouts, tmp_path, capsys):
    """--gemm quack through the command: it says so, and its frames are the API's with gemm="quack"."""
    from safetensors.torch import load_file, save_file

    from minimax_h3_vae import to_uint8_frames

    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(9))
    latents, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"latents": z}, str(latents))
    code = cli.main([str(latents), str(out), "--model", str(layouts["original"]), "--raw-latents", "--gemm", "quack"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "quack's GEMM for w1 and its gate" in err
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], gemm="quack")
    assert torch.equal(load_file(str(out))["video"], to_uint8_frames(decoder.decode(z)).cpu())
