"""One core behind every door: the API, the command, the diffusers swap and the ComfyUI nodes resolve the
same user options into the same run settings, no door changes a shared decoder per call, and the package's
imports run one way."""

from __future__ import annotations

import threading

import pytest
import torch
from checkpoints import random_diffusers_vae
from import_graph import package_imports
from safetensors.torch import save_file

from minimax_h3_vae import H3VideoDecoder, Tiling, comfyui, denormalize_latents, to_unit_rgb
from minimax_h3_vae.comfyui import NODE_CLASS_MAPPINGS, PATH_CHOICE
from minimax_h3_vae.command.flags import parse_args
from minimax_h3_vae.command.preflight import prepare
from minimax_h3_vae.diffusers import decoder_of, swap_decoder, vae_tiling
from minimax_h3_vae.runtime import GIB, resolve_call

# ---- imports run one way --------------------------------------------------------------------------------


def test_imports_have_no_circle():
    graph = package_imports()
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if target == "__init__":
                continue
            assert state.get(target) != 1, f"import circle: {' -> '.join([*path, module, target])}"
            if target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_model_never_imports_the_orchestration():
    graph = package_imports()
    reached, todo = set(), ["model"]
    while todo:
        for target in graph[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    assert not reached & {"decoding", "loading", "weights", "runtime", "memory", "distributed", "command.main"}, reached


def test_the_library_never_imports_the_command():
    """The command (minimax_h3_vae/command/) sits on top of the library: no module outside it imports it."""
    graph = package_imports()
    reaching = {m: sorted(t for t in ts if t.startswith("command")) for m, ts in graph.items()}
    assert not {m: ts for m, ts in reaching.items() if ts and not m.startswith("command")}


# ---- the same options through every door ---------------------------------------------------------------


def settings(decoder: H3VideoDecoder, runtime=None) -> tuple:
    return (decoder.device, decoder.compute_dtype, runtime or decoder.runtime)


def through_the_command(layouts, tmp_path, flags: list[str]) -> tuple:
    z = torch.randn(24, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    save_file({"latents": z}, str(tmp_path / "in.safetensors"))
    args = parse_args([str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"), *flags])
    prepared = prepare(args, None, 0)
    prepared.sink.discard()
    return settings(prepared.decoder)


def test_same_options_same_settings_at_every_door(layouts, tmp_path):
    options = dict(device="cpu", dtype="fp32", fused=False, tile_batch=3, offload="none", max_gpu_memory=2)
    api = settings(H3VideoDecoder.from_pretrained(layouts["original"], **options))
    assert api[2].max_gpu_memory == 2 * GIB and api[2].tiling == Tiling(256, 64)
    flags = ["--model", str(layouts["original"]), "--device", "cpu", "--dtype", "fp32", "--eager"]
    flags += ["--tile-batch", "3", "--offload", "none", "--max-gpu-memory", "2"]
    assert through_the_command(layouts, tmp_path, flags) == api
    vae = swap_decoder(random_diffusers_vae(seed=0), **{k: v for k, v in options.items() if k != "device"})
    h3 = decoder_of(vae)
    assert settings(h3, resolve_call(h3.runtime, h3.config, tiling=vae_tiling(vae, 16))) == api


def test_the_nodes_resolve_like_the_other_doors(layouts, tmp_path):
    """The loader node offers fused and tile_batch (device and dtype are ComfyUI's: here the CPU's defaults)."""
    comfyui.release_decoders()
    (node,) = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"]().load(PATH_CHOICE, str(layouts["comfyui"]), "off", 3)
    comfyui.release_decoders()
    nodes = settings(node.decoder, node.runtime)
    assert nodes == settings(H3VideoDecoder.from_pretrained(layouts["original"], fused=False, tile_batch=3))
    flags = ["--model", str(layouts["original"]), "--eager", "--tile-batch", "3"]
    assert nodes == through_the_command(layouts, tmp_path, flags)
    # The swap builds on the VAE's device: put the VAE where the other doors put the decoder.
    vae = swap_decoder(random_diffusers_vae(seed=0).to(node.decoder.device), fused=False, tile_batch=3)
    h3 = decoder_of(vae)
    assert nodes == settings(h3, resolve_call(h3.runtime, h3.config, tiling=vae_tiling(vae, 16)))


# ---- the diffusers swap: its options mean what they mean elsewhere ---------------------------------------


def test_swap_max_gpu_memory_is_gib():
    """Bug: swap_decoder(vae, max_gpu_memory=8) stored 8 bytes (from_pretrained reads GiB)."""
    vae = swap_decoder(random_diffusers_vae(seed=0), max_gpu_memory=8)
    assert decoder_of(vae).runtime.max_gpu_memory == 8 * GIB


def test_swap_offload_auto_and_blocks(one_thread):
    """Bug: offload="auto" raised, and offload="blocks" was set after the weights were placed."""
    z = torch.randn(1, 24, 3, 4, 6, generator=torch.Generator().manual_seed(1))
    auto = swap_decoder(random_diffusers_vae(seed=0), offload="auto", tile_batch=1)
    blocks = swap_decoder(random_diffusers_vae(seed=0), offload="blocks", tile_batch=1)
    assert decoder_of(auto).runtime.offload == "none" and decoder_of(blocks).runtime.offload == "blocks"
    assert torch.equal(blocks.decode(z).sample, auto.decode(z).sample), "layer-major, bit for bit"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_swap_offload_blocks_keeps_the_linears_in_host_memory():
    vae = swap_decoder(random_diffusers_vae(seed=0).to("cuda"), offload="blocks")
    linears = [p for name, p in decoder_of(vae).named_parameters() if ".attn.to_" in name or ".ff.w" in name]
    assert linears and all(p.device.type == "cpu" and p.is_pinned() for p in linears)


# ---- no door changes a shared decoder behind another's back ----------------------------------------------


def run_together(jobs: dict) -> dict:
    """Run the jobs in threads started together; their results (or exceptions), by name."""
    results, start = {}, threading.Barrier(len(jobs))

    def run(name, job):
        start.wait()
        try:
            results[name] = job()
        except Exception as error:  # handed to the test
            results[name] = error

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_swapped_vae_decodes_in_two_threads(one_thread):
    """Bug: the swap rewrote the shared config's tiling at every decode, so with disable_tiling() a small and
    a large decode at once got each other's tile plan (max abs error 2.29 in a trial)."""
    vae = swap_decoder(random_diffusers_vae(seed=0), tile_batch=1)
    vae.disable_tiling()
    small = torch.randn(1, 24, 1, 1, 1, generator=torch.Generator().manual_seed(2))
    large = torch.randn(1, 24, 17, 6, 6, generator=torch.Generator().manual_seed(3))
    expected = {"small": vae.decode(small).sample, "large": vae.decode(large).sample}
    for _ in range(3):
        got = run_together({"small": lambda: vae.decode(small).sample, "large": lambda: vae.decode(large).sample})
        for name in expected:
            assert torch.equal(got[name], expected[name]), name


def test_comfyui_nodes_share_a_decoder_without_changing_it(layouts, one_thread):
    """Bug: the decode node wrote its tile_batch onto the shared cached decoder at every call."""
    comfyui.release_decoders()
    loader, decode = NODE_CLASS_MAPPINGS["MiniMaxH3DecoderLoader"](), NODE_CLASS_MAPPINGS["MiniMaxH3Decode"]()
    (one,) = loader.load(PATH_CHOICE, str(layouts["comfyui"]), "off", 1)
    (three,) = loader.load(PATH_CHOICE, str(layouts["comfyui"]), "off", 3)
    assert one.decoder is three.decoder and one.decoder.tile_batch is None
    sizes, forward = [], one.decoder.forward
    one.decoder.forward = lambda tiles, ops, out=None: sizes.append(tiles.shape[0]) or forward(tiles, ops, out)
    z = {"samples": torch.randn(1, 24, 3, 20, 20, generator=torch.Generator().manual_seed(4))}  # 2 x 2 tiles
    (a,) = decode.decode(one, z)
    assert sizes == [1, 1, 1, 1] and one.decoder.tile_batch is None
    sizes.clear()
    (b,) = decode.decode(three, z)
    assert sizes == [3, 1] and three.runtime.tile_batch == 3 and one.runtime.tile_batch == 1
    model = one.decoder
    for frames, tile_batch in ((a, 1), (b, 3)):
        expected = to_unit_rgb(model.decode(denormalize_latents(z["samples"], model.config), tile_batch=tile_batch))
        assert torch.equal(frames, expected.cpu().permute(0, 2, 3, 4, 1).flatten(0, 1)), tile_batch
    comfyui.release_decoders()
