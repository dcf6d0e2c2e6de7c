"""``CancelToken``: generation-scoped cancellation for ``CompiledModule.forward_with_cancel_token``.

A token holds one counter, its generation. ``cancel()`` bumps it; a forward records the
generation it started at and is cancelled exactly when the token's generation has moved past
that (``Admission.cancelled``). Invariants that follow:

- a forward observes only cancels issued after it started: a cancel issued before it (or after
  an earlier forward finished) is history, never a sticky flag, so nothing has to be cleared
  and no forward can clear another's pending cancel;
- a cancel reaches every forward in flight on that token (one token cancels what it was given
  to); forwards on other tokens are untouched, so callers who want to cancel forwards one by
  one give each its own token;
- reading and bumping the generation is atomic (one lock), so a cancel concurrent with a
  forward's start lands on one side of it, never half.

Granularity (the runtimes have no in-run cancel hook today): a compiled module's plan runs as
one ``runtime.run`` call, which is not interrupted. The token is checked before the run starts
and again when it returns; a cancel that lands during the run discards its outputs and the
forward raises ``Cancelled``, without waiting for anything else.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from poot.errors import Cancelled


class CancelToken:
    """Cancels the forwards started with it before each ``cancel()`` (see the module docs)."""

    def __init__(self) -> None:
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        """How many times ``cancel()`` was called."""
        with self._lock:
            return self._generation

    def cancel(self) -> int:
        """Cancels every forward in flight on this token; returns the new generation."""
        with self._lock:
            self._generation += 1
            return self._generation

    def admit(self) -> Admission:
        """Starts one forward: it will observe only cancels issued from now on."""
        with self._lock:
            return Admission(self, self._generation)

    def __repr__(self) -> str:
        return f"CancelToken(generation={self.generation})"


@dataclass(frozen=True)
class Admission:
    """One forward's view of its token: the generation it started at."""

    token: CancelToken
    generation: int

    @property
    def cancelled(self) -> bool:
        return self.token.generation != self.generation

    def check(self, where: str) -> None:
        """Raises ``Cancelled`` if the token was cancelled since this forward started."""
        now = self.token.generation
        if now != self.generation:
            raise Cancelled(
                f"forward started at generation {self.generation} was cancelled {where} "
                f"(token now at generation {now})",
                generation=self.generation,
            )
