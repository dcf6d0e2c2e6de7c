"""One model placed across two Ray nodes against the same model in one process
(``poot.serve.nodes``, docs/ray.md).

Each round generates ``POOT_BENCH_RAY_TOKENS`` greedy tokens (default 32) from a short prompt,
after a warm-up that compiles the step shapes. The ``baseline`` row is ``poot.LLM`` in this
process; the ``poot`` row is the same model split over two nodes (so the ratio column reads
one process / two nodes: below 1 means the split is slower). Both run
``POOT_BENCH_THREADS`` CPU threads (default 1) per engine or segment. The split is forced by
capping every node's budget at ``POOT_BENCH_RAY_NODE_BUDGET`` bytes (default 80% of the
model's weights), so the model fits no single node. At the end a line prints the measured
per-step time on each node and on each link (the spans ``visualize(measured=True)`` draws),
and the planner's link cost.

The cluster: ``RAY_ADDRESS`` when set (two nodes or more), else two local nodes on loopback
started as the tests start them (``tests/ray_cluster.py``). ``POOT_BENCH_MODEL`` picks the
checkpoint (default: the default model). No thresholds: speed is measured, not asserted.
Needs ``pip install 'poot[ray]'``. Run it alone on a quiet machine:
``pytest benches/bench_ray_nodes.py --benchmark-only``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'poot[ray]')")

THREADS = int(os.environ.get("POOT_BENCH_THREADS", "1"))
TOKENS = int(os.environ.get("POOT_BENCH_RAY_TOKENS", "32"))
PROMPT = "Once upon a time, in a small village by the sea, there lived"
LLM_KW: dict[str, Any] = {"threads": THREADS, "max_model_len": 256, "num_blocks": 32}

_NOTES: list[str] = []


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    import ray

    if os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ray_cluster import NodeSpec, local_cluster

    node = NodeSpec(num_cpus=THREADS, memory=4 << 30)
    with local_cluster([node, node]):
        yield


@pytest.fixture(scope="module")
def model(request: pytest.FixtureRequest) -> Path:
    given = os.environ.get("POOT_BENCH_MODEL")
    return Path(given) if given else Path(request.getfixturevalue("default_model_path"))


def _generate(llm: Any) -> None:
    from poot import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    out = llm.generate(PROMPT, sp)[0].outputs[0]
    assert len(out.token_ids) == TOKENS


@pytest.fixture(scope="module", autouse=True)
def _notes(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None or not _NOTES:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        tr.write_line("")
        for line in _NOTES:
            tr.write_line(line)


def test_one_process(benchmark: Any, model: Path) -> None:
    import poot

    llm = poot.LLM(str(model), **LLM_KW)
    _generate(llm)  # warm: compile the step shapes
    benchmark.group = f"ray nodes: {TOKENS} greedy tokens, {model.name}"
    benchmark.extra_info.update(impl="baseline", tokens=TOKENS)
    benchmark.pedantic(_generate, args=(llm,), rounds=3, iterations=1)


def test_two_nodes(benchmark: Any, cluster: None, model: Path) -> None:
    import poot
    from poot import CompileConfig
    from poot.serve.nodes import NodesConfig

    budget = os.environ.get("POOT_BENCH_RAY_NODE_BUDGET")
    cap = int(budget) if budget else int(model.stat().st_size * 0.8)
    cfg = NodesConfig(CompileConfig(device_budget_bytes=cap), threads=THREADS)
    llm = poot.LLM(str(model), config=cfg, **LLM_KW)
    try:
        assert llm.compiled is not None and len(llm.compiled.placement.devices) == 2
        _generate(llm)  # warm: compile the step shapes on both nodes
        benchmark.group = f"ray nodes: {TOKENS} greedy tokens, {model.name}"
        benchmark.extra_info.update(impl="poot", tokens=TOKENS)
        benchmark.pedantic(_generate, args=(llm,), rounds=3, iterations=1)
        lanes: dict[str, list[float]] = {}
        for step in list(llm.compiled.recorder.steps):
            for s in step:
                lanes.setdefault(f"{s.lane} ({s.kind})", []).append(s.end - s.start)
        _NOTES.append(f"two-node placement: {llm.compiled.placement.describe(llm.compiled.stats)}")
        _NOTES.append(
            "  median ms per step: "
            + ", ".join(f"{k} {statistics.median(v) * 1e3:.3f}" for k, v in sorted(lanes.items()))
        )
        _NOTES.append(
            f"  planner's transfer cost per step: {llm.compiled.chosen.cost.transfer_s * 1e3:.3f}"
            " ms"
        )
    finally:
        llm.runtime.close()  # type: ignore[attr-defined]
