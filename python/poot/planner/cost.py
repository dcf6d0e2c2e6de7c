"""The analytic cost model: seconds for one step of a placement.

A placement cuts the model's units (``graphstats``) into contiguous ranges, one per device, each
resident or streamed (from host memory or disk). One step runs the ranges in order, so its time
is the sum over segments of

- compute: per weight dtype ``max(bytes / gemv_bw, flops / gemm_flops)`` (a one-row matmul is
  bound by reading the weights, a many-row one by arithmetic), attention KV reads at
  ``read_bw``, and ``dispatch_s`` per equation;
- streaming: a streamed range is loaded through a double buffer, so loading overlaps compute:
  ``max(compute, load) + load / chunks`` (the first chunk is loaded before anything runs), and
  each chunk pays the device's ``segment_s`` to start and ``stage_s`` to stage;
- transfers: activations across each cut (device to device over ``peer_bw``, else through the
  host over both links) plus the step's inputs and token ids when the ends are not the host;
- contention: work that overlaps on the same cores or memory. A step runs its segments in
  order, so a software adapter (lavapipe: the CPU's own cores) and the CPU never compute at
  once; its measured rates already are what those cores give it. What does overlap is a
  loader thread staging the next chunk while the CPU or a software adapter computes (it takes
  a core, ``loaded_compute_s``), and host memory bandwidth spent streaming to a device while
  the CPU computes.

The model is deliberately simple and explainable; ``simulate`` checks the best few candidates
with a discrete-event run of the same step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from poot.planner.graphstats import ModelStats, UnitStats
from poot.planner.profiles import DeviceProfile, HostProfile

__all__ = ["Cost", "Placement", "Residency", "Segment", "segment_compute_s", "step_cost"]

Residency = Literal["resident", "host", "disk"]


@dataclass(frozen=True)
class Segment:
    """Units ``[start, end)`` on ``device``, resident or streamed in ``chunks`` pieces."""

    device: str
    start: int
    end: int
    residency: Residency = "resident"
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def streamed(self) -> bool:
        return self.residency != "resident"


@dataclass(frozen=True)
class Placement:
    """Segments in step order, covering every unit once."""

    segments: tuple[Segment, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.device for s in self.segments))

    def describe(self, stats: ModelStats) -> str:
        parts = []
        for s in self.segments:
            first, last = stats.units[s.start].name, stats.units[s.end - 1].name
            span = first if s.end - s.start == 1 else f"{first}..{last}"
            how = "resident" if not s.streamed else f"streamed from {s.residency}"
            parts.append(f"{s.device} [{span}] {how}")
        return "; ".join(parts)


@dataclass
class Cost:
    """Seconds of one step, by part (``total_s`` is what the search minimizes)."""

    compute_s: float = 0.0
    memory_s: float = 0.0
    transfer_s: float = 0.0
    stream_s: float = 0.0
    contention_s: float = 0.0
    total_s: float = 0.0
    per_segment: list[float] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.total_s * 1e3:.2f} ms (compute {self.compute_s * 1e3:.2f}, memory "
            f"{self.memory_s * 1e3:.2f}, transfer {self.transfer_s * 1e3:.2f}, stream "
            f"{self.stream_s * 1e3:.2f}, contention {self.contention_s * 1e3:.2f})"
        )


def unit_compute_s(u: UnitStats, p: DeviceProfile) -> tuple[float, float]:
    """(arithmetic-or-weight-read seconds, attention memory + dispatch seconds) of one unit."""
    mm = 0.0
    for dt, flops in u.matmul_flops.items():
        mm += max(u.bytes_by_dtype.get(dt, 0) / p.gemv(dt), flops / p.gemm(dt))
    mm += u.matmuls * p.matmul_s
    other = u.kv_bytes / p.read_bw + u.attn_flops / p.gemm("F32") + u.equations * p.dispatch_s
    return mm, other


def segment_compute_s(stats: ModelStats, start: int, end: int, p: DeviceProfile) -> float:
    """Seconds the units ``[start, end)`` compute on ``p``."""
    return sum(sum(unit_compute_s(u, p)) for u in stats.units[start:end])


def load_bw(p: DeviceProfile, host: HostProfile, residency: Residency) -> float:
    """Bytes/s a streamed range is loaded at: from host memory or disk, then over the link."""
    src = host.copy_bw if residency == "host" else host.disk_read_bw
    if p.is_host:
        return min(src, p.stage_bw) if p.stage_bw > 0 else src
    return src if p.link_bw <= 0 else min(src, p.link_bw)


def loaded_compute_s(compute: float, load: float, p: DeviceProfile, staging: bool = False) -> float:
    """Seconds work of ``compute`` seconds takes while ``load`` seconds of other work run beside
    it on the same cores: slowed by ``loader_slowdown`` while both run, full speed after. Used
    both ways: compute beside the loader, and (``staging``) the loader beside compute."""
    k = loader_slowdown(p, staging)
    overlap = min(compute * k, load)
    return overlap + (compute - overlap / k)


def loader_slowdown(p: DeviceProfile, staging: bool = False) -> float:
    """How much slower a device computes while a loader thread stages the next chunk on the
    host (``staging``: how much slower the loader stages meanwhile). The measured
    ``overlap_slowdown`` where there is one; else the loader takes one of ``cores``. Only the
    CPU and a software adapter (whose cores are the CPU's) share cores with the loader."""
    if not (p.is_host or p.software):
        return 1.0
    if p.overlap_slowdown is not None:
        return max(1.0, p.overlap_slowdown[1 if staging else 0])
    return p.cores / (p.cores - 1) if p.cores > 1 else 1.0


def _cut_s(stats: ModelStats, a: DeviceProfile, b: DeviceProfile) -> float:
    act = stats.activation_bytes
    if b.key in a.peer_bw:
        return act / a.peer_bw[b.key] + max(a.link_latency_s, b.link_latency_s)
    t = 0.0
    for p in (a, b):
        if not p.is_host and p.link_bw > 0:
            t += act / p.link_bw + p.link_latency_s
    return t


def step_cost(
    stats: ModelStats, placement: Placement, profiles: dict[str, DeviceProfile], host: HostProfile
) -> Cost:
    """The analytic cost of one step of ``placement`` (see the module docs)."""
    c = Cost()
    used = [profiles[k] for k in placement.devices]
    cpu_used = any(p.is_host for p in used)
    host_stream_bytes = 0
    cpu_compute = 0.0
    for s in placement.segments:
        p = profiles[s.device]
        mm = other = 0.0
        for u in stats.units[s.start : s.end]:
            a, b = unit_compute_s(u, p)
            mm, other = mm + a, other + b
        compute = mm + other
        c.compute_s += mm
        c.memory_s += other
        seg = compute
        if s.streamed:
            nbytes = stats.bytes_of(s.start, s.end)
            n = max(1, len(s.chunks))
            load = nbytes / load_bw(p, host, s.residency) + n * p.stage_s
            # Each chunk is started (opened, compiled) and its fresh buffer first touched.
            start = n * p.segment_s + (nbytes / p.fresh_map_bw if p.fresh_map_bw > 0 else 0.0)
            compute += start
            c.memory_s += start
            # The CPU's loader and its compute threads share the cores both ways.
            shared, load_shared = (
                loaded_compute_s(compute, load, p),
                loaded_compute_s(load, compute, p, staging=True),
            )
            c.contention_s += shared - compute
            compute, load = shared, load_shared
            seg = max(compute, load) + load / n
            c.stream_s += seg - compute
            if not p.is_host and s.residency == "host":
                host_stream_bytes += nbytes
        if p.is_host:
            cpu_compute += compute
        c.per_segment.append(seg)
    bus = 0.0
    if cpu_used and host_stream_bytes:
        # Streaming to a device reads host memory the CPU also reads; charge the overlap.
        bus = min(cpu_compute, host_stream_bytes / host.copy_bw)
        c.contention_s += bus
    segs = placement.segments
    for left, right in zip(segs, segs[1:], strict=False):
        if left.device != right.device:
            c.transfer_s += _cut_s(stats, profiles[left.device], profiles[right.device])
    for end in (profiles[segs[0].device], profiles[segs[-1].device]):
        if not end.is_host:
            c.transfer_s += end.link_latency_s  # step inputs in, token ids out
    c.total_s = sum(c.per_segment) + c.transfer_s + bus
    return c
