"""``poot-serve`` side by side with llama.cpp's ``llama-server`` on the same GGUF (the default
model, SmolLM2-135M-Instruct Q4_1), both on 2 threads (``POOT_BENCH_THREADS``), over loopback
HTTP.

- Start-up: process start to the first ``/health`` 200 (the model already cached), and then
  the first request's latency (one token), so start-up work moved onto it would show. Also
  printed: the CPU time the server process had used when it answered 200 (user + system, all
  its threads, from ``/proc``), which other work on the machine inflates much less than the
  wall time.
- Load: C concurrent streaming clients (C = 1, 8, 32), each sending the same prompts to
  ``/v1/completions`` (greedy, ``ignore_eos``, 64 tokens each). The timed round is the whole
  workload, so the ratio table's tok/s column is output tokens per second; the p50/p99
  time-to-first-token (client side: request sent to first text chunk) of each run is printed
  in a table of its own at the end.

poot-serve fits its rows and KV pool to the memory, as a user gets it (no row cap: with
``--max-model-len 512`` it finds room for every client); llama-server gets as many slots as
there are clients.

The peer runs where ``$LLAMA_BIN/llama-server`` exists (``source /tmp/llama-env.sh``); without
it only poot's rows appear. No thresholds: speed is measured, not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

# ``POOT_BENCH_THREADS`` overrides: on a machine shared with other work, llama.cpp's spinning
# thread pool slows down sharply once its threads are descheduled, so 1 thread compares more
# fairly there.
THREADS = int(os.environ.get("POOT_BENCH_THREADS", "2"))
MAX_TOKENS = 64
CONCURRENCY = [1, 8, 32]
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "Once upon a time, in a small village,",
    "Explain what a neural network is in one paragraph.",
    "List three fruits and their colors:",
    "The quick brown fox",
    "In the year 2050, cities will",
    "A recipe for pancakes starts with",
]
_TTFT: dict[str, dict[str, tuple[float, float]]] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peer_bin() -> Path | None:
    path = Path(os.environ.get("LLAMA_BIN", "")) / "llama-server"
    return path if os.environ.get("LLAMA_BIN") and path.is_file() else None


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    model: str
    ready_cpu_s: float | None = None  # the process's CPU time at its first /health 200

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_health(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as http:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
    raise RuntimeError("server not healthy in time")


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far, all threads (None without /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # utime and stime are fields 14 and 15, counted after the parenthesized command name.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _compile_poot() -> None:
    """Writes poot's bytecode where it is missing or stale, as ``pip install`` does for a wheel.

    An editable checkout under ``PYTHONDONTWRITEBYTECODE=1`` (set on some machines) never
    writes it, and every start would compile each module from source, more than doubling the
    start-up; a user's installed package starts from bytecode, and so does the bench.
    """
    import compileall

    import poot

    compileall.compile_dir(Path(poot.__file__).parent, quiet=2)


def _start(impl: str, gguf: Path, slots: int) -> Server:
    port = _free_port()
    if impl == "poot":
        cmd = [
            sys.executable, "-m", "poot.server.cli", "--model", str(gguf), "--port", str(port),
            "--threads", str(THREADS), "--max-model-len", "512",
            "--log-level", "warning",
        ]  # fmt: skip
        model = gguf.stem
    else:
        peer = _peer_bin()
        if peer is None:
            pytest.skip("llama-server not found ($LLAMA_BIN; source /tmp/llama-env.sh)")
        cmd = [
            str(peer), "-m", str(gguf), "--port", str(port), "--host", "127.0.0.1",
            "-t", str(THREADS), "-np", str(slots), "-c", str(512 * slots), "--no-webui",
            "--log-disable", "--threads-http", str(slots + 8),
        ]  # fmt: skip
        model = gguf.stem
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_health(proc, url)
    return Server(proc, url, model, _cpu_s(proc.pid))


def _first_then_stop(live: list[Server], first: list[float]) -> None:
    """The first request's latency on the server just started (into ``first``), then its stop:
    a readiness that left work for the first request would show there. Untimed, like the stop
    (poot drains gracefully on SIGTERM, llama-server exits at once: neither is start-up)."""
    while live:
        server = live.pop()
        body = {"model": server.model, "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0}
        t1 = time.monotonic()
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        first.append(time.monotonic() - t1)
        assert r.status_code == 200, r.text
        server.stop()


@pytest.mark.parametrize("impl", ["poot", "peer"])
def test_startup_to_health(benchmark: Any, default_model_path: Path, impl: str) -> None:
    if impl == "peer" and _peer_bin() is None:
        pytest.skip("llama-server not found ($LLAMA_BIN; source /tmp/llama-env.sh)")
    benchmark.group = "server start to /health 200"
    benchmark.extra_info["impl"] = impl
    first: list[float] = []
    live: list[Server] = []
    cpu: list[float] = []

    def setup() -> None:
        # Untimed: the previous round's first request and stop, and (poot) its bytecode.
        _first_then_stop(live, first)
        if impl == "poot":
            _compile_poot()

    def start() -> None:
        live.append(_start(impl, default_model_path, 1))
        if live[-1].ready_cpu_s is not None:
            cpu.append(live[-1].ready_cpu_s)

    try:
        benchmark.pedantic(start, setup=setup, rounds=7)
    finally:
        _first_then_stop(live, first)
    benchmark.extra_info["first_request_s"] = statistics.median(first)
    print(f"\n{impl}: first request (1 token) after /health 200: {statistics.median(first):.3f} s")
    if cpu:
        benchmark.extra_info["ready_cpu_s"] = statistics.median(cpu)
        print(f"{impl}: process CPU time at /health 200: {statistics.median(cpu):.3f} s")


async def _one(http: httpx.AsyncClient, server: Server, prompt: str) -> tuple[float, int]:
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        # The token count comes from the server's own usage report, not from MAX_TOKENS.
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = None
    finish = None
    usage: int | None = None
    events = 0
    # A fresh connection per request: llama-server closes a connection after a streamed
    # response, so reusing one would fail; both servers are measured the same way.
    headers = {"Connection": "close"}
    url = f"{server.url}/v1/completions"
    async with http.stream("POST", url, json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            choice = event["choices"][0] if event.get("choices") else {}
            if ttft is None and choice.get("text"):
                ttft = time.perf_counter() - t0
            events += "text" in choice
            finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                usage = int(event["usage"]["completion_tokens"])
    assert finish == "length" and ttft is not None
    # The server's own count; a server that reports no usage is counted by its token events
    # (both servers send one event per token).
    return ttft, usage if usage is not None else events


def _per_client(clients: int) -> int:
    return max(1, 8 // clients)  # at least 8 requests per round


def _load(server: Server, clients: int, ttfts: list[float], per_client: int) -> int:

    async def client(http: httpx.AsyncClient, c: int) -> int:
        tokens = 0
        for i in range(per_client):
            ttft, n = await _one(http, server, PROMPTS[(c + i) % len(PROMPTS)])
            ttfts.append(ttft)
            tokens += n
        return tokens

    async def main() -> int:
        limits = httpx.Limits(max_connections=clients + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            return sum(await asyncio.gather(*(client(http, c) for c in range(clients))))

    return asyncio.run(main())


@pytest.fixture(scope="module")
def servers(default_model_path: Path) -> Iterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    for impl in ("poot", "peer"):
        if impl == "peer" and _peer_bin() is None:
            continue
        if impl == "poot":
            _compile_poot()
        started[impl] = _start(impl, default_model_path, max(CONCURRENCY))
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module", autouse=True)
def _ttft_table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if not _TTFT:
        return
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        return
    # Teardown output is captured; this table is for the terminal.
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        _write_ttft(tr)


def _write_ttft(tr: Any) -> None:
    tr.write_line("")
    tr.write_line("time to first token, client side (seconds): p50 / p99")
    for group, impls in sorted(_TTFT.items()):
        cells = [f"{impl} {p50:.3f} / {p99:.3f}" for impl, (p50, p99) in sorted(impls.items())]
        ratio = ""
        if "poot" in impls and "peer" in impls and impls["poot"][0] > 0:
            ratio = f"  p50 ratio peer/poot {impls['peer'][0] / impls['poot'][0]:.2f}"
        tr.write_line(f"  {group:<24} " + "   ".join(cells) + ratio)


@pytest.mark.parametrize("clients", CONCURRENCY)
@pytest.mark.parametrize("impl", ["poot", "peer"])
def test_streaming_load(
    benchmark: Any, servers: dict[str, Server], impl: str, clients: int
) -> None:
    if impl not in servers:
        pytest.skip("llama-server not found ($LLAMA_BIN; source /tmp/llama-env.sh)")
    server = servers[impl]
    _load(server, clients, [], 1)  # warm: compile the step shapes this load uses
    ttfts: list[float] = []
    group = f"server stream x{clients}"
    benchmark.group = group
    benchmark.extra_info["impl"] = impl
    per_client = _per_client(clients)
    got = benchmark.pedantic(_load, (server, clients, ttfts, per_client), rounds=2)
    # tok/s in the table uses the tokens the server reported decoding in a round.
    benchmark.extra_info["tokens"] = got
    assert got == clients * per_client * MAX_TOKENS, (got, clients * per_client * MAX_TOKENS)
    ttfts.sort()
    p99 = ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]
    _TTFT.setdefault(group, {})[impl] = (statistics.median(ttfts), p99)
    benchmark.extra_info["ttft_p50_s"] = statistics.median(ttfts)
    benchmark.extra_info["ttft_p99_s"] = p99
