"""Run options at every door: per-call attention backends that stay the call's own, backend names
and options checked when they are made, misspelt options named with the nearest one, decoder.dtype, and
what offload / max_gpu_memory do on the CPU."""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from checkpoints import random_diffusers_vae
from repo import TINY
from safetensors.torch import save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

from minimax_h3_vae import DecodeOptions, H3VideoDecoder
from minimax_h3_vae.command import main as cli
from minimax_h3_vae.diffusers import SwapError, swap_decoder, vae_tiling
from minimax_h3_vae.runtime import ATTENTION_BACKENDS, Runtime, check_machine


@pytest.fixture(scope="module")
def tiny():
    return H3VideoDecoder.from_pretrained(TINY, device="cpu")


def small_latents(seed: int = 0) -> torch.Tensor:
    """One window of 3 tiles: 3 decoder calls with tile_batch=1."""
    return torch.randn(1, 24, 2, 1, 29, generator=torch.Generator().manual_seed(seed))


def sdpa_switches() -> tuple:
    """Every process-wide SDPA setting torch has: the backend switches and the priority order."""
    b = torch.backends.cuda
    switches = (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())
    return switches, tuple(torch._C._get_sdp_priority_order())


# ---- the attention op: each backend through its own op, bit for bit torch's ----------------------------------------


def decoder_qkv(dtype: torch.dtype, head_dim: int = 64, device: str = "cpu"):
    """q, k, v as the block passes them: q and k new tensors, v a strided view of the projection."""
    qkv = torch.randn(2, 37, 2, 3, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    q, k, v = qkv.transpose(1, 2).unbind(3)
    return q.contiguous(), k.contiguous(), v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_default_backends_are_torchs_default_bit_for_bit(dtype):
    """The decoder's default list runs what F.scaled_dot_product_attention runs by default, bit for bit (on
    the CPU its flash kernel, which differs from the math path in the last bits: both are checked)."""
    from minimax_h3_vae import sdpa

    q, k, v = decoder_qkv(dtype)
    expected = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(sdpa.attention(q, k, v), expected)
    with sdpa_kernel([SDPBackend.MATH]):
        math = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(sdpa.attention(q, k, v, ("MATH",)), math)
    assert dtype != torch.float32 or not torch.equal(math, expected), "the two backends must be told apart"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 40])
def test_each_cuda_backend_is_torchs_bit_for_bit(dtype, head_dim):
    """Each backend that can run, alone, equals F.scaled_dot_product_attention restricted to it (head dim
    40: flash's padded path)."""
    from minimax_h3_vae import sdpa

    q, k, v = decoder_qkv(dtype, head_dim, "cuda")
    ran = 0
    for name in ATTENTION_BACKENDS:
        if sdpa.problem(name, q, k, v) is not None:
            continue
        with sdpa_kernel([getattr(SDPBackend, name)]):
            expected = F.scaled_dot_product_attention(q, k, v)
        assert torch.equal(sdpa.attention(q, k, v, (name,)), expected), name
        ran += 1
    assert ran >= 2, "MATH and at least one fused backend"
    # The default list, as the decoder ran it before (the same order, set as the process's priority).
    with sdpa_kernel([getattr(SDPBackend, name) for name in ATTENTION_BACKENDS], set_priority=True):
        expected = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(sdpa.attention(q, k, v), expected)


def test_no_backend_that_can_run_is_a_clear_error():
    from minimax_h3_vae import sdpa

    q, k, v = decoder_qkv(torch.float32)
    with pytest.raises(ValueError, match="CUDNN_ATTENTION: not a backend on cpu"):
        sdpa.attention(q, k, v, ("CUDNN_ATTENTION",))


# ---- per-call backends are that call's alone -----------------------------------------------------------------------


def test_a_call_with_its_own_backends_changes_no_process_setting(tiny):
    """Bug: per-call attention_backends went through torch.nn.attention.sdpa_kernel, which sets switches of
    the whole process: during the decode every other thread and library saw MATH alone."""
    before = sdpa_switches()
    during = []
    tiny.decode(
        small_latents(), tile_batch=1, attention_backends=("MATH",), progress=lambda *_: during.append(sdpa_switches())
    )
    assert len(during) > 1 and set(during) == {before}, "nothing process-wide changes while the call runs"
    assert sdpa_switches() == before


