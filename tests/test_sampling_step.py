"""The sampling step on the CPU runtime, on logits the test fixes.

A graph whose logits are an input ("a tiny model whose logits the test fixes") followed by the
real sampling step (``poot.models.step.trace_head``), compiled and run by ``CpuRuntime``. Each
row of a step is one independent draw, so one run of a few thousand rows gives a sample of the
distribution to check with a chi-square bound. References are written here in numpy.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cpu_runtime_or_skip

from poot import _native, errors
from poot.models.step import MASK_INPUT, StepShape, trace_head

V = 12
LOGITS = np.array([2.0, 1.5, 1.4, 1.0, 0.5, 0.0, -0.3, -1.0, -1.5, -2.0, -3.0, -4.0], np.float32)


@pytest.fixture(scope="module")
def weights(stories: Path) -> Any:
    return _native.Weights(_native.GgufFile(str(stories / "stories260K-f32.gguf")))


def run_head(
    weights: Any, logits: np.ndarray, shape: StepShape, late: Any = None, **ins: Any
) -> dict:
    """Traces logits-as-input + the sampling step, runs it on the CPU runtime."""
    rt = cpu_runtime_or_skip(1)
    t = _native.Tracer(weights, 1)
    trace_head(t, t.input("logits", "f32", list(logits.shape)), shape)
    plan = rt.prepare(t.finish(), weights, _native.CompileLimits())
    return rt.run(plan, {"logits": logits, **ins}, 30.0, late)


def rows_inputs(s: int, **cols: Any) -> dict[str, np.ndarray]:
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "uniform": 0.0}
    base.update(cols)
    out: dict[str, np.ndarray] = {}
    for k, v in base.items():
        dtype = np.int32 if k == "top_k" else np.float32
        out[k] = np.broadcast_to(np.asarray(v, dtype), (s,)).copy()
    return out


def expected(logits: np.ndarray, t: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The documented distribution: temperature, top-k, top-p, then min-p, renormalized."""
    z = logits.astype(np.float64) / t
    order = np.lexsort((np.arange(len(z)), -z))
    if top_k:
        order = order[:top_k]
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    keep = len(order) if top_p >= 1 else int(np.searchsorted(np.cumsum(p), top_p) + 1)
    keep = min(keep, int((p >= min_p * p[0]).sum()))
    out = np.zeros(len(z))
    out[order[:keep]] = p[:keep] / p[:keep].sum()
    return out


@pytest.mark.parametrize(
    ("t", "top_k", "top_p", "min_p"),
    [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.0),
        (1.5, 5, 1.0, 0.0),
        (1.0, 0, 0.8, 0.0),
        (1.0, 0, 1.0, 0.2),
        (2.0, 8, 0.9, 0.05),
    ],
)
def test_sampled_frequencies_match_the_distribution(
    weights: Any, t: float, top_k: int, top_p: float, min_p: float
) -> None:
    s = 4096
    uniform = np.random.default_rng(123).random(s, dtype=np.float32)
    ins = rows_inputs(s, temperature=t, top_k=top_k, top_p=top_p, min_p=min_p, uniform=uniform)
    out = run_head(weights, np.tile(LOGITS, (s, 1)), StepShape(1, s, 1), **ins)
    counts = np.bincount(out["token_ids"], minlength=V)
    p = expected(LOGITS, t, top_k, top_p, min_p)
    assert counts[p == 0].sum() == 0, "a cut token was drawn"
    live = p > 0
    chi2 = float((((counts[live] - s * p[live]) ** 2) / (s * p[live])).sum())
    df = int(live.sum()) - 1
    # 5 standard deviations of the chi-square distribution: fails only on a wrong sampler.
    assert chi2 < df + 5 * np.sqrt(2 * df), (chi2, df, counts, s * p)


def test_greedy_rows_and_broken_rows(weights: Any) -> None:
    logits = np.tile(LOGITS, (4, 1))
    logits[1, 3] = 9.0
    logits[2, 5] = np.nan
    logits[3, :] = -np.inf
    ins = rows_inputs(4, temperature=0.0)
    out = run_head(weights, logits, StepShape(1, 4, 1), **ins)
    assert out["token_ids"].tolist() == [0, 3, -1, -1]


def numpy_adjust(
    row: np.ndarray,
    seen_prompt: set[int],
    generated: dict[int, int],
    bias: dict[int, float],
    rep: float,
    pres: float,
    freq: float,
) -> np.ndarray:
    out = row.astype(np.float64).copy()
    for i in set(seen_prompt) | set(generated):
        out[i] = out[i] / rep if out[i] > 0 else out[i] * rep
    for i, c in generated.items():
        out[i] -= pres + freq * c
    for i, b in bias.items():
        out[i] += b
    return out


