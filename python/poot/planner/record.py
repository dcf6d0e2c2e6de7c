"""Spans recorded by the runtime while a step runs (``visualize(measured=True)`` draws them).

A ``Recorder`` keeps the spans of the last ``keep`` steps, times relative to each step's start
(``time.perf_counter``), each step's absolute start, and ledger samples (bytes in use) taken
during it. ``view`` lays the last steps out in sequence with their real gaps. Recording is a
lock and an append per span, cheap enough to stay on.
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
        self.starts: deque[float] = deque(maxlen=keep)
        self.ledgers: deque[list[tuple[float, int]]] = deque(maxlen=keep)
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def _begin(self, held: int | None) -> None:
        self._t0 = time.perf_counter()
        self.steps.append([])
        self.starts.append(self._t0)
        self.ledgers.append([] if held is None else [(0.0, held)])

    def begin_step(self, held: int | None = None) -> None:
        """Starts a new step; later spans are relative to now. ``held``: ledger bytes in use."""
        with self._lock:
            self._begin(held)

    def span(self, lane: str, label: str, start: float, end: float, kind: str = "compute") -> None:
        """Records ``[start, end)`` (``perf_counter`` seconds) on ``lane``."""
        with self._lock:
            if not self.steps:
                self._begin(None)
                self._t0 = start
                self.starts[-1] = start
            self.steps[-1].append(Span(lane, label, start - self._t0, end - self._t0, kind))

    def sample(self, held: int) -> None:
        """Records the ledger's bytes in use now."""
        with self._lock:
            if self.ledgers:
                self.ledgers[-1].append((time.perf_counter() - self._t0, held))

    def last(self) -> list[Span]:
        """The spans of the last step with any (oldest first within it)."""
        with self._lock:
            for step in reversed(self.steps):
                if step:
                    return list(step)
            return []

    def view(
        self, steps: int = 8
    ) -> tuple[list[Span], list[tuple[float, int]], list[tuple[str, float]]]:
        """The last ``steps`` steps with spans, in sequence from the first one's start: their
        spans, ledger samples and (label, start) marks."""
        with self._lock:
            kept = [
                (s, t, led)
                for s, t, led in zip(self.steps, self.starts, self.ledgers, strict=True)
                if s
            ][-steps:]
        if not kept:
            return [], [], []
        first = kept[0][1]
        spans: list[Span] = []
        ledger: list[tuple[float, int]] = []
        marks: list[tuple[str, float]] = []
        for i, (step, start, led) in enumerate(kept):
            off = start - first
            marks.append((f"step {i + 1}", off))
            spans += [Span(s.lane, s.label, s.start + off, s.end + off, s.kind) for s in step]
            ledger += [(t + off, b) for t, b in led]
        return spans, ledger, marks
