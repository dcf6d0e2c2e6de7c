"""The host memory this process may still take: the OS's MemAvailable, and the memory limit of
the control group it runs in (a container's, a Kubernetes pod's, a systemd slice's).

Inside a container ``/proc/meminfo`` describes the whole host, not the container: a pod limited
to 2 GiB on a 256 GiB node reads 200+ GiB available there. Sizing a KV pool from that gets the
process killed by the kernel's OOM killer once the pool's pages are written. So the headroom
is the smallest of MemAvailable and, for the process's memory cgroup and each of its parents,
``limit - (usage - inactive page cache)``; inactive file pages are reclaimable, so a mapped
checkpoint the kernel can drop again does not count against the headroom (``docker stats``
counts the same way).

Both cgroup versions are read: v2 (``memory.max``, ``memory.current``, ``memory.stat``'s
``inactive_file``) and v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``,
``total_inactive_file``). Where the process's cgroup path does not exist under the mount (a
container that mounts its own cgroup as the root), the mount's root files are read instead.
Nothing here raises: an unreadable file means "no limit known there".

``trim_heap`` hands the C heap's free pages back to the OS (glibc's ``malloc_trim``) after
work whose transient allocations would otherwise stay resident (loading a model).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

__all__ = ["HostMemory", "host_memory", "trim_heap"]

# v1 reports "no limit" as a huge page-rounded number, not a word.
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class HostMemory:
    """What ``host_memory`` found.

    Attributes:
        available: bytes this process may still take (the smaller of the two below; 0 when
            neither is known).
        meminfo_available: the OS's MemAvailable (0 where unknown).
        cgroup_limit: the tightest memory cgroup limit over the process's cgroup and its
            parents (None: no limit).
        cgroup_headroom: that cgroup's limit less its usage net of inactive page cache (None
            where no limit).
        cgroup_path: the cgroup directory whose limit is the tightest.
    """

    available: int
    meminfo_available: int
    cgroup_limit: int | None = None
    cgroup_headroom: int | None = None
    cgroup_path: str | None = None

    def describe(self) -> str:
        """One line for logs: where ``available`` came from."""
        mib = 1 << 20
        text = f"{self.available / mib:.0f} MiB available"
        if self.cgroup_limit is not None and self.cgroup_headroom is not None:
            bound = "cgroup" if self.cgroup_headroom < self.meminfo_available else "MemAvailable"
            text += (
                f" (MemAvailable {self.meminfo_available / mib:.0f} MiB; cgroup {self.cgroup_path}"
                f" limit {self.cgroup_limit / mib:.0f} MiB leaves "
                f"{self.cgroup_headroom / mib:.0f} MiB; bound by {bound})"
            )
        else:
            text += " (MemAvailable; no cgroup memory limit)"
        return text


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def meminfo_available(path: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable in bytes (MemFree where the kernel is too old to say; 0 where unknown)."""
    free = 0
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
                if line.startswith("MemFree:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free:
        return free
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def _cgroup_dirs(proc_cgroup: Path, root: Path) -> list[tuple[Path, int]]:
    """The process's memory cgroup directory and its parents, each with its version."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    found: list[tuple[Path, int]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "" and (root / "cgroup.controllers").exists():
            base, version = root, 2
        elif "memory" in controllers.split(","):
            base, version = root / "memory", 1
        else:
            continue
        here = base / rel.lstrip("/")
        if not here.is_dir():
            here = base  # a namespaced mount: the process's cgroup is the mount's root
        while True:
            found.append((here, version))
            if here == base:
                break
            here = here.parent
    return found


def _headroom(d: Path, version: int) -> tuple[int, int] | None:
    """(limit, limit - usage net of inactive page cache) of one cgroup, or None: no limit."""
    if version == 2:
        limit = _read_int(d / "memory.max")
        usage = _read_int(d / "memory.current")
        inactive = _stat(d / "memory.stat", "inactive_file")
    else:
        limit = _read_int(d / "memory.limit_in_bytes")
        usage = _read_int(d / "memory.usage_in_bytes")
        inactive = _stat(d / "memory.stat", "total_inactive_file")
    if limit is None or limit >= _V1_UNLIMITED or usage is None:
        return None
    return limit, max(limit - max(usage - inactive, 0), 0)


def host_memory(
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    meminfo: Path = Path("/proc/meminfo"),
) -> HostMemory:
    """The memory this process may still take; see the module docs."""
    avail = meminfo_available(meminfo)
    best: tuple[int, int, Path] | None = None
    for d, version in _cgroup_dirs(proc_cgroup, cgroup_root):
        got = _headroom(d, version)
        if got is not None and (best is None or got[1] < best[1]):
            best = (got[0], got[1], d)
    if best is None:
        return HostMemory(avail, avail)
    limit, room, path = best
    available = min(avail, room) if avail > 0 else room
    return HostMemory(available, avail, limit, room, str(path))


def trim_heap() -> None:
    """Returns the C heap's free pages to the OS: glibc's ``malloc_trim(0)``, which releases
    whole free pages inside every arena (the main heap and each thread's), not only the top.

    Why: glibc keeps freed blocks below its map threshold, which rises with every large block
    freed, in the heap they came from, and they count as resident until reused. Loading a
    model frees many such blocks at once (``tokenizer.json``'s parse, the re-lays' sources on
    the weight-preparation thread). A no-op where the C library has no such call (musl,
    macOS, Windows).
    """
    fn = _malloc_trim()
    if fn is not None:
        fn(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return cast("Callable[[int], int]", fn)
