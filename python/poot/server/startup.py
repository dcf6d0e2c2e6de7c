"""The start-up trace of ``poot-serve``: one line per phase, at debug level.

``poot-serve --log-level debug`` logs (logger ``poot.server.startup``) when each phase of the
start ended, in seconds since the process started, and how long it took: in wall time and in
its own thread's CPU time, which a busy machine inflates less::

    startup 0.112 s: interpreter started, poot-serve imported, arguments read (0.112 s, ...)
    startup 0.390 s: [poot-load] model loaded (0.270 s, this thread's CPU 0.120 s)
    ...
    startup 0.455 s: ready: /health answers 200

The model's own phases (tokenizer, weights mapped, weights prepared) come from ``poot.LLM`` on
logger ``poot`` at the same level. The process's start is read from ``/proc/self/stat`` (to
the kernel's clock tick, 10 ms), so the interpreter's own start-up is counted; where there is
no ``/proc`` the clock starts when this module is imported.
"""

from __future__ import annotations

import logging
import os
import threading
import time

__all__ = ["Phase", "mark", "since_start"]

logger = logging.getLogger("poot.server.startup")


def _process_start() -> float:
    """The process's start on the ``time.monotonic`` clock (its boot-time clock on Linux)."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Field 22 (starttime, clock ticks since boot) counts from after the command's name,
        # which is in parentheses and may hold spaces.
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        started = ticks / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < 60 else now


_START = _process_start()


def since_start() -> float:
    """Seconds since the process started."""
    return time.monotonic() - _START


def mark(what: str) -> None:
    """Logs that ``what`` happened, with the time since the process started and the CPU
    time of the calling thread since it started."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "startup %.3f s: %s (this thread's CPU so far %.3f s)",
            since_start(),
            what,
            time.thread_time(),
        )


class Phase:
    """Times consecutive phases of one thread; ``done(name)`` logs the one that just ended.

    The first phase starts now, or with the process where ``from_process_start``.
    """

    def __init__(self, *, from_process_start: bool = False) -> None:
        self._last = _START if from_process_start else time.monotonic()
        self._cpu = 0.0 if from_process_start else time.thread_time()

    def done(self, what: str) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        if logger.isEnabledFor(logging.DEBUG):
            thread = threading.current_thread()
            where = "" if thread is threading.main_thread() else f"[{thread.name}] "
            logger.debug(
                "startup %.3f s: %s%s (%.3f s, this thread's CPU %.3f s)",
                now - _START,
                where,
                what,
                now - self._last,
                cpu - self._cpu,
            )
        self._last, self._cpu = now, cpu
