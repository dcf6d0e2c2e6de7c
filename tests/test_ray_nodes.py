"""One model placed across the nodes of a real local Ray cluster (``poot.serve.nodes``).

The cluster (module-scoped, ``ray_cluster.local_cluster``: every Ray process on loopback) is a
head and a second node, one CPU each and 96 MiB of Ray ``memory`` each: SmolLM2's 94 MiB of
weights and its KV pool fit neither node, so the planner splits it by the nodes' own budgets;
stories260K (1 MiB) is split by a ``device_budget_bytes`` cap. Each node's profile is measured
there (``validate_cpu`` in a task on the node) and the links by task pairs, once per module.
The results are compared with a one-process ``poot.LLM`` on the same checkpoint: greedy ids and
logprobs equal. The fault test starts a third node, pins the model to the head and that node,
kills the node mid-generation and checks the request ends with ``NodeLostError`` in time.

Without Ray the module skips with the reason; under ``POOT_REQUIRE_RAY=1`` (CI) it fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import Cluster, NodeSpec, local_cluster

import poot
from poot import CompileConfig, SamplingParams
from poot.errors import NodeLostError, PlannerError, RuntimePoisonedError

if os.environ.get("POOT_REQUIRE_RAY") == "1":
    import ray  # noqa: F401  # fails the module: CI must have Ray
else:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'poot[ray]')")

from poot.serve.cluster import ClusterProfile, measure_cluster  # noqa: E402
from poot.serve.nodes import NodesCompiledModel, NodesConfig  # noqa: E402

pytestmark = pytest.mark.timeout(900)  # the first test also starts the cluster and measures it

NODE_MEMORY = 96 << 20
# Small pools: the KV of a short context, so the split is set by the weights.
LLM_KW: dict[str, Any] = {"threads": 1, "max_model_len": 128, "num_blocks": 16}
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    node = NodeSpec(num_cpus=1, memory=NODE_MEMORY, object_store_memory=80 * 10**6)
    with local_cluster([node, node]) as c:
        yield c


@pytest.fixture(scope="module")
def measured(cluster: Cluster) -> ClusterProfile:
    return measure_cluster(threads=1, timeout_s=600)


def _run(llm: poot.LLM, n: int = 12) -> tuple[list[int], list[dict[int, tuple[float, Any]]]]:
    sp = SamplingParams(temperature=0.0, max_tokens=n, logprobs=5, ignore_eos=True)
    out = llm.generate(PROMPT, sp)[0].outputs[0]
    assert out.logprobs is not None
    lps = [{t: (lp.logprob, lp.rank) for t, lp in step.items()} for step in out.logprobs]
    return list(out.token_ids), lps


def _nodes_llm(path: Path, measured: ClusterProfile, **compile_kw: Any) -> poot.LLM:
    cfg = NodesConfig(CompileConfig(**compile_kw), cluster=measured, threads=1)
    return poot.LLM(str(path), config=cfg, **LLM_KW)


def _close(llm: poot.LLM) -> None:
    close = getattr(llm.runtime, "close", None)
    if close is not None:
        close()


def test_each_node_and_link_is_measured_on_the_cluster(measured: ClusterProfile) -> None:
    import ray

    # Both nodes the cluster started with (the fault test's third node, added later, may still
    # be listed alive for a moment after it was killed).
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {n.node_id for n in measured.nodes} <= alive and len(measured.nodes) == 2
    assert measured.nodes[0].head and not measured.nodes[1].head
    for n in measured.nodes:
        assert n.profile is not None and n.source in ("measured", "stored"), n
        assert n.profile.validated and n.memory_bytes == NODE_MEMORY and n.cpus == 1
    a, b = (n.key for n in measured.nodes)
    assert set(measured.links) == {(a, b), (b, a)}
    for link in measured.links.values():
        assert link.bandwidth > 0 and link.latency_s > 0
    profiles, dropped = measured.device_profiles()
    assert not dropped and set(profiles) == {a, b}
    assert profiles[a].peer_bw == {b: measured.links[(a, b)].bandwidth}
    assert profiles[a].memory_bytes == NODE_MEMORY and profiles[a].is_host


def _check_placed(llm: poot.LLM, measured: ClusterProfile, tmp_path: Path) -> NodesCompiledModel:
    compiled = llm.compiled
    assert isinstance(compiled, NodesCompiledModel)
    keys = [n.key for n in measured.nodes]
    assert set(compiled.placement.devices) == set(keys), compiled.placement
    assert all(not s.streamed for s in compiled.placement.segments)
    # Each segment runs in an actor on its own node.
    import ray

    n_layers = compiled.stats.n_layers
    per_layer = set()
    for p in llm.runtime.parts:  # type: ignore[attr-defined]
        assert ray.get(p.actor.ready.remote())["node_id"] == p.node_id
        assert p.device == next(n.key for n in measured.nodes if n.node_id == p.node_id)
        # Its own KV pool holds its own layers only (a pool of one where it holds none).
        layers = min(n_layers, p.end - 1) - max(0, p.start - 1)
        per_layer.add(ray.get(p.actor.memory.remote())["kv_bytes"] / max(1, layers))
    assert len(per_layer) == 1 and per_layer.pop() > 0
    text = compiled.explain()
    assert "links (a task pair moving a buffer" in text and "(a cut of the chosen plan)" in text
    assert all(f"{k} used:" in text for k in keys), text
    # The simulated timeline and the measured one both show the transfer between the nodes.
    first, second = (s.device for s in compiled.placement.segments)
    cut = f"{first}-&gt;{second}"  # the transfer's label, as the page escapes it
    for html in (
        compiled.visualize(tmp_path / "sim.html").read_text(),
        compiled.visualize(tmp_path / "run.html", measured=True).read_text(),
    ):
        assert 'class="span transfer"' in html and f"{second} link" in html and cut in html
    return compiled


def test_stories_split_across_nodes_equals_one_process(
    stories: Path, measured: ClusterProfile, tmp_path: Path
) -> None:
    f32 = stories / "stories260K-f32.gguf"
    want = _run(poot.LLM(str(f32), **LLM_KW))
    # 1 MiB of weights and 0.3 MiB of KV against a 1 MB cap per node: no node holds it alone.
    llm = _nodes_llm(f32, measured, device_budget_bytes=1_000_000)
    try:
        got = _run(llm)
        compiled = _check_placed(llm, measured, tmp_path)
        assert "fits no single node's budget" in compiled.explain()
        assert got == want
        kv = llm.runtime.memory()["kv_bytes"]
        assert kv > 0
    finally:
        _close(llm)


def test_a_model_one_node_holds_runs_there_alone(stories: Path, measured: ClusterProfile) -> None:
    f32 = stories / "stories260K-f32.gguf"
    want = _run(poot.LLM(str(f32), **LLM_KW), n=6)
    llm = _nodes_llm(f32, measured)
    try:
        assert llm.compiled is not None and len(llm.compiled.placement.devices) == 1
        assert len(llm.runtime.parts) == 1  # type: ignore[attr-defined]
        assert "used: the whole model fits it" in llm.compiled.explain()
        assert _run(llm, n=6) == want
    finally:
        _close(llm)


def test_smollm2_split_by_the_nodes_memory_equals_one_process(
    default_model_path: Path, measured: ClusterProfile, tmp_path: Path
) -> None:
    want = _run(poot.LLM(str(default_model_path), **LLM_KW), n=8)
    llm = _nodes_llm(default_model_path, measured)
    try:
        got = _run(llm, n=8)
        compiled = _check_placed(llm, measured, tmp_path)
        text = compiled.explain()
        assert "fits no single node's budget" in text and "96.0 MiB" in text, text
        assert got == want
    finally:
        _close(llm)


def test_a_model_no_set_of_nodes_holds_is_refused(stories: Path, measured: ClusterProfile) -> None:
    with pytest.raises(PlannerError, match="node budgets") as e:
        _nodes_llm(stories / "stories260K-f32.gguf", measured, device_budget_bytes=100_000)
    assert set(e.value.reasons) >= {n.key for n in measured.nodes}


def test_a_node_lost_mid_run_ends_the_request_with_a_typed_error(
    stories: Path, cluster: Cluster, measured: ClusterProfile
) -> None:
    # A third node, lost on purpose: the model pinned to the head and it.
    node_id = cluster.add_node(NodeSpec(num_cpus=1, memory=NODE_MEMORY))
    three = measure_cluster(threads=1, timeout_s=600, known=measured)
    head, lost = measured.nodes[0].key, next(n.key for n in three.nodes if n.node_id == node_id)
    f32 = stories / "stories260K-f32.gguf"
    spec = ((head, 0, 4), (lost, 4, 7))
    cfg = NodesConfig(CompileConfig(force_placement=spec), cluster=three, threads=1)
    llm = poot.LLM(str(f32), config=cfg, timeout_s=60, **LLM_KW)
    assert llm.compiled is not None
    # The node left out of the pinned plan says why.
    other = measured.nodes[1].key
    assert f"{other} dropped: not in CompileConfig.force_placement" in llm.compiled.explain()
    errors: list[BaseException] = []
    # Long enough to be running when the node goes: generations of 100 tokens, until it does.
    sp = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)

    def generate() -> None:
        try:
            for _ in range(1000):
                llm.generate(PROMPT, sp)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors.append(e)

    worker = threading.Thread(target=generate, daemon=True)
    worker.start()
    end = time.monotonic() + 120
    while len(llm.compiled.recorder.steps) < 3:
        assert time.monotonic() < end and worker.is_alive(), errors
        time.sleep(0.05)
    t0 = time.monotonic()
    cluster.kill_node(len(cluster.procs) - 1)
    worker.join(90)
    assert not worker.is_alive(), "the request hung past its deadline"
    assert errors and isinstance(errors[0], NodeLostError), errors
    assert errors[0].node == lost and time.monotonic() - t0 < 90
    # The placement is unusable from now on, and says so at once.
    assert llm.runtime.health()["status"] == "poisoned"
    with pytest.raises(RuntimePoisonedError):
        llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=2))
    _close(llm)
