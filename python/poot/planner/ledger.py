"""CapacityLedger: the bytes one compiled model's forwards may hold at once.

Pools: host, disk and one per device of the plan (``"device:cpu"``, ``"device:wgpu:0"``), each
with a budget (every device gets the per-device budget). A forward ``lease``s the incremental bytes
it needs (activations, a streaming buffer slot, a spill file) and returns them when done (the
lease is a context manager). A lease that does not fit *now* waits, bounded by ``wait_s``, for
other forwards to return bytes, then raises ``CapacityError``; one that could never fit (more
than the budget) raises at once, and a pool whose budget is zero refuses every non-zero request
at once: a zero budget fails closed, it never means "unlimited" (that is ``None``).

A compiled model's resident weights and each device's KV pool hold one standing lease
(``resident``) for its life, so what forwards lease on top is checked against what is left.
``snapshot()["device"]`` sums the device pools (budget, used, peak of the sum).

Cancellation is generation-scoped (``Generations``): each forward gets its own generation
number; ``cancel(g)`` marks only ``g`` and ``end(g)`` forgets only ``g``, so one forward finishing
never clears another's cancel.

Invariants: ``used[pool] <= budget[pool]`` always, per device; every byte leased is returned
exactly once (double release is a no-op); leases are all-or-nothing across pools.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from poot.errors import Cancelled, CapacityError

__all__ = ["POOLS", "CapacityLedger", "Generations", "Lease"]

# The kinds of pool (``CapacityError.pool``); each device of a plan has its own device pool.
POOLS = ("host", "device", "disk")


@dataclass
class Lease:
    """Bytes held from a ledger; returned on ``release`` or on leaving the ``with`` block."""

    ledger: CapacityLedger
    amounts: dict[str, int]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.ledger._give_back(self.amounts)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class CapacityLedger:
    """Budgets per pool (bytes; None = unlimited) and the bytes leased now.

    Args:
        host, disk: the host and spill budgets.
        device: the budget of each device in ``devices``.
        devices: the plan's device keys; a lease's ``device`` bytes go to the first unless it
            names another (``on``).
    """

    def __init__(
        self,
        *,
        host: int | None,
        device: int | None,
        disk: int | None,
        devices: Sequence[str] = ("cpu",),
    ) -> None:
        self.devices = tuple(devices) or ("cpu",)
        self.budget: dict[str, int | None] = {"host": host, "disk": disk}
        self.budget.update({_pool(d): device for d in self.devices})
        self.used = dict.fromkeys(self.budget, 0)
        self.peak = dict.fromkeys(self.budget, 0)
        self.device_peak = 0
        self.leases = 0
        self.resident: Lease | None = None  # the model's standing lease (weights and KV)
        self._cond = threading.Condition()

    def _check(self, pool: str, n: int) -> None:
        limit = self.budget[pool]
        kind = pool.split(":")[0]
        if n < 0:
            raise ValueError(f"a lease of {n} B of {pool} memory is negative")
        if limit is None or n == 0:
            return
        if limit == 0:
            raise CapacityError(
                f"{pool} budget is 0 B (fails closed): requested {n} B, available 0 B",
                pool=kind, requested=n, available=0, limit=0,
            )  # fmt: skip
        if n > limit:
            raise CapacityError(
                f"{pool}: requested {n} B exceeds the budget of {limit} B "
                f"(available {limit - self.used[pool]} B)",
                pool=kind, requested=n, available=limit - self.used[pool], limit=limit,
            )  # fmt: skip

    def _fits(self, amounts: dict[str, int]) -> str | None:
        for pool, n in amounts.items():
            limit = self.budget[pool]
            if limit is not None and n and self.used[pool] + n > limit:
                return pool
        return None

    def lease(
        self,
        *,
        host: int = 0,
        device: int = 0,
        disk: int = 0,
        on: str | None = None,
        devices: Mapping[str, int] | None = None,
        wait_s: float = 0.0,
    ) -> Lease:
        """Takes the bytes (all or nothing), waiting up to ``wait_s`` for them to be free.

        Args:
            host, disk: bytes of those pools.
            device: bytes of device ``on`` (default: the plan's first device).
            devices: more device bytes, per device key.
            wait_s: how long to wait for bytes others hold.

        Raises:
            CapacityError: a zero budget, a request over the budget, or no room in ``wait_s``.
            ValueError: a device that is not in the plan.
        """
        amounts = {"host": host, "disk": disk}
        per = dict(devices or {})
        if device:
            key = on or self.devices[0]
            per[key] = per.get(key, 0) + device
        for key, n in per.items():
            if _pool(key) not in self.budget:
                raise ValueError(f"device {key!r} is not in this plan ({', '.join(self.devices)})")
            amounts[_pool(key)] = n
        for pool, n in amounts.items():
            self._check(pool, n)
        deadline = time.monotonic() + wait_s
        with self._cond:
            while (short := self._fits(amounts)) is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    limit = self.budget[short] or 0
                    raise CapacityError(
                        f"{short}: requested {amounts[short]} B, available "
                        f"{limit - self.used[short]} B of {limit} B after waiting {wait_s:g} s",
                        pool=short.split(":")[0], requested=amounts[short],
                        available=limit - self.used[short], limit=limit,
                    )  # fmt: skip
                self._cond.wait(left)
            for pool, n in amounts.items():
                self.used[pool] += n
                self.peak[pool] = max(self.peak[pool], self.used[pool])
            self.device_peak = max(self.device_peak, self._device_used())
            self.leases += 1
        return Lease(self, amounts)

    def _device_used(self) -> int:
        return sum(n for p, n in self.used.items() if p.startswith("device:"))

    def _give_back(self, amounts: dict[str, int]) -> None:
        with self._cond:
            for pool, n in amounts.items():
                self.used[pool] -= n
            self._cond.notify_all()

    def snapshot(self) -> dict[str, dict[str, int | None]]:
        """Budget, used and peak bytes per pool, and ``"device"``: the device pools summed."""
        with self._cond:
            snap: dict[str, dict[str, int | None]] = {
                p: {"budget": self.budget[p], "used": self.used[p], "peak": self.peak[p]}
                for p in self.budget
            }
            budgets = [self.budget[_pool(d)] for d in self.devices]
            total = None if any(b is None for b in budgets) else sum(b or 0 for b in budgets)
            snap["device"] = {
                "budget": total, "used": self._device_used(), "peak": self.device_peak
            }  # fmt: skip
            return snap


def _pool(device: str) -> str:
    return f"device:{device}"


class Generations:
    """Generation-scoped cancellation: each forward checks only its own generation."""

    def __init__(self) -> None:
        self._next = itertools.count(1)
        self._cancelled: set[int] = set()
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def begin(self) -> int:
        """A new generation for one forward."""
        with self._lock:
            g = next(self._next)
            self._live.add(g)
            return g

    def cancel(self, generation: int) -> bool:
        """Cancels ``generation`` if it is live; returns whether it was."""
        with self._lock:
            if generation in self._live:
                self._cancelled.add(generation)
                return True
            return False

    def check(self, generation: int) -> None:
        """Raises ``Cancelled`` if ``generation`` was cancelled."""
        with self._lock:
            if generation in self._cancelled:
                raise Cancelled(f"forward {generation} was cancelled", generation=generation)

    def is_cancelled(self, generation: int) -> bool:
        with self._lock:
            return generation in self._cancelled

    def end(self, generation: int) -> None:
        """Forgets ``generation`` (only it): its cancel mark and its liveness."""
        with self._lock:
            self._live.discard(generation)
            self._cancelled.discard(generation)
