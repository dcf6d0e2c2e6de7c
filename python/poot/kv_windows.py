"""Which KV layout a model's sliding windows call for: ``kv_window`` (every layer windowed:
blocks behind the window go back to the pool) or ``kv_group_window`` (windowed layers
interleaved with global ones: the windowed layers' KV runs as a group of its own), and what
the pool must hold per sequence under each (``KvWindows``). Read from the model definition's
``hparams.layer_windows`` (0 or less: a global layer).

Invariant: ``window_span_blocks`` is ``poot_engine``'s bound (``groups::window_span_blocks``):
the most blocks a windowed table holds at once, so pools sized here admit what the scheduler
admits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KvWindows", "kv_group_window", "kv_window", "kv_windows", "window_span_blocks"]


def _windows(definition: Any) -> tuple[int, ...]:
    h = getattr(definition, "hparams", None)
    return tuple(getattr(h, "layer_windows", ()) or ())


def kv_window(definition: Any) -> int | None:
    """The scheduler's ``kv_window``: the largest window when every layer attends to a sliding
    window (Mistral v0.1's layout), so blocks behind it can go back to the pool; None when any
    layer is global (Gemma's interleaving: one block table serves every layer) or the family
    has no windows."""
    windows = _windows(definition)
    if not windows or any(w <= 0 for w in windows):
        return None
    return max(windows)


def kv_group_window(definition: Any) -> int | None:
    """The scheduler's ``window_group``: the largest window when windowed layers are
    interleaved with global ones (Gemma 2 and 3), so the windowed layers' KV runs as a group
    of its own whose blocks behind the window go back to the pool; None otherwise."""
    windows = _windows(definition)
    if not any(w > 0 for w in windows) or all(w > 0 for w in windows):
        return None
    return max(windows)


def window_span_blocks(window: int, step_tokens: int, block_size: int) -> int:
    """Most blocks a request holds at once in a table that reads a window of ``window``
    positions: the window behind a step's first token, the step's tokens, and a block of
    rounding at each end."""
    return -(-(window - 1 + step_tokens) // block_size) + 1


@dataclass(frozen=True)
class KvWindows:
    """How a model's sliding windows shrink its KV pool.

    Attributes:
        window: the largest window (positions).
        windowed_layers: layers that read a window.
        grouped: the windowed layers are interleaved with global ones and keep their KV in a
            pool of their own (``window_group``); False: every layer is windowed
            (``kv_window``) and the one pool holds only each request's window.
    """

    window: int
    windowed_layers: int
    grouped: bool

    def span_blocks(self, step_tokens: int, block_size: int) -> int:
        """Blocks one request holds at most in a windowed table."""
        return window_span_blocks(self.window, step_tokens, block_size)


def kv_windows(definition: Any) -> KvWindows | None:
    """The definition's ``KvWindows``; None when no layer is windowed."""
    windows = _windows(definition)
    n = sum(1 for w in windows if w > 0)
    if n == 0:
        return None
    return KvWindows(max(windows), n, grouped=n < len(windows))
