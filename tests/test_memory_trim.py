"""``poot.host_memory.trim_heap`` hands the C heap's free pages back: blocks freed below glibc's
map threshold stay resident in the heap until then (what loading a model leaves behind). Checked
in a fresh interpreter with the C library's own ``malloc``/``free``."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

_SCRIPT = r"""
import ctypes, json
from poot.host_memory import trim_heap

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
# 64 MiB in 64 KiB blocks (below the map threshold: heap memory), each written, then all freed
# but the last, which keeps the heap's top in use so free() alone cannot shrink it.
blocks = [libc.malloc(64 << 10) for _ in range(1024)]
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
held = rss()
for b in blocks[:-1]:
    libc.free(b)
freed = rss()
trim_heap()
print(json.dumps({"held": held, "freed": freed, "trimmed": rss()}))
"""


def _glibc() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return hasattr(ctypes.CDLL(None), "malloc_trim")


@pytest.mark.skipif(
    not _glibc(), reason="glibc's malloc_trim only (elsewhere trim_heap is a no-op)"
)
def test_trim_heap_returns_freed_heap_pages() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=120
    )
    m = json.loads(out.stdout)
    # Freed, the blocks were still resident (most of 64 MiB); trimmed, they are not.
    assert m["freed"] - m["trimmed"] >= 48 << 20, m
