"""``poot-serve``'s life: /health answers 503 ``loading`` while the model loads and 200 after,
a model that cannot be loaded ends the process with a clear error, and bad options are refused
before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from server_process import ServerProcess
from starlette.testclient import TestClient

import poot
from poot.errors import ConfigError
from poot.server import ServerConfig, create_app


def test_health_loading_then_ok(stories: Path) -> None:
    release = threading.Event()
    gguf = str(stories / "stories260K-f32.gguf")

    def slow_loader() -> poot.LLM:
        release.wait(60)  # the real loader, held back until the test has seen "loading"
        return poot.LLM(gguf, threads=1)

    app = create_app(ServerConfig(model=gguf), loader=slow_loader)
    with TestClient(app) as client:
        r = client.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        r = client.post("/v1/completions", json={"model": "x", "prompt": "a"})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "model_loading" and r.headers["retry-after"] == "1"
        release.set()
        for _ in range(600):
            r = client.get("/health")
            if r.status_code == 200:
                break
            threading.Event().wait(0.05)
        assert r.json() == {"status": "ok"}
        body = {"model": "stories260K-f32", "prompt": "Once", "max_tokens": 3}
        assert client.post("/v1/completions", json=body).status_code == 200


def test_unloadable_model_exits_with_error(tmp_path: Path) -> None:
    srv = ServerProcess(["--model", str(tmp_path / "missing.gguf")], wait_ready=False)
    code = srv.proc.wait(120)
    log = srv.log()
    srv.stop()
    assert code == 1
    assert "poot-serve: error:" in log and "missing.gguf" in log


@pytest.mark.parametrize(
    "args",
    [["--max-queue", "0"], ["--queue-timeout", "-1"], ["--port", "x"]],
)
def test_bad_options_exit_2(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "poot.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "poot-serve: error:" in proc.stderr


def test_config_refuses_bad_values() -> None:
    with pytest.raises(ConfigError, match="max_queue"):
        ServerConfig(max_queue=0)
    with pytest.raises(ConfigError, match="api_key"):
        ServerConfig(api_key=" ")


@pytest.mark.parametrize("args", [["--max-num-seqs", "8"], ["--kv-cache-mib=512"]])
def test_removed_batch_flags_name_their_replacement(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "poot.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    flag = args[0].split("=")[0]
    assert f"poot-serve: error: {flag} is gone" in proc.stderr
    assert "--device-budget" in proc.stderr and "fitted to the memory" in proc.stderr


@pytest.mark.parametrize("value", ["0", "two"])
def test_a_bad_row_cap_exits_2(value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "poot.server.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POOT_SERVE_MAX_ROWS": value},
    )
    assert proc.returncode == 2, proc.stderr
    assert "POOT_SERVE_MAX_ROWS must be an integer >= 1" in proc.stderr
