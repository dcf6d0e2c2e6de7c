"""A real ``poot-serve`` process on a free loopback port, for the server tests (tests only).

``ServerProcess(args)`` starts ``python -m poot.server.cli --port 0 ARGS`` (the module behind
the ``poot-serve`` script), reads the one line saying where it listens, and waits for
``/health`` to answer 200. Its stderr (the server's log) goes to a file, read by ``log()``;
``stop()`` sends SIGTERM and waits for a clean exit. ``prefix`` runs the server through a
wrapper that ``exec``s it (the same process: a cgroup it enters is the server's).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

# uvicorn exits a SIGTERM'd server by re-raising the signal once it has shut down cleanly.
CLEAN_EXIT = (0, -signal.SIGTERM)

_LISTENING = re.compile(r"poot-serve: listening on (http://\S+)")


class ServerProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        wait_ready: bool = True,
        start_timeout_s: float = 120.0,
        prefix: Sequence[str] = (),
    ) -> None:
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="poot-serve-", suffix=".log", delete=False
        )
        cmd = [sys.executable, "-m", "poot.server.cli", "--port", "0", "--host", "127.0.0.1"]
        self.proc = subprocess.Popen(
            [*prefix, *cmd, *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "TQDM_DISABLE": "1", **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = _LISTENING.search(line)
        if match is None:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"poot-serve did not start: {line!r}\n{self.log()}")
        self.url = match.group(1)
        if wait_ready:
            self.wait_ready(start_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"poot-serve exited with {self.proc.returncode}\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"poot-serve was not ready within {timeout_s} s\n{self.log()}")

    def log(self) -> str:
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of ``/metrics`` (``name{labels}``), 0 when absent."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        key = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def wait_metric(self, name: str, value: float, timeout_s: float = 30.0) -> float:
        """Polls until ``name`` equals ``value`` (or the timeout); returns the last value."""
        end = time.monotonic() + timeout_s
        got = self.metric(name)
        while got != value and time.monotonic() < end:
            time.sleep(0.05)
            got = self.metric(name)
        return got

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode


def unexpected_log_lines(log: str) -> list[str]:
    """Lines of a server log that show a failure (errors, tracebacks)."""
    return [
        line
        for line in log.splitlines()
        if "ERROR" in line or "Traceback" in line or "Exception" in line
    ]
