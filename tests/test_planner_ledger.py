"""CapacityLedger leases and generation-scoped cancellation."""

from __future__ import annotations

import threading

import pytest

from poot.errors import Cancelled, CapacityError
from poot.planner.ledger import CapacityLedger, Generations


def test_lease_and_return() -> None:
    ledger = CapacityLedger(host=100, device=50, disk=None)
    with ledger.lease(host=60, device=50, disk=10**12):
        snap = ledger.snapshot()
        assert snap["host"]["used"] == 60 and snap["device"]["used"] == 50
    snap = ledger.snapshot()
    assert all(v["used"] == 0 for v in snap.values())
    assert snap["device"]["peak"] == 50


class _ObservedCondition(threading.Condition):
    """The ledger's condition, telling the test when a lease starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.waiting.set()
        return super().wait(timeout)


def test_zero_budget_fails_closed_at_once() -> None:
    ledger = CapacityLedger(host=None, device=0, disk=0)
    ledger._cond = cond = _ObservedCondition()
    for pool in ("device", "disk"):
        with pytest.raises(CapacityError) as e:
            ledger.lease(**{pool: 1}, wait_s=5.0)
        assert cond.waits == 0  # refused before any wait, whatever wait_s allows
        assert (e.value.pool, e.value.requested, e.value.available, e.value.limit) == (
            pool,
            1,
            0,
            0,
        )
    with ledger.lease(host=10**9):  # None is unlimited
        pass


def test_over_budget_fails_with_the_numbers() -> None:
    ledger = CapacityLedger(host=100, device=None, disk=None)
    with pytest.raises(CapacityError) as e:
        ledger.lease(host=101)
    assert (e.value.requested, e.value.limit) == (101, 100)
    assert "101" in str(e.value) and "100" in str(e.value)


def test_a_lease_waits_bounded_then_fails() -> None:
    ledger = CapacityLedger(host=100, device=None, disk=None)
    ledger._cond = cond = _ObservedCondition()
    held = ledger.lease(host=80)
    with pytest.raises(CapacityError) as e:
        ledger.lease(host=30, wait_s=0.05)
    assert e.value.available == 20 and "after waiting 0.05 s" in str(e.value)
    cond.waiting.clear()
    got: list[object] = []

    def waiter() -> None:
        got.append(ledger.lease(host=30, wait_s=5.0))

    t = threading.Thread(target=waiter)
    t.start()
    assert cond.waiting.wait(5)  # the waiter is blocked on the ledger, not yet served
    held.release()
    held.release()  # a second release is a no-op
    t.join(5)
    assert got and ledger.snapshot()["host"]["used"] == 30


def test_cancel_is_generation_scoped() -> None:
    gens = Generations()
    a, b = gens.begin(), gens.begin()
    assert gens.cancel(a)
    gens.check(b)
    gens.end(b)  # b finishing does not clear a's cancel
    with pytest.raises(Cancelled) as e:
        gens.check(a)
    assert e.value.generation == a
    gens.end(a)
    assert not gens.cancel(a)  # ended: nothing to cancel
    c = gens.begin()
    gens.check(c)


@pytest.mark.parametrize(
    "kw",
    [{"device_budget_bytes": -1}, {"stall_timeout_s": 0.0}, {"rows": 0}, {"planner_workers": -2}],
)
def test_compile_config_rejects_bad_values(kw: dict[str, float]) -> None:
    from poot.errors import ConfigError
    from poot.planner import CompileConfig

    with pytest.raises(ConfigError):
        CompileConfig(**kw)  # type: ignore[arg-type]


def test_each_device_has_its_own_pool() -> None:
    ledger = CapacityLedger(host=None, device=100, disk=None, devices=("cpu", "wgpu:0"))
    with ledger.lease(devices={"cpu": 100, "wgpu:0": 60}):
        # Each device has the whole per-device budget; the other's use does not count.
        with ledger.lease(device=40, on="wgpu:0"):
            snap = ledger.snapshot()
            assert snap["device:cpu"]["used"] == 100 and snap["device:wgpu:0"]["used"] == 100
            assert snap["device"] == {"budget": 200, "used": 200, "peak": 200}
        with pytest.raises(CapacityError) as e:
            ledger.lease(device=1)  # the first device, cpu, is full
        assert e.value.pool == "device" and "device:cpu" in str(e.value)
        with pytest.raises(ValueError, match="not in this plan"):
            ledger.lease(device=1, on="cuda:0")
    assert all(v["used"] == 0 for v in ledger.snapshot().values())
