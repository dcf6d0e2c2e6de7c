"""Which KV layout a model's sliding windows call for: ``kv_window`` (every layer windowed:
blocks behind the window go back to the pool) or ``kv_group_window`` (windowed layers
interleaved with global ones: the windowed layers' KV runs as a group of its own). Read from
the model definition's ``hparams.layer_windows`` (0 or less: a global layer)."""

from __future__ import annotations

from typing import Any

__all__ = ["kv_group_window", "kv_window"]


def kv_window(definition: Any) -> int | None:
    """The scheduler's ``kv_window``: the largest window when every layer attends to a sliding
    window (Mistral v0.1's layout), so blocks behind it can go back to the pool; None when any
    layer is global (Gemma's interleaving: one block table serves every layer) or the family
    has no windows."""
    h = getattr(definition, "hparams", None)
    windows = tuple(getattr(h, "layer_windows", ()) or ())
    if not windows or any(w <= 0 for w in windows):
        return None
    return max(windows)


def kv_group_window(definition: Any) -> int | None:
    """The scheduler's ``window_group``: the largest window when windowed layers are
    interleaved with global ones (Gemma 2 and 3), so the windowed layers' KV runs as a group
    of its own whose blocks behind the window go back to the pool; None otherwise."""
    h = getattr(definition, "hparams", None)
    windows = tuple(getattr(h, "layer_windows", ()) or ())
    if not any(w > 0 for w in windows) or all(w > 0 for w in windows):
        return None
    return max(windows)
