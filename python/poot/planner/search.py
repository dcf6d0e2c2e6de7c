"""The placement search: which devices, which layer ranges, resident or streamed.

Candidates are built from eligible devices only (a profile, allowed by the config) and are
contiguous: an ordered subset of at most ``MAX_DEVICES`` devices cuts the model's units into as
many ranges (cut positions coarsened to ``MAX_CUTS`` per model so the count stays small). A
range is resident when its distinct weights fit the device's budget; otherwise it streams from
host memory (if the host budget holds the weights) or from disk (if the disk budget holds its
double buffer), through a double buffer of chunks each at most half the device budget. The KV
pool of a range's layers (``ModelStats.kv_of``) stays on its device and comes off its budget
first. Each candidate is scored by ``cost.step_cost``; ``simulate`` then re-ranks the best
``top``.

Invariant: every returned candidate covers every unit exactly once, and fits every budget.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from poot.errors import ConfigError, PlannerError
from poot.planner.cost import Cost, Placement, Residency, Segment, step_cost
from poot.planner.graphstats import ModelStats
from poot.planner.profiles import DeviceProfile, HostProfile

__all__ = ["Budgets", "Candidate", "SearchResult", "chunk_units", "forced", "search"]

MAX_DEVICES = 3
MAX_CUTS = 16


@dataclass(frozen=True)
class Budgets:
    """Bytes the plan may use: per device (weights and buffers), host memory, disk (spill)."""

    device: dict[str, int]
    host: int
    disk: int


@dataclass
class Candidate:
    """A placement and its analytic cost (``simulated_s`` once simulated)."""

    placement: Placement
    cost: Cost
    simulated_s: float | None = None

    @property
    def score(self) -> float:
        return self.simulated_s if self.simulated_s is not None else self.cost.total_s


@dataclass
class SearchResult:
    """Candidates best first, and per device the best candidate that used it."""

    candidates: list[Candidate]
    best_with: dict[str, Candidate] = field(default_factory=dict)
    infeasible: dict[str, str] = field(default_factory=dict)
    considered: int = 0


def chunk_units(stats: ModelStats, start: int, end: int, limit: int) -> list[tuple[int, int]]:
    """Splits units ``[start, end)`` into consecutive chunks of at most ``limit`` bytes each.

    Returns [] when one unit alone is over ``limit`` (no double buffer can hold it).
    """
    chunks: list[tuple[int, int]] = []
    a = start
    while a < end:
        b = a + 1
        if stats.bytes_of(a, b) > limit:
            return []
        while b < end and stats.bytes_of(a, b + 1) <= limit:
            b += 1
        chunks.append((a, b))
        a = b
    return chunks


def _segment(
    stats: ModelStats, dev: str, a: int, b: int, budgets: Budgets, is_host: bool
) -> Segment | str:
    """The cheapest feasible way to hold units [a, b) on ``dev``, or why none is.

    The KV pool of the range's layers stays on ``dev`` either way: it counts against the
    device's budget before any weight does.
    """
    weights, kv = stats.bytes_of(a, b), stats.kv_of(a, b, dev)
    budget = budgets.device.get(dev, 0)
    if weights + kv <= budget:
        return Segment(dev, a, b, "resident")
    if kv >= budget:
        return f"{dev}: the KV pool of its layers ({kv} B) fills its {budget} B budget"
    chunks = chunk_units(stats, a, b, (budget - kv) // 2)
    if not chunks:
        return (
            f"{dev}: one layer needs more than half of its {budget} B budget less {kv} B of KV "
            "(double buffer)"
        )
    biggest = max(stats.bytes_of(x, y) for x, y in chunks)
    source: Residency
    if is_host and budgets.disk < 2 * biggest:
        # On the CPU both buffer slots are files in the spill dir (``streaming``).
        return (
            f"{dev}: streaming needs {2 * biggest} B of spill disk, the budget is {budgets.disk} B"
        )
    # On the CPU the KV pool is host memory too: what the host budget holds besides it.
    host_left = budgets.host - (kv if is_host else 0)
    if host_left >= weights:
        source = "host"
    elif budgets.disk >= 2 * biggest:
        source = "disk"
    else:
        return (
            f"{dev}: {weights} B (and {kv} B of KV) do not fit its {budget} B budget, the host "
            f"budget ({budgets.host} B) or the disk budget ({budgets.disk} B)"
        )
    return Segment(dev, a, b, source, tuple(chunks))


def _cut_positions(n_units: int) -> list[int]:
    inner = list(range(1, n_units))
    if len(inner) <= MAX_CUTS:
        return inner
    step = len(inner) / MAX_CUTS
    return sorted({inner[int(i * step)] for i in range(MAX_CUTS)})


def search(
    stats: ModelStats,
    profiles: dict[str, DeviceProfile],
    host: HostProfile,
    budgets: Budgets,
    *,
    allow_mixed_vendor: bool = False,
) -> SearchResult:
    """Every feasible contiguous placement over ``profiles``, best analytic cost first."""
    result = SearchResult([])
    keys = list(profiles)
    n = len(stats.units)
    for k in range(1, min(MAX_DEVICES, len(keys)) + 1):
        for order in itertools.permutations(keys, k):
            vendors = {profiles[d].vendor for d in order if not profiles[d].is_host}
            if len(vendors) > 1 and not allow_mixed_vendor:
                continue
            for cuts in itertools.combinations(_cut_positions(n), k - 1):
                bounds = (0, *cuts, n)
                segs: list[Segment] = []
                for dev, a, b in zip(order, bounds, bounds[1:], strict=False):
                    seg = _segment(stats, dev, a, b, budgets, profiles[dev].is_host)
                    if isinstance(seg, str):
                        result.infeasible.setdefault(dev, seg)
                        break
                    segs.append(seg)
                else:
                    placement = Placement(tuple(segs))
                    cand = Candidate(placement, step_cost(stats, placement, profiles, host))
                    result.candidates.append(cand)
                    result.considered += 1
    result.candidates.sort(key=lambda c: c.cost.total_s)
    for c in result.candidates:
        for d in c.placement.devices:
            result.best_with.setdefault(d, c)
    return result


def forced(
    stats: ModelStats,
    profiles: dict[str, DeviceProfile],
    host: HostProfile,
    budgets: Budgets,
    spec: tuple[tuple[str, int, int], ...],
    dropped: dict[str, str],
) -> SearchResult:
    """The one placement ``spec`` names (``CompileConfig.force_placement``), costed.

    Raises:
        ConfigError: ``spec`` does not end at the model's last unit.
        PlannerError: a device in ``spec`` is not eligible (``dropped`` says why) or a range
            does not fit its device's budgets.
    """
    n = len(stats.units)
    if spec[-1][2] != n:
        raise ConfigError(
            f"CompileConfig.force_placement must end at unit {n} (this model has "
            f"{stats.n_layers} layers: units 0..{n - 1}); got {spec!r}"
        )
    segs: list[Segment] = []
    for dev, a, b in spec:
        if dev not in profiles:
            why = dropped.get(dev, "no such device")
            raise PlannerError(
                f"CompileConfig.force_placement uses {dev}, which is not eligible: {why}",
                reasons={dev: why},
            )
        seg = _segment(stats, dev, a, b, budgets, profiles[dev].is_host)
        if isinstance(seg, str):
            raise PlannerError(f"CompileConfig.force_placement: {seg}", reasons={dev: seg})
        segs.append(seg)
    placement = Placement(tuple(segs))
    cand = Candidate(placement, step_cost(stats, placement, profiles, host))
    result = SearchResult([cand], considered=1)
    for d in placement.devices:
        result.best_with[d] = cand
    for d in profiles:
        if d not in placement.devices:
            result.infeasible[d] = "not in CompileConfig.force_placement"
    return result
