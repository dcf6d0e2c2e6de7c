"""CapacityLedger: the bytes one compiled model's forwards may hold at once.

Three pools (host, device, disk), each with a budget. A forward ``lease``s the incremental bytes
it needs (activations, a streaming buffer slot, a spill file) and returns them when done (the
lease is a context manager). A lease that does not fit *now* waits, bounded by ``wait_s``, for
other forwards to return bytes, then raises ``CapacityError``; one that could never fit (more
than the budget) raises at once, and a pool whose budget is zero refuses every non-zero request
at once: a zero budget fails closed, it never means "unlimited" (that is ``None``).

A compiled model's resident weights hold one standing device lease (``resident``) for its
life, so what forwards lease on top is checked against what is left.

Cancellation is generation-scoped (``Generations``): each forward gets its own generation
number; ``cancel(g)`` marks only ``g`` and ``end(g)`` forgets only ``g``, so one forward finishing
never clears another's cancel.

Invariants: ``used[pool] <= budget[pool]`` always; every byte leased is returned exactly once
(double release is a no-op); leases are all-or-nothing across pools.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from poot.errors import Cancelled, CapacityError

__all__ = ["POOLS", "CapacityLedger", "Generations", "Lease"]

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
    """Budgets per pool (bytes; None = unlimited) and the bytes leased now."""

    def __init__(self, *, host: int | None, device: int | None, disk: int | None) -> None:
        self.budget: dict[str, int | None] = {"host": host, "device": device, "disk": disk}
        self.used = dict.fromkeys(POOLS, 0)
        self.peak = dict.fromkeys(POOLS, 0)
        self.leases = 0
        self.resident: Lease | None = None  # the model's standing lease (resident weights)
        self._cond = threading.Condition()

    def _check(self, pool: str, n: int) -> None:
        limit = self.budget[pool]
        if n < 0:
            raise ValueError(f"a lease of {n} B of {pool} memory is negative")
        if limit is None or n == 0:
            return
        if limit == 0:
            raise CapacityError(
                f"{pool} budget is 0 B (fails closed): requested {n} B, available 0 B",
                pool=pool, requested=n, available=0, limit=0,
            )  # fmt: skip
        if n > limit:
            raise CapacityError(
                f"{pool}: requested {n} B exceeds the budget of {limit} B "
                f"(available {limit - self.used[pool]} B)",
                pool=pool, requested=n, available=limit - self.used[pool], limit=limit,
            )  # fmt: skip

    def _fits(self, amounts: dict[str, int]) -> str | None:
        for pool, n in amounts.items():
            limit = self.budget[pool]
            if limit is not None and n and self.used[pool] + n > limit:
                return pool
        return None

    def lease(self, *, host: int = 0, device: int = 0, disk: int = 0, wait_s: float = 0.0) -> Lease:
        """Takes the bytes, waiting up to ``wait_s`` for them to be free.

        Raises:
            CapacityError: a zero budget, a request over the budget, or no room in ``wait_s``.
        """
        amounts = {"host": host, "device": device, "disk": disk}
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
                        pool=short, requested=amounts[short],
                        available=limit - self.used[short], limit=limit,
                    )  # fmt: skip
                self._cond.wait(left)
            for pool, n in amounts.items():
                self.used[pool] += n
                self.peak[pool] = max(self.peak[pool], self.used[pool])
            self.leases += 1
        return Lease(self, amounts)

    def _give_back(self, amounts: dict[str, int]) -> None:
        with self._cond:
            for pool, n in amounts.items():
                self.used[pool] -= n
            self._cond.notify_all()

    def snapshot(self) -> dict[str, dict[str, int | None]]:
        """Budget, used and peak bytes per pool."""
        with self._cond:
            return {
                p: {"budget": self.budget[p], "used": self.used[p], "peak": self.peak[p]}
                for p in POOLS
            }


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
