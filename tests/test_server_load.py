"""A bounded load test: 64 concurrent streaming clients for ``POOT_SERVER_LOAD_S`` seconds
(default 30) against a real ``poot-serve`` on loopback, with random cancels (by request id),
disconnects and non-streamed requests mixed in.

What must hold: every request ends with a defined outcome (a finish reason and ``[DONE]``, a
cancel, or the client's own disconnect; no errors), the server's per-outcome counters add up to
the requests sent, it stays healthy throughout, KV blocks in use return to zero, and its log
has no errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import httpx
from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines

from poot.server.metrics import OUTCOMES

MODEL = "stories260K-f32"
CLIENTS = 64
PROMPTS = ["Once upon a time", "The cat sat on", "Lily and Tom", "One day, a big", "The sun"]


def _duration() -> float:
    return float(os.environ.get("POOT_SERVER_LOAD_S", "30"))


async def _client(
    http: httpx.AsyncClient, cid: int, end: float, sent: Counter[str], seen: Counter[str]
) -> None:
    rng = random.Random(cid)
    i = 0
    while time.monotonic() < end:
        i += 1
        action = rng.choice(["full", "full", "full", "disconnect", "cancel", "whole"])
        rid = f"load-{cid}-{i}"
        body = {
            "model": MODEL,
            "prompt": rng.choice(PROMPTS),
            "max_tokens": rng.randint(4, 96),
            "temperature": rng.choice([0.0, 0.8]),
            "seed": rng.randint(0, 1000),
            "stream": action != "whole",
        }
        headers = {"X-Request-Id": rid}
        sent["requests"] += 1
        if action == "whole":
            r = await http.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            seen["finished"] += 1
            continue
        stop_after = rng.randint(1, 8)
        finish, chunks, done = None, 0, False
        async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                assert "error" not in event, event
                chunks += 1
                finish = event["choices"][0]["finish_reason"] or finish
                if chunks == stop_after and finish is None:
                    if action == "disconnect":
                        break  # leaving the block closes the connection
                    if action == "cancel":
                        c = await http.post(f"/v1/requests/{rid}/cancel")
                        assert c.status_code in (200, 404), c.text  # 404: it just finished
        if action == "disconnect" and not done:
            seen["disconnected"] += 1
            continue
        assert done, (action, chunks)
        assert finish in ("stop", "length", "cancelled"), finish
        seen["cancelled" if finish == "cancelled" else "finished"] += 1


async def _watch_health(http: httpx.AsyncClient, end: float, bad: list[int]) -> None:
    while time.monotonic() < end:
        r = await http.get("/health")
        if r.status_code != 200:
            bad.append(r.status_code)
        await asyncio.sleep(0.5)


def test_64_streaming_clients(stories: Path) -> None:
    # 16 rows, so the 64 clients also queue (the fitted server would give each a row).
    srv = ServerProcess(
        ["--model", str(stories / "stories260K-f32.gguf")], env={"POOT_SERVE_MAX_ROWS": "16"}
    )
    try:
        sent: Counter[str] = Counter()
        seen: Counter[str] = Counter()
        bad_health: list[int] = []

        async def main() -> None:
            limits = httpx.Limits(max_connections=CLIENTS * 2 + 4)
            async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as http:
                end = time.monotonic() + _duration()
                await asyncio.gather(
                    _watch_health(http, end, bad_health),
                    *(_client(http, i, end, sent, seen) for i in range(CLIENTS)),
                )

        asyncio.run(main())
        assert not bad_health
        assert sent["requests"] >= CLIENTS
        assert sum(seen.values()) == sent["requests"]
        assert seen["cancelled"] > 0 and seen["disconnected"] > 0

        def counted() -> dict[str, float]:
            return {
                o: srv.metric("poot_requests_total", f'outcome="{o}",route="completions"')
                for o in OUTCOMES
            }

        end = time.monotonic() + 30
        while sum(counted().values()) < sent["requests"] and time.monotonic() < end:
            time.sleep(0.1)
        by_outcome = counted()
        print(f"load: {dict(sent)} client-side {dict(seen)} server-side {by_outcome}")
        assert sum(by_outcome.values()) == sent["requests"], by_outcome
        for outcome in ("timeout", "rejected", "invalid", "error"):
            assert by_outcome[outcome] == 0, by_outcome
        assert by_outcome["cancelled"] == seen["cancelled"]
        assert srv.wait_metric("poot_kv_blocks_used", 0) == 0
        assert srv.metric("poot_queue_depth") == 0
        assert httpx.get(f"{srv.url}/health").status_code == 200
    finally:
        code = srv.stop()
    assert code in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()
