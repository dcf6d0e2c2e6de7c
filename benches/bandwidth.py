"""The read bandwidth a decode roofline divides by (``bench_cpu_table.py``): numpy reductions
on ``threads`` threads over a buffer of the bytes one decode step reads, read over and over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def read_bandwidth(threads: int = 2, nbytes: int = 1 << 30, passes: int = 5) -> float:
    """Bytes per second `threads` threads read from a buffer of `nbytes` bytes, read over and
    over: the best of `passes` passes for each of three numpy reductions, since which one keeps
    up with the memory depends on the CPU (on a Zen 5, `np.max` over float32 is compute-bound at
    33-35 GB/s where an OR over the same bytes as uint64 reads 45-47, and poot's own decode
    streamed faster than the float max, so a roofline from it alone read over 100%).

    The buffer is the size of what one decode step reads, because that is where its bytes
    live: a model smaller than the last-level cache decodes from it, not from DRAM (on an
    Emerald Rapids with 300 MiB of L3 a fixed 512 MiB probe read 31 GB/s where one of the
    default model's 100 MB read 50, and SmolLM2's decode read 105% of that DRAM roofline).
    A pass reads the buffer at least 256 MiB's worth of times, so a small buffer's figure is
    not the threads' start-up."""
    a = np.ones(max(nbytes, threads << 12) // 8 * 2, dtype=np.float32)
    reps = max(1, -(-(256 << 20) // a.nbytes))
    reads: list[tuple[Callable[[Any], Any], Any]] = [
        (np.max, a),
        (np.bitwise_or.reduce, a.view(np.uint64)),
        (np.max, a.view(np.int64)),
    ]

    def again(fn: Callable[[Any], Any], part: Any) -> None:
        for _ in range(reps):
            fn(part)

    best = float("inf")
    for fn, arr in reads:
        parts = np.array_split(arr, threads)
        for _ in range(passes):
            ths = [threading.Thread(target=again, args=(fn, p)) for p in parts]
            t0 = time.perf_counter()
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            best = min(best, time.perf_counter() - t0)
    return a.nbytes * reps / best
