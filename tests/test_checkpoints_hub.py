"""Resolving hub ids: offline and unreachable hubs fail fast, the cache answers offline."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from checkpoints_data import STORIES_HPARAMS, needs_safetensors

from poot.checkpoints import resolve_model_files
from poot.errors import ModelNotFoundError, OfflineError

# ---------------------------------------------------------------- the hub, offline


def test_hub_offline_env_fails_fast(
    silent_server: SilentServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Fast means "without touching the network": the endpoint records every connection.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", silent_server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(OfflineError) as e:
        resolve_model_files("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert silent_server.connections() == 0
    msg = str(e.value)
    assert "HF_HUB_OFFLINE" in msg and "local path" in msg and "poot pull" in msg
    assert isinstance(e.value, ConnectionError)


class SilentServer:
    """A TCP endpoint that accepts connections and never answers (a black-holed network)."""

    def __init__(self, url: str, held: list[socket.socket]) -> None:
        self.url = url
        self._held = held

    def connections(self) -> int:
        """Connections accepted so far."""
        return len(self._held)


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    """A ``SilentServer`` on a free loopback port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield SilentServer(f"http://127.0.0.1:{srv.getsockname()[1]}", held)
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.timeout(30)
def test_hub_unreachable_fails_fast(
    silent_server: SilentServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A black-holed hub ends in OfflineError through the read timeout poot passes
    # (POOT_NETWORK_TIMEOUT), not by hanging: the error names the timeout. pytest-timeout's 30 s
    # is the hang guard, not a claim about speed.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", silent_server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("POOT_NETWORK_TIMEOUT", "1")
    with pytest.raises(OfflineError, match="local path.*poot pull") as e:
        resolve_model_files("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "timeout" in str(e.value).lower() or "timed out" in str(e.value).lower()
    assert silent_server.connections() >= 1


@pytest.mark.timeout(30)
def test_hub_connection_refused_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(OfflineError, match="SmolLM2") as e:
        resolve_model_files("HuggingFaceTB/SmolLM2-135M-Instruct@main")
    assert "connect" in str(e.value).lower() or "refused" in str(e.value).lower()


class _NotFoundHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(30)
def test_hub_unknown_repo_is_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFoundHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
        with pytest.raises(ModelNotFoundError, match="no model 'poot-test/no-such-model'"):
            resolve_model_files("poot-test/no-such-model")
    finally:
        server.shutdown()
        server.server_close()
        t.join()


# ---------------------------------------------------------------- the hub, reachable or cached


@needs_safetensors
def test_hub_download_pins_the_resolved_commit(
    shared_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    hf = shared_models / "stories260K" / "hf"
    commit = "a" * 40
    calls: list[dict[str, Any]] = []

    def model_info(self: object, repo_id: str, **kwargs: Any) -> SimpleNamespace:
        calls.append({"repo_id": repo_id, **kwargs})
        return SimpleNamespace(sha=commit)

    def snapshot_download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(hf)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("POOT_NETWORK_TIMEOUT", "3")
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    mf = resolve_model_files("poot-test/stories@v1")
    assert mf.kind == "hf" and mf.spec == "poot-test/stories@v1" and mf.path == hf
    assert mf.hparams == STORIES_HPARAMS
    info, snap = calls
    assert info == {"repo_id": "poot-test/stories", "revision": "v1", "timeout": 3.0}
    assert snap["revision"] == commit and snap["etag_timeout"] == 3.0
    assert {"config.json", "*.safetensors", "tokenizer.json"} <= set(snap["allow_patterns"])


def _hub_cache(shared_models: Path, cache: Path, repo_id: str) -> Path:
    """A Hugging Face hub cache holding stories260K/hf as ``repo_id`` at ``main``."""
    commit = "c" * 40
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(shared_models / "stories260K" / "hf", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@needs_safetensors
def test_hub_offline_uses_the_cache(
    shared_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = _hub_cache(shared_models, tmp_path / "hf", "poot-test/stories")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mf = resolve_model_files("poot-test/stories")
    assert mf.kind == "hf" and mf.path == snapshot and mf.hparams == STORIES_HPARAMS
    # unreachable hub, cached repo: the cache answers
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert resolve_model_files("poot-test/stories").path == snapshot
