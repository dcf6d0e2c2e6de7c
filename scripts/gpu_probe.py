"""Where a GPU runtime's step time goes: fixed cost per run, cost per dispatch, kernel time.

Times three graphs on one runtime, each run `--runs` times after a warm-up, on a real
checkpoint's weights (SmolLM2's first FFN by default):

- ``add``: one elementwise op, the floor of a run (upload, submit, wait, read back);
- ``one``: one matvec ``x @ gate`` (one token);
- ``chain``: ``--depth`` matvecs alternating gate and down, as a decode step's layers do.

``(chain - one) / (depth - 1)`` is the cost of one more matvec in a step: its kernel time
plus whatever the runtime spends per dispatch. Prints one JSON line per runtime. Reports,
not thresholds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from poot import _native


def _runtime(name: str) -> Any:
    if name == "cuda":
        return _native.CudaRuntime()
    if name == "wgpu":
        return _native.WgpuRuntime(60.0)
    return _native.CpuRuntime(None, "exact")


def _time(rt: Any, g: Any, w: Any, x: np.ndarray, runs: int) -> float:
    plan = rt.prepare(g, w)
    for _ in range(3):
        rt.run(plan, {"x": x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        rt.run(plan, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe(rt_name: str, model: str, gate: str, down: str, depth: int, runs: int) -> dict:
    w = _native.Weights(_native.GgufFile(model))
    rt = _runtime(rt_name)
    desc = w.describe(gate)
    if desc is None:
        raise KeyError(f"{model} has no weight {gate!r}")
    k = int(desc[1][1])
    x = np.random.default_rng(0).standard_normal((1, k), dtype=np.float32)

    t = _native.Tracer(w, 1)
    xi = t.input("x", "f32", [1, k])
    t.output("y", t.add(xi, xi))
    add = _time(rt, t.finish(), w, x, runs)

    t = _native.Tracer(w, 1)
    xi = t.input("x", "f32", [1, k])
    t.output("y", t.matmul(xi, t.weight(gate)))
    one = _time(rt, t.finish(), w, x, runs)

    t = _native.Tracer(w, 1)
    h = t.input("x", "f32", [1, k])
    for i in range(depth):
        h = t.matmul(h, t.weight(gate if i % 2 == 0 else down))
    t.output("y", h)
    chain = _time(rt, t.finish(), w, x, runs)
    return {
        "runtime": rt_name,
        "add_us": round(add * 1e6, 1),
        "one_matvec_us": round(one * 1e6, 1),
        f"chain_{depth}_us": round(chain * 1e6, 1),
        "per_extra_matvec_us": round((chain - one) / (depth - 1) * 1e6, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a GGUF file")
    p.add_argument("--runtimes", default="cuda,wgpu,cpu")
    p.add_argument("--gate", default="blk.0.ffn_gate.weight")
    p.add_argument("--down", default="blk.0.ffn_down.weight")
    p.add_argument("--depth", type=int, default=60)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    for name in args.runtimes.split(","):
        try:
            res = probe(name, args.model, args.gate, args.down, args.depth, args.runs)
        except Exception as e:  # one runtime's failure must not hide the others
            res = {"runtime": name, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
