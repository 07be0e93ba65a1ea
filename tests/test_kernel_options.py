"""The two Hopper kernel options, decided the same way: gemm ("cublas" | "quack": fused/linear_silu_mul.py,
fused/linear_qk_rms_norm_rope.py) and attention ("sdpa" | "fa4": fused/flash_attention.py). "auto" picks the
Hopper kernel only where all of it runs; asked for where it cannot run, it says why and names the way out; the
option is checked when made and fixed at load; the command's flag defaults to the portable kernel and refuses
what it cannot honour in one line, before anything is loaded; asked for through the command, it writes what the
API decodes.

The kernels' own tests: tests/test_quack_gemm.py, tests/test_flash_attention.py. The last test here needs a
Hopper GPU with the `hopper` extra and skips elsewhere."""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from minimax_h3_vae import H3DecoderConfig, H3VideoDecoder, to_uint8_frames
from minimax_h3_vae.command import flags
from minimax_h3_vae.command import main as cli
from minimax_h3_vae.fused import flash_attention
from minimax_h3_vae.runtime import DecodeOptions, Runtime, resolve, resolve_attention, resolve_call, resolve_gemm

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
QUACK = importlib.util.find_spec("quack") is not None and importlib.util.find_spec("cutlass") is not None
CUDA = torch.device("cuda")

GEMM = SimpleNamespace(
    name="gemm",
    resolve=resolve_gemm,
    hopper="quack",
    portable="cublas",
    misspelt="cutlass",
    choices="gemm must be 'auto', 'cublas' or 'quack'",
    work="GEMMs",  # "needs the fp16 recipe's GEMMs, not fp32"
    way_out="'cublas'",
    cpu_error="error: --gemm 'quack' needs a Hopper GPU (compute capability 9.0); cpu is not one; or choose the "
    "'cublas' GEMMs",
    # the command's default attention is SDPA, so quack's GEMMs come with exact's default on: quack runs w1 alone
    said="(quack's GEMMs for w1, exact: the release's bits)",
    runs_here=HOPPER and QUACK,
    other={"attention": "sdpa"},  # the command's default for the other option
)
ATTENTION = SimpleNamespace(
    name="attention",
    resolve=resolve_attention,
    hopper="fa4",
    portable="sdpa",
    misspelt="flash",
    choices="attention must be 'auto', 'sdpa' or 'fa4'",
    work="attention",
    way_out="or choose 'sdpa'",
    cpu_error="error: --attention 'fa4' needs a Hopper GPU (compute capability 9.0); cpu is not one; or choose 'sdpa'",
    said=" ops (FlashAttention 4)",
    runs_here=HOPPER and flash_attention.installed(),
    other={"gemm": "cublas"},
)


@pytest.fixture(params=[GEMM, ATTENTION], ids=["gemm", "attention"])
def option(request):
    return request.param


@pytest.fixture
def on_hopper(option, monkeypatch):
    """The option's resolver on a machine that has everything its Hopper kernel needs (the CPU stands in)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    if option is GEMM:
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: object() if name in ("quack", "cutlass") else find_spec(name, *a),
        )
    else:
        monkeypatch.setattr(flash_attention, "installed", lambda: True)


def test_auto_picks_the_hopper_kernel_only_where_all_of_it_runs(option, on_hopper, monkeypatch):
    resolve, hopper, portable = option.resolve, option.hopper, option.portable
    assert resolve("auto", CUDA, torch.float16, True) == hopper
    assert resolve("auto", CUDA, torch.float32, True) == portable
    assert resolve("auto", CUDA, torch.float16, False) == portable
    assert resolve("auto", torch.device("cpu"), torch.float16, True) == portable
    assert resolve(portable, CUDA, torch.float16, True) == portable
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert resolve("auto", CUDA, torch.float16, True) == portable, "measured on Hopper only"


@pytest.mark.parametrize(
    ("device", "dtype", "fused", "message"),
    [
        ("cpu", torch.float16, True, "needs a Hopper GPU"),
        ("cuda", torch.float32, True, "fp16 recipe's {work}, not fp32"),
        ("cuda", torch.float16, False, "runs on the fused path"),
    ],
)
def test_the_hopper_kernel_where_it_cannot_run_says_why(option, on_hopper, device, dtype, fused, message):
    with pytest.raises(ValueError, match=message.format(work=option.work)) as caught:
        option.resolve(option.hopper, torch.device(device), dtype, fused)
    assert option.way_out in str(caught.value), "names the way out"


def test_the_option_is_checked_and_fixed_at_load(option):
    with pytest.raises(ValueError, match=option.choices):
        DecodeOptions(device="cpu", **{option.name: option.misspelt})
    assert getattr(DecodeOptions(device="cpu"), option.name) == "auto", "plain data: decided by resolve"
    assert getattr(resolve(DecodeOptions(device="cpu"), H3DecoderConfig()), option.name) == option.portable, (
        "auto on the CPU"
    )
    assert getattr(Runtime(), option.name) == option.portable, "a decoder built directly imports nothing"
    with pytest.raises(ValueError, match=f"{option.name}: fixed when the decoder is loaded"):
        resolve_call(Runtime(), H3DecoderConfig(), **{option.name: option.hopper})


def test_the_command_defaults_to_the_portable_kernel_and_names_its_flag(option, layouts, tmp_path, capsys):
    """The command pays no quack or flash-attn-4 import unless asked (--gemm, --attention), and a value it cannot
    honour is one error line naming the flag, exit code 2, before anything is loaded."""
    args = flags.parse_args(["in.safetensors", "out.mp4"])
    assert getattr(args, option.name) == option.portable
    assert getattr(flags.decode_options(args), option.name) == option.portable
    latents, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"latents": torch.randn(24, 1, 2, 2)}, str(latents))
    argv = [str(latents), str(out), "--model", str(layouts["original"]), "--device", "cpu"]
    code = cli.main([*argv, f"--{option.name}", option.hopper])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err == [option.cpu_error]


def test_the_command_with_the_hopper_kernel_writes_what_the_api_decodes(option, layouts, tmp_path, capsys):
    """--gemm quack, --attention fa4 through the command: it says so, and its frames are the API's with the
    same option (and the command's default for the other)."""
    if not option.runs_here:
        pytest.skip("needs a Hopper GPU with the hopper extra")
    z = torch.randn(1, 24, 3, 5, 7, generator=torch.Generator().manual_seed(9))
    latents, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"latents": z}, str(latents))
    argv = [str(latents), str(out), "--model", str(layouts["original"]), "--raw-latents"]
    code = cli.main([*argv, f"--{option.name}", option.hopper])
    err = capsys.readouterr().err
    assert code == 0, err
    assert option.said in err
    decoder = H3VideoDecoder.from_pretrained(layouts["original"], **{option.name: option.hopper}, **option.other)
    assert torch.equal(load_file(str(out))["video"], to_uint8_frames(decoder.decode(z)).cpu())


def test_exact_per_call_refuses_flash_attention_4_alone():
    """A decoder loaded with fa4 cannot give the release's bits per call (its attention is not torch's SDPA);
    one loaded with quack's GEMMs can (exact=True takes its exact w1 line, the rest as with cuBLAS)."""
    config = H3DecoderConfig()
    with pytest.raises(ValueError, match="loaded with attention='fa4', which is not bit for bit the release's"):
        resolve_call(Runtime(attention="fa4"), config, exact=True)
    assert resolve_call(Runtime(gemm="quack"), config, exact=True).exact
