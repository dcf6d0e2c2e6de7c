"""``CompiledModel.explain()``: the plan in words.

It states the chosen placement and its cost (analytic and simulated), what it holds on each
device (resident weights and KV pool), the runner-up and its cost, the budgets, whether the plan
runs on the direct path or streams, and for each device not in the plan why it was dropped.
Every number printed is one the planner used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from poot.planner.compiled import CompiledModel
    from poot.planner.graphstats import ModelStats
    from poot.planner.profiles import DeviceProfile
    from poot.planner.search import Candidate

__all__ = ["candidate_line", "choice_lines", "explain", "versus"]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n < (1 << 60) else "unlimited"


def candidate_line(c: Candidate, stats: ModelStats) -> str:
    """A candidate's placement and cost (analytic, and simulated where it was)."""
    sim = "" if c.simulated_s is None else f"; simulated {c.simulated_s * 1e3:.3f} ms"
    return f"{c.placement.describe(stats)}\n    cost {c.cost.summary()}{sim}"


def choice_lines(
    stats: ModelStats,
    runner_up: Candidate | None,
    candidates: list[Candidate],
    profiles: dict[str, DeviceProfile],
    dropped: dict[str, str],
) -> list[str]:
    """The end of a plan's explanation: the runner-up, how many candidates were weighed,
    each device's profile, and why each device left out was dropped."""
    lines = []
    if runner_up is not None:
        lines.append(f"runner-up: {candidate_line(runner_up, stats)}")
    else:
        lines.append("runner-up: none (one feasible candidate)")
    lines.append(f"candidates considered: {len(candidates)}")
    for key, p in profiles.items():
        tag = "validated" if p.validated else p.source
        lines.append(f"device {key}: {p.name} ({tag})")
    if dropped:
        lines.append("dropped:")
        lines.extend(f"  {k}: {v}" for k, v in sorted(dropped.items()))
    return lines


def versus(p: DeviceProfile, chosen: list[DeviceProfile], stats: ModelStats) -> str:
    """Why ``p`` costs more than the chosen devices, in its measured numbers: one-row matmul
    rate on the model's main weight dtype, dispatch cost, its link, and whether it shares the
    CPU's cores."""
    by_dtype: dict[str, int] = {}
    for u in stats.units:
        for dt, n in u.bytes_by_dtype.items():
            by_dtype[dt] = by_dtype.get(dt, 0) + n
    dt = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else "F32"
    tag = "measured" if p.validated else p.source
    parts = [
        f"{dt} one-row matmul {p.gemv(dt) / 1e9:.2f} GB/s vs "
        + ", ".join(f"{q.gemv(dt) / 1e9:.2f} on {q.key}" for q in chosen),
        f"dispatch {p.dispatch_s * 1e6:.1f} us vs "
        + ", ".join(f"{q.dispatch_s * 1e6:.1f}" for q in chosen),
    ]
    if not p.is_host:
        parts.append(
            f"host link {p.link_bw / 1e9:.2f} GB/s + {p.link_latency_s * 1e6:.1f} us per transfer"
        )
    text = f"{tag}: " + "; ".join(parts)
    if p.software:
        text += "; a software adapter: it computes on the CPU's own cores, more slowly"
    return text


def explain(compiled: CompiledModel) -> str:
    """The explanation text (see the module docs)."""
    from poot.planner.compiled import standing_bytes

    s, w = compiled.stats, compiled.stats.workload
    lines = [
        f"model: {compiled.files.path} ({s.n_layers} layers, {_mib(s.total_weight_bytes)} weights)",
        f"workload: {w.rows} row(s) per step, context {w.context}",
        "budgets: "
        + ", ".join(f"{k} {_mib(v)}" for k, v in compiled.budgets.device.items())
        + f"; host {_mib(compiled.budgets.host)}; disk {_mib(compiled.budgets.disk)}",
        f"chosen: {candidate_line(compiled.chosen, s)}",
    ]
    held = standing_bytes(compiled.stats, compiled.placement)
    lines.append(
        "    held per device (resident weights + KV pool): "
        + ", ".join(f"{k} {_mib(v)}" for k, v in held.items())
    )
    if compiled.config.force_placement is not None:
        lines.append("    pinned by CompileConfig.force_placement (no search)")
    if compiled.direct:
        lines.append("    path: direct (one resident segment: no segmenting, loader or buffer)")
    elif compiled.streams:
        chunks = [len(x.chunks) for x in compiled.placement.segments if x.streamed]
        lines.append(
            f"    path: streamed through a double buffer ({sum(chunks)} chunks), spill dir "
            f"{compiled.spill_dir}"
        )
    lines += choice_lines(
        s, compiled.runner_up, compiled.candidates, compiled.profiles, compiled.dropped
    )
    return "\n".join(lines)
