"""``CompiledModel.visualize()``: one step as a self-contained HTML timeline.

The page is a single file: inline CSS, an inline SVG drawn at write time (so it shows without
JavaScript) and a small inline script for hover details. It fetches nothing (no external
scripts, styles, fonts or images). One lane per device or link; one rectangle per span, colored by
kind (compute, load, transfer; ``op`` spans, one per equation or op kind, colored by their
label). ``measured=True`` draws the spans the runtime recorded for the last step
(``Recorder``); otherwise the simulated spans of the chosen plan. ``render_timeline`` also
draws, when given, step boundaries (several steps in sequence) and a ledger lane: the bytes in
use over time as a step line.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from poot.planner.cost import unit_compute_s
from poot.planner.graphstats import ModelStats
from poot.planner.profiles import DeviceProfile
from poot.planner.simulate import SimResult, Span

if TYPE_CHECKING:
    from poot.planner.compiled import CompiledModel

__all__ = ["render_timeline", "simulated_view", "write_timeline"]

_COLORS = {"compute": "#4e79a7", "load": "#f28e2b", "transfer": "#59a14f"}
# Op spans: a color per label (op kind), stable across pages.
_OP_COLORS = ("#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#e15759")
_LANE_H, _LEFT, _WIDTH = 28, 160, 900
_LEDGER_H = 60


def _color(s: Span) -> str:
    if s.kind == "op":
        return _OP_COLORS[sum(map(ord, s.label)) % len(_OP_COLORS)]
    return _COLORS.get(s.kind, "#999")


def render_timeline(
    title: str,
    spans: list[Span],
    subtitle: str = "",
    *,
    ledger: list[tuple[float, int]] | None = None,
    steps: list[tuple[str, float]] | None = None,
) -> str:
    """The HTML page for ``spans``; ``ledger`` is (seconds, bytes in use) samples, ``steps``
    is (label, start seconds) of each step drawn."""
    lanes = list(dict.fromkeys(s.lane for s in spans))
    ledger = ledger or []
    steps = steps or []
    end = max([s.end for s in spans] + [t for t, _ in ledger], default=0.0) or 1e-9
    scale = _WIDTH / end
    base = 20 + _LANE_H * max(1, len(lanes))
    height = base + 20 + (_LEDGER_H + 10 if ledger else 0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _WIDTH + 20}" '
        f'height="{height}" id="timeline">'
    ]
    for i, lane in enumerate(lanes):
        y = 20 + i * _LANE_H
        parts.append(
            f'<text class="lane" x="4" y="{y + 18}" data-lane="{html.escape(lane)}">'
            f"{html.escape(lane)}</text>"
            f'<line x1="{_LEFT}" x2="{_LEFT + _WIDTH}" y1="{y + _LANE_H - 2}" '
            f'y2="{y + _LANE_H - 2}" stroke="#ddd"/>'
        )
    for s in spans:
        y = 20 + lanes.index(s.lane) * _LANE_H
        if s.kind == "note":  # a lane with nothing measured on it says why, with no bar
            parts.append(
                f'<text class="note" x="{_LEFT + 4}" y="{y + 18}" font-size="11" fill="#666" '
                f'data-lane="{html.escape(s.lane)}">{html.escape(s.label)}</text>'
            )
            continue
        x = _LEFT + s.start * scale
        w = max(1.0, (s.end - s.start) * scale)
        ms = f"{s.label}: {s.start * 1e3:.3f}-{s.end * 1e3:.3f} ms"
        parts.append(
            f'<rect class="span {s.kind}" x="{x:.2f}" y="{y + 3}" width="{w:.2f}" '
            f'height="{_LANE_H - 8}" fill="{_color(s)}" '
            f'data-lane="{html.escape(s.lane)}" data-label="{html.escape(s.label)}">'
            f"<title>{html.escape(ms)}</title></rect>"
        )
    for label, t in steps:
        x = _LEFT + t * scale
        parts.append(
            f'<line class="step" x1="{x:.2f}" x2="{x:.2f}" y1="14" y2="{base}" stroke="#888" '
            f'stroke-dasharray="3,3" data-label="{html.escape(label)}"/>'
            f'<text x="{x + 2:.2f}" y="12" font-size="10">{html.escape(label)}</text>'
        )
    peak = max((b for _, b in ledger), default=0)
    if ledger:
        top = base + 10
        parts.append(
            f'<text class="lane" x="4" y="{top + _LEDGER_H // 2}" data-lane="ledger">'
            f"ledger bytes (peak {peak / (1 << 20):.2f} MiB)</text>"
        )
        pts: list[str] = []
        prev: float = top + _LEDGER_H
        for t, b in ledger:
            lx = _LEFT + t * scale
            ly = top + _LEDGER_H - (b / peak if peak else 0) * _LEDGER_H
            pts += [f"{lx:.2f},{prev:.2f}", f"{lx:.2f},{ly:.2f}"]  # a step line
            prev = ly
        parts.append(
            f'<polyline class="ledger" fill="none" stroke="#e15759" stroke-width="1.5" '
            f'points="{" ".join(pts)}"/>'
        )
    parts.append(
        f'<text x="{_LEFT}" y="{height - 4}" font-size="11">0 ms</text>'
        f'<text x="{_LEFT + _WIDTH - 60}" y="{height - 4}" font-size="11">{end * 1e3:.3f} ms</text>'
        "</svg>"
    )
    table = "".join(
        f"<tr><td>{html.escape(s.lane)}</td><td>{html.escape(s.label)}</td><td>{s.kind}</td>"
        f"<td>{s.start * 1e3:.3f}</td><td>{s.end * 1e3:.3f}</td></tr>"
        for s in spans
    )
    data = json.dumps({
        "lanes": lanes, "spans": len(spans), "step_ms": end * 1e3, "steps": len(steps),
        "ledger_samples": len(ledger), "ledger_peak_bytes": peak,
    })  # fmt: skip
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font: 13px sans-serif; margin: 16px; }}
.lane {{ font-size: 12px; }}
rect.span:hover {{ stroke: #000; }}
#detail {{ min-height: 1.4em; color: #333; }}
table {{ border-collapse: collapse; margin-top: 12px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p id="subtitle">{html.escape(subtitle)}</p>
<p id="summary">{len(lanes)} lanes, {len(spans)} spans, step {end * 1e3:.3f} ms</p>
<div id="detail"></div>
{"".join(parts)}
<table id="spans"><tr><th>lane</th><th>span</th><th>kind</th><th>start ms</th><th>end ms</th></tr>
{table}</table>
<script id="timeline-data" type="application/json">{data}</script>
<script>
document.querySelectorAll("rect.span").forEach(function (r) {{
  r.addEventListener("mouseover", function () {{
    document.getElementById("detail").textContent = r.querySelector("title").textContent;
  }});
}});
document.body.dataset.rendered = "yes";
</script>
</body></html>
"""


