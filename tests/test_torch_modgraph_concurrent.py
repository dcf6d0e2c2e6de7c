"""Independent branches of a ``ModuleGraph`` on different devices run at the same time (issue
34 item 6), proved by event order, not by wall-clock thresholds:

- the scheduler: each branch's start hook waits at a two-party barrier, which only a schedule
  running both branches at once can pass (run one after another, the barrier breaks);
- the native runs: a run blocked inside native code on a late input while this thread runs the
  other runtime to completion and then supplies the input, which a run holding the GIL would
  make impossible (its late wait would time out);
- the join: the joining node starts after both branches' spans end;
- results: a concurrent call equals a sequential one bit for bit.

The runtimes are real (CPU and wgpu on lavapipe); the profiles are synthetic and the placement
pinned, as in tests/test_torch_modgraph_wgpu.py.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tests.torch_support import require_torch, wgpu_runtime

torch = require_torch()

from poot import _native  # noqa: E402
from poot.planner import CompileConfig  # noqa: E402
from tests.planner_fixtures import cpu, lavapipe  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    return wgpu_runtime()


def _towers(wgpu: Any) -> tuple[Any, dict, dict]:
    from tests.test_torch_modgraph import two_tower

    g, inputs, want = two_tower()
    cfg = CompileConfig(force_placement=(("cpu", 0, 1), ("wgpu:0", 1, 3)))
    compiled = g.compile(inputs, cfg, profiles=[cpu(), lavapipe()], runtimes={"wgpu:0": wgpu})
    assert compiled.placed == {"query_tower": "cpu", "doc_tower": "wgpu:0", "score": "wgpu:0"}
    return compiled, inputs, want


def _host(out: dict) -> dict:
    return {k: np.array(v.cpu()) for k, v in out.items()}


def test_branches_on_two_devices_are_in_flight_together_and_the_join_waits(wgpu):
    compiled, inputs, want = _towers(wgpu)
    barrier = threading.Barrier(2, timeout=60)
    started: list[str] = []

    def meet(name: str) -> None:
        started.append(name)
        if name != "score":
            barrier.wait()  # passes only when both towers have started

    compiled.before_node = meet
    got = _host(compiled(**inputs))
    assert started[-1] == "score" and set(started[:2]) == {"query_tower", "doc_tower"}
    spans = {s.label: s for s in compiled.recorder.last() if s.kind == "compute"}
    # The join starts only after both branches ended.
    assert spans["score"].start >= max(spans["query_tower"].end, spans["doc_tower"].end)
    for k in want:
        np.testing.assert_allclose(got[k], want[k].numpy(), rtol=0, atol=2e-5)
    # The same barrier breaks when the nodes run one after another: the proof discriminates.
    compiled.concurrent = False
    compiled.before_node = None
    sequential = _host(compiled(**inputs))
    for k in want:
        assert np.array_equal(sequential[k], got[k]), k  # identical, bit for bit
    alone = threading.Barrier(2, timeout=1)

    def meet_alone(name: str) -> None:
        if name != "score":
            alone.wait()  # the other tower cannot start while this one waits

    compiled.before_node = meet_alone
    with pytest.raises(threading.BrokenBarrierError):
        compiled(**inputs)
    assert compiled.ledger.snapshot()["device"]["used"] == sum(
        p.numel() * 4 for n in compiled.graph.nodes for p in n.module.parameters()
    )  # the failed call returned its leases


def _late_plan(rt: Any, weights: Any) -> Any:
    tr = _native.Tracer(weights, 2, _native.TraceLimits())
    y = tr.matmul(tr.input("x", "f32", [2, 4]), tr.weight("w"))
    tr.output("y", tr.add(y, tr.input("late", "f32", [2, 8])))
    return rt.prepare(tr.finish(), weights)


@pytest.mark.parametrize("waiting", ["wgpu", "cpu"])
def test_a_native_run_releases_the_gil_while_it_waits(wgpu, waiting):
    """``waiting``'s run blocks in native code on a late input; meanwhile this thread runs the
    other runtime and only then fills the input. On wgpu the run is known to be in native code
    (its run counter moved, which happens inside the call before the late wait); on the CPU
    the thread signals just before its call, so the proof could at worst pass vacuously in the
    instant between, never fail spuriously."""
    rng = np.random.default_rng(3)
    w = _native.Weights.from_arrays({"w": rng.standard_normal((8, 4)).astype(np.float32)})
    cpu_rt = _native.CpuRuntime(1)
    rts = {"wgpu": wgpu, "cpu": cpu_rt}
    slow, other = rts[waiting], rts["cpu" if waiting == "wgpu" else "wgpu"]
    plan, other_plan = _late_plan(slow, w), _late_plan(other, w)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    late = rng.standard_normal((2, 8)).astype(np.float32)
    slot, entering = _native.LateInput(), threading.Event()
    result: dict[str, Any] = {}
    runs0 = wgpu.stats()["runs"]

    def run() -> None:
        entering.set()
        try:
            result["y"] = slow.run(plan, {"x": x}, 60.0, {"late": slot})["y"]
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    entering.wait(60)
    if waiting == "wgpu":
        while wgpu.stats()["runs"] == runs0 and t.is_alive():
            entering.wait(0.001)  # a GIL handoff, not a timing condition
    alone = other.run(other_plan, {"x": x, "late": late})["y"]
    slot.fill(late)
    t.join(60)
    assert "error" not in result, result.get("error")
    np.testing.assert_allclose(result["y"], alone, rtol=0, atol=1e-5)
