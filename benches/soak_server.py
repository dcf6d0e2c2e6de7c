"""Soak ``poot-serve``: many mixed requests from concurrent clients, and what the server holds.

``python benches/soak_server.py [--requests 5000] [--clients 32] [--model PATH]`` starts a real
server (the default model unless ``--model``), then sends requests of five kinds in a fixed,
seeded mix: short and long completions, streamed chats, streams the client cancels after a
few events, and guided (JSON schema) chats. It samples the server's resident memory
(``/proc/PID/status`` VmRSS), open file descriptors (``/proc/PID/fd``) and KV blocks in use
(``/metrics``) at the start, after warm-up (10% of the requests), at the middle and at the end,
and prints them with each kind's outcomes.

The server's rows are capped at ``--rows`` (default: one per client, through
``POOT_SERVE_MAX_ROWS``) at ``--max-model-len`` (default 512), which caps its KV pool at that
many full sequences. The pool's pages are touched as blocks are first used, and freed full
blocks stay in the prefix cache until evicted, so resident memory grows until every block has
been used once; with the pool fitted to all free memory (the server's default) that takes far
longer than a soak and the growth is the cache filling, not a leak. A pool of ``rows *
max_model_len`` tokens is cycled during warm-up, so growth after it means a leak.

It fails (exit 1) when a request has no defined outcome (not 200/429/503/504 or a cancel the
client made), when KV blocks are not back to zero at the end, when open descriptors grew past
warm-up by more than ``FD_SLACK``, or resident memory by more than ``RSS_SLACK`` of the warm-up
figure. Not a unit test (it runs for minutes); run it by hand or from ``make bench`` hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from server_process import CLEAN_EXIT, ServerProcess  # noqa: E402

FD_SLACK = 8
RSS_SLACK = 0.10
KINDS = ("short", "long", "stream", "cancel", "guided")
DEFINED = {200, 429, 503, 504}
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def _sample(srv: ServerProcess) -> dict[str, float]:
    pid = srv.proc.pid
    rss_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    return {
        "rss_mib": rss_kib / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "kv_blocks": srv.metric("poot_kv_blocks_used"),
    }


async def _one(http: httpx.AsyncClient, kind: str, name: str, rng: random.Random) -> str:
    prompt = rng.choice(["Once upon a time", "The capital of France is", "Write a haiku."])
    chat = {"model": name, "messages": [{"role": "user", "content": prompt}]}
    if kind == "short":
        r = await http.post("/v1/completions", json={"model": name, "prompt": prompt,
                                                     "max_tokens": 4})  # fmt: skip
        return str(r.status_code)
    if kind == "long":
        body = {"model": name, "prompt": prompt, "max_tokens": 128, "ignore_eos": True}
        r = await http.post("/v1/completions", json=body)
        return str(r.status_code)
    if kind == "guided":
        body = {**chat, "max_tokens": 16, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}  # fmt: skip
        r = await http.post("/v1/chat/completions", json=body)
        if r.status_code == 200:
            json.loads(r.json()["choices"][0]["message"]["content"])  # must parse
        return str(r.status_code)
    body = {**chat, "max_tokens": 48, "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return str(r.status_code)
        events = 0
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events += 1
                if kind == "cancel" and events >= 3:
                    return "cancelled"  # leaving the block closes the stream
        return "200"


async def _run(srv: ServerProcess, n: int, clients: int, name: str) -> dict[str, Any]:
    rng = random.Random(0)
    plan = [rng.choice(KINDS) for _ in range(n)]
    outcomes: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    samples: dict[str, dict[str, float]] = {"start": _sample(srv)}
    marks = {max(1, n // 10): "warm", n // 2: "middle"}
    done = 0
    queue: asyncio.Queue[str] = asyncio.Queue()
    for kind in plan:
        queue.put_nowait(kind)

    async def client(seed: int) -> None:
        nonlocal done
        crng = random.Random(seed)
        async with httpx.AsyncClient(base_url=srv.url, timeout=300) as http:
            while not queue.empty():
                kind = queue.get_nowait()
                try:
                    outcome = await _one(http, kind, name, crng)
                except (httpx.HTTPError, ValueError, KeyError) as e:
                    outcome = f"error:{type(e).__name__}"
                outcomes[kind][outcome] += 1
                done += 1
                if (point := marks.get(done)) is not None:
                    samples[point] = await asyncio.to_thread(_sample, srv)

    await asyncio.gather(*(client(i) for i in range(clients)))
    await asyncio.sleep(1)  # cancelled streams' rows are freed by the next step
    samples["end"] = await asyncio.to_thread(_sample, srv)
    return {"outcomes": outcomes, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--model", default=None, help="a GGUF path (default: the default model)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None, help="rows (default: --clients)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument(
        "--chat-template", default=None, help="for a --model without one (e.g. stories260K)"
    )
    args = ap.parse_args(argv)
    cmd = ["--served-model-name", "soak", "--max-queue", str(4 * args.clients)]
    cmd += ["--max-model-len", str(args.max_model_len)]
    rows = args.rows or args.clients
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.chat_template:
        cmd += ["--chat-template", args.chat_template]
    srv = ServerProcess(cmd, env={"POOT_SERVE_MAX_ROWS": str(rows)})
    print(f"rows {rows}, KV pool {srv.metric('poot_kv_blocks_total'):.0f} blocks", flush=True)
    try:
        report = asyncio.run(_run(srv, args.requests, args.clients, "soak"))
    finally:
        code = srv.stop()
    samples, outcomes = report["samples"], report["outcomes"]
    print(f"{'point':<8} {'rss MiB':>9} {'fds':>5} {'kv blocks':>10}")
    for point, s in samples.items():
        print(f"{point:<8} {s['rss_mib']:>9.1f} {s['fds']:>5} {s['kv_blocks']:>10.0f}")
    problems = []
    for kind, counts in outcomes.items():
        print(f"{kind:<8} " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        undefined = {k: v for k, v in counts.items() if k != "cancelled" and int(
            k if k.isdigit() else 0) not in DEFINED}  # fmt: skip
        if undefined:
            problems.append(f"{kind}: outcomes without a definition {undefined}")
    warm, end = samples.get("warm", samples["start"]), samples["end"]
    if end["kv_blocks"] != 0:
        problems.append(f"{end['kv_blocks']:.0f} KV blocks still held at the end")
    if end["fds"] > warm["fds"] + FD_SLACK:
        problems.append(f"open descriptors grew from {warm['fds']} to {end['fds']}")
    if end["rss_mib"] > warm["rss_mib"] * (1 + RSS_SLACK):
        problems.append(
            f"resident memory grew from {warm['rss_mib']:.0f} to {end['rss_mib']:.0f} MiB"
        )
    if code not in CLEAN_EXIT:
        problems.append(f"the server exited with {code}")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
