"""``schedule.run_nodes`` (how a ``CompiledGraph`` runs its nodes) on plain callables: nodes
of different devices run at once, a device runs its own nodes one at a time in order, a node
waits for its dependencies, and a failure fails its dependents only and is raised after every
node settled. Proofs by event order (a barrier that only concurrent nodes pass), no timing.
"""

from __future__ import annotations

import threading

import pytest

from poot.torch_frontend.node_runs import run_nodes


def test_nodes_of_two_devices_run_at_once_and_a_join_waits_for_both() -> None:
    barrier = threading.Barrier(2, timeout=30)
    log: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        with lock:
            log.append(f"start {i}")
        if i in (0, 1):
            barrier.wait()  # both branches must be in flight together
        with lock:
            log.append(f"end {i}")

    run_nodes(["cpu", "wgpu:0", "wgpu:0"], [set(), set(), {0, 1}], run)
    assert log.index("start 2") > max(log.index("end 0"), log.index("end 1"))


def test_one_device_runs_its_nodes_in_order_on_the_callers_thread() -> None:
    seen: list[tuple[int, str]] = []
    run_nodes(
        ["cpu"] * 3,
        [set(), {0}, set()],
        lambda i: seen.append((i, threading.current_thread().name)),
    )
    assert seen == [(i, threading.current_thread().name) for i in range(3)]


def test_sequential_mode_never_overlaps() -> None:
    barrier = threading.Barrier(2, timeout=0.5)

    def run(i: int) -> None:
        if i < 2:
            barrier.wait()

    with pytest.raises(threading.BrokenBarrierError):
        run_nodes(["cpu", "wgpu:0"], [set(), set()], run, concurrent=False)


def test_a_failure_fails_its_dependents_only_and_the_first_is_raised() -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        if i == 1:
            raise KeyError("node 1 broke")
        with lock:
            ran.append(i)

    # 0 (cpu) and 1 (wgpu) are independent, 2 (cpu) reads 1, 3 (wgpu) reads 0.
    with pytest.raises(KeyError, match="node 1 broke"):
        run_nodes(["cpu", "wgpu:0", "cpu", "wgpu:0"], [set(), set(), {1}, {0}], run)
    assert sorted(ran) == [0, 3]
