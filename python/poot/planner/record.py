"""Spans recorded by the runtime while a step runs (``visualize(measured=True)`` draws them).

A ``Recorder`` keeps the spans of the last ``keep`` steps, times relative to each step's start
(``time.perf_counter``). Recording is a lock and an append per span, cheap enough to stay on.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from poot.planner.simulate import Span

__all__ = ["Recorder"]


class Recorder:
    """Spans per step, the last ``keep`` steps."""

    def __init__(self, keep: int = 8) -> None:
        self.steps: deque[list[Span]] = deque(maxlen=keep)
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def begin_step(self) -> None:
        """Starts a new step; later spans are relative to now."""
        with self._lock:
            self._t0 = time.perf_counter()
            self.steps.append([])

    def span(self, lane: str, label: str, start: float, end: float, kind: str = "compute") -> None:
        """Records ``[start, end)`` (``perf_counter`` seconds) on ``lane``."""
        with self._lock:
            if not self.steps:
                self.steps.append([])
            self.steps[-1].append(Span(lane, label, start - self._t0, end - self._t0, kind))

    def last(self) -> list[Span]:
        """The spans of the last step with any (oldest first within it)."""
        with self._lock:
            for step in reversed(self.steps):
                if step:
                    return list(step)
            return []
