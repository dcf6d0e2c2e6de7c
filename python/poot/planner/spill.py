"""The spill directory: where streamed weights' buffer files live.

It must be a real disk. A tmpfs directory would put "spilled" bytes back in the RAM the budget
was meant to protect, so it is refused (``statfs`` ``f_type`` is ``TMPFS_MAGIC``) unless the
caller overrides it explicitly (``CompileConfig.allow_tmpfs_spill``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

from poot.errors import SpillDirError

__all__ = ["TMPFS_MAGIC", "check_spill_dir", "fs_type"]

TMPFS_MAGIC = 0x01021994
RAMFS_MAGIC = 0x858458F6


def fs_type(path: Path) -> int:
    """``statfs(path).f_type``, or 0 where statfs is unavailable."""
    name = ctypes.util.find_library("c")
    if name is None:
        return 0
    libc = ctypes.CDLL(name, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86-64 / arm64
    if libc.statfs(os.fsencode(path), buf) != 0:
        return 0
    # f_type is the first field, a native long (__fsword_t).
    return int(struct.unpack_from("l", buf.raw)[0]) & 0xFFFFFFFF


def check_spill_dir(path: Path, *, allow_tmpfs: bool = False) -> Path:
    """Creates ``path`` if needed and checks it is a writable, non-tmpfs directory.

    Raises:
        SpillDirError: it cannot be created or written, or it is on tmpfs/ramfs.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpillDirError(f"spill dir {path} cannot be created: {e}", path=str(path)) from e
    if not os.access(path, os.W_OK):
        raise SpillDirError(f"spill dir {path} is not writable", path=str(path))
    kind = fs_type(path)
    if kind in (TMPFS_MAGIC, RAMFS_MAGIC) and not allow_tmpfs:
        raise SpillDirError(
            f"spill dir {path} is on tmpfs (f_type {kind:#x}): spilled weights would use the "
            "RAM the budget protects; choose a disk directory or set allow_tmpfs_spill=True",
            path=str(path),
            fs_type=kind,
        )
    return path
