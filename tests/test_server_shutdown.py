"""Graceful shutdown of a real ``poot-serve`` process with live streams (``--shutdown-timeout``).

SIGTERM while streams run: new requests get 503 ``server_shutting_down`` with Retry-After and
``/health`` says ``draining``; streams that finish within the timeout end normally; those that
do not end with a final error event and ``[DONE]``; every KV block is free (the server's
``shutdown:`` log line) and the process exits 0. A second signal exits at once with 1.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from server_process import ServerProcess, unexpected_log_lines  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1"


class _Stream(threading.Thread):
    """A streamed completion read on a thread; ``started`` is set at its first token."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.started = threading.Event()
        self.events: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    self.events.append(data if data == "[DONE]" else json.loads(data))
                    self.started.set()
        except BaseException as e:  # the test asserts on it
            self.error = e
            self.started.set()


@pytest.fixture
def start(default_model_path: Path) -> Iterator[Any]:
    servers: list[ServerProcess] = []

    def make(timeout_s: float) -> ServerProcess:
        srv = ServerProcess(
            [
                "--model",
                str(default_model_path),
                "--threads",
                "2",
                "-q",
                "--shutdown-timeout",
                str(timeout_s),
            ]
        )
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def _streams(srv: ServerProcess, n: int, max_tokens: int) -> list[_Stream]:
    streams = [_Stream(srv.url, max_tokens) for _ in range(n)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.started.wait(60), "the stream did not start"
        assert s.error is None, s.error
    return streams


def _wait_draining(srv: ServerProcess) -> None:
    """Returns once the server handles the signal (``/health`` says ``draining``)."""
    for _ in range(1000):
        if httpx.get(f"{srv.url}/health", timeout=30).status_code == 503:
            return
    raise AssertionError("the server never started draining")


def _shutdown_line(log: str) -> str:
    lines = [line for line in log.splitlines() if "shutdown:" in line]
    assert len(lines) == 1, log
    return lines[0]


def test_running_streams_finish_and_new_requests_get_503(start: Any) -> None:
    srv = start(60)
    streams = _streams(srv, 2, 200)
    srv.proc.send_signal(signal.SIGTERM)
    _wait_draining(srv)
    r = httpx.post(
        f"{srv.url}/v1/completions",
        json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"]
    assert r.json()["error"]["code"] == "server_shutting_down"
    health = httpx.get(f"{srv.url}/health", timeout=30)
    assert health.status_code == 503 and health.json() == {"status": "draining"}
    for s in streams:
        s.join(120)
        assert s.error is None, s.error
        assert s.events[-1] == "[DONE]"
        last = s.events[-2]
        assert last["choices"][0]["finish_reason"] == "length", last
    assert srv.proc.wait(60) == 0, srv.log()
    assert "2 requests finished, 0 cancelled, 0 KV blocks still used" in _shutdown_line(srv.log())
    assert not unexpected_log_lines(srv.log()), srv.log()


def test_streams_past_the_timeout_end_with_an_error_event(start: Any) -> None:
    srv = start(0.2)
    streams = _streams(srv, 2, 3000)
    srv.proc.send_signal(signal.SIGTERM)
    for s in streams:
        s.join(120)
        assert s.error is None, s.error
        assert s.events[-1] == "[DONE]"
        final = s.events[-2]
        assert final["error"]["code"] == "server_shutting_down", final
        assert len(s.events) < 3000
    assert srv.proc.wait(60) == 0, srv.log()
    assert "0 requests finished, 2 cancelled, 0 KV blocks still used" in _shutdown_line(srv.log())


def test_a_second_signal_exits_at_once(start: Any) -> None:
    srv = start(600)
    streams = _streams(srv, 1, 3000)
    srv.proc.send_signal(signal.SIGTERM)
    _wait_draining(srv)
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(60) == 1
    streams[0].join(60)
    assert "exiting now" in srv.log()


def test_shutdown_timeout_is_checked(default_model_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "poot.server.cli", "--shutdown-timeout", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "shutdown_timeout_s" in r.stderr
