"""One model placed across Ray nodes: ``poot.LLM(model, config=NodesConfig(...))``.

The planner treats each Ray node as a device (its CPU, with the profile measured on the node)
and the links between nodes as measured (``poot.serve.cluster``). ``NodesConfig.plan_runner``,
which ``LLM`` calls for a config that places the model itself:

1. joins the cluster (``poot.serve.ray.connect``) and measures it, unless given a measured
   ``ClusterProfile``;
2. places the model with ``poot.compile`` over the nodes' profiles (the config's
   ``CompileConfig``: budgets, workload, ``force_placement`` by node key), each node's budget
   its Ray ``memory`` resource (see ``ClusterProfile.budget``). Segments stay resident: a node
   never streams weights (the disk budget is 0), so a model that fits no set of nodes fails
   with ``PlannerError`` naming each node's budget;
3. starts one ``SegmentWorker`` actor per segment on its node (``num_cpus`` its threads,
   ``memory`` the bytes the planner charged the node: its weights and the KV of its layers),
   waits for each within ``startup_timeout_s`` and runs the model's steps over them
   (``NodesRuntime``).

``llm.compiled`` is a ``NodesCompiledModel``: its ``explain()`` adds the nodes (budget, what each
holds), the measured links and what the chosen plan's cuts cost over them, and why each node
was used or dropped; ``visualize()`` draws the transfers between nodes. ``llm.runtime.close()``
ends the actors (they also end when the ``LLM`` is collected).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from poot.errors import CapacityError, ConfigError, PlannerError
from poot.planner.compiled import CompileConfig, CompiledModel, compile, standing_bytes
from poot.planner.profiles import HostProfile
from poot.serve.cluster import ClusterProfile

if TYPE_CHECKING:
    from poot.checkpoints import ModelFiles
    from poot.planner.runners import PlannedRunner
    from poot.runner import StepRunner

__all__ = ["NodesCompiledModel", "NodesConfig"]


@dataclass(frozen=True)
class NodesConfig:
    """How to place a model across the nodes of a Ray cluster (module docs).

    Attributes:
        compile: the planner's settings (``device_budget_bytes`` caps every node's budget;
            ``force_placement`` pins segments to node keys, ``cpu:<node id prefix>``).
        address: the cluster (None: ``RAY_ADDRESS``, else the one this machine runs).
        cluster: a measured cluster to plan over (``measure_cluster``); None measures it.
        threads: CPU threads (and Ray CPUs reserved) per segment; None: the node's CPUs.
        quick: quick benchmark buffers when measuring a node without a stored profile.
        startup_timeout_s: the bound on measuring and on starting each segment's actor.
        call_timeout_s: the bound on each call that is not a step (compile, health, memory).
    """

    compile: CompileConfig = field(default_factory=CompileConfig)
    address: str | None = None
    cluster: ClusterProfile | None = None
    threads: int | None = None
    quick: bool = True
    startup_timeout_s: float = 300.0
    call_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"NodesConfig.threads must be >= 1 or None, got {self.threads}")
        if not (self.startup_timeout_s > 0 and self.call_timeout_s > 0):
            raise ConfigError(
                "NodesConfig.startup_timeout_s and call_timeout_s must be > 0, got "
                f"{self.startup_timeout_s} and {self.call_timeout_s}"
            )

    def plan_runner(
        self, runner: StepRunner, files: ModelFiles, backend: str, numerics: str
    ) -> PlannedRunner:
        """Places ``runner``'s model across the cluster and builds the runner over the nodes."""
        from poot.serve.placement import start_on_nodes

        return start_on_nodes(self, runner, files, backend, numerics)


