"""Per-step host overhead of decode: the one-call step against the host path it replaced.

One request decodes ``--steps`` tokens, greedy or seeded, on the CPU runtime. Each decode step
is timed three ways, round by round so both paths see the same machine load:

- ``one call``: ``EngineCore.step`` as it runs (``StepDriver.step`` schedules, lays out, runs
  and applies the step in one crossing);
- ``host path``: the same step forced through the runner (the driver plans it unrun, Python
  wraps the layout as numpy arrays and calls ``runtime.run``, a second call applies it): the
  pre-driver flow of three crossings;
- ``run only``: ``runtime.run`` alone on the same plan and inputs (the device's share).

Reported: the median per-step wall time of each, and each path's overhead (its median minus
the run-only median). No thresholds; run it on a quiet machine.

Run: ``python benches/bench_step_overhead.py --model PATH/SmolLM2-135M-Instruct.Q4_1.gguf``
(``../shared/models/README.md`` says where that file comes from; without ``--model`` it uses
stories260K, where the overhead is most of the step).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import poot
from poot.engine_core import EngineCore
from poot.models.step import StepShape

ROOT = Path(__file__).resolve().parents[1]
STORIES = ROOT.parent / "shared" / "models" / "stories260K" / "stories260K-f32.gguf"


class _HostPath:
    """The driver with every step planned unrun, so ``EngineCore`` takes the runner's path."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    def step(self, fast: bool = True, forget: Any = (), logits_for: Any = None) -> Any:
        return self.driver.step(False, list(forget), logits_for)


def _decode_times(
    core: EngineCore, llm: poot.LLM, params: Any, prompt: str, host: bool
) -> list[float]:
    """Wall time of each decode step of one request (its prefill step not counted)."""
    driver = core.driver
    if host:
        core.driver = _HostPath(driver)  # type: ignore[assignment]
    try:
        req = llm.make_request(prompt, params)
        core.add_request(req)
        core.step()  # the prefill
        times = []
        while core.has_unfinished():
            t0 = time.perf_counter()
            core.step()
            times.append(time.perf_counter() - t0)
        return times
    finally:
        core.driver = driver


def _run_only(core: EngineCore, llm: poot.LLM, params: Any, prompt: str, n: int) -> list[float]:
    """``runtime.run`` alone, on a decode step's plan and inputs, ``n`` times."""
    req = llm.make_request(prompt, params)
    core.add_request(req)
    core.step()  # the prefill
    out = core.driver.step(False, [])
    dims = tuple(out["dims"])
    shape = StepShape(*dims, "sample", out["adjust"], False, 0)
    plan = core.runner.plan(shape)
    inputs = {**out["inputs"], **out["sampling"]}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        core.runner.runtime.run(plan, inputs, 600.0)
        times.append(time.perf_counter() - t0)
    core.abort(req.request_id)
    core.settle()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(STORIES))
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seeded", action="store_true", help="temperature 0.8, seed 1")
    a = ap.parse_args()
    llm = poot.LLM(a.model, threads=a.threads, max_model_len=512)
    core = llm.core
    if a.seeded:
        params = poot.SamplingParams(max_tokens=a.steps, temperature=0.8, seed=1, ignore_eos=True)
    else:
        params = poot.SamplingParams(max_tokens=a.steps, temperature=0.0, ignore_eos=True)
    prompt = "Once upon a time"
    _decode_times(core, llm, params, prompt, host=False)  # warm every plan
    one: list[float] = []
    host: list[float] = []
    run: list[float] = []
    for _ in range(a.rounds):
        one += _decode_times(core, llm, params, prompt, host=False)
        host += _decode_times(core, llm, params, prompt, host=True)
        run += _run_only(core, llm, params, prompt, a.steps)
    med = {k: statistics.median(v) * 1e6 for k, v in (("one", one), ("host", host), ("run", run))}
    print(f"model {a.model}, {a.steps} decode steps x {a.rounds} rounds, {a.threads} threads")
    print(f"{'path':<10} {'median us/step':>15} {'overhead us':>12}")
    print(f"{'one call':<10} {med['one']:>15.1f} {med['one'] - med['run']:>12.1f}")
    print(f"{'host path':<10} {med['host']:>15.1f} {med['host'] - med['run']:>12.1f}")
    print(f"{'run only':<10} {med['run']:>15.1f} {0.0:>12.1f}")


if __name__ == "__main__":
    main()