def test_threads_with_different_backends_equal_their_single_thread_decodes(tiny, one_thread):
    """Bug: a thread's backends changed another thread's result. Thread B (the default backends) pauses
    after its first tile; thread A (MATH) starts and pauses after its first tile; B finishes, then A. Each
    equals its own decode run alone, and no process-wide setting has changed."""
    z = small_latents()
    backends = {"a": ("MATH",), "b": ATTENTION_BACKENDS}
    alone = {name: tiny.decode(z, tile_batch=1, attention_backends=names) for name, names in backends.items()}
    assert not torch.equal(alone["a"], alone["b"]), "the backends must differ in the last bits"
    before = sdpa_switches()
    paused = {name: threading.Event() for name in backends}
    go = {name: threading.Event() for name in backends}
    results, errors = {}, []

    def run(name):
        def pause(done, total):
            if done == 1:
                paused[name].set()
                go[name].wait(60)

        try:
            results[name] = tiny.decode(z, progress=pause, tile_batch=1, attention_backends=backends[name])
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            paused[name].set()

    threads = {name: threading.Thread(target=run, args=(name,)) for name in backends}
    threads["b"].start()
    assert paused["b"].wait(60)
    threads["a"].start()
    assert paused["a"].wait(60)
    go["b"].set()
    threads["b"].join(60)
    go["a"].set()
    threads["a"].join(60)
    assert not errors, errors
    assert torch.equal(results["b"], alone["b"]), "thread B ran with thread A's backends"
    assert torch.equal(results["a"], alone["a"])
    assert sdpa_switches() == before


# ---- backend names, and backends for the device, refused when the options are made ---------------------------------


@pytest.mark.parametrize("names", ["__class__", "name", "ERROR", "OVERRIDEABLE", ("MATH", "flash"), (), 3])
def test_attention_backends_must_be_backends(names, tiny):
    """Bug: any attribute of SDPBackend passed ("__class__", "name", "ERROR"), to fail inside the decode."""
    message = "must name SDPA backends from .*CUDNN_ATTENTION.*MATH"
    with pytest.raises(ValueError, match=message):
        DecodeOptions(device="cpu", attention_backends=names)
    with pytest.raises(ValueError, match=message):
        tiny.decode(small_latents(), attention_backends=names)
    with pytest.raises(ValueError, match=message):
        tiny.configure(attention_backends=names)
    assert tiny.runtime.attention_backends == ATTENTION_BACKENDS


def test_a_near_backend_name_is_named():
    with pytest.raises(ValueError, match="did you mean 'FLASH_ATTENTION'"):
        DecodeOptions(device="cpu", attention_backends=("FLASH_ATTENTIONS",))


