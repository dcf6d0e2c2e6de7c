"""Planning a model over Ray nodes without a cluster (``poot.serve.nodes.plan_over``).

The nodes are ``NodeProfile``s with this CPU's discovery-based profile (marked synthetic) and
links of stated bandwidth and latency, as ``measure_cluster`` would report them; the model is
the real stories260K checkpoint. These run without Ray: the planner's side of the placement
(budgets, the split, the link cost in ``explain()`` and the timeline) needs none.
``tests/test_ray_nodes.py`` runs the same on a real cluster.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from poot import CompileConfig, _native
from poot.checkpoints import resolve_model_files
from poot.errors import ConfigError, PlannerError
from poot.models import model_definition
from poot.planner.discovery import cpu_info
from poot.planner.profiles import estimated_cpu_profile
from poot.serve.cluster import ClusterProfile, Link, NodeProfile, node_key
from poot.serve.nodes import NodesCompiledModel, NodesConfig, plan_over

A, B, C = "a1" * 28, "b2" * 28, "c3" * 28
MIB = 1 << 20


def _node(node_id: str, memory: int, head: bool = False, ok: bool = True) -> NodeProfile:
    p = replace(estimated_cpu_profile(cpu_info()), source="measured")
    return NodeProfile(
        node_id, node_key(node_id), "127.0.0.2", head, 1, memory, 64 << 30,
        p if ok else None, "measured" if ok else "failed", "" if ok else "matmul.Q8_0: 0.3",
    )  # fmt: skip


def _cluster(*nodes: NodeProfile, bw: float = 1e9, latency: float = 1e-4) -> ClusterProfile:
    links = {
        (a.key, b.key): Link(a.key, b.key, bw, latency) for a in nodes for b in nodes if a is not b
    }
    return ClusterProfile(nodes, links, "127.0.0.2:6379")


def _plan(stories: Path, cluster: ClusterProfile, **kw: int) -> NodesCompiledModel:
    files = resolve_model_files(str(stories / "stories260K-f32.gguf"))
    assert files.gguf is not None
    weights = _native.Weights(files.gguf)
    cfg = NodesConfig(CompileConfig(**kw), cluster=cluster)  # type: ignore[arg-type]
    # 17 blocks of 16 positions in f32 (exact numerics), as an LLM with num_blocks=16 keeps.
    return plan_over(cfg, cluster, files, model_definition(files), weights, (272, {"cpu": 4}))


def test_nodes_become_profiles_joined_by_their_links() -> None:
    a, b, c = _node(A, 96 * MIB, head=True), _node(B, 64 * MIB), _node(C, 96 * MIB, ok=False)
    cl = _cluster(a, b, c, bw=2e9, latency=3e-4)
    profiles, dropped = cl.device_profiles(device_budget_bytes=80 * MIB)
    assert set(profiles) == {a.key, b.key}
    assert profiles[a.key].peer_bw == {b.key: 2e9, c.key: 2e9}
    assert profiles[a.key].link_latency_s == 3e-4 and profiles[a.key].is_host
    # The budget: Ray's memory resource of the node, capped by device_budget_bytes.
    assert profiles[a.key].memory_bytes == 80 * MIB and profiles[b.key].memory_bytes == 64 * MIB
    assert "(head)" in profiles[a.key].name
    assert c.key in dropped and "conformance failed" in dropped[c.key]
    assert "matmul.Q8_0" in dropped[c.key]


def test_a_model_that_fits_no_node_is_split_and_explained(stories: Path) -> None:
    a, b = _node(A, 10 * MIB, head=True), _node(B, 10 * MIB)
    compiled = _plan(stories, _cluster(a, b), device_budget_bytes=1_000_000)
    assert set(compiled.placement.devices) == {a.key, b.key}
    assert all(not s.streamed for s in compiled.placement.segments)
    assert compiled.chosen.cost.transfer_s > 0
    text = compiled.explain()
    assert "fits no single node's budget" in text and "(a cut of the chosen plan)" in text
    assert f"{a.key} used:" in text and f"{b.key} used:" in text
    act = compiled.stats.activation_bytes
    assert f"a hidden state of {act} B costs {(act / 1e9 + 1e-4) * 1e3:.3f} ms" in text
    # The simulated step moves the hidden state over the link between the two.
    first, second = (s.device for s in compiled.placement.segments)
    transfers = [s for s in compiled.simulation.spans if s.kind == "transfer"]
    assert [(s.lane, s.label) for s in transfers] == [(f"{second} link", f"{first}->{second}")]


def test_a_model_that_fits_one_node_stays_there_and_the_other_says_why(stories: Path) -> None:
    a, b = _node(A, 64 * MIB, head=True), _node(B, 64 * MIB)
    compiled = _plan(stories, _cluster(a, b, bw=1e8, latency=5e-3))
    assert len(compiled.placement.devices) == 1
    (used,) = compiled.placement.devices
    other = b.key if used == a.key else a.key
    text = compiled.explain()
    assert f"{used} used: the whole model fits it" in text
    # Dropped: the split costs more, and what its link would cost is stated.
    line = next(x for x in text.splitlines() if x.startswith(f"  {other} dropped:"))
    assert "costs" in line and f"{used} -> {other}" in line


def test_a_model_no_set_of_nodes_holds_is_refused_with_each_budget(stories: Path) -> None:
    a, b = _node(A, 64 * MIB), _node(B, 64 * MIB)
    with pytest.raises(PlannerError, match="node budgets") as e:
        _plan(stories, _cluster(a, b), device_budget_bytes=100_000)
    assert set(e.value.reasons) == {a.key, b.key}
    with pytest.raises(PlannerError, match="no node of the cluster"):
        _plan(stories, _cluster(_node(C, 64 * MIB, ok=False)))


@pytest.mark.parametrize(
    "kw", [{"threads": 0}, {"startup_timeout_s": 0.0}, {"call_timeout_s": -1.0}]
)
def test_bad_settings_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        NodesConfig(**kw)  # type: ignore[arg-type]