def test_penalties_and_bias_match_numpy(weights: Any) -> None:
    rng = np.random.default_rng(5)
    s, w = 3, 16
    logits = rng.normal(size=(s, V)).astype(np.float32) * 2
    cases = [
        ({1, 2, 3}, {2: 3, 7: 1}, {4: 5.0, 2: -1.0}, 1.3, 0.4, 0.2),
        (set(), {}, {0: -100.0, 11: 100.0}, 1.0, 0.0, 0.0),
        ({0, 5}, {5: 2}, {}, 0.8, -0.5, 1.5),
    ]
    ids = np.full((s, w), -1, np.int32)
    counts = np.full((s, w), -1, np.int32)
    bias = np.zeros((s, w), np.float32)
    for r, (prompt, gen, b, *_) in enumerate(cases):
        entries = {i: [0, 0.0] for i in prompt} | {i: [c, 0.0] for i, c in gen.items()}
        for i, v in b.items():
            entries.setdefault(i, [-1, 0.0])[1] = v
        for j, (i, (c, v)) in enumerate(entries.items()):
            ids[r, j], counts[r, j], bias[r, j] = i, c, v
    shape = StepShape(1, s, 1, adjust=w, logprobs=0)
    # Read the adjusted logits back: greedy picks their argmax, and with the top-k op over
    # the *raw* logits unaffected, compare through a graph that outputs them directly.
    rt = cpu_runtime_or_skip(1)
    t = _native.Tracer(weights, 1)
    x = t.input("logits", "f32", [s, V])
    adj = t.adjust_logits(
        x,
        ids=t.input("adj_ids", "i32", [s, w]),
        counts=t.input("adj_counts", "i32", [s, w]),
        bias=t.input("adj_bias", "f32", [s, w]),
        repetition=t.input("repetition", "f32", [s]),
        presence=t.input("presence", "f32", [s]),
        frequency=t.input("frequency", "f32", [s]),
    )
    t.output("adjusted", adj)
    plan = rt.prepare(t.finish(), weights, _native.CompileLimits())
    per_row = {
        k: np.array([c[i] for c in cases], np.float32)
        for i, k in [(3, "repetition"), (4, "presence"), (5, "frequency")]
    }
    got = rt.run(
        plan, {"logits": logits, "adj_ids": ids, "adj_counts": counts, "adj_bias": bias, **per_row}
    )["adjusted"]
    for r, case in enumerate(cases):
        want = numpy_adjust(logits[r], *case)
        np.testing.assert_allclose(got[r], want, rtol=1e-6, atol=1e-5)
    # The full sampling step picks the adjusted argmax at temperature 0.
    out = run_head(
        weights,
        logits,
        shape,
        **rows_inputs(s, temperature=0.0),
        adj_ids=ids,
        adj_counts=counts,
        adj_bias=bias,
        **per_row,
    )
    assert out["token_ids"].tolist() == [
        int(np.argmax(numpy_adjust(logits[r], *c))) for r, c in enumerate(cases)
    ]


def test_logprobs_are_log_softmax_of_the_raw_logits(weights: Any) -> None:
    rng = np.random.default_rng(9)
    s, k = 2, 5
    logits = rng.normal(size=(s, V)).astype(np.float32)
    out = run_head(
        weights, logits, StepShape(1, s, 1, logprobs=k), **rows_inputs(s, temperature=0.0)
    )
    ref = logits.astype(np.float64) - np.log(
        np.exp(logits.astype(np.float64)).sum(1, keepdims=True)
    )
    ids, lps = out["logprob_ids"], out["logprobs"]
    assert ids.shape == (s, 1 + k) and lps.shape == (s, 1 + k)
    for r in range(s):
        assert ids[r, 0] == out["token_ids"][r] == int(np.argmax(logits[r]))
        assert ids[r, 1:].tolist() == np.argsort(-logits[r], kind="stable")[:k].tolist()
        np.testing.assert_allclose(lps[r], ref[r, ids[r]], atol=1e-5)


def test_the_mask_is_a_late_input(weights: Any) -> None:
    s = 2
    mask = np.zeros((s, 1), np.int32)
    mask[0, 0] = 1 << 7  # row 0: only token 7
    mask[1, 0] = -1  # row 1: everything
    slot = _native.LateInput()

    def fill_later() -> None:
        time.sleep(0.2)
        slot.fill(mask)

    filler = threading.Thread(target=fill_later)
    filler.start()
    out = run_head(
        weights,
        np.tile(LOGITS, (s, 1)),
        StepShape(1, s, 1, masked=True),
        {MASK_INPUT: slot},
        **rows_inputs(s, temperature=0.0),
    )
    filler.join()
    assert out["token_ids"].tolist() == [7, 0]
    assert slot.settled and not slot.fill(mask)


def test_a_failed_late_input_fails_the_run_and_nothing_else(weights: Any) -> None:
    rt = cpu_runtime_or_skip(1)
    t = _native.Tracer(weights, 1)
    trace_head(t, t.input("logits", "f32", [1, V]), StepShape(1, 1, 1, masked=True))
    plan = rt.prepare(t.finish(), weights, _native.CompileLimits())
    ins = {"logits": LOGITS[None, :].copy(), **rows_inputs(1, temperature=0.0)}
    slot = _native.LateInput()
    slot.fail("the grammar engine crashed")
    with pytest.raises(errors.PootError, match="grammar engine crashed"):
        rt.run(plan, ins, 30.0, {MASK_INPUT: slot})
    assert rt.health()["status"] == "ok"
    ok = _native.LateInput()
    ok.fill(np.full((1, 1), -1, np.int32))
    assert rt.run(plan, ins, 30.0, {MASK_INPUT: ok})["token_ids"].tolist() == [0]
    # A mask that never comes is a bounded wait: a timeout that poisons the runtime.
    with pytest.raises(errors.DeviceTimeoutError):
        rt.run(plan, ins, 0.2, {MASK_INPUT: _native.LateInput()})
    assert rt.health()["status"] == "poisoned"