@pytest.mark.parametrize("names", [("CUDNN_ATTENTION",), ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION")])
def test_backends_that_cannot_run_on_the_device_are_refused(names, tiny):
    """Bug: CUDNN_ATTENTION alone on the CPU was taken, then every decode failed ("No viable backend")."""
    message = "none of them runs on cpu.*FLASH_ATTENTION, MATH"
    with pytest.raises(ValueError, match=message):  # the options are plain data: the machine is resolve's
        check_machine(DecodeOptions(device="cpu", attention_backends=names))
    with pytest.raises(ValueError, match=message):
        tiny.decode(small_latents(), attention_backends=names)
    with pytest.raises(ValueError, match=message):
        tiny.configure(attention_backends=names)
    assert tiny.runtime.attention_backends == ATTENTION_BACKENDS
    # A preference that names a backend of another device too still runs what runs here.
    out = tiny.decode(small_latents(), attention_backends=("CUDNN_ATTENTION", "MATH"))
    assert torch.equal(out, tiny.decode(small_latents(), attention_backends=("MATH",)))


def test_options_of_another_type_are_refused(tiny):
    """Bug: options=dict raised AttributeError ('dict' object has no attribute 'device')."""
    with pytest.raises(ValueError, match="options must be a minimax_h3_vae.DecodeOptions, got dict"):
        H3VideoDecoder.from_pretrained(TINY, options={"tile_batch": 2})
    with pytest.raises(SwapError, match="options must be a minimax_h3_vae.DecodeOptions, got dict"):
        swap_decoder(random_diffusers_vae(seed=0), options={"tile_batch": 2})


# ---- misspelt options, at every door -------------------------------------------------------------------------------

NEAREST = r"unknown option 'tile_bach' \(did you mean 'tile_batch'\?\)"


def test_a_misspelt_option_is_named_with_the_nearest_one(tiny):
    """Bug: decode(z, tile_bach=2) said "fixed when the decoder is loaded; give it to from_pretrained", which
    then raised TypeError (unexpected keyword)."""
    z = small_latents()
    for door in (
        lambda: tiny.decode(z, tile_bach=2),
        lambda: tiny.decode_stream(z, tile_bach=2),
        lambda: tiny.configure(tile_bach=2),
        lambda: H3VideoDecoder.from_pretrained(TINY, device="cpu", tile_bach=2),
        lambda: swap_decoder(random_diffusers_vae(seed=0), tile_bach=2),
    ):
        with pytest.raises(ValueError, match=NEAREST):
            door()
    with pytest.raises(ValueError, match=r"'devise' \(did you mean 'device'\?\)"):
        H3VideoDecoder.from_pretrained(TINY, devise="cpu")
    with pytest.raises(ValueError, match="offload: fixed when the decoder is loaded"):
        tiny.decode(z, offload="none")  # a real option, fixed at load: its own message
    assert tiny.tile_batch is None


# ---- decoder.dtype -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, expected", [("fp32", torch.float32), ("fp16", torch.float16)])
def test_decoder_dtype_is_the_compute_dtype(dtype, expected):
    decoder = H3VideoDecoder.from_pretrained(TINY, device="cpu", dtype=dtype)
    assert decoder.dtype == expected == decoder.decoder.transformer_blocks[0].ff.w1.weight.dtype


# ---- the fused path on the CPU: one warning, its reason once -------------------------------------------------------


def test_the_fused_path_says_its_reason_once(monkeypatch, tiny):
    """Bug: decode(fused=True) on the CPU without the interpreter repeated the same reason for each of the
    five kernels."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    decoder = H3VideoDecoder.from_pretrained(TINY, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoder.decode(small_latents(), fused=True)
    messages = [str(w.message) for w in caught if "fused path" in str(w.message)]
    assert len(messages) == 1, messages
    assert messages[0].count("need a CUDA device") == 1, messages[0]
    for kernel in ("rms_norm", "scale_add_rms_norm", "qk_rms_norm_rope", "silu_mul", "tf32x3_linear"):
        assert kernel in messages[0]


# ---- offload and max_gpu_memory on the CPU: accepted, and said for what they are -----------------------------------


def test_offload_and_gpu_budget_on_the_cpu_are_said_for_what_they_do(tmp_path, capsys):
    """Bug: on the CPU the command reported "eager, block weights streamed from host memory ops": nothing is
    streamed there, and --max-gpu-memory has no GPU to budget."""
    save_file({"latents": small_latents()[0]}, str(tmp_path / "in.safetensors"))
    args = [tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--model", TINY, "--device", "cpu"]
    assert cli.main([str(a) for a in [*args, "--offload", "blocks", "--max-gpu-memory", "2", "--raw-latents"]]) == 0
    err = capsys.readouterr().err
    assert "streamed from host memory" not in err and "ops ops" not in err
    assert "layer-major, nothing streamed" in err and "max_gpu_memory does nothing on the CPU" in err
    from minimax_h3_vae.runtime import placement_description

    cuda = placement_description(Runtime(offload="blocks", max_gpu_memory=2**31), torch.device("cuda"))
    assert cuda == "block weights streamed from host memory; GPU memory budget 2.0 GiB"
    assert placement_description(Runtime(), torch.device("cpu")) == ""


# ---- the diffusers swap --------------------------------------------------------------------------------------------


def test_the_swap_without_diffusers_names_the_extra(monkeypatch):
    """Bug: `from minimax_h3_vae.diffusers import swap_decoder` without diffusers: a bare ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an environment without diffusers imports
    monkeypatch.delitem(sys.modules, "minimax_h3_vae.diffusers")
    with pytest.raises(ModuleNotFoundError) as info:
        importlib.import_module("minimax_h3_vae.diffusers")
    message = str(info.value)
    assert 'pip install -e ".[diffusers]"' in message and 'pip install "diffusers>=0.42"' in message


def tiling_switches(size, overlap) -> SimpleNamespace:
    return SimpleNamespace(
        use_tiling=True,
        tile_sample_min_height=size,
        tile_sample_min_width=size,
        tile_sample_min_overlap_height=overlap,
        tile_sample_min_overlap_width=overlap,
    )


@pytest.mark.parametrize("size, overlap", [("256", "64"), (256, "64"), (256.0, 64.0), (256.5, 64), (True, 64)])
def test_enable_tiling_values_that_are_not_pixels_are_one_swap_error(size, overlap):
    """Bug: strings raised "not all arguments converted during string formatting" (a TypeError) and float
    sizes a ValueError from Tiling, not the SwapError with the rule."""
    with pytest.raises(SwapError, match="whole numbers of pixels, multiples of 16 px"):
        vae_tiling(tiling_switches(size, overlap), 16)


def test_enable_tiling_with_strings_through_the_swapped_vae():
    vae = swap_decoder(random_diffusers_vae(seed=0), tile_batch=1)
    vae.enable_tiling(tile_sample_min_height="256", tile_sample_min_width="256")
    with pytest.raises(SwapError, match="whole numbers of pixels"):
        vae.decode(small_latents())
    vae.enable_tiling(tile_sample_min_height=256, tile_sample_min_width=256)
    assert vae.decode(small_latents()).sample.shape == (1, 3, 5, 16, 464)


# ---- exact ------------------------------------------------------------------------------------------------------


def test_exact_is_checked_and_refuses_flash_attention_4():
    """exact takes a bool; asking for fa4 with it names why, at every door (the command: one line). quack's GEMMs
    are refused only where they cannot run at all: with exact=True they run w1 in an epilogue that keeps the
    release's bits."""
    with pytest.raises(ValueError, match=r"exact must be True, False or None \(automatic\), got 1"):
        DecodeOptions(exact=1)
    with pytest.raises(ValueError, match="is not bit for bit the release's, which exact=True asks for"):
        check_machine(DecodeOptions(device="cpu", exact=True, attention="fa4"))
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        check_machine(DecodeOptions(device="cpu", exact=True, gemm="quack"))


@pytest.fixture
def hopper_with_the_extra(monkeypatch):
    """A Hopper GPU with quack, the CuTe DSL, flash-attn-4 and Triton installed, as `resolve` sees the machine (the
    CPU stands in: nothing is loaded)."""
    from minimax_h3_vae.fused import flash_attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    find_spec = importlib.util.find_spec
    installed = ("quack", "cutlass", "triton")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in installed else find_spec(name, *a)
    )
    monkeypatch.setattr(flash_attention, "installed", lambda: True)


@pytest.mark.parametrize(
    ("asked", "gemm", "exact", "attention"),
    [
        ({}, "quack", True, "sdpa"),  # the release's bits cost nothing with quack's exact w1: on by default
        ({"exact": True}, "quack", True, "sdpa"),
        ({"exact": False}, "quack", False, "fa4"),  # the fastest path, asked for
        ({"attention": "fa4"}, "quack", False, "fa4"),
        ({"attention": "sdpa", "exact": False}, "quack", False, "sdpa"),
        ({"gemm": "cublas"}, "cublas", False, "fa4"),  # exact with cuBLAS alone costs more: off unless asked
        ({"gemm": "cublas", "exact": True}, "cublas", True, "sdpa"),
        ({"dtype": "fp32"}, "cublas", False, "sdpa"),
        ({"fused": False}, "cublas", False, "sdpa"),
    ],
)
def test_exact_by_default_where_it_costs_nothing(hopper_with_the_extra, asked, gemm, exact, attention):
    """exact=None (every door's default) is on where quack's GEMMs run and the attention is not asked to be
    flash-attn-4's: there the exact path is no slower than the fused default (benchmarks/RESULTS.md); elsewhere
    it is off. An explicit answer is kept."""
    assert DecodeOptions().exact is None
    device, dtype, _, got_gemm, got_exact, got_attention = check_machine(DecodeOptions(device="cuda", **asked))
    assert device == torch.device("cuda", 0) and (got_gemm, got_exact, got_attention) == (gemm, exact, attention)


def test_exact_by_default_is_off_without_the_hopper_kernels():
    assert check_machine(DecodeOptions(device="cpu"))[3:] == ("cublas", False, "sdpa")
    assert Runtime().exact is False


def test_exact_per_call_none_is_the_default_for_the_decoder():
    """decode(z, exact=None) decides as at load, with the decoder's GEMMs and attention."""
    from minimax_h3_vae import H3DecoderConfig
    from minimax_h3_vae.runtime import resolve_call

    config = H3DecoderConfig()
    assert resolve_call(Runtime(gemm="quack", attention="sdpa"), config, exact=None).exact is True
    assert resolve_call(Runtime(gemm="quack", attention="fa4", exact=True), config, exact=None).exact is False
    assert resolve_call(Runtime(exact=True), config, exact=None).exact is False


def test_every_door_leaves_exact_to_the_default_unless_asked():
    from minimax_h3_vae.comfyui import inputs
    from minimax_h3_vae.command import flags

    parse = lambda *extra: flags.parse_args(["in.safetensors", "out.mp4", *extra]).exact  # noqa: E731
    assert (parse(), parse("--exact"), parse("--no-exact")) == (None, True, False)
    assert inputs.node_options("auto", 0).exact is None, "the widget off: the default"
    assert inputs.node_options("auto", 0, exact=True).exact is True
    with pytest.raises(ValueError, match="exact must be True or False"):
        inputs.node_options("auto", 0, exact=None)
    assert swap_decoder(random_diffusers_vae(seed=0)).decoder.minimax_h3.options.exact is None


def test_exact_chooses_only_the_exact_kernels(tiny):
    """exact=True (at load or per call) takes the registry's exact lines: the norms in torch's order, the gate,
    and proj_out eager; without it the faster norms. The decoder's own setting stays for later calls."""
    from minimax_h3_vae import fused

    if not fused.interpreting() and not torch.cuda.is_available():
        pytest.skip("the fused kernels need CUDA or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    options = dict(device=device, dtype="fp16", fused=True, gemm="cublas", attention="sdpa")
    decoder = H3VideoDecoder.from_pretrained(TINY, **options)
    kernels = decoder.runtime.kernels
    assert (kernels.rms_norm, kernels.scale_add_rms_norm, kernels.qk_rms_norm_rope) == ("triton",) * 3
    exact = decoder.configure(exact=True).runtime.kernels
    assert (exact.rms_norm, exact.scale_add_rms_norm, exact.qk_rms_norm_rope) == ("triton-exact",) * 3
    assert (exact.silu_mul, exact.linear_fp32) == ("triton", "eager")
    assert decoder.configure(exact=False).runtime.kernels == kernels


def test_the_command_refuses_exact_with_fa4(tmp_path, capsys):
    """--exact --attention fa4: one error line naming the flag, exit code 2, nothing written."""
    latents = tmp_path / "in.safetensors"
    save_file({"latents": torch.zeros(24, 3, 2, 2)}, str(latents))
    out = tmp_path / "out.safetensors"
    code = cli.main([str(latents), str(out), "--model", str(TINY), "--exact", "--attention", "fa4", "--no-audio"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err == [
        "error: --attention 'fa4' is not bit for bit the release's, which exact=True asks for; or choose 'sdpa'"
    ]
