"""The wgpu per-op timer (issue 34 item 9): device timestamps around every compute pass give
the last run's per-equation spans (``WgpuRuntime.last_run_spans``, the CPU runtime's shape),
which fill a module graph's ``"wgpu:0 ops"`` lane; a device without timestamp queries (raw
Vulkan here) leaves that lane empty with a label saying so, never invented numbers. Rendered in
headless Chromium as tests/test_timeline_lanes.py does. lavapipe offers ``timestamp-query``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from poot import _native
from tests.test_planner_timeline import _chromium, _no_fetches
from tests.test_timeline_lanes import _labels, _lanes

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu() -> Any:
    from wgpu_util import require_wgpu

    require_wgpu()
    return _native.WgpuRuntime(timeout_s=60.0)


def _plan(rt: Any) -> tuple[Any, dict[str, np.ndarray]]:
    w = _native.Weights.from_arrays({"w": np.ones((8, 4), np.float32)})
    tr = _native.Tracer(w, 2, _native.TraceLimits())
    tr.output("y", tr.silu(tr.matmul(tr.input("x", "f32", [2, 4]), tr.weight("w"))))
    return rt.prepare(tr.finish(), w), {"x": np.ones((2, 4), np.float32)}


def test_each_dispatch_is_timed_by_the_device() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()
    rt = _native.WgpuRuntime(timeout_s=60.0)  # its own: the timer is per runtime
    assert rt.adapter["timestamp_query"] is True
    plan, x = _plan(rt)
    rt.run(plan, x)
    assert rt.last_run_spans() == []  # off by default
    rt.record_spans(True)
    read0 = rt.stats()["readback_bytes"]
    rt.run(plan, x)
    assert rt.stats()["readback_bytes"] == read0 + 2 * 8 * 4  # the output only
    spans = rt.last_run_spans()
    names = [eq[0] for eq in plan.graph.equations()]
    # Inputs and weights dispatch nothing; the matmul and the SiLU each run on the device.
    assert [k for _, k, _, _ in spans] == ["matmul F32", "silu"]
    for i, kind, start, end in spans:
        assert 0 <= start <= end and kind.startswith(names[i])
    assert spans[0][2] == 0.0  # from the run's first timestamp
    starts = [s for _, _, s, _ in spans]
    assert starts == sorted(starts)
    rt.run_on_device(plan, x)  # a resident run is timed the same way
    assert [k for _, k, _, _ in rt.last_run_spans()] == ["matmul F32", "silu"]
    rt.record_spans(False)
    assert rt.last_run_spans() == []


def _graph(runtime: Any) -> Any:
    from poot.planner import CompileConfig
    from tests.planner_fixtures import cpu, lavapipe
    from tests.test_torch_modgraph import two_tower
    from tests.torch_support import require_torch

    require_torch()
    g, inputs, _ = two_tower()
    cfg = CompileConfig(force_placement=(("cpu", 0, 1), ("wgpu:0", 1, 3)))
    compiled = g.compile(inputs, cfg, profiles=[cpu(), lavapipe()], runtimes={"wgpu:0": runtime})
    compiled(**inputs)
    compiled(**inputs)
    return compiled


def test_a_module_graph_draws_wgpu_ops_from_timestamps(wgpu: Any, tmp_path: Path) -> None:
    compiled = _graph(wgpu)
    path = compiled.visualize(tmp_path / "m.html", measured=True)
    page = path.read_text()
    _no_fetches(page)
    assert {"cpu", "cpu ops", "wgpu:0", "wgpu:0 ops", "ledger"} <= _lanes(page)
    ops = _labels(page, "wgpu:0 ops")
    assert any(k.startswith("matmul") for k in ops) and "silu" in ops
    assert _labels(page, "wgpu:0") == ["doc_tower", "score"] * 2
    sim = compiled.visualize(tmp_path / "s.html").read_text()
    assert "wgpu:0 ops" in _lanes(sim)  # the simulated view draws the same lane
    browser = _chromium()
    dom = subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom", path.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert 'data-rendered="yes"' in dom
    assert re.search(r'<rect class="span op"[^>]*data-lane="wgpu:0 ops"', dom)


def test_a_device_without_timestamps_says_so_in_an_empty_lane(tmp_path: Path) -> None:
    from poot.errors import BackendNotCompiledError, DeviceUnavailableError

    try:
        raw = _native.WgpuRuntime(timeout_s=60.0, api="vulkan")
    except (BackendNotCompiledError, DeviceUnavailableError) as e:
        if os.environ.get("POOT_REQUIRE_WGPU") == "1":
            pytest.fail(f"POOT_REQUIRE_WGPU=1 but no raw Vulkan device: {e}")
        pytest.skip(f"no raw Vulkan device (its runtime has no timestamps to test): {e}")
    assert raw.adapter["timestamp_query"] is False
    compiled = _graph(raw)
    page = compiled.visualize(tmp_path / "m.html", measured=True).read_text()
    assert "wgpu:0 ops" in _lanes(page)
    assert _labels(page, "wgpu:0 ops") == []  # no bars: nothing was measured
    assert re.search(
        r'<text class="note"[^>]*data-lane="wgpu:0 ops">no per-op timer: this device offers '
        r"no timestamp queries</text>",
        page,
    )
