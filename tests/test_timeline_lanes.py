"""Timelines worth opening (issue 34 item 9): several steps in sequence, spans per layer and
per op kind from the CPU runtime's own span recorder, transfers, and the ledger's bytes over
time, measured and simulated with the same lanes; rendered in headless Chromium as
tests/test_planner_timeline.py does.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import poot
from poot.planner import CompileConfig
from tests.test_planner_timeline import _chromium, _no_fetches


def _data(page: str) -> dict:
    m = re.search(r'<script id="timeline-data" type="application/json">(.*?)</script>', page)
    assert m is not None
    return json.loads(m.group(1))


def _lanes(page: str) -> set[str]:
    return set(re.findall(r'<text class="lane"[^>]*data-lane="([^"]+)"', page))


def _labels(page: str, lane: str) -> list[str]:
    pat = rf'<rect class="span \w+"[^>]*data-lane="{re.escape(lane)}" data-label="([^"]+)"'
    return re.findall(pat, page)


@pytest.fixture(scope="module")
def resident_llm(stories: Path) -> poot.LLM:
    llm = poot.LLM(stories / "stories260K-Q8_0.gguf", config=CompileConfig(allow_gpu=False))
    llm.generate(["Once upon"], poot.SamplingParams(max_tokens=4, temperature=0.0))
    return llm


def test_a_resident_cpu_plan_draws_layers_ops_steps_and_the_ledger(
    resident_llm: poot.LLM, tmp_path: Path
) -> None:
    c = resident_llm.compiled
    assert c is not None and c.direct
    page = c.visualize(tmp_path / "m.html", measured=True).read_text()
    _no_fetches(page)
    assert {"cpu", "cpu ops", "ledger"} <= _lanes(page)
    layers = set(_labels(page, "cpu"))
    assert {"pre", "layer 0", "post"} <= layers  # stories260K has 5 layers
    ops = set(_labels(page, "cpu ops"))
    assert any(k.startswith("matmul") for k in ops) and "rms_norm" in ops
    data = _data(page)
    assert data["steps"] >= 4  # the prefill, then decode steps, in sequence
    assert data["ledger_samples"] >= 2 * data["steps"] and data["ledger_peak_bytes"] > 0
    sim = c.visualize(tmp_path / "s.html").read_text()
    assert _lanes(sim) == _lanes(page)  # the same lanes, side by side
    assert _data(sim)["steps"] == data["steps"]


def test_a_module_graph_timeline(tmp_path: Path) -> None:
    from tests.planner_fixtures import cpu
    from tests.test_torch_modgraph import two_tower

    g, inputs, _ = two_tower()
    compiled = g.compile(inputs, profiles=[cpu()])
    for _ in range(3):
        compiled(**inputs)
    page = compiled.visualize(tmp_path / "m.html", measured=True).read_text()
    assert _lanes(page) == {"cpu", "cpu ops", "ledger"}
    assert _labels(page, "cpu") == ["query_tower", "doc_tower", "score"] * 3
    assert "batch_matmul" not in _labels(page, "cpu ops")  # towers: matmuls over weights
    assert any(k.startswith("matmul") for k in _labels(page, "cpu ops"))
    data = _data(page)
    assert data["steps"] == 3
    weights = sum(p.numel() * 4 for n in g.nodes for p in n.module.parameters())
    assert data["ledger_peak_bytes"] > weights  # weights plus the leased outputs
    assert compiled.ledger.snapshot()["device"]["used"] == weights  # all returned
    sim = compiled.visualize(tmp_path / "s.html").read_text()
    assert _lanes(sim) == _lanes(page) and _data(sim)["steps"] == 3


@pytest.mark.parametrize("measured", [False, True])
def test_chromium_renders_the_module_timeline(tmp_path: Path, measured: bool) -> None:
    from tests.planner_fixtures import cpu
    from tests.test_torch_modgraph import two_tower

    browser = _chromium()
    g, inputs, _ = two_tower()
    compiled = g.compile(inputs, profiles=[cpu()])
    compiled(**inputs)
    compiled(**inputs)
    path = compiled.visualize(tmp_path / "t.html", measured=measured)
    base = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
    ]  # fmt: skip
    dom = subprocess.run(
        [*base, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert 'data-rendered="yes"' in dom
    assert _lanes(dom) == {"cpu", "cpu ops", "ledger"}
    assert len(re.findall(r'<line class="step"', dom)) == 2
    assert re.search(r'<polyline class="ledger"[^>]*points="[0-9., ]+"', dom)
    assert re.findall(r'<rect class="span op"', dom)


def test_the_cpu_runtime_records_each_equation_of_the_last_run() -> None:
    import numpy as np

    from poot import _native

    w = _native.Weights.from_arrays({"w": np.ones((8, 4), np.float32)})
    tr = _native.Tracer(w, 2, _native.TraceLimits())
    tr.output("y", tr.silu(tr.matmul(tr.input("x", "f32", [2, 4]), tr.weight("w"))))
    rt = _native.CpuRuntime(1)
    plan = rt.prepare(tr.finish(), w)
    x = {"x": np.ones((2, 4), np.float32)}
    rt.run(plan, x)
    assert rt.last_run_spans() == []  # off by default: nothing kept
    rt.record_spans(True)
    rt.run(plan, x)
    spans = rt.last_run_spans()
    names = [eq[0] for eq in plan.graph.equations()]
    assert [k for _, k, _, _ in spans if not k.startswith("matmul")] == ["input", "weight", "silu"]
    assert any(k == "matmul F32" for _, k, _, _ in spans)
    for i, kind, start, end in spans:
        assert 0 <= start <= end and (kind == names[i] or kind.startswith(names[i]))
    starts = [s for _, _, s, _ in spans]
    assert starts == sorted(starts)
    rt.run(plan, x)
    assert len(rt.last_run_spans()) == len(spans)  # the last run only, not accumulated
