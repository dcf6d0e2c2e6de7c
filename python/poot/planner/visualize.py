"""``CompiledModel.visualize()``: one step as a self-contained HTML timeline.

The page is a single file: inline CSS, an inline SVG drawn at write time (so it shows without
JavaScript) and a small inline script for hover details. It fetches nothing (no external
scripts, styles, fonts or images). One lane per device or link; one rectangle per span, colored by
kind (compute, load, transfer). ``measured=True`` draws the spans the runtime recorded for the
last step (``Recorder``); otherwise the simulated spans of the chosen plan.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from poot.planner.simulate import Span

if TYPE_CHECKING:
    from poot.planner.compiled import CompiledModel

__all__ = ["render_timeline", "write_timeline"]

_COLORS = {"compute": "#4e79a7", "load": "#f28e2b", "transfer": "#59a14f"}
_LANE_H, _LEFT, _WIDTH = 28, 160, 900


def render_timeline(title: str, spans: list[Span], subtitle: str = "") -> str:
    """The HTML page for ``spans``."""
    lanes = list(dict.fromkeys(s.lane for s in spans))
    end = max((s.end for s in spans), default=0.0) or 1e-9
    scale = _WIDTH / end
    height = 40 + _LANE_H * max(1, len(lanes))
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
        x = _LEFT + s.start * scale
        w = max(1.0, (s.end - s.start) * scale)
        ms = f"{s.label}: {s.start * 1e3:.3f}-{s.end * 1e3:.3f} ms"
        parts.append(
            f'<rect class="span {s.kind}" x="{x:.2f}" y="{y + 3}" width="{w:.2f}" '
            f'height="{_LANE_H - 8}" fill="{_COLORS.get(s.kind, "#999")}" '
            f'data-lane="{html.escape(s.lane)}" data-label="{html.escape(s.label)}">'
            f"<title>{html.escape(ms)}</title></rect>"
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
    data = json.dumps({"lanes": lanes, "spans": len(spans), "step_ms": end * 1e3})
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


def write_timeline(compiled: CompiledModel, path: Path, *, measured: bool) -> Path:
    """Writes the timeline of ``compiled`` to ``path``."""
    if measured:
        spans = compiled.recorder.last()
        if not spans:
            raise ValueError("no measured step yet: run a forward before visualize(measured=True)")
        kind = "measured"
    else:
        spans = compiled.simulation.spans
        kind = "simulated"
    title = f"poot step timeline ({kind})"
    sub = f"{compiled.files.path}: {compiled.placement.describe(compiled.stats)}"
    path.write_text(render_timeline(title, spans, sub))
    return path
