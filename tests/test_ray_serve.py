"""``poot-serve --ray``: two poot engines on a local two-node Ray cluster, through one endpoint.

The cluster (module-scoped, ``ray_cluster.local_cluster``: every Ray process on loopback) is
a head and a second node started with ``ray start``, each with one CPU, so the two engine
replicas land one per node. The server is a real ``poot-serve --ray``
process; the tests talk to it over HTTP with the ``openai`` client and ``httpx``.

Without Ray the module skips with the reason; under ``POOT_REQUIRE_RAY=1`` (CI) it fails.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray_cluster import Cluster, NodeSpec, local_cluster
from server_process import ServerProcess

if os.environ.get("POOT_REQUIRE_RAY") == "1":
    import ray  # noqa: F401  # fails the module: CI must have Ray
    from ray import serve  # noqa: F401
else:
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'poot[ray]')")

pytestmark = pytest.mark.timeout(600)  # the first test also starts the cluster and the app

# SmolLM2 (the default model), not stories260K: a stream must last long enough to be
# cancelled or have its replica killed while it runs.
MODEL = "SmolLM2-135M-Instruct.Q4_1"
KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Shared by every prompt of the prefix test: well over the 16-token blocks the KV cache
# reuses, and over the router's 64-character blocks.
SYSTEM = (
    "Once upon a time there was a little girl named Lily. She lived in a small house with her "
    "mom and dad and her dog. Every day she went to the park to play with her friends. "
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with local_cluster([NodeSpec(), NodeSpec()]) as c:
        yield c


@pytest.fixture(scope="module")
def server(cluster: Cluster, default_model_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        [
            "--ray",
            "--replicas",
            "2",
            "--model",
            str(default_model_path),
            "--threads",
            "1",
            "--max-model-len",
            "256",
        ],
        env={**cluster.env, "POOT_API_KEY": KEY, "POOT_SERVE_MAX_ROWS": "4"},
        start_timeout_s=300,
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120, headers=AUTH) as c:
        yield c


def _complete(prompt: str = "Once upon a time", **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 8, **kw}


def _events(r: httpx.Response) -> Iterator[dict[str, Any] | str]:
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def _metric(http: httpx.Client, name: str) -> dict[str, float]:
    """One metric's samples by replica."""
    out: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and 'replica="' in line:
            replica = line.split('replica="', 1)[1].split('"', 1)[0]
            out[replica] = out.get(replica, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _replicas_ok(http: httpx.Client) -> dict[str, str]:
    r = http.get("/health")
    return dict(r.json().get("replicas", {}))


# ---- the endpoint ------------------------------------------------------------------------------


def test_routes_errors_and_auth_match_poot_serve(server: ServerProcess, http: httpx.Client) -> None:
    import openai

    health = http.get("/health").json()
    assert health["status"] == "ok" and len(health["replicas"]) == 2
    assert all(s == "ok" for s in health["replicas"].values())
    # The API key, checked by the replica's own app, in OpenAI's shape.
    bare = httpx.post(f"{server.url}/v1/completions", json=_complete(), timeout=60)
    assert bare.status_code == 401 and bare.json()["error"]["type"]
    assert http.get("/v1/models").json()["data"][0]["id"] == MODEL
    bad = http.post("/v1/completions", json={"model": MODEL, "max_tokens": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=6)
    assert out.choices[0].text and out.usage is not None and out.usage.completion_tokens == 6
    chunks = list(
        client.completions.create(model=MODEL, prompt="Once upon", max_tokens=6, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    r = http.post("/v1/completions", json=_complete(), headers={"X-Request-Id": "ray-id-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "ray-id-1"
    assert r.headers["x-poot-replica"].startswith("SERVE_REPLICA::")
    # Both replicas' metrics, each sample labelled with its replica.
    assert len(_metric(http, "poot_kv_blocks_total")) == 2


def test_cancel_by_id_reaches_the_replica_running_it(http: httpx.Client) -> None:
    body = _complete(max_tokens=200, ignore_eos=True, stream=True, temperature=0)
    with http.stream(
        "POST", "/v1/completions", json=body, headers={"X-Request-Id": "ray-cancel-1"}
    ) as r:
        assert r.status_code == 200
        events = []
        for event in _events(r):
            events.append(event)
            if len(events) == 3:
                dup = http.post(
                    "/v1/completions", json=_complete(), headers={"X-Request-Id": "ray-cancel-1"}
                )
                assert dup.status_code == 409
                assert dup.json()["error"]["code"] == "duplicate_request_id"
                c = http.post("/v1/requests/ray-cancel-1/cancel")
                where = (r.headers["x-poot-replica"], c.headers.get("x-poot-replica"), c.text)
                assert c.status_code == 200 and c.json()["cancelled"] is True, where
    assert events[-1] == "[DONE]"
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if isinstance(e, dict)]
    assert finishes[-1] == "cancelled" and len(finishes) < 200
    gone = http.post("/v1/requests/ray-cancel-1/cancel")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "request_not_found"


# ---- prefix-aware routing ----------------------------------------------------------------------


def test_shared_prefix_hits_the_cache_on_every_replica_it_touches(http: httpx.Client) -> None:
    before = _metric(http, "poot_prefix_cached_tokens_total")
    served_before = _metric(http, "poot_prompt_tokens_total")

    def one(i: int) -> str:
        r = http.post("/v1/completions", json=_complete(SYSTEM + f"Story {i}:", max_tokens=24))
        assert r.status_code == 200, r.text
        return str(r.headers["x-poot-replica"])

    # Two waves of 8 at once on 2 replicas: the first wave computes the prefix where it goes
    # (on both replicas when it arrives before any replica is known for it, or spills past
    # busy_requests); in the second, every replica it touches already holds its blocks.
    touched: set[str] = set()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for wave in range(2):
            touched.update(pool.map(one, range(wave * 8, wave * 8 + 8)))
    after = _metric(http, "poot_prefix_cached_tokens_total")
    served = _metric(http, "poot_prompt_tokens_total")
    assert touched, "no request was served"
    for replica in touched:
        assert served[replica] > served_before.get(replica, 0.0)
        hits = after.get(replica, 0.0) - before.get(replica, 0.0)
        assert hits > 0, f"{replica} served the shared prefix without a cache hit: {after}"


# ---- faults ------------------------------------------------------------------------------------


def test_replica_killed_mid_stream(server: ServerProcess, http: httpx.Client) -> None:
    import ray

    body = _complete(max_tokens=200, ignore_eos=True, stream=True, temperature=0)
    t0 = time.monotonic()
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        victim = r.headers["x-poot-replica"]
        events = []
        for event in _events(r):
            events.append(event)
            if len(events) == 2:
                ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    # The stream ended (no hang) with an error event in OpenAI's shape, then [DONE].
    assert events[-1] == "[DONE]"
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert errors and errors[-1]["error"]["code"] == "replica_failed", events[-3:]
    assert errors[-1]["error"]["type"] == "server_error"
    assert time.monotonic() - t0 < 120
    # New requests go to the live replica.
    for _ in range(3):
        r = http.post("/v1/completions", json=_complete())
        assert r.status_code == 200 and r.headers["x-poot-replica"] != victim
    # Serve starts a replacement.
    end = time.monotonic() + 240
    while time.monotonic() < end:
        replicas = _replicas_ok(http)
        if len(replicas) == 2 and victim not in replicas:
            if all(s == "ok" for s in replicas.values()):
                break
        time.sleep(1)
    replicas = _replicas_ok(http)
    assert victim not in replicas and list(replicas.values()) == ["ok", "ok"], replicas
