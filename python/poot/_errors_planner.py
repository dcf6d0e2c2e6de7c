"""The planner's errors (``poot.planner``), re-exported by ``poot.errors``, where callers and
the native module find them; import them from there. This module is only imported by
``poot.errors`` (importing it first would meet ``poot.errors`` half-initialised).
"""

from __future__ import annotations

from poot.errors import PootError


class PlannerError(PootError, RuntimeError):
    """The planner found no placement that satisfies the config and the budgets.

    Attributes:
        reasons: per device key, why it was dropped.
    """

    hint = (
        "Raise the budgets (CompileConfig), allow more devices, or run `poot validate-hardware`;"
        " `reasons` says why each device was dropped."
    )

    def __init__(self, message: str, *, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.reasons = dict(reasons or {})


class CapacityError(PootError, MemoryError):
    """A forward could not lease the bytes it needs from its model's ``CapacityLedger``.

    Attributes:
        pool: ``"host"``, ``"device"`` or ``"disk"``.
        requested: bytes the forward asked for.
        available: bytes free in the pool when it gave up.
        limit: the pool's budget.
    """

    hint = "Raise the CompileConfig budget of `pool`, or run fewer forwards at once."

    def __init__(
        self,
        message: str,
        *,
        pool: str = "",
        requested: int = 0,
        available: int = 0,
        limit: int = 0,
    ) -> None:
        super().__init__(message)
        self.pool = pool
        self.requested = requested
        self.available = available
        self.limit = limit


class SpillDirError(PootError, ValueError):
    """The spill directory cannot be used (missing, not writable, or on tmpfs).

    Attributes:
        path: the directory.
        fs_type: its filesystem magic (``statfs`` ``f_type``), when known.
    """

    hint = "Point CompileConfig.spill_dir at a writable directory on a disk (not tmpfs)."

    def __init__(self, message: str, *, path: str = "", fs_type: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.fs_type = fs_type


class Stalled(PootError, TimeoutError):  # noqa: N818 - the issue names it
    """A wait made no progress for ``stall_timeout_s``.

    Attributes:
        waited_for: what the wait was for (e.g. ``"weights of segment 2 (layers 8..12)"``).
        timeout_s: the stall timeout.
        progress: units of progress seen before the stall (bytes copied).
    """

    hint = (
        "Check the spill disk and the checkpoint's storage, or raise CompileConfig.stall_timeout_s."
    )

    def __init__(
        self, message: str, *, waited_for: str = "", timeout_s: float = 0.0, progress: int = 0
    ) -> None:
        super().__init__(message)
        self.waited_for = waited_for
        self.timeout_s = timeout_s
        self.progress = progress


class Cancelled(PootError, RuntimeError):  # noqa: N818 - parallels asyncio.CancelledError
    """A forward was cancelled (its own generation's cancel; never another's).

    Attributes:
        generation: the forward's generation number.
    """

    hint = "Nothing to fix: the forward was cancelled on purpose; run it again if needed."

    def __init__(self, message: str, *, generation: int = 0) -> None:
        super().__init__(message)
        self.generation = generation


class HardwareValidationError(PootError, RuntimeError):
    """A device failed ``poot validate-hardware`` (a conformance check or a benchmark).

    Attributes:
        device: the device key.
        check: the check that failed.
    """

    hint = "Do not plan on this device: update its driver, or report the failing check."

    def __init__(self, message: str, *, device: str = "", check: str = "") -> None:
        super().__init__(message)
        self.device = device
        self.check = check
