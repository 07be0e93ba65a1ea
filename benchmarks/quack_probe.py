"""Probe (device only, not part of the suite): quack's gated GEMM on the decoder's w1 shape."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

for i in range(2):
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", "import quack.gemm_interface"], capture_output=True, text=True)
    print(f"fresh import #{i}: {time.perf_counter() - t:.2f} s rc={r.returncode} {r.stderr[-300:]}")

t = time.perf_counter()
import quack  # noqa: E402
from quack import gemm_interface as gi  # noqa: E402

print(f"import in process: {time.perf_counter() - t:.2f} s, quack {getattr(quack, '__version__', '?')}")
import cutlass  # noqa: E402

print("cutlass", getattr(cutlass, "__version__", "?"))

if len(sys.argv) > 1 and sys.argv[1] == "key":
    logging.Logger.__quack_semantic_key__ = lambda self: ("logging.Logger", self.name)
    print("Logger key set")

torch.manual_seed(0)
dev = "cuda"
M, K, N = 28 * 1797, 2048, 16384
x = torch.randn(M, K, device=dev, dtype=torch.float16)
w = (torch.randn(N, K, device=dev) / K**0.5).half()
b = (torch.randn(N, device=dev) * 0.1).half()


def ref32(x, w, b):
    h = F.linear(x.float(), w.float(), b.float())
    g, v = h.chunk(2, -1)
    return (F.silu(g) * v).half()


def timeit(fn, n=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


ref = ref32(x, w, b)
results = {}


def attempt(name, fn):
    try:
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        err = (out.float() - ref.float()).abs()
        ms = timeit(fn)
        results[name] = (first, ms, err.max().item(), err.mean().item())
        print(f"{name}: first {first:.2f} s, {ms:.3f} ms, max {err.max().item():.3e} mean {err.mean().item():.3e}")
    except Exception as exc:  # noqa: BLE001
        print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:600]}")
        traceback.print_exc(limit=-3)


from minimax_h3_vae.fused.silu_mul import silu_mul  # noqa: E402

attempt("cublas+silu_mul", lambda: silu_mul(F.linear(x, w, b)))
attempt(
    "concat2d",
    lambda: gi.gemm_act(
        x, w.T, bias=b, activation="swiglu", store_preact=False, tuned=False, concat_layout=("B", "bias")
    )[1],
)
attempt(
    "concat3d",
    lambda: gi.gemm_act(
        x[None],
        w.T[None],
        bias=b[None],
        activation="swiglu",
        store_preact=False,
        tuned=False,
        concat_layout=("B", "bias"),
    )[1][0],
)
wi = w.view(2, N // 2, K).transpose(0, 1).reshape(N, K)  # rows gate0, value0, gate1, ...
bi = b.view(2, N // 2).t().reshape(N)
attempt("interleaved", lambda: gi.gemm_act(x, wi.T, bias=bi, activation="swiglu", store_preact=False, tuned=False)[1])

# New M values: compile per M?
for m in (4 * 1797, 3 * 1797 + 17, 1797):
    try:
        t = time.perf_counter()
        gi.gemm_act(x[:m], wi.T, bias=bi, activation="swiglu", store_preact=False, tuned=False)
        torch.cuda.synchronize()
        print(f"interleaved M={m}: first {time.perf_counter() - t:.3f} s")
    except Exception as exc:  # noqa: BLE001
        print(f"M={m} FAILED {exc!s:.300}")
print("done")
