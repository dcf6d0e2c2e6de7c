"""Forward time of a tiny nanoGPT decoder: poot.compile on the CPU runtime against torch eager,
both on the same number of threads (``torch.set_num_threads`` and ``CpuRuntime(threads=)``).

Rounds alternate the two (so both see the same machine load); each round times ``--iters``
forwards of each. Reported per config: the median ms per forward of each side and the median
of the per-round ratios poot/torch, with their range. No thresholds: the table is printed (and
``--json`` saved), not asserted. Run it on a quiet machine:

    python benches/bench_torch_decoder.py --threads 1 --rounds 7
    python benches/bench_torch_decoder.py --threads 4 --json out.json

The training step (issue 34 item 7) is not timed here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, batch, seq, width, heads, layers, vocab)
CONFIGS = [
    ("tiny b2 t16 c32 l2", 2, 16, 32, 4, 2, 65),
    ("small b4 t64 c128 l4", 4, 64, 128, 4, 4, 256),
]


def _time(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def run(threads: int, rounds: int, iters: int) -> list[dict[str, object]]:
    import torch

    import poot
    from poot import _native
    from tests.test_torch_compile_gpt import Gpt

    torch.set_num_threads(threads)
    rows = []
    for name, b, t, c, h, layers, v in CONFIGS:
        torch.manual_seed(0)
        m = Gpt(True, v=v, c=c, h=h, layers=layers, t=t).eval()
        idx = torch.randint(0, v, (b, t))
        compiled = poot.compile(m, (idx,), runtime=_native.CpuRuntime(threads=threads))
        with torch.no_grad():
            want = m(idx).numpy()
        err = float(abs(compiled(idx).cpu() - want).max())

        def eager(m: torch.nn.Module = m, idx: torch.Tensor = idx) -> None:
            with torch.no_grad():
                m(idx)

        def ours(compiled: poot.CompiledModule = compiled, idx: torch.Tensor = idx) -> None:
            compiled(idx)

        for f in (eager, ours):  # warm both
            _time(f, iters)
        torch_s, poot_s = [], []
        for _ in range(rounds):
            torch_s.append(_time(eager, iters))
            poot_s.append(_time(ours, iters))
        ratios = [p / q for p, q in zip(poot_s, torch_s, strict=True)]
        rows.append({
            "config": name, "threads": threads,
            "torch_ms": statistics.median(torch_s) * 1e3,
            "poot_ms": statistics.median(poot_s) * 1e3,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "max_abs_err": err,
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = run(a.threads, a.rounds, a.iters)
    head = ("config", "thr", "torch ms", "poot ms", "poot/torch", "range")
    print("{:<24} {:>3} {:>9} {:>9} {:>11} {:>13}".format(*head))
    for r in rows:
        print(
            f"{r['config']:<24} {r['threads']:>3} {r['torch_ms']:>9.3f} {r['poot_ms']:>9.3f} "
            f"{r['ratio']:>11.2f} {r['ratio_min']:>6.2f}-{r['ratio_max']:<6.2f}"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
