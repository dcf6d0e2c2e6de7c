"""Starting a model placed across Ray nodes: the plan, one actor per segment, the runner.

``start_on_nodes`` does steps 1-3 of ``NodesConfig`` (its module has the whole story): the
cluster measured (or given), the placement over its nodes, then one ``SegmentWorker`` per
segment pinned to its node, each reserving its threads as Ray CPUs and the bytes the planner
charged the node as Ray ``memory``. An actor that does not start within the startup timeout
(its node lacks the free CPUs or memory, or died) ends the start with ``RayClusterError`` and
every actor started so far is ended: nothing is left holding cluster resources.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from poot._native import CpuRuntime
from poot.errors import ConfigError
from poot.planner.compiled import standing_bytes
from poot.planner.runners import PlannedRunner, SplitStepRunner
from poot.serve.cluster import measure_cluster, pinned
from poot.serve.nodes import NodesCompiledModel, NodesConfig, plan_over
from poot.serve.segments import NodePart, NodesRuntime, SegmentSpec, SegmentWorker

if TYPE_CHECKING:
    from poot.checkpoints import ModelFiles
    from poot.runner import StepRunner

__all__ = ["start_on_nodes"]

_TRACE = ("max_tokens", "max_values", "max_equations", "max_literal_bytes", "max_records")
_COMPILE = ("max_equations", "max_kernel_instructions", "max_kernel_locals", "max_artifact_bytes")


def _layers(compiled: NodesCompiledModel, start: int, end: int) -> tuple[int, int]:
    """The model layers in units ``[start, end)``: (first, count)."""
    n = compiled.stats.n_layers
    first = max(0, start - 1)
    return first, max(0, min(n, end - 1) - first)


def start_on_nodes(
    cfg: NodesConfig, runner: StepRunner, files: ModelFiles, backend: str, numerics: str
) -> PlannedRunner:
    """Plans ``runner``'s model over the cluster and starts its segments (module docs).

    Raises:
        ConfigError: a backend other than the CPU (nodes run the CPU runtime).
        RayNotInstalledError, RayClusterError: no Ray, no cluster, or an actor did not start.
        PlannerError: no placement over the nodes holds the model.
    """
    if backend != "cpu":
        raise ConfigError(f'a model placed across nodes runs on their CPUs: use backend="cpu", '
                          f"not {backend!r}")  # fmt: skip
    from poot.serve.ray import RayClusterError, connect

    connect(cfg.address)
    import ray

    cluster = cfg.cluster or measure_cluster(
        threads=cfg.threads, quick=cfg.quick, timeout_s=cfg.startup_timeout_s
    )
    old = runner
    entry = CpuRuntime.kv_entry_bytes_for(numerics)
    positions = old.pool_blocks * old.block_size
    compiled = plan_over(
        cfg, cluster, files, old.definition, old.weights, (positions, {"cpu": entry})
    )
    held = standing_bytes(compiled.stats, compiled.placement)
    units = compiled.stats.units
    segments = compiled.placement.segments
    actor_class = ray.remote(SegmentWorker)
    parts: list[NodePart] = []
    try:
        for i, s in enumerate(segments):
            node = cluster.node(s.device)
            threads = cfg.threads or node.cpus
            first, count = _layers(compiled, s.start, s.end)
            spec = SegmentSpec(
                str(files.path), numerics, threads, s.start, s.end, first, count,
                old.definition,
                {k: int(getattr(old.trace_limits, k)) for k in _TRACE},
                {k: int(getattr(old.compile_limits, k)) for k in _COMPILE},
                old.plans.max_entries,
                i == len(segments) - 1,
            )  # fmt: skip
            label = units[s.start].name + (
                "" if s.end - s.start == 1 else f"..{units[s.end - 1].name}"
            )
            actor = actor_class.options(
                num_cpus=threads,
                memory=max(1, held.get(s.device, 0)),
                scheduling_strategy=pinned(node.node_id),
                max_restarts=0,
                # A second thread answers health and memory while a step runs (the engine
                # itself never overlaps two calls that touch the plans).
                max_concurrency=2,
            ).remote(spec)
            parts.append(NodePart(s.device, node.node_id, s.start, s.end, label, actor))
        deadline = time.monotonic() + cfg.startup_timeout_s
        for p in parts:
            left = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait([p.actor.ready.remote()], timeout=left)
            if not ready:
                raise RayClusterError(
                    f"the segment for {p.label} did not start on node {p.device} within "
                    f"{cfg.startup_timeout_s:.0f} s: the node lacks the free CPUs or memory "
                    f"it reserves ({cfg.threads or cluster.node(p.device).cpus} CPU, "
                    f"{held.get(p.device, 0)} B), or it left the cluster"
                )
            try:
                ray.get(ready[0])
            except ray.exceptions.RayError as e:
                raise RayClusterError(
                    f"the segment for {p.label} failed to start on node {p.device}: {e}"
                ) from None
    except BaseException:
        for p in parts:
            ray.kill(p.actor, no_restart=True)
        raise
    runtime = NodesRuntime(
        parts, entry, compiled.generations, compiled.recorder, call_timeout_s=cfg.call_timeout_s
    )
    common: dict[str, Any] = dict(
        block_size=old.block_size, pool_blocks=old.pool_blocks,
        max_step_tokens=old.max_step_tokens, trace_limits=old.trace_limits,
        compile_limits=old.compile_limits, timeout_s=old.timeout_s,
    )  # fmt: skip
    try:
        planned = SplitStepRunner(old.definition, old.weights, runtime, **common)  # type: ignore[arg-type]
    except BaseException:
        runtime.close()
        raise
    return PlannedRunner(planned, runtime, "cpu", compiled)  # type: ignore[arg-type]
