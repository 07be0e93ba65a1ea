"""Every kernel of the registry (minimax_h3_vae/fused/registry.py), read from it: each line names an op of one
decoder and a module with the kernel interface; each kernel matches its reference within a tolerance set by its
output's dtype and counts its launch; each refuses a call outside its contract; the chooser of both decoders
follows the lines, in their order; docs/kernels.md lists them.

The kernels run where they can: the CPU through Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py
without a GPU) and CUDA when present. The lines that a run option asks for (gemm="quack", attention="fa4") need
a Hopper GPU with the `hopper` extra: elsewhere their kernel test is skipped with the kernel's own reason.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import types
import warnings

import pytest
import torch
from repo import REPO

from minimax_h3_vae import H3AudioDecoder, H3DecoderConfig, blocks, fused
from minimax_h3_vae.audio import model as audio_model
from minimax_h3_vae.audio.config import H3AudioDecoderConfig
from minimax_h3_vae.fused import registry
from minimax_h3_vae.runtime import ATTENTION_KERNELS, GEMM_BACKENDS

LINES = [line for line in registry.KERNELS if line.module is not None]
LINE_IDS = [f"{line.op}-{line.name}" for line in LINES]
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not fused.interpreting(), reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
RECORDS = (fused.Kernels, fused.AudioKernels)
OPTIONS = {"gemm": GEMM_BACKENDS, "attention": ATTENTION_KERNELS}
EPS = 1e-5
# The tolerance of every kernel against its reference: this many units of its output dtype's precision (eps)
# at the output's largest magnitude. It allows another summation order and one rounding apart; a kernel that
# computes another function (a lost bias, a wrong partner or tap) is O(1) off.
ULPS = 16


def record_of(op: str) -> type:
    (record,) = [r for r in RECORDS if op in {f.name for f in dataclasses.fields(r)}]
    return record


# ---- the lines ------------------------------------------------------------------------------------------------


def test_every_line_runs_an_op_of_one_decoder():
    seen = set()
    for line in registry.KERNELS:
        record = record_of(line.op)
        assert (line.op, line.name) not in seen, "one name per kernel of an op"
        seen.add((line.op, line.name))
        default = {f.name: f.default for f in dataclasses.fields(record)}[line.op]
        assert line.name != default, "the eager op's name is no kernel's"
        assert (line.module is None) == (line.after is not None), "a kernel module, or an op it follows"
        if line.after is not None:
            assert record_of(line.after) is record
            assert registry.OPS.index(line.after) < registry.OPS.index(line.op), "chosen before the op after it"
        if line.option is not None:
            name, value = line.option
            assert value in OPTIONS[name][1:], "asked by a run option's value other than its default"
    assert registry.MODULES == fused.LAUNCH_NAMES and len(set(registry.MODULES)) == len(registry.MODULES)


@pytest.mark.parametrize("line", LINES, ids=LINE_IDS)
def test_every_kernel_module_has_the_interface(line):
    """unsupported, the launcher (named after the op: the eager op's parameters, then keyword-only the model's
    counts and state), the reference, model_call."""
    module = fused.kernel_module(line.module)
    eager = inspect.signature(getattr(record_of(line.op).eager_ops, line.op)).parameters.values()
    launcher = inspect.signature(getattr(module, line.op)).parameters.values()
    required = [p.name for p in eager if p.default is p.empty]
    assert [p.name for p in launcher if p.kind != p.KEYWORD_ONLY] == required
    assert list(inspect.signature(module.unsupported).parameters) == required
    state = {"launches", *(module.new_state() if hasattr(module, "new_state") else {})}
    state |= {"ordered"} if hasattr(module, "stored_rows") else set()
    assert {p.name for p in launcher if p.kind == p.KEYWORD_ONLY} == state
    assert callable(getattr(module, f"{line.op}_reference"))
    assert list(inspect.signature(module.model_call).parameters) == ["config", "device", "dtype"]


# ---- each kernel against its reference --------------------------------------------------------------------------


def randn(*shape, device, dtype=torch.float32, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


def neox_table(seq: int, rotary: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (seq, rotary) float32 with equal halves, as rope.rotary_table builds them."""
    angles = (2 * math.pi * torch.rand(seq, rotary // 2, generator=torch.Generator().manual_seed(1))).repeat(1, 2)
    return angles.cos().to(device), angles.sin().to(device)


def projection(device, dtype, heads=2, seq=37):
    """q, k, v as (B, H, S, D) strided views of one (B, S, H, 3, D) projection, q and k of unit RMS."""
    qkv = randn(2, seq, heads, 3, 64, device=device)
    qkv[..., :2, :] *= torch.rsqrt(qkv[..., :2, :].square().mean(-1, keepdim=True))
    return qkv.to(dtype).transpose(1, 2).unbind(3)


def scores_and_v(q, k, v):
    """What attention reads of the projection: q k^T (unchanged by one permutation of both's head dims) and v."""
    return q.double() @ k.double().transpose(-1, -2), v


HALF = (torch.float16, torch.bfloat16)
ALL = (torch.float32, *HALF)
# op -> (the dtypes its kernels are tested in, a function of (device, dtype) making its arguments, and what of its
# outputs is compared: by default all of them).
CALLS = {
    "rms_norm": (
        ALL,
        lambda d, t: (randn(3, 23, 100, device=d, dtype=t)[..., 2:98], 1 + 0.2 * randn(96, device=d, seed=1), EPS, t),
    ),
    "scale_add_rms_norm": (
        ALL,
        lambda d, t: (
            randn(2, 19, 72, device=d),
            randn(2, 19, 72, device=d, dtype=t, seed=1),
            randn(72, device=d, seed=2),
            1 + 0.2 * randn(72, device=d, seed=3),
            EPS,
            t,
        ),
    ),
    "qk_rms_norm_rope": (
        ALL,
        lambda d, t: (randn(2, 37, 3 * 3 * 64, device=d, dtype=t), *neox_table(37, 48, d), 3, EPS),
    ),
    "silu_mul": (ALL, lambda d, t: (4 * randn(37, 5008, device=d, dtype=t)[:, 4:5004],)),
    "linear_fp32": (
        (torch.float32,),
        lambda d, t: (randn(2, 75, 16, device=d), 0.1 * randn(128, 16, device=d, seed=1), randn(128, device=d, seed=2)),
    ),
    "linear_silu_mul": (
        HALF,
        lambda d, t: (
            randn(3, 37, 64, device=d, dtype=t),
            randn(256, 64, device=d, dtype=t, seed=1) / 8,
            randn(256, device=d, dtype=t, seed=2),
        ),
    ),
    "linear_qk_rms_norm_rope": (
        HALF,
        lambda d, t: (
            randn(2, 37, 64, device=d, dtype=t),
            randn(3 * 2 * 64, 64, device=d, dtype=t, seed=1) / 8,
            0.1 * randn(3 * 2 * 64, device=d, dtype=t, seed=2),
            *neox_table(37, 48, d),
            2,
            EPS,
        ),
        # q and k come with their head dims in the kernel's own order (its launcher's contract)
        scores_and_v,
    ),
    "attention": (HALF, lambda d, t: projection(d, t)),
    "anti_aliased_snake_beta": (
        (torch.float32,),
        lambda d, t: (
            2 * randn(2, 3, 100, device=d),
            torch.exp(0.5 * randn(1, 3, 1, device=d, seed=1)),
            (torch.exp(0.5 * randn(1, 3, 1, device=d, seed=2)) + 1e-9).reciprocal(),
            audio_model.kaiser_sinc_filter().to(d) + 0.01 * randn(1, 1, 12, device=d, seed=3),
            audio_model.kaiser_sinc_filter().to(d) + 0.01 * randn(1, 1, 12, device=d, seed=4),
        ),
    ),
}
CASES = [
    pytest.param(line, dtype, id=f"{line.op}-{line.name}-{str(dtype).split('.')[-1]}")
    for line in LINES
    for dtype in CALLS[line.op][0]
]


def outputs(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def supported_or_skip(line, module, args):
    """A kernel that every fused run may take must run here; one a run option asks for is skipped, with its
    reason, where it cannot (quack and flash-attn-4 need a Hopper GPU with the hopper extra)."""
    why = module.unsupported(*args)
    if why is not None:
        assert line.option is not None, why
        pytest.skip(f"{line.module}: {why}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("line", "dtype"), CASES)
def test_every_kernel_matches_its_reference_and_counts_its_launch(line, dtype, device):
    module = fused.kernel_module(line.module)
    _, make, *view = CALLS[line.op]
    view = view[0] if view else lambda *outs: outs
    args = make(device, dtype)
    supported_or_skip(line, module, args)
    # in-place ops (the residual add) get their own copy of every argument
    expected = outputs(getattr(module, f"{line.op}_reference")(*make(device, dtype)))
    launches = {}
    state = module.new_state() if hasattr(module, "new_state") else {}
    actual = outputs(getattr(module, line.op)(*args, launches=launches, **state))
    assert launches == {line.module: 1}, "the kernel ran, once, counted under its module's name"
    assert len(actual) == len(expected)
    for got, want in zip(view(*actual), view(*expected)):
        if want is None:
            assert got is None
            continue
        assert got.shape == want.shape
        if line.exact and got.is_cuda:  # Triton's CPU interpreter has no libdevice: exact only where compiled
            assert torch.equal(got, want), f"an exact kernel: max abs difference {(got - want).abs().max().item():.3g}"
            continue
        # A view computed in float64 (the scores q k^T) is judged by the dtype the kernel computed in.
        eps = torch.finfo(dtype if got.dtype == torch.float64 else got.dtype).eps
        scale = want.double().abs().max().item()
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=ULPS * eps * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("line", LINES, ids=LINE_IDS)
def test_every_launcher_refuses_a_call_outside_its_contract(line, device):
    """Inputs that need a gradient (the kernels have none; quack's and flash-attn-4's refuse the CPU first): a
    ValueError naming the op, and no launch."""
    module = fused.kernel_module(line.module)
    dtypes, make, *_ = CALLS[line.op]
    args = list(make(device, dtypes[0]))
    args[0] = args[0].detach().clone().requires_grad_()
    launches = {}
    with pytest.raises(ValueError, match=f"^{line.op}: "):
        getattr(module, line.op)(*args, launches=launches)
    assert launches == {}


# ---- one chooser for both decoders, following the lines -----------------------------------------------------------


CONFIG = H3DecoderConfig(num_layers=1, num_heads=2)


@pytest.fixture
def extra_line(monkeypatch):
    """Adds a kernel the way a new one is added: a module (here made in memory, running the eager op) and its
    line, the preferred kernel of rms_norm. Its `unsupported` says `fake.why` (None: it runs)."""
    fake = types.ModuleType(f"{fused.__name__}.probe_rms_norm")
    fake.why = None
    fake.unsupported = lambda *args: fake.why
    fake.model_call = fused.kernel_module("rms_norm").model_call

    def rms_norm(x, weight, eps, out_dtype, *, launches=None):
        launches["probe_rms_norm"] = launches.get("probe_rms_norm", 0) + 1
        return blocks.rms_norm(x, weight, eps, out_dtype)

    fake.rms_norm = rms_norm
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(
        registry, "KERNELS", (registry.Kernel("rms_norm", "probe", "probe_rms_norm"), *registry.KERNELS)
    )
    monkeypatch.setattr(registry, "MODULES", ("probe_rms_norm", *registry.MODULES))
    return fake


@pytest.mark.skipif(not fused.interpreting(), reason="CPU runs need TRITON_INTERPRET=1")
def test_a_new_line_is_chosen_first_and_wired(extra_line):
    kernels = fused.choose_kernels(CONFIG, torch.device("cpu"), torch.float32)
    assert kernels.rms_norm == "probe" and kernels.scale_add_rms_norm == "triton"
    launches = {}
    ops = fused.ops_for(kernels, launches)
    x, weight = randn(3, CONFIG.dim, device="cpu"), torch.ones(CONFIG.dim)
    assert torch.equal(ops.rms_norm(x, weight, EPS, torch.float32), blocks.rms_norm(x, weight, EPS, torch.float32))
    assert launches == {"probe_rms_norm": 1}


@pytest.mark.skipif(not fused.interpreting(), reason="CPU runs need TRITON_INTERPRET=1")
def test_a_new_line_that_cannot_run_is_named_and_the_next_runs(extra_line):
    extra_line.why = "a reason of its own"
    with pytest.warns(UserWarning) as caught:
        kernels = fused.choose_kernels(CONFIG, torch.device("cpu"), torch.float32)
    assert [str(w.message) for w in caught] == [
        "fused path on cpu with torch.float32: running without the kernel(s) probe_rms_norm (a reason of its own; "
        "the rms_norm kernel runs instead)"
    ]
    assert kernels.rms_norm == "triton"


def test_a_record_naming_no_kernel_is_refused():
    with pytest.raises(ValueError, match="rms_norm: no kernel 'cuda' in the registry"):
        fused.ops_for(fused.Kernels(rms_norm="cuda"))


def test_the_audio_decoder_is_chosen_for_as_the_video_one(monkeypatch):
    """The same chooser and warning: where no kernel can run (the CPU without the interpreter), one warning in
    the video decoder's words, and the eager op."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.warns(UserWarning) as caught:
        kernels = fused.choose_audio_kernels(H3AudioDecoderConfig(), torch.device("cpu"))
    assert kernels == fused.AudioKernels() and fused.ops_for(kernels) is audio_model.EAGER_OPS
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("fused path on cpu with torch.float32: running without the kernel(s) ")
    assert message.endswith(
        "anti_aliased_snake_beta (tensors on cpu need a CUDA device, or the CPU with "
        "TRITON_INTERPRET=1 set before the kernels were first used; the eager op runs instead)"
    )
    assert fused.choose_audio_kernels(H3AudioDecoderConfig(), torch.device("cpu"), fused=False) == kernels


def test_the_audio_decoder_chooses_once_at_load(audio_layouts, monkeypatch):
    """The warning comes with the load, once; decoding chooses nothing again."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.warns(UserWarning, match="anti_aliased_snake_beta"):
        decoder = H3AudioDecoder.from_pretrained(audio_layouts["original"], device="cpu", fused=True)
    assert decoder.kernels == fused.AudioKernels()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder.decode(torch.zeros(1, decoder.config.latent_channels, 1))
    assert decoder.launch_counts() == dict.fromkeys(fused.LAUNCH_NAMES, 0)


# ---- the docs ------------------------------------------------------------------------------------------------------


def docs_table() -> str:
    """docs/kernels.md's table of the registry, line by line."""
    rows = ["| op | kernel | where | asked for by | exact |", "|---|---|---|---|---|"]
    for line in registry.KERNELS:
        where = f"`fused/{line.module}.py`" if line.module else f"torch's linear, then the `{line.after}` op"
        asked = f'`{line.option[0]}="{line.option[1]}"`' if line.option else "every fused run"
        rows.append(f"| `{line.op}` | `{line.name}` | {where} | {asked} | {'yes' if line.exact else ''} |")
    return "\n".join(rows)


def test_the_docs_list_every_kernel():
    table = docs_table()
    assert table in (REPO / "docs" / "kernels.md").read_text(), f"docs/kernels.md's table should read:\n{table}"
