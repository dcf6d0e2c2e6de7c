"""Placing the modules of a ``ModuleGraph`` on devices with the planner's own search.

Each module is one planner unit (``graphstats.UnitStats``) read from its traced graph: the
stored bytes of the weights it reads, the FLOPs of its matmuls over weights (per weight dtype)
and of its batched matmuls between activations, and its kernel dispatches. The modules, in the
graph's (topological) order, are the units the planner's ``search`` cuts into contiguous
ranges, one per device; ``cost.step_cost`` scores them and ``simulate.simulate_step`` re-ranks
the best few, exactly as for an LLM's layers.

Invariants: a module plan is resident only (a candidate that would stream a range is not
taken: compiled modules have no segment loader), and a module is placed only on a device whose
runtime supports every op of its graph (``runtime.supports``); a device that can take none of
the candidates is dropped with the reason. ``activation_bytes`` is the largest f32 value any
module hands to the next (the planner prices every cut with one size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from poot import _native
from poot.errors import PlannerError
from poot.planner.compiled import (
    CompileConfig,
    Placed,
    _budgets,
    _profiles_from,
    choose,
    eligible_devices,
    search_under,
)
from poot.planner.explain import candidate_line, choice_lines
from poot.planner.graphstats import ModelStats, UnitStats, Workload
from poot.planner.profiles import DeviceProfile, HostProfile
from poot.planner.search import Budgets, Candidate

__all__ = ["ModulePlacement", "explain_modules", "module_unit", "place_modules"]

# Equations that launch no kernel (as graphstats counts them).
_FREE = {"input", "weight", "literal", "reshape", "cast"}


def module_unit(name: str, graph: _native.Graph, sizes: dict[str, int]) -> UnitStats:
    """The planner's view of one module's graph (see the module docs)."""
    u = UnitStats(name)
    weight_of: dict[int, tuple[str, str, tuple[int, ...]]] = {}
    shapes: list[tuple[int, ...]] = []
    for vid, (op, ins, attrs, dtype, out_shape) in enumerate(graph.equations()):
        shapes.append(tuple(out_shape))
        if op == "weight":
            wname = str(attrs["name"])
            weight_of[vid] = (wname, dtype, tuple(out_shape))
        elif op == "cast" and ins[0] in weight_of:
            weight_of[vid] = weight_of[ins[0]]  # fused into its reader
        if op not in _FREE:
            u.equations += 1
        for i in ins:
            if i in weight_of and weight_of[i][0] not in u.weights:
                u.weights.add(weight_of[i][0])
                u.weight_bytes += sizes.get(weight_of[i][0], 0)
        if op == "matmul" and len(ins) == 2 and ins[1] in weight_of:
            wname, wdt, wshape = weight_of[ins[1]]
            flops = 2 * math.prod(out_shape[:-1]) * math.prod(wshape)
            u.matmul_flops[wdt] = u.matmul_flops.get(wdt, 0) + flops
            u.bytes_by_dtype[wdt] = u.bytes_by_dtype.get(wdt, 0) + sizes.get(wname, 0)
            u.matmuls += 1
        elif op in ("batch_matmul", "matmul") and len(ins) == 2:
            # Between activations: arithmetic at the F32 rate (the cost model's attention term).
            inner = shapes[ins[0]][-1] if shapes[ins[0]] else 1
            u.attn_flops += 2 * math.prod(out_shape) * inner
    return u


def module_stats(units: list[UnitStats], sizes: dict[str, int], activation: int) -> ModelStats:
    total = sum(sizes.get(n, 0) for n in set().union(*(u.weights for u in units)))
    return ModelStats(tuple(units), activation, total, Workload(), dict(sizes))


@dataclass
class ModulePlacement(Placed):
    """Where each module runs and why (the fields ``explain_modules`` prints): the planner's
    decision over the modules' ``stats``."""

    stats: ModelStats
    host: HostProfile
    pinned: bool

    def device_of(self, unit: int) -> str:
        for s in self.chosen.placement.segments:
            if s.start <= unit < s.end:
                return s.device
        raise IndexError(unit)


def discover_profiles(settings: Any = None) -> tuple[dict[str, DeviceProfile], dict[str, str]]:
    """This machine's device profiles (stored by ``poot validate-hardware``; the CPU
    estimated when it has none), and why each unprofiled device is left out."""
    from poot.config import Settings
    from poot.planner.discovery import discover

    return _profiles_from(discover(), _native.__version__, settings or Settings.from_env())


def place_modules(
    stats: ModelStats,
    found: dict[str, DeviceProfile],
    host: HostProfile,
    config: CompileConfig,
    supported: dict[str, set[int]],
    dropped: dict[str, str],
) -> ModulePlacement:
    """The placement of ``stats``' units over ``found`` (see the module docs).

    Args:
        supported: per device key, the units whose every op its runtime supports.
        dropped: devices already left out, and why (extended here).

    Raises:
        PlannerError: no resident placement on supporting devices fits the budgets.
    """
    from pathlib import Path

    dropped = dict(dropped)
    eligible = eligible_devices(found, config, dropped)
    # Modules never stream: no spill disk is ever used.
    budgets = _budgets(config, eligible, host, Path("/"))
    budgets = Budgets(budgets.device, budgets.host, 0)
    result = search_under(stats, eligible, host, budgets, config, dropped)
    why_not: dict[str, str] = dict(result.infeasible)

    def takes(c: Candidate) -> bool:
        for s in c.placement.segments:
            if s.streamed:
                why_not.setdefault(s.device, f"{s.device}: the modules do not fit resident")
                return False
            missing = [u for u in range(s.start, s.end) if u not in supported.get(s.device, ())]
            if missing:
                names = ", ".join(stats.units[u].name for u in missing)
                why_not.setdefault(s.device, f"its runtime lacks an op of module(s) {names}")
                return False
        return True

    cands = [c for c in result.candidates if takes(c)]
    if not cands:
        reasons = {**dropped, **why_not}
        raise PlannerError(
            "no resident placement of the modules fits: "
            + "; ".join(f"{k}: {v}" for k, v in reasons.items()),
            reasons=reasons,
        )
    best_with: dict[str, Candidate] = {}
    for c in cands:
        for d in c.placement.devices:
            best_with.setdefault(d, c)
    chosen, sim, runner_up = choose(
        stats, cands, eligible, host, config, best_with, why_not, dropped
    )
    return ModulePlacement(
        eligible, budgets, chosen, runner_up, cands, dropped, sim, stats, host,
        config.force_placement is not None,
    )  # fmt: skip


def _mib(n: int) -> str:
    if n >= 1 << 60:
        return "unlimited"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def explain_modules(p: ModulePlacement) -> str:
    """The plan in words: each module's device, the chosen placement and its cost, the
    runner-up, the budgets, and why each device not used was dropped."""
    s = p.stats
    lines = [
        f"modules: {len(s.units)} ({_mib(s.total_weight_bytes)} weights)",
        "budgets: " + ", ".join(f"{k} {_mib(v)}" for k, v in p.budgets.device.items()),
        f"chosen: {candidate_line(p.chosen, s)}",
    ]
    if p.pinned:
        lines.append("    pinned by CompileConfig.force_placement (no search)")
    for i, u in enumerate(s.units):
        lines.append(
            f"  {u.name} -> {p.device_of(i)} ({_mib(u.weight_bytes)} weights, "
            f"{u.equations} kernels)"
        )
    lines += choice_lines(s, p.runner_up, p.candidates, p.profiles, p.dropped)
    return "\n".join(lines)
