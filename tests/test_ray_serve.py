"""``poot-serve --ray``: two poot engines on a local two-node Ray cluster, through one endpoint.

The cluster (module-scoped) is a head and a second node started with ``ray start``, each with
one CPU, so the two engine replicas land one per node. Every Ray process and every address
they advertise is loopback: ``--node-ip-address=127.0.0.2`` (Ray 2.60's ``ray start`` replaces
127.0.0.1 with the machine's routable address on Linux; 127.0.0.2 is loopback too and kept),
``RAY_TMPDIR`` and ``--temp-dir`` under a fresh temporary folder (nothing in the user's
``/tmp/ray``), no ``RAY_*`` variable of the caller's inherited, and token auth off
(``RAY_AUTH_MODE=disabled``: nothing read from or written to ``~/.ray``). Teardown ends each
``ray start --block`` process group it started. The server is a real ``poot-serve --ray``
process; the tests talk to it over HTTP with the ``openai`` client and ``httpx``.

Without Ray the module skips with the reason; under ``POOT_REQUIRE_RAY=1`` (CI) it fails.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import ServerProcess

if os.environ.get("POOT_REQUIRE_RAY") == "1":
    import ray  # noqa: F401  # fails the module: CI must have Ray
    from ray import serve  # noqa: F401
else:
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'poot[ray]')")

pytestmark = pytest.mark.timeout(600)  # the first test also starts the cluster and the app

NODE_IP = "127.0.0.2"
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


@dataclass
class Cluster:
    address: str
    env: dict[str, str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head did not listen on {host}:{port} within {timeout_s} s")


def _started_here(root: Path) -> list[int]:
    """Processes of this cluster that left its process groups (Ray starts some actors, such
    as Serve's controller, in sessions of their own): those whose RAY_TMPDIR is ``root``."""
    mark = f"RAY_TMPDIR={root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def _stop(procs: list[subprocess.Popen[bytes]], root: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        end = time.monotonic() + 10
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            time.sleep(0.1)
    for pid in _started_here(root):
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    import ray

    # A short path: Ray's unix sockets live under it (108 bytes at most).
    root = Path(tempfile.mkdtemp(prefix="poot-ray-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # RAY_AUTH_MODE explicit: a token a local ray.init() left in ~/.ray would otherwise turn
    # token auth on for the nodes and not for the drivers.
    ray_env = {"RAY_TMPDIR": str(root), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.update(ray_env)
    port = _free_port()
    ray_cli = str(Path(sys.executable).parent / "ray")
    common = [
        "--block",
        f"--node-ip-address={NODE_IP}",
        "--num-cpus=1",
        f"--memory={1 << 30}",
        f"--object-store-memory={200 * 10**6}",
        f"--temp-dir={root}",
        "--disable-usage-stats",
    ]
    procs: list[subprocess.Popen[bytes]] = []
    saved = {k: os.environ.get(k) for k in ray_env}
    try:
        for i, args in enumerate(
            (
                ["--head", f"--port={port}", "--include-dashboard=false"],
                [f"--address={NODE_IP}:{port}"],
            )
        ):
            with open(root / f"node{i}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [ray_cli, "start", *args, *common],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group, ended at teardown
                    )
                )
            if i == 0:
                _wait_port(NODE_IP, port, procs[0], 120)
        os.environ.update(ray_env)
        address = f"{NODE_IP}:{port}"
        ray.init(address=address, _node_ip_address=NODE_IP, log_to_driver=False)
        end = time.monotonic() + 120
        while sum(n["Alive"] for n in ray.nodes()) < 2:
            assert time.monotonic() < end, "the second Ray node did not join"
            time.sleep(0.5)
        yield Cluster(address, {**env, "RAY_ADDRESS": address})
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        _stop(procs, root)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)


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
