"""A run's spans per layer and per op kind, from the CPU runtime's own span recorder
(``CpuRuntime.record_spans`` / ``last_run_spans``), for the measured timeline.

``run_spans`` turns the last run's equation spans (indices into the plan's graph, after the
runtime's passes) into spans on two lanes: ``lane`` (one per unit the equations belong to:
``pre``, ``layer i``, ``post``, as ``graphstats`` assigns them by weight names; consecutive
equations of one unit merge into one span) and ``"{lane} ops"`` (one per equation, labelled by
its op kind). The wgpu runtime's spans come from device timestamps around each dispatch; on an
adapter without timestamp queries (``runtime.adapter["timestamp_query"]`` false) the ops lane
holds one ``note`` span saying so (drawn as text, never as a bar); a runtime without
``last_run_spans`` gives none.

Invariant: times are ``t0`` (the caller's clock read just before ``runtime.run``) plus the
offsets the runtime measured from its own run start, so spans may sit a few microseconds late;
the wgpu offsets are from the run's first device timestamp (the device clock has no host
correlation), so its spans keep their measured lengths and gaps but start at ``t0``.
"""

from __future__ import annotations

import re
from typing import Any

from poot.planner.simulate import Span

__all__ = ["equation_units", "run_spans"]

_LAYER = re.compile(r"(?:^|\.)(?:blk|layers|h)\.(\d+)\.")


def equation_units(graph: Any) -> list[str]:
    """Per equation of ``graph``, the unit it belongs to: ``pre`` before the first layer
    weight, ``layer i`` from a weight of layer ``i`` on, ``post`` after the last layer."""
    units: list[str] = []
    current = "pre"
    seen_layer = False
    for op, _ins, attrs, _dt, _shape in graph.equations():
        if op == "weight":
            m = _LAYER.search(str(attrs.get("name", "")))
            if m:
                current, seen_layer = f"layer {m.group(1)}", True
            elif seen_layer:
                current = "post"
        units.append(current)
    return units


def run_spans(runtime: Any, plan: Any, t0: float, lane: str, cache: dict[int, Any]) -> list[Span]:
    """The last run's layer and op spans (see the module docs); ``cache`` keeps each plan's
    equation units (by plan id) across runs."""
    spans_of = getattr(runtime, "last_run_spans", None)
    if spans_of is None:
        return []
    eqs = spans_of()
    if not eqs:
        adapter = getattr(runtime, "adapter", None)
        if isinstance(adapter, dict) and adapter.get("timestamp_query") is False:
            why = "no per-op timer: this device offers no timestamp queries"
            return [Span(f"{lane} ops", why, t0, t0, "note")]
        return []
    units = cache.get(id(plan))
    if units is None:
        units = cache[id(plan)] = equation_units(plan.graph)
    out: list[Span] = []
    layer: list[Any] = []  # [unit, start, end] of the span being merged
    for i, kind, a, b in eqs:
        out.append(Span(f"{lane} ops", kind, t0 + a, t0 + b, "op"))
        unit = units[i] if i < len(units) else "post"
        if layer and layer[0] == unit:
            layer[2] = t0 + b
        else:
            if layer:
                out.append(Span(lane, layer[0], layer[1], layer[2]))
            layer = [unit, t0 + a, t0 + b]
    if layer:
        out.append(Span(lane, layer[0], layer[1], layer[2]))
    return out
