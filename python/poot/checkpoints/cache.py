"""The model cache's integrity: verified files, one writer at a time, no debris, typed faults.

Invariants:

- A cached file is served only once its sha256 matched. The result is remembered in a sidecar
  (``<file>.verified``: sha256, size, mtime_ns); while size and mtime are unchanged the file is
  trusted without rehashing (a hash of the default model costs ~0.3 s); when either changed, or
  when asked (``poot pull --verify``), it is hashed again, and a mismatch makes it "not cached"
  (the caller downloads it again, replacing it atomically).
- Writers hold ``<models dir>/.pull.lock`` (``flock``), so a pull never deletes another live
  pull's files: under the lock, every ``.*.part`` file and ``.pull-*`` folder is the debris of an
  interrupted pull and is removed.
- A full disk or a read-only cache is a ``CacheWriteError`` naming the path and the bytes
  needed (checked before writing where the free space is known, and mapped from ENOSPC, EDQUOT,
  EFBIG, EROFS, EACCES and EPERM while writing); the temporary file is removed, so nothing
  half-written is left in place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from poot.errors import CacheWriteError

_CHUNK = 1 << 20
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}
LOCK_NAME = ".pull.lock"


def sidecar(path: Path) -> Path:
    """Where the verification record of ``path`` lives."""
    return path.with_name(path.name + ".verified")


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, lowercase hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _record_matches(path: Path, st: os.stat_result, sha256: str) -> bool:
    try:
        rec = json.loads(sidecar(path).read_text(encoding="ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(rec, dict) and rec == {
        "sha256": sha256,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def record_verified(path: Path, sha256: str) -> None:
    """Remembers that ``path``, as it is now (size, mtime), has ``sha256``.

    Best effort: on a read-only cache the record is skipped and the next check hashes again.
    """
    st = path.stat()
    rec = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    out = sidecar(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        tmp.write_text(json.dumps(rec, sort_keys=True) + "\n", encoding="ascii")
        os.replace(tmp, out)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def verified(path: Path, size: int, sha256: str, *, rehash: bool = False) -> bool:
    """Whether ``path`` holds exactly the expected bytes.

    Trusts the sidecar while size and mtime match it, unless ``rehash``; otherwise hashes the
    file and, when it matches, renews the sidecar.
    """
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != size:
        return False
    if not rehash and _record_matches(path, st, sha256):
        return True
    try:
        ok = sha256_file(path) == sha256
    except OSError:
        return False
    if ok:
        record_verified(path, sha256)
    else:  # no later lookup may trust the damaged file on its old record
        with contextlib.suppress(OSError):
            sidecar(path).unlink()
    return ok


def write_error(e: OSError, path: Path, needed: int) -> CacheWriteError | None:
    """The typed error for a write that failed with ``e`` (None: not a space or permission
    fault)."""
    if e.errno in _FULL:
        free = free_bytes(path)
        return CacheWriteError(
            f"no space left to write {path}: it needs {needed} B, {free} B are free on that disk",
            path=str(path),
            needed=needed,
            available=free,
        )
    if e.errno in _READ_ONLY:
        return CacheWriteError(
            f"cannot write {path} ({os.strerror(e.errno or 0)}): the model cache is read-only "
            f"here, and the file needs {needed} B",
            path=str(path),
            needed=needed,
            available=0,
        )
    return None


def free_bytes(path: Path) -> int:
    """Free bytes on the disk holding ``path`` (its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(shutil.disk_usage(probe).free)
    except OSError:
        return 0


def check_space(directory: Path, needed: int) -> None:
    """Raises ``CacheWriteError`` before writing when ``directory``'s disk lacks ``needed``
    bytes."""
    free = free_bytes(directory)
    if free < needed:
        raise CacheWriteError(
            f"not enough space in {directory}: the model needs {needed} B, {free} B are free",
            path=str(directory),
            needed=needed,
            available=free,
        )


@contextlib.contextmanager
def writer_lock(directory: Path, needed: int) -> Iterator[None]:
    """Holds the cache's writer lock for ``directory`` (created if missing), then removes the
    debris of interrupted pulls.

    Raises:
        CacheWriteError: the folder or its lock file cannot be created (read-only, full).
    """
    lock_path = directory / LOCK_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise (write_error(e, lock_path, needed) or e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        clean_debris(directory)
        yield
    finally:
        os.close(fd)  # releases the lock


def clean_debris(directory: Path) -> list[str]:
    """Removes ``.*.part`` files and ``.pull-*`` folders (call with the writer lock held);
    returns their names."""
    removed: list[str] = []
    for entry in directory.iterdir():
        name = entry.name
        if name.startswith(".pull-") and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif name.startswith(".") and name.endswith(".part") and entry.is_file():
            with contextlib.suppress(OSError):
                entry.unlink()
        else:
            continue
        removed.append(name)
    return sorted(removed)
