"""A progress bar over work that runs in Rust with the GIL released.

``polled_bar(poll)`` draws a ``tqdm`` bar from a helper thread that calls ``poll()`` (a
lock-free ``(done, total)`` read, such as ``CpuRuntime.weight_progress``) every ``interval``
seconds while the body of the ``with`` runs in the calling thread.

Invariants:
    - The bar shows nothing for work shorter than ``delay`` seconds (tqdm's ``delay``), and
      nothing where ``disable`` is None and the file is not a terminal (logs stay clean) or
      ``TQDM_DISABLE`` is set. A disabled bar starts no thread and does not import
      ``tqdm`` (about 40 ms of a server's start-up, mostly its version lookup).
    - Leaving the ``with``, by return or by exception, stops and joins the thread; the bar
      ends at the last figures ``poll`` gave, never past ``total``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


@contextmanager
def polled_bar(
    poll: Callable[[], tuple[int, int]],
    *,
    desc: str,
    file: TextIO | None = None,
    disable: bool | None = None,
    delay: float = 0.5,
    interval: float = 0.1,
) -> Iterator[None]:
    """Draws ``poll()``'s ``(done, total)`` bytes as a bar while the body runs (module docs)."""
    if disable is None:
        # tqdm's own None ("not a terminal") would override TQDM_DISABLE, which only sets
        # its defaults; both are honoured here.
        out = file if file is not None else sys.stderr
        disable = bool(os.environ.get("TQDM_DISABLE")) or not out.isatty()
    if disable:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(
        total=0,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        file=file,
        delay=delay,
    )
    stop = threading.Event()

    def show() -> None:
        done, total = poll()
        if total != bar.total:
            bar.total = total
        bar.update(min(done, total) - bar.n)

    def watch() -> None:
        while not stop.wait(interval):
            show()

    watcher = threading.Thread(target=watch, name="poot-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        show()
        bar.close()
