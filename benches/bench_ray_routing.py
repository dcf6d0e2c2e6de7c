"""Prefix-aware routing against round-robin on Ray Serve: time to first token on a
shared-system-prompt workload (``poot.serve.ray``, docs/ray.md).

The workload: ``POOT_BENCH_RAY_SYSTEMS`` system prompts (long, distinct), each followed by
short user questions, sent as streaming ``/v1/completions`` by C concurrent clients
(``POOT_BENCH_RAY_CLIENTS``, default 8), ``POOT_BENCH_RAY_REQUESTS`` requests per round in
all, 16 greedy tokens each. The same application is deployed twice on the cluster,
``routing="prefix"`` (the ``poot`` row) and ``routing="round_robin"`` (the ``peer`` row, so the
ratio column reads round-robin / prefix: above 1 means prefix routing is faster), with
``POOT_BENCH_RAY_REPLICAS`` engine replicas (default 2) of ``POOT_BENCH_THREADS`` threads.
At the end a table prints each router's client-side TTFT p50 / p99 and the prompt tokens the
replicas took from their prefix caches (``poot_prefix_cached_tokens_total``).

The cluster: ``RAY_ADDRESS`` when set (each replica needs one CPU there), else a local one
started in this process (``ray.init``, its temp dir under pytest's). No thresholds: speed is
measured, not asserted. Needs ``pip install 'poot[ray]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'poot[ray]')")

THREADS = int(os.environ.get("POOT_BENCH_THREADS", "2"))
REPLICAS = int(os.environ.get("POOT_BENCH_RAY_REPLICAS", "2"))
CLIENTS = int(os.environ.get("POOT_BENCH_RAY_CLIENTS", "8"))
REQUESTS = int(os.environ.get("POOT_BENCH_RAY_REQUESTS", "64"))
SYSTEMS = int(os.environ.get("POOT_BENCH_RAY_SYSTEMS", "4"))
# PrefixRouter's busy threshold (build_app's busy_requests; 8 is its default).
BUSY = int(os.environ.get("POOT_BENCH_RAY_BUSY", "8"))
MAX_TOKENS = 16
TOPICS = ["the sea", "a library", "the moon", "a garden", "trains", "winter", "a market", "bees"]
QUESTIONS = ["Say hello.", "Name a colour.", "Count to three.", "Give a short title."]

_RESULTS: dict[str, dict[str, Any]] = {}


def _system(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    rules = " ".join(f"Rule {k}: always answer about {topic} in plain words." for k in range(12))
    return f"You are assistant number {i}, an expert on {topic}. {rules}\n"


def _prompts() -> list[str]:
    # A seeded shuffle of which system prompt each request carries: in index order with
    # SYSTEMS a multiple of the replicas, round-robin sends every request of a system prompt
    # to the same replica by accident, which made the baseline prefix-affine.
    import random

    systems = [i % SYSTEMS for i in range(REQUESTS)]
    random.Random(0).shuffle(systems)
    return [
        _system(s) + f"Question {i}: " + QUESTIONS[i % len(QUESTIONS)] + "\nAnswer:"
        for i, s in enumerate(systems)
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[int]:
    """Serve's HTTP port on a connected cluster."""
    import ray
    from ray import serve

    temp = None
    # Explicit, so a local ray.init() neither writes a token into ~/.ray nor needs one.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        temp = tempfile.mkdtemp(prefix="poot-bench-ray-")
        ray.init(
            num_cpus=REPLICAS,
            include_dashboard=False,
            _temp_dir=temp,
            log_to_driver=False,
            object_store_memory=200 * 10**6,
        )
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    try:
        yield port
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


async def _one(http: httpx.AsyncClient, url: str, model: str, prompt: str) -> float:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    ttft = None
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                if json.loads(line[6:]).get("choices", [{}])[0].get("text"):
                    ttft = time.perf_counter() - t0
    assert ttft is not None
    return ttft


def _load(url: str, model: str, prompts: list[str], ttfts: list[float]) -> int:
    queue = list(reversed(prompts))

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            ttfts.append(await _one(http, url, model, queue.pop()))

    async def main() -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            await asyncio.gather(*(client(http) for _ in range(CLIENTS)))

    asyncio.run(main())
    return len(prompts) * MAX_TOKENS


def _summed(url: str, metric: str) -> float:
    """A metric summed over the replicas."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith(metric + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module", autouse=True)
def _ttft_table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None or not _RESULTS:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        tr.write_line("")
        tr.write_line(
            f"Ray Serve routing, {REPLICAS} replicas, {CLIENTS} clients, {REQUESTS} requests, "
            f"{SYSTEMS} system prompts: TTFT p50 / p99 (s), prompt tokens from prefix caches"
        )
        for routing, r in sorted(_RESULTS.items()):
            tr.write_line(
                f"  {routing:<12} {r['p50']:.3f} / {r['p99']:.3f}   cached {r['cached']:.0f}"
                f" of {r['prompt_tokens']:.0f}"
            )


@pytest.mark.parametrize("routing", ["prefix", "round_robin"])
def test_shared_system_prompt_ttft(
    benchmark: Any, cluster: int, default_model_path: Path, routing: str
) -> None:
    from ray import serve

    from poot.serve.ray import build_app
    from poot.server.config import ServerConfig

    config = ServerConfig(model=str(default_model_path), threads=THREADS, max_model_len=1024)
    name = f"bench-{routing}"
    serve.run(
        build_app(config, replicas=REPLICAS, routing=routing, busy_requests=BUSY),
        name=name,
        route_prefix=f"/{name}",
    )
    url = f"http://127.0.0.1:{cluster}/{name}"
    try:
        model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        prompts = _prompts()
        _load(url, model, prompts[: len(QUESTIONS)], [])  # warm: compile the step shapes
        cached0 = _summed(url, "poot_prefix_cached_tokens_total")
        prompt0 = _summed(url, "poot_prompt_tokens_total")
        ttfts: list[float] = []
        benchmark.group = "ray routing: shared system prompts"
        benchmark.extra_info["impl"] = "poot" if routing == "prefix" else "peer"
        benchmark.extra_info["tokens"] = REQUESTS * MAX_TOKENS
        benchmark.pedantic(_load, (url, model, prompts, ttfts), rounds=1)
        ttfts.sort()
        p99 = ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]
        _RESULTS[routing] = {
            "p50": statistics.median(ttfts),
            "p99": p99,
            "cached": _summed(url, "poot_prefix_cached_tokens_total") - cached0,
            "prompt_tokens": _summed(url, "poot_prompt_tokens_total") - prompt0,
        }
        benchmark.extra_info["ttft_p50_s"] = statistics.median(ttfts)
        benchmark.extra_info["ttft_p99_s"] = p99
    finally:
        serve.delete(name)
