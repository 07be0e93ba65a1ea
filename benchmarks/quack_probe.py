"""Probe (device only, not part of the suite): the residual add and the norm after it in quack's epilogue,
tile configs for the attention projection's epilogue (fused/linear_qk_rms_norm_rope.py) and for w1's gated
GEMM (fused/linear_silu_mul.py), and to_out and w2 on quack (plain GEMM + bias).

    PYTHONPATH=. python benchmarks/quack_probe.py [residual|qkv|w1|out]

out: to_out (2048 -> 2048) and w2 (8192 -> 2048) alone at M = 28 x 1797 in quack tile configs against cuBLAS,
then a quack + fa4 decode with both on quack (this script swaps the two modules' forward; the package does
not) against the shipped one, alternating, with clocks and the error against an fp32 eager decode.

What the fused path does after to_out and w2 today: cuBLAS writes the fp16 branch y, then the Triton
`scale_add_rms_norm` reads the float32 residual and y, writes the residual back and the next block's fp16
normalised input (14 bytes per element with the GEMM's store). The candidate (a "deferred rstd" epilogue):
the GEMM reads the residual as its C operand and writes, per element, the new residual (float32) and
`fp16(residual * norm_weight * prev)` (prev: the row's rstd from the norm before, which keeps the values near
1 so fp16 cannot overflow), plus per-row partial sums of squares (10 bytes per element); the next GEMM then
scales its accumulator rows by rstd / prev. This times both at M = 28 tiles x 1797 tokens for to_out
(2048 -> 2048) and w2 (8192 -> 2048), checks the candidate against float64, and prints a table last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import run_info, timed  # noqa: E402

from minimax_h3_vae.fused import _quack  # noqa: E402
from minimax_h3_vae.fused.scale_add_rms_norm import scale_add_rms_norm  # noqa: E402

EPS = 1e-5


def build():
    """The candidate epilogue (quack must be loaded)."""
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.ops import ColVecLoad, ColVecReduce, RowVecLoad

    @gemm_epilogue(
        outputs=("resid",),
        ops={
            "bias": RowVecLoad("bias"),
            "scale": RowVecLoad("scale"),
            "weight": RowVecLoad("weight"),
            "prev": ColVecLoad("prev"),
        },
        reduces={"sqsum": ColVecReduce("sqsum", scaled=True)},
    )
    def scale_add_deferred_norm(acc, c, bias, scale, weight, prev):
        y = c + (acc + bias) * scale
        return {"D": y * weight * prev, "resid": y, "sqsum": (y, y)}

    return scale_add_deferred_norm


def probe(epilogue, name, k, residual, scale, norm_w, prev, g, config=None):
    """Time today's pair of ops against the candidate for one GEMM (K = k) with quack's `config` (None: its
    default), and check the candidate."""
    rows, dim = residual.shape
    a = torch.randn(rows, k, device=residual.device, generator=g).half()
    w = (torch.randn(dim, k, device=residual.device, generator=g) / k**0.5).half()
    b = (0.02 * torch.randn(dim, device=residual.device, generator=g)).half()
    d16 = torch.empty(rows, dim, device=residual.device, dtype=torch.float16)
    resid_out = torch.empty(rows, dim, device=residual.device)

    def candidate():
        out = epilogue(
            a,
            w.T,
            residual,
            out={"D": d16, "resid": resid_out},
            tuned=False,
            bias=b,
            scale=scale,
            weight=norm_w,
            prev=prev.view(1, -1),
        )
        rstd = torch.rsqrt(out["sqsum"].view(-1) / dim + EPS)
        return rstd / prev

    def today():
        r = residual.clone()  # the op writes in place; the clone is timed separately and subtracted
        return scale_add_rms_norm(r, F.linear(a, w, b), scale, norm_w, EPS, torch.float16)

    t0 = time.perf_counter()
    ratio = candidate()
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    # Against float64: the new residual, and the normalised input the next GEMM effectively sees.
    y64 = residual.double() + F.linear(a.double(), w.double(), b.double()) * scale.double()
    normed64 = F.rms_norm(y64, (dim,), norm_w.double(), EPS)
    resid_err = (resid_out.double() - y64).abs().max().item()
    seen = d16.double() * ratio.double()[:, None]
    normed_err = ((seen - normed64).abs() / normed64.abs().clamp_min(1e-3)).max().item()
    _, today_normed = today()
    today_err = ((today_normed.double() - normed64).abs() / normed64.abs().clamp_min(1e-3)).max().item()
    clone_ms = min(timed(residual.clone, 10).ms for _ in range(2))
    ms = {"today": [], "candidate": []}
    for _ in range(2):
        ms["today"].append(round(timed(today, 10).ms - clone_ms, 3))
        ms["candidate"].append(round(timed(candidate, 10).ms, 3))
    return name, ms, build_s, resid_err, normed_err, today_err


def tile(m: int, n: int, cluster_m: int, cluster_n: int, pingpong: bool):
    """A quack GemmConfig with an m x n tile, clusters of cluster_m x cluster_n, pingpong or cooperative."""
    from quack.gemm_config import GemmConfig

    return GemmConfig(
        tile_m=m, tile_n=n, cluster_m=cluster_m, cluster_n=cluster_n, pingpong=pingpong, is_dynamic_persistent=False
    )


def sweep(title: str, cublas, run, configs: dict) -> None:
    """Time run(config) for each config (None: quack's default), twice, each time after cuBLAS + the Triton
    op it replaces, median of 10; compare each config's output with the first one's; print a table."""
    reference = run(next(iter(configs.values()))).clone()
    rows_out = []
    for label, config in configs.items():
        try:
            diff = (run(config).float() - reference.float()).abs().max().item()
            ms = [(round(timed(cublas, 10).ms, 3), round(timed(lambda c=config: run(c), 10).ms, 3)) for _ in range(2)]
            rows_out.append((label, ms, diff))
        except Exception as error:  # a config quack refuses: say so, go on
            print(f"{label}: {type(error).__name__}: {str(error)[:300]}")
    print(f"\n| {title} config | (cuBLAS + Triton, quack) ms, twice | max abs diff vs {next(iter(configs))} |")
    print("| --- | --- | ---: |")
    for label, ms, diff in rows_out:
        print(f"| {label} | {ms} | {diff:.2e} |")


def qkv_configs(cuda: torch.device) -> None:
    """The projection + QK norm + RoPE op at M = 28 x 1797 with quack tile configs whose N tile is 192 (one
    head's q, k, v), against cuBLAS + the Triton kernel."""
    from minimax_h3_vae.fused import linear_qk_rms_norm_rope as op
    from minimax_h3_vae.fused.qk_rms_norm_rope import qk_rms_norm_rope
    from minimax_h3_vae.rope import rotary_table, token_positions

    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(28, 1797, 2048, device=cuda, generator=g).half()
    w = (0.02 * torch.randn(6144, 2048, device=cuda, generator=g)).half()
    b = (0.02 * torch.randn(6144, device=cuda, generator=g)).half()
    table = rotary_table(token_positions(7, 16, 16, 5, device=cuda), 48, 100.0)
    rows, normed, kept = op._layout(32, 64, 48, cuda)
    cs = op._table(table.cos, table.sin, 28, 64, torch.float16)
    w_rows, b_rows = w.index_select(0, rows), b.index_select(0, rows)
    out = torch.empty(28 * 1797, 6144, device=cuda, dtype=torch.float16)
    epilogue = op._epilogue(EPS)

    def run(config):
        epilogue(
            x.view(-1, 2048),
            w_rows.T,
            out={"D": out},
            config=config,
            tuned=False,
            bias=b_rows,
            rstd=64,
            normed=normed,
            kept=kept,
            table=cs,
        )
        return out

    configs = {
        "128x192 c2x1 pingpong": tile(128, 192, 2, 1, True),
        "128x192 c1x1 pingpong": tile(128, 192, 1, 1, True),
        "128x192 c1x2 pingpong": tile(128, 192, 1, 2, True),
        "256x192 c1x1 coop": tile(256, 192, 1, 1, False),
        "256x192 c2x1 coop": tile(256, 192, 2, 1, False),
        "192x192 c1x1 pingpong": tile(192, 192, 1, 1, True),
    }
    sweep("qkv", lambda: qk_rms_norm_rope(F.linear(x, w, b), table.cos, table.sin, 32, EPS), run, configs)


def w1_configs(cuda: torch.device) -> None:
    """w1 + gate (quack's gemm_act, called as fused/linear_silu_mul.py calls it but with each config) at
    M = 28 x 1797, against cuBLAS + the Triton gate."""
    from quack.gemm_interface import gemm_act

    from minimax_h3_vae.fused.silu_mul import silu_mul

    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(28 * 1797, 2048, device=cuda, generator=g).half()
    w = (0.02 * torch.randn(16384, 2048, device=cuda, generator=g)).half()
    b = (0.02 * torch.randn(16384, device=cuda, generator=g)).half()
    out = torch.empty(28 * 1797, 8192, device=cuda, dtype=torch.float16)

    def run(config):
        gemm_act(
            x,
            w.T,
            bias=b,
            activation="swiglu",
            postact_out=out,
            store_preact=False,
            tuned=False,
            config=config,
            concat_layout=("B", "bias"),
        )
        return out

    configs = {
        "default (128x192 c2x1 pingpong)": None,
        "128x192 c1x2 pingpong": tile(128, 192, 1, 2, True),
        "128x256 c2x1 pingpong": tile(128, 256, 2, 1, True),
        "128x256 c1x1 coop": tile(128, 256, 1, 1, False),
        "256x128 c2x1 coop": tile(256, 128, 2, 1, False),
        "256x192 c2x1 coop": tile(256, 192, 2, 1, False),
        "128x128 c2x1 pingpong": tile(128, 128, 2, 1, True),
    }
    sweep("w1", lambda: silu_mul(F.linear(x, w, b)), run, configs)


def residual_configs(cuda: torch.device) -> None:
    """The residual candidate against today's pair, for to_out and w2, in four tile configs."""
    epilogue = build()
    g = torch.Generator(device=cuda).manual_seed(0)
    rows, dim = 28 * 1797, 2048
    residual = 3 * torch.randn(rows, dim, device=cuda, generator=g)
    scale = 0.1 * torch.randn(dim, device=cuda, generator=g)
    norm_w = 1 + 0.1 * torch.randn(dim, device=cuda, generator=g)
    prev = torch.rsqrt(residual.pow(2).mean(-1) + EPS) * (1 + 0.05 * torch.rand(rows, device=cuda, generator=g))
    configs = {
        "default 128x192 c2x1 pingpong": None,
        "128x256 c1x1 coop": tile(128, 256, 1, 1, False),
        "256x128 c2x1 coop": tile(256, 128, 2, 1, False),
        "128x128 c2x1 pingpong": tile(128, 128, 2, 1, True),
    }
    table = []
    for label, config in configs.items():
        for name, k in (("to_out", 2048), ("w2", 8192)):
            try:
                table.append(probe(epilogue, f"{name}, {label}", k, residual, scale, norm_w, prev, g, config))
            except Exception as error:  # a config quack refuses: say so, go on
                print(f"{name}, {label}: {type(error).__name__}: {str(error)[:300]}")
    print(
        "\n| GEMM | today: cuBLAS + scale_add_rms_norm, ms | candidate epilogue + rstd, ms | build s | "
        "residual max abs err | normed max rel err (candidate / today) |"
    )
    print("| --- | --- | --- | ---: | ---: | --- |")
    for name, ms, build_s, resid_err, normed_err, today_err in table:
        print(
            f"| {name} | {ms['today']} | {ms['candidate']} | {build_s:.1f} | {resid_err:.2e} | "
            f"{normed_err:.2e} / {today_err:.2e} |"
        )


def bias_epilogue():
    """D = acc + bias, through quack's epilogue frontend (which takes a tile config)."""
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.ops import RowVecLoad

    @gemm_epilogue(ops={"bias": RowVecLoad("bias")})
    def plus_bias(acc, bias):
        return {"D": acc + bias}

    return plus_bias


def quack_linear(x, weight, bias, config):
    """F.linear(x, weight, bias) on quack: config None takes quack's own heuristic (`gemm`)."""
    from quack.gemm_interface import gemm

    rows = x.reshape(-1, x.shape[-1])
    if config is None:
        out = gemm(rows, weight.T, bias=bias, tuned=False)
    else:
        out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        bias_epilogue()(rows, weight.T, out={"D": out}, config=config, tuned=False, bias=bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def out_configs(cuda: torch.device) -> None:
    import statistics

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_gemm import errors, sharing_weights
    from common import UNIT_SHAPE, fp32_reference, random_latents, random_released_decoder

    g = torch.Generator(device=cuda).manual_seed(0)
    configs = {
        "quack's heuristic": None,
        "128x192 c1x2 pingpong (the package's)": tile(128, 192, 1, 2, True),
        "128x192 c2x1 pingpong": tile(128, 192, 2, 1, True),
        "128x256 c1x1 coop": tile(128, 256, 1, 1, False),
        "256x128 c2x1 coop": tile(256, 128, 2, 1, False),
        "128x128 c2x1 pingpong": tile(128, 128, 2, 1, True),
    }
    for name, k in (("to_out", 2048), ("w2", 8192)):
        x = torch.randn(28 * 1797, k, device=cuda, generator=g).half()
        w = (0.02 * torch.randn(2048, k, device=cuda, generator=g)).half()
        b = (0.02 * torch.randn(2048, device=cuda, generator=g)).half()
        cublas = F.linear(x, w, b)
        for label, config in configs.items():
            try:
                same = torch.equal(quack_linear(x, w, b, config), cublas)
            except Exception as error:  # a config quack refuses: say so, go on
                print(f"{name} {label}: {type(error).__name__}: {str(error)[:200]}")
                continue
            ms = [
                (
                    round(timed(lambda x=x, w=w, b=b: F.linear(x, w, b), 10).ms, 3),
                    round(timed(lambda x=x, w=w, b=b, c=config: quack_linear(x, w, b, c), 10).ms, 3),
                )
                for _ in range(2)
            ]
            print(f"| {name} | {label} | (cuBLAS, quack) {ms} | bits equal cuBLAS's: {same} |", flush=True)

    z = random_latents(UNIT_SHAPE, seed=1)
    reference = fp32_reference(z)
    base = random_released_decoder(cuda).configure(fused=True)
    models = {
        "quack + fa4": sharing_weights(base, gemm="quack", attention="fa4"),
        "+ to_out, w2 on quack 128x192 c1x2": sharing_weights(base, gemm="quack", attention="fa4"),
        "+ to_out, w2 on quack's heuristic": sharing_weights(base, gemm="quack", attention="fa4"),
    }
    for label, config in (
        ("+ to_out, w2 on quack 128x192 c1x2", configs["128x192 c1x2 pingpong (the package's)"]),
        ("+ to_out, w2 on quack's heuristic", None),
    ):
        for block in models[label].decoder.transformer_blocks:
            for linear in (block.attn.to_out, block.ff.w2):
                linear.forward = lambda x, linear=linear, config=config: quack_linear(
                    x, linear.weight, linear.bias, config
                )
    ms, outs, clocks = {n: [] for n in models}, {}, {n: [] for n in models}
    for _ in range(3):
        for label, model in models.items():
            t = timed(lambda model=model: model.decode(z), 3)
            ms[label].append(round(t.ms, 1))
            outs[label] = t.out
            clocks[label].append(f"{t.clocks.get('median_sm_mhz', '?')} MHz/{t.clocks.get('median_power_w', '?')} W")
    first = statistics.median(ms["quack + fa4"])
    print(
        "\n| decoder | ms per unit | rounds | vs quack + fa4 | max abs err | mean abs err | diff vs quack + fa4 "
        "| clocks |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for label in models:
        unit = statistics.median(ms[label])
        err = errors(outs[label], reference)
        diff = errors(outs[label], outs["quack + fa4"])[0]
        row = f"| {label} | {unit:.1f} | {ms[label]} | {unit / first:.3f} | {err[0]:.2e} | {err[1]:.2e}"
        print(f"{row} | {diff:.2e} | {clocks[label]} |")


def main() -> None:
    probes = {"residual": residual_configs, "qkv": qkv_configs, "w1": w1_configs, "out": out_configs}
    name = sys.argv[1] if len(sys.argv) > 1 else "residual"
    if name not in probes:
        raise SystemExit(f"usage: quack_probe.py [{'|'.join(probes)}]")
    start = time.perf_counter()
    _quack.load()
    print(f"quack import {time.perf_counter() - start:.1f} s")
    run_info("probe")
    probes[name](torch.device("cuda"))


if __name__ == "__main__":
    main()
