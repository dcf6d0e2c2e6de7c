"""Shared fixtures: the real checkpoints in ../shared/models and the default model.

Invariants:

- Isolation: every pytest session runs against its own empty caches. ``pytest_configure``
  points ``POOT_CACHE_DIR``, ``HF_HUB_CACHE``, ``HF_HOME`` and ``XDG_CACHE_HOME`` at a fresh
  temporary folder before any test module (and so poot) is imported, and removes it at the end.
  Settings are read from the environment on each call, and servers started by tests inherit it,
  so nothing reads or writes the user's models, stored hardware profiles or spill files.
- The default model reaches a test only through ``default_model_path``, which copies a verified
  file into the session cache. It comes from ``POOT_TEST_SMOLLM2``, ``../shared/models/smollm2``
  or pytest's own cache (``.pytest_cache``, filled by one download); tests that would need that
  download are marked ``network`` at collection, so ``-m "not network"`` never downloads.
- Missing ``../shared`` fixtures skip with the reason, or fail under ``POOT_REQUIRE_SHARED=1``
  (``shared_data.require_shared``).
- Network only where marked: in a test without the ``network`` marker, a connection or name
  lookup in this process that leaves loopback is refused and fails the test at teardown
  (naming the address), even when the code under test turned the refusal into an "offline"
  error. Child processes (pip, servers) are not watched.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# tests/ holds test-only helpers (numpy_runtime, shared_data) imported by several test files.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_data import SHARED_MODELS, missing_shared, require_shared  # noqa: E402

pytest_plugins = ["pytester"]  # tests/test_isolation.py runs inner sessions under this conftest

_ISOLATED_VARS = ("POOT_CACHE_DIR", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
_session_root: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_root
    _session_root = Path(tempfile.mkdtemp(prefix="poot-test-session-"))
    for var in _ISOLATED_VARS:
        folder = _session_root / var.lower()
        folder.mkdir()
        os.environ[var] = str(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_root is not None:
        shutil.rmtree(_session_root, ignore_errors=True)


def session_cache_dir() -> Path:
    """This session's ``POOT_CACHE_DIR`` (empty at the start of the session)."""
    assert _session_root is not None, "pytest_configure has not run"
    return _session_root / "poot_cache_dir"


def _pytest_model_store(config: pytest.Config) -> Path:
    """A poot cache root inside pytest's own cache dir, where the default model is kept once
    downloaded (per checkout, never the user's cache)."""
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("poot-default-model"))
    return Path(config.rootpath) / ".pytest_cache" / "d" / "poot-default-model"


def local_default_model(config: pytest.Config) -> Path | None:
    """A copy of the default model that needs no network, or None."""
    from poot.checkpoints import DEFAULT_MODEL, cached_model
    from poot.config import Settings

    env = os.environ.get("POOT_TEST_SMOLLM2")
    candidates = [Path(env)] if env else []
    candidates.append(SHARED_MODELS / "smollm2" / DEFAULT_MODEL.filename)
    for path in candidates:
        if path.is_file() and path.stat().st_size == DEFAULT_MODEL.size:
            return path
    return cached_model(DEFAULT_MODEL, Settings(cache_dir=_pytest_model_store(config)))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [i for i in items if "default_model_path" in getattr(i, "fixturenames", ())]
    if users and local_default_model(config) is None:
        for item in users:
            item.add_marker(pytest.mark.network)


def _loopback(host: object) -> bool:
    if not isinstance(host, str) or host in ("localhost", ""):
        return isinstance(host, str)
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a name other than localhost: a real lookup


@pytest.fixture(autouse=True)
def _network_only_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Any:
    if request.node.get_closest_marker("network") is not None:
        yield
        return
    tried: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(sock: socket.socket, address: Any) -> None:
        inet = sock.family in (socket.AF_INET, socket.AF_INET6)
        if inet and isinstance(address, tuple) and not _loopback(address[0]):
            tried.append(f"connect {address[0]}:{address[1]}")
            raise ConnectionRefusedError(f"test without the network marker reached {address}")

    def connect(sock: socket.socket, address: Any) -> None:
        check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *a: Any, **k: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and not _loopback(name):
            tried.append(f"lookup {name}")
            raise socket.gaierror(socket.EAI_NONAME, f"test without the network marker: {name}")
        return real_getaddrinfo(host, *a, **k)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield
    assert not tried, f"reached the network without @pytest.mark.network: {tried}"


@pytest.fixture(scope="session")
def shared_models() -> Path:
    """The shared folder of real checkpoints (see its README)."""
    return require_shared(SHARED_MODELS / "stories260K", "real checkpoints").parent


@pytest.fixture(scope="session")
def default_model_path(pytestconfig: pytest.Config) -> Path:
    """The default model's GGUF in this session's cache (``POOT_CACHE_DIR``), verified.

    Copied from a local source (see the module doc); where there is none it is pulled once into
    pytest's cache (the tests using it were marked ``network``).
    """
    from poot.checkpoints import DEFAULT_MODEL, pull
    from poot.checkpoints.default import copy_verified
    from poot.config import Settings
    from poot.errors import OfflineError

    source = local_default_model(pytestconfig)
    if source is None:
        try:
            source = pull(settings=Settings(cache_dir=_pytest_model_store(pytestconfig)))
        except OfflineError as e:
            missing_shared(f"the default model is not available locally and cannot be pulled: {e}")
    dest = DEFAULT_MODEL.cache_path(Settings(cache_dir=session_cache_dir()))
    return copy_verified(source, DEFAULT_MODEL, dest, progress=False)


STORIES = "stories260K"


@pytest.fixture(scope="session")
def stories(shared_models: Path) -> Path:
    """The stories260K folder (HF directory, GGUF files, reference.json)."""
    return shared_models / STORIES


def cpu_runtime_or_skip(threads: int | None = None) -> Any:
    """A ``CpuRuntime``; skips while poot-cpu's runtime is not compiled into the build."""
    from poot._native import CpuRuntime
    from poot.errors import BackendNotCompiledError

    try:
        return CpuRuntime(threads)
    except BackendNotCompiledError as e:
        pytest.skip(f"the CPU runtime is not in this build yet: {e}")


@pytest.fixture
def make_llm(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Builds ``poot.LLM(path, **kw)`` on ``runtime="cpu"`` (the real one) or ``"numpy"``
    (the reference interpreter in ``tests/numpy_runtime.py``; ``ggml_numerics=True`` mimics
    llama.cpp's CPU arithmetic)."""
    import poot
    import poot.llm

    def make(path: Path | str, runtime: str = "cpu", ggml_numerics: bool = False, **kw: Any) -> Any:
        if runtime == "cpu":
            cpu_runtime_or_skip(1)
            return poot.LLM(str(path), **kw)
        from numpy_runtime import NumpyRuntime, load_weights

        weights = load_weights(Path(path))
        monkeypatch.setattr(
            poot.llm,
            "_make_runtime",
            lambda threads, numerics="exact": NumpyRuntime(weights, ggml_numerics=ggml_numerics),
        )
        return poot.LLM(str(path), **kw)

    return make


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """``family_checkpoints(family, seed=0)``: a family's random-weight HF dir and GGUF
    (``tests/family_models.py``), written once per session, or once into
    ``POOT_FAMILY_CACHE`` when that is set."""
    import os

    from family_models import write_family

    cache = os.environ.get("POOT_FAMILY_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("families")

    def make(family: str, seed: int = 0) -> Any:
        return write_family(root, family, seed)

    return make
