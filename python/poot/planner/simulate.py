"""A discrete-event simulation of one step of a placement.

The step becomes tasks on resources (a device's compute queue, its host link, the disk): a
compute task per unit, a load task per streamed chunk, a transfer per cut between devices.
Dependencies encode the double buffer: chunk ``i`` may load only once chunk ``i - 2`` finished
computing (two buffer slots), and computes in order. Each resource runs one task at a time, in
task order; time advances from completion to completion (a heap of events). Durations come from
the same per-unit numbers as ``cost``, so the simulation differs from the analytic cost only
where overlap and waiting matter, which is what it is for.

Invariants: every task runs exactly once; a task starts no earlier than its dependencies end and
its resource is free; the result's spans are the timeline ``visualize`` draws.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from poot.planner.cost import Placement, load_bw, loaded_compute_s, unit_compute_s
from poot.planner.graphstats import ModelStats
from poot.planner.profiles import DeviceProfile, HostProfile

__all__ = ["Span", "SimResult", "Task", "run_tasks", "simulate_step"]


@dataclass(frozen=True)
class Span:
    """One interval on one lane of the timeline (seconds from the step's start)."""

    lane: str
    label: str
    start: float
    end: float
    kind: str = "compute"  # compute | load | transfer | op | note (a label, no bar)


@dataclass
class Task:
    """A unit of simulated work on one resource, after its dependencies."""

    label: str
    resource: str
    duration: float
    deps: list[int] = field(default_factory=list)
    kind: str = "compute"


@dataclass
class SimResult:
    """The simulated step: its length and every span."""

    total_s: float
    spans: list[Span]


def run_tasks(tasks: list[Task]) -> SimResult:
    """Runs ``tasks`` to completion; each resource serves its ready tasks in task order."""
    waiting = [len(t.deps) for t in tasks]
    users: list[list[int]] = [[] for _ in tasks]
    for i, t in enumerate(tasks):
        for d in t.deps:
            users[d].append(i)
    ready: dict[str, list[int]] = {}
    busy: set[str] = set()
    events: list[tuple[float, int]] = []
    spans: list[Span | None] = [None] * len(tasks)
    now = 0.0

    def start_ready() -> None:
        for res, queue in ready.items():
            if res not in busy and queue:
                i = heapq.heappop(queue)
                busy.add(res)
                t = tasks[i]
                spans[i] = Span(t.resource, t.label, now, now + t.duration, t.kind)
                heapq.heappush(events, (now + t.duration, i))

    for i, t in enumerate(tasks):
        if not t.deps:
            heapq.heappush(ready.setdefault(t.resource, []), i)
    start_ready()
    while events:
        now, i = heapq.heappop(events)
        busy.discard(tasks[i].resource)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready.setdefault(tasks[u].resource, []), u)
        start_ready()
    done = [s for s in spans if s is not None]
    if len(done) != len(tasks):
        raise RuntimeError(f"simulation deadlocked: {len(tasks) - len(done)} tasks never ran")
    return SimResult(max((s.end for s in done), default=0.0), done)


def simulate_step(
    stats: ModelStats,
    placement: Placement,
    profiles: dict[str, DeviceProfile],
    host: HostProfile,
) -> SimResult:
    """Simulates one step of ``placement`` (see the module docs)."""
    tasks: list[Task] = []
    last_compute: int | None = None
    prev_dev: str | None = None
    for seg in placement.segments:
        p = profiles[seg.device]
        factor = 1.0
        if prev_dev is not None and prev_dev != seg.device:
            q = profiles[prev_dev]
            act = stats.activation_bytes
            if seg.device in q.peer_bw:
                dur = act / q.peer_bw[seg.device] + max(q.link_latency_s, p.link_latency_s)
            else:
                dur = sum(
                    act / d.link_bw + d.link_latency_s
                    for d in (q, p)
                    if not d.is_host and d.link_bw > 0
                )
            deps = [] if last_compute is None else [last_compute]
            tasks.append(
                Task(f"{prev_dev}->{seg.device}", f"{seg.device} link", dur, deps, "transfer")
            )
            last_compute = len(tasks) - 1
        chunks = list(seg.chunks) if seg.streamed else [(seg.start, seg.end)]
        chunk_done: list[int] = []
        bw = load_bw(p, host, seg.residency)
        stage_s = p.stage_s
        if seg.streamed and (p.is_host or p.software):
            # A loader on the host takes one of the cores this device computes on while it
            # stages (``cost.loaded_compute_s``).
            base = sum(sum(unit_compute_s(u, p)) for u in stats.units[seg.start : seg.end])
            load = stats.bytes_of(seg.start, seg.end) / bw + len(chunks) * stage_s
            factor *= loaded_compute_s(base, load, p) / base if base > 0 else 1.0
            if load > 0:
                slowed = load / loaded_compute_s(load, base, p, staging=True)
                bw, stage_s = bw * slowed, stage_s / slowed
        for ci, (a, b) in enumerate(chunks):
            deps = []
            if seg.streamed:
                ldeps = [chunk_done[ci - 2]] if ci >= 2 else []
                res = "disk" if seg.residency == "disk" else f"{seg.device} load"
                dur = stats.bytes_of(a, b) / bw + stage_s
                tasks.append(Task(f"load {_span(stats, a, b)}", res, dur, ldeps, "load"))
                deps.append(len(tasks) - 1)
            if seg.streamed and (p.segment_s > 0 or p.fresh_map_bw > 0):
                d = list(deps) + ([] if last_compute is None else [last_compute])
                label = f"start {_span(stats, a, b)}"
                fresh = stats.bytes_of(a, b) / p.fresh_map_bw if p.fresh_map_bw > 0 else 0.0
                tasks.append(Task(label, seg.device, p.segment_s + fresh, d, "compute"))
                last_compute = len(tasks) - 1
                deps = []
            for u in range(a, b):
                d = list(deps) + ([] if last_compute is None else [last_compute])
                dur = sum(unit_compute_s(stats.units[u], p)) * factor
                tasks.append(Task(stats.units[u].name, seg.device, dur, d, "compute"))
                last_compute = len(tasks) - 1
                deps = []
            assert last_compute is not None
            chunk_done.append(last_compute)
        prev_dev = seg.device
    for end in {placement.segments[0].device, placement.segments[-1].device}:
        p = profiles[end]
        if not p.is_host and p.link_latency_s > 0:
            deps = [] if last_compute is None else [last_compute]
            tasks.append(Task("inputs/ids", f"{end} link", p.link_latency_s, deps, "transfer"))
    return run_tasks(tasks)


def _span(stats: ModelStats, a: int, b: int) -> str:
    first, last = stats.units[a].name, stats.units[b - 1].name
    return first if b - a == 1 else f"{first}..{last}"