@dataclass
class NodesCompiledModel(CompiledModel):
    """A ``CompiledModel`` placed on Ray nodes, with the cluster it was planned over."""

    cluster: ClusterProfile | None = None

    @classmethod
    def of(cls, compiled: CompiledModel, cluster: ClusterProfile) -> NodesCompiledModel:
        kw = {f.name: getattr(compiled, f.name) for f in fields(CompiledModel)}
        return cls(**kw, cluster=cluster)

    def explain(self) -> str:
        """The planner's explanation, then the nodes, the links and why each node was used."""
        return super().explain() + "\n" + nodes_section(self)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def nodes_section(c: NodesCompiledModel) -> str:
    """The nodes part of ``explain()`` (every number is one the planner used)."""
    assert c.cluster is not None
    cl, stats = c.cluster, c.stats
    held = standing_bytes(stats, c.placement)
    whole = stats.total_weight_bytes + stats.kv_of(0, len(stats.units), "cpu")
    lines = [f"nodes (Ray cluster {cl.address}):"]
    for n in cl.nodes:
        budget = c.budgets.device.get(n.key)
        segs = [s for s in c.placement.segments if s.device == n.key]
        what = "; ".join(f"holds {_span(c, s.start, s.end)}" for s in segs)
        tag = "head, " if n.head else ""
        lines.append(
            f"  {n.key} ({tag}{n.address}, {n.cpus} CPU, Ray memory {_mib(n.memory_bytes)}): "
            + (f"budget {_mib(budget)}" if budget is not None else "not eligible")
            + (f"; {what}, {_mib(held[n.key])} with its KV" if segs else "")
            + f"; profile {n.source} on the node ({n.measure_s:.1f} s)"
        )
    lines.append("links (a task pair moving a buffer between the nodes):")
    order = c.placement.segments
    cuts = {(a.device, b.device) for a, b in zip(order, order[1:], strict=False)}
    act = stats.activation_bytes
    for (a, b), link in sorted(cl.links.items()):
        used = (a, b) in cuts
        lines.append(
            f"  {a} -> {b}: {link.bandwidth / 1e9:.3f} GB/s, {link.latency_s * 1e6:.1f} us "
            f"latency; a hidden state of {act} B costs {link.cost_s(act) * 1e3:.3f} ms"
            + (" (a cut of the chosen plan)" if used else "")
        )
    lines.append(
        f"  transfers in the chosen plan: {c.chosen.cost.transfer_s * 1e3:.3f} ms per step"
    )
    lines.append("why each node:")
    fits = [k for k, b in c.budgets.device.items() if whole <= b]
    singles = [x for x in c.candidates if len(x.placement.segments) == 1]
    for n in cl.nodes:
        if n.key in c.placement.devices:
            if len(c.placement.devices) == 1:
                why = "the whole model fits it, and it is the cheapest"
            elif not fits:
                why = (
                    f"the model ({_mib(whole)} of weights and KV) fits no single node's budget "
                    f"({', '.join(f'{k} {_mib(b)}' for k, b in c.budgets.device.items())}), so "
                    "its layers are split over nodes"
                )
            else:
                best = min(singles, key=lambda x: x.score, default=None)
                alone = "" if best is None else f" vs {best.score * 1e3:.3f} ms on one node"
                why = f"the split costs {c.chosen.score * 1e3:.3f} ms per step{alone}"
            lines.append(f"  {n.key} used: {why}")
        else:
            # What joining the plan would add per cut: a hidden state over its links.
            over = [
                f"{d} -> {n.key} {cl.links[(d, n.key)].cost_s(act) * 1e3:.3f} ms"
                for d in c.placement.devices
                if (d, n.key) in cl.links
            ]
            links = f"; a hidden state over its links: {', '.join(over)}" if over else ""
            why = c.dropped.get(n.key, "not in the chosen plan")
            lines.append(f"  {n.key} dropped: {why}{links}")
    return "\n".join(lines)


def _span(c: CompiledModel, a: int, b: int) -> str:
    units = c.stats.units
    return units[a].name if b - a == 1 else f"{units[a].name}..{units[b - 1].name}"


def plan_over(
    cfg: NodesConfig,
    cluster: ClusterProfile,
    files: ModelFiles,
    definition: Any,
    weights: Any,
    kv_pool: tuple[int, dict[str, int]],
) -> NodesCompiledModel:
    """Places the model over ``cluster``'s nodes (step 2 of the module docs).

    Raises:
        PlannerError: no set of nodes holds the model resident (each node's budget named).
    """
    profiles, dropped = cluster.device_profiles(cfg.compile.device_budget_bytes)
    if not profiles:
        raise PlannerError(
            "no node of the cluster can hold a segment: " + "; ".join(dropped.values()),
            reasons=dropped,
        )
    config = replace(cfg.compile, disk_budget_bytes=0)
    host = HostProfile(max(p.memory_bytes for p in profiles.values()))
    try:
        compiled = compile(
            files, config, profiles=list(profiles.values()), host=host, definition=definition,
            weights=weights, kv_pool=kv_pool,
        )  # fmt: skip
    except (CapacityError, PlannerError) as e:
        reasons = {**dropped, **getattr(e, "reasons", {})}
        for k, p in profiles.items():
            reasons.setdefault(
                k, f"budget {_mib(p.memory_bytes)}: its share of every split tried does not fit"
            )
        budgets = ", ".join(f"{k} {_mib(p.memory_bytes)}" for k, p in profiles.items())
        raise PlannerError(
            f"no placement over the cluster's nodes holds the model resident (nodes never "
            f"stream weights); node budgets: {budgets}; {e.message}",
            reasons=reasons,
        ) from None
    compiled.dropped.update(dropped)
    return NodesCompiledModel.of(compiled, cluster)