View = tuple[list[Span], list[tuple[float, int]], list[tuple[str, float]]]


def simulated_view(
    stats: ModelStats, sim: SimResult, profiles: dict[str, DeviceProfile], held: int, steps: int
) -> View:
    """The simulated step ``steps`` times in sequence, with the measured view's lanes: each
    unit's compute span split on ``"{device} ops"`` into its matmul and other-op parts (as
    ``cost.unit_compute_s`` prices them), and the ledger: ``held`` bytes plus one activation
    per unit computed in the step."""
    units = {u.name: u for u in stats.units}
    spans: list[Span] = []
    ledger: list[tuple[float, int]] = []
    marks: list[tuple[str, float]] = []
    step = sim.total_s or 1e-9
    for k in range(max(1, steps)):
        off = k * step
        marks.append((f"step {k + 1}", off))
        ledger.append((off, held))
        leased = 0
        for s in sorted(sim.spans, key=lambda x: x.start):
            spans.append(Span(s.lane, s.label, s.start + off, s.end + off, s.kind))
            u, p = units.get(s.label), profiles.get(s.lane)
            if u is None or p is None or s.kind != "compute":
                continue
            mm, other = unit_compute_s(u, p)
            cut = s.start + off + (s.end - s.start) * (mm / (mm + other) if mm + other else 0)
            if mm > 0:
                spans.append(Span(f"{s.lane} ops", "matmul", s.start + off, cut, "op"))
            if other > 0:
                spans.append(Span(f"{s.lane} ops", "other ops", cut, s.end + off, "op"))
            leased += stats.activation_bytes
            ledger.append((s.end + off, held + leased))
        ledger.append((off + step, held))
    return spans, ledger, marks


def write_timeline(compiled: CompiledModel, path: Path, *, measured: bool) -> Path:
    """Writes the timeline of ``compiled`` to ``path``: the last recorded steps, or as many
    simulated steps (one when none ran)."""
    from poot.planner.compiled import standing_bytes

    recorded = compiled.recorder.view()
    if measured:
        spans, ledger, marks = recorded
        if not spans:
            raise ValueError("no measured step yet: run a forward before visualize(measured=True)")
        kind = "measured"
    else:
        held = sum(standing_bytes(compiled.stats, compiled.placement).values())
        spans, ledger, marks = simulated_view(
            compiled.stats, compiled.simulation, compiled.profiles, held, len(recorded[2])
        )
        kind = "simulated"
    title = f"poot step timeline ({kind})"
    sub = f"{compiled.files.path}: {compiled.placement.describe(compiled.stats)}"
    path.write_text(render_timeline(title, spans, sub, ledger=ledger, steps=marks))
    return path
