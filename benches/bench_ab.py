"""Two builds of poot side by side: the "no row slower than before" check of a kernel change.

Each side is a poot tree (its ``python/`` folder with a built ``_native`` module in it, for
example a ``git worktree`` of the base commit built with ``cargo build --release -p poot-py``
and the module copied in). For every row of ``bench_cpu_table.py`` asked for, each side loads
the model once in its own worker process; then, round by round, the two alternate (so both see
the same machine load): prefill of 512 tokens, and decode of 128 tokens after a 64-token prompt
(the 64+1 run subtracted from the 64+128 run), every run with a fresh prompt. Reported: each
side's median tok/s, and the ratio new/base taken round by round, its median and range.
No thresholds: the table is printed (and ``--json`` saved), not asserted.

Run: ``python benches/bench_ab.py --base ../wt-base --new . --rows smollm2,qwen25-q4_k_m``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu_table as table  # noqa: E402
import cpu_synthetic as syn  # noqa: E402

# One side's worker: loads the model, then answers one timing request per input line.
_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import poot
llm = poot.LLM(sys.argv[2], threads=int(sys.argv[3]), max_model_len=1024, numerics=sys.argv[4])
print(json.dumps({"ready": poot.__file__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    p = poot.SamplingParams(max_tokens=req["n"], temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate([req["prompt"]], p)
    print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
"""


class Side:
    def __init__(self, tree: Path, model: Path, numerics: str) -> None:
        py = tree.resolve() / "python"
        env = dict(os.environ, PYTHONPATH=str(py))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(py), str(model), str(table.THREADS), numerics],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        ready = json.loads(self._line())
        if not ready["ready"].startswith(str(py)):
            raise SystemExit(f"{tree}: imported poot from {ready['ready']}, not from {py}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("a worker exited early (see its stderr above)")
        return line

    def time(self, prompt: list[int], n: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "n": n}) + "\n")
        self.proc.stdin.flush()
        return float(json.loads(self._line())["s"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_row(base: Path, new: Path, model: Path, numerics: str, rounds: int) -> dict[str, list]:
    sides = {"base": Side(base, model, numerics), "new": Side(new, model, numerics)}
    res: dict[str, list] = {f"{k}_{m}": [] for k in sides for m in ("prefill", "decode")}
    try:
        for s in sides.values():
            s.time(table._prompt(8), 4)  # warm up: plans compiled, pages touched
        for r in range(rounds):
            # Alternate which side goes first, so neither always follows the other's warmth.
            order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
            for name, s in order:
                res[f"{name}_prefill"].append(512 / s.time(table._prompt(512), 1))
                short = s.time(table._prompt(64), 1)
                long = s.time(table._prompt(64), 129)
                res[f"{name}_decode"].append(128 / max(long - short, 1e-9))
    finally:
        for s in sides.values():
            s.close()
    return res


def report(label: str, res: dict[str, list]) -> str:
    cells = [label]
    for m in ("prefill", "decode"):
        b, n = res[f"base_{m}"], res[f"new_{m}"]
        ratios = [x / y for x, y in zip(n, b, strict=True)]
        cells.append(f"{statistics.median(b):.1f} / {statistics.median(n):.1f}")
        cells.append(table._spread(ratios, ".2f", "x"))
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the base poot tree")
    ap.add_argument("--new", type=Path, default=table.ROOT, help="the new poot tree")
    ap.add_argument("--rows", default="smollm2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also save every round's numbers here")
    args = ap.parse_args()
    from poot.checkpoints import cached_model

    smollm = cached_model()
    if smollm is None:
        raise SystemExit("the default model is not cached: run `poot pull` first")
    keys = args.rows.split(",")
    print(f"machine: {table.machine()}; {table.THREADS} threads; {args.rounds} rounds")
    print(
        "| row | prefill 512 tok/s base / new | new / base | decode tok/s base / new | new / base |"
    )
    print("|---|---|---|---|---|")
    saved = {}
    for key, label, shape, quant, numerics in table.ROWS:
        if key not in keys:
            continue
        path = smollm if shape is None else syn.synthetic_gguf(shape, quant, smollm)
        res = run_row(args.base, args.new, path, numerics, args.rounds)
        saved[key] = res
        print(report(f"{label} ({numerics})", res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
