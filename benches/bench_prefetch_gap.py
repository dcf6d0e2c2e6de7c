"""In-process A/B of ``CpuSettings.prefetch_gap`` on SmolLM2-135M decode (2 threads).

Two ``poot.LLM``s of the default model in one process, one with the gap prefetch off
(``prefetch_gap=0``) and one with it on (``--gap`` bytes), alternate round by round (the order
flips every round, and a pause between them lets the idle one's pool threads park, so they do
not spin against the other). Each round each side decodes ``--tokens`` tokens after a 64-token
prompt (the 64+1 run subtracted from the 64+N run, prefix caching off), then ``--steps``
decode steps with per-equation spans on. Reported: each side's median ms/token and spread
(min-max), the on/off ratio round by round (median and range), and per step the matmul,
attention and other time from the spans (each equation's median over all steps, summed:
robust to a step preempted by another process). Alternating makes both sides see the same
machine load, so the ratio holds up under load better than either side's absolute figure. No
thresholds: printed (and ``--json`` saved), not asserted.

Run: ``python benches/bench_prefetch_gap.py [--rounds 15] [--gap 262144] [--tokens 64]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import poot
from poot.checkpoints.default import cached_model
from poot.config import CpuSettings

THREADS = 2
PROMPT = [1] + [100 + 7 * i for i in range(63)]


def load(path: Path, gap: int) -> Any:
    return poot.LLM(
        str(path),
        threads=THREADS,
        max_model_len=512,
        enable_prefix_caching=False,
        progress=False,
        cpu=CpuSettings(prefetch_gap=gap),
    )


def decode_ms(llm: Any, tokens: int) -> float:
    """Milliseconds per decoded token: the 64+N run less the 64+1 run."""

    def run(n: int) -> float:
        p = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([PROMPT], p)
        return time.perf_counter() - t0

    return (run(tokens + 1) - run(1)) / tokens * 1e3


def step_spans(llm: Any, into: dict[int, list[float]], kinds: dict[int, str]) -> None:
    """Appends each equation's time (ms) in one decode step (``last_run_spans``) to ``into``."""
    rt = getattr(llm.runtime, "inner", llm.runtime)
    rt.record_spans(True)
    llm.generate([PROMPT], poot.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    for i, kind, a, b in rt.last_run_spans():
        into.setdefault(i, []).append((b - a) * 1e3)
        kinds[i] = kind
    rt.record_spans(False)


def per_op_medians(
    spans: dict[int, list[float]], kinds: dict[int, str]
) -> tuple[float, float, float]:
    """(matmul ms, attention ms, other ms) per step: each equation's median over the rounds,
    summed (a preempted step inflates one round of a few equations, not the sum of medians).
    Attention apart: it runs on the pool while the idle worker streams the hint."""
    med = {i: statistics.median(v) for i, v in spans.items()}
    mm = sum(v for i, v in med.items() if kinds[i].startswith("matmul"))
    attn = sum(v for i, v in med.items() if kinds[i] == "paged_attention")
    return mm, attn, sum(med.values()) - mm - attn


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--gap", type=int, default=256 << 10, help="prefetch_gap bytes of the on side")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4, help="decode steps with spans per round")
    ap.add_argument("--json", type=Path, help="also save every round's numbers here")
    args = ap.parse_args()
    path = cached_model()
    if path is None:
        sys.exit("the default model is not pulled (poot pull)")
    sides = {"off": load(path, 0), f"on({args.gap})": load(path, args.gap)}
    res: dict[str, dict[str, list[float]]] = {k: {"ms": []} for k in sides}
    spans: dict[str, dict[int, list[float]]] = {k: {} for k in sides}
    kinds: dict[int, str] = {}
    for llm in sides.values():  # warm-up: plans compiled, pages touched
        decode_ms(llm, 8)
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            time.sleep(0.05)  # the other side's pool threads park
            res[name]["ms"].append(decode_ms(sides[name], args.tokens))
            for _ in range(args.steps):
                step_spans(sides[name], spans[name], kinds)
    off, on = list(sides)
    for name in sides:
        mm, attn, rest = per_op_medians(spans[name], kinds)
        print(
            f"{name:>14}: {spread(res[name]['ms'])} ms/token; per step, each equation's "
            f"median summed: matmul {mm:.3f} ms, attention {attn:.3f} ms, other {rest:.3f} ms"
        )
    ratio = [a / b for a, b in zip(res[on]["ms"], res[off]["ms"], strict=True)]
    print(f"on/off ms/token, round by round: {spread(ratio)} over {args.rounds} rounds")
    if args.json:
        out = {"gap": args.gap, "rounds": res, "spans": spans, "kinds": kinds}
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
