"""A runtime wrapped as a Python object that calls a hook before each run (tests only).

``EngineCore`` runs steps through whatever runtime its runner holds; given this wrapper, the
step driver calls ``run`` back in Python for each step, so a test can fail or interrupt a
chosen step's run for real (the driver's error path is the one a native run's error takes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class HookedRuntime:
    """Forwards to ``inner``; ``hook(n)`` runs before the n-th ``run`` (from 1) and may raise."""

    def __init__(self, inner: Any, hook: Callable[[int], None]) -> None:
        self.inner, self.hook, self.calls = inner, hook, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        self.hook(self.calls)
        return self.inner.run(*args, **kw)
