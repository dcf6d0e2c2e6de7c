"""Load time of MoE GGUFs, two builds of poot alternating: what re-laying the expert stacks costs
at load and in the first steps.

Each side is a poot tree (its ``python/`` folder with a built ``_native`` module, as for
``bench_ab.py``). Round by round, for every GGUF, each side in turn runs a fresh process that
times ``poot.LLM(path)`` (ggml numerics: the re-laid path), then a first 16-token prompt with one
new token (the step that re-lays the experts it selects, where that is lazy), then the same
again with a different prompt, then 16 decoded tokens twice (the second time most experts are
re-laid already: near the steady state); and reads the process's peak and final
RSS (VmHWM, VmRSS). The file's pages stay in the page cache between runs (the first round
warms it), so the load is compute, not disk. No thresholds: the rows are printed (and
``--json`` saved), each side's runs listed in the order they ran.

Run: ``python benches/bench_moe_load.py --base /work/main --new . \\
--gguf ~/.cache/poot/bench-gguf/synthetic-qwen3-30b-a3b-8l-q4_k_m.gguf --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import poot

def rss():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out

t0 = time.perf_counter()
llm = poot.LLM(sys.argv[2], threads=int(sys.argv[3]), max_model_len=512, numerics="ggml")
load = time.perf_counter() - t0
one = poot.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
t0 = time.perf_counter()
llm.generate([[1] + list(range(100, 115))], one)
first = time.perf_counter() - t0
t0 = time.perf_counter()
llm.generate([[1] + list(range(300, 315))], one)
second = time.perf_counter() - t0
dec = poot.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
t0 = time.perf_counter()
llm.generate([[1] + list(range(500, 515))], dec)
decode16 = time.perf_counter() - t0
t0 = time.perf_counter()
llm.generate([[1] + list(range(700, 715))], dec)
again = time.perf_counter() - t0
res = dict(load=load, first=first, second=second, decode16=decode16, again=again)
print(json.dumps(dict(res, **rss())))
"""


def run(tree: Path, gguf: Path, threads: int) -> dict[str, float]:
    py = tree.resolve() / "python"
    env = dict(os.environ, PYTHONPATH=str(py))
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, str(py), str(gguf), str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for r in range(args.rounds):
        for g in args.gguf:
            for side, tree in (("base", args.base), ("new", args.new)):
                res = run(tree, g, args.threads)
                results.setdefault(g.name, {}).setdefault(side, []).append(res)
                print(
                    f"round {r} {g.name} {side}: load {res['load']:.2f} s, first step "
                    f"{res['first']:.2f} s, second {res['second']:.2f} s, 16 decoded "
                    f"{res['decode16']:.2f} s, 16 more {res['again']:.2f} s, "
                    f"RSS {res['VmRSS'] / 2**20:.0f} MiB "
                    f"(peak {res['VmHWM'] / 2**20:.0f})",
                    flush=True,
                )
    for g, sides in results.items():
        for side, runs in sides.items():
            med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            print(
                f"{g} {side} median of {len(runs)}: load {med['load']:.2f} s, load + first "
                f"step {med['load'] + med['first']:.2f} s, decode16 {med['decode16']:.2f} s, "
                f"again {med['again']:.2f} s"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
