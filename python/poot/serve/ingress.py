"""``PootIngress``: the HTTP entry of a poot Serve application.

Serve's HTTP proxy hands each request to an ingress replica, which reads the body, computes the
prompt's prefix keys (``poot.serve.prefix``) and forwards the request (ASGI scope and body) to
an engine replica through a ``DeploymentHandle`` whose router is ``PrefixRouter``. The engine
replica answers with ``poot-serve``'s app (``poot.serve.replica``); the ingress streams its
messages back unchanged. The ingress itself answers only what spans replicas:

- ``GET /health``: 200 ``ok`` while any replica is ok (with each replica's status), else the
  first non-ok status (``loading``, ``draining``, ``dead``) with 503.
- ``GET /metrics``: every replica's ``/metrics`` with a ``replica`` label on each sample.
- ``POST /v1/requests/{id}/cancel``: sent to the replica that runs request ``id`` (the
  ingress gives every completion an ``X-Request-Id`` before forwarding: the client's, else
  Serve's id of the request, which Serve's proxy answers as ``X-Request-ID``; and remembers
  where it went while it runs).

Every forwarded response carries ``X-Poot-Replica``, the replica (Serve's full replica id, the
name of its Ray actor) that answered it.

Faults: an engine replica that dies before answering gives 503 ``replica_failed``; one that
dies while streaming ends the stream with an error event in OpenAI's shape and
``data: [DONE]``. No request outlives the server's request timeout (plus ``_GRACE_S``): the
wait for every message is bounded, including the wait for a replica to take the request.
Invariants: each forwarded request is removed from ``live`` however it ends; the downstream
stream is cancelled when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from poot.serve.prefix import prefix_hashes, prompt_text
from poot.serve.routing import Route, replica_ids
from poot.server.config import ServerConfig
from poot.server.errors import APIError
from poot.server.metrics import CONTENT_TYPE
from poot.server.responses import sse

__all__ = ["PootIngress"]

logger = logging.getLogger("poot.serve")

_GRACE_S = 10.0
_CANCEL = re.compile(r"/v1/requests/([^/]+)/cancel")
_ID_PREFIX = {"/v1/completions": "cmpl", "/v1/chat/completions": "chatcmpl"}
_DONE = b"data: [DONE]\n\n"


def _replica_failed(what: str) -> APIError:
    return APIError(
        503,
        f"the engine replica {what}; send the request again",
        type="server_error",
        code="replica_failed",
        headers={"Retry-After": "1"},
    )


def _timed_out() -> APIError:
    return APIError(
        504,
        "the request took longer than the server's request timeout",
        type="server_error",
        code="request_timeout",
    )


def _serve_request_id() -> str:
    """Serve's id of the request being handled: its proxy answers it as ``X-Request-ID``
    whatever the app says, so a request the client gave no id runs under this one."""
    try:
        from ray.serve.context import _get_serve_request_context  # no public accessor

        return str(_get_serve_request_context().request_id or "")
    except (ImportError, AttributeError):
        return ""


def _scope(request: Request, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The parts of an HTTP scope the app reads, picklable; ``path`` below any route prefix."""
    s = request.scope
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": s.get("http_version", "1.1"),
        "method": s["method"],
        "scheme": s.get("scheme", "http"),
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": s.get("query_string", b""),
        "headers": headers,
        "client": s.get("client"),
        "server": s.get("server"),
    }


class _Relabelled(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def merge_metrics(texts: dict[str, str]) -> bytes:
    """Each replica's exposition, merged: every sample gains a ``replica`` label."""
    merged: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type)
            for sample in family.samples:
                into.add_sample(sample.name, {"replica": replica, **sample.labels}, sample.value)
    registry = CollectorRegistry()
    registry.register(_Relabelled(list(merged.values())))
    return generate_latest(registry)


class _Forwarded(Response):
    """Streams an engine replica's messages to the client (module docs, faults)."""

    def __init__(
        self,
        start: dict[str, Any],
        rest: AsyncIterator[Any],
        next_message: Any,
        on_close: Any,
    ) -> None:
        self.status_code = int(start["status"])
        self.background = None
        self._start = start
        self._rest = rest
        self._next = next_message
        self._on_close = on_close
        self._sse = any(
            k.lower() == b"content-type" and v.startswith(b"text/event-stream")
            for k, v in start.get("headers", [])
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(self._start)
            while True:
                try:
                    message = await self._next()
                except StopAsyncIteration:
                    break
                except Exception as e:
                    error = _timed_out() if isinstance(e, TimeoutError) else None
                    if error is None:
                        logger.warning("engine replica failed mid-response: %s", e)
                        error = _replica_failed("serving this request failed")
                    if self._sse:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": sse(error.body()) + _DONE,
                                "more_body": True,
                            }
                        )
                    break
                if message.get("type") == "http.response.body":
                    await send({**message, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self._on_close()


class PootIngress:
    """A Serve deployment class: the application's HTTP ingress (module docs)."""

    def __init__(self, engine: Any, config: ServerConfig, deployment: str) -> None:
        from ray import serve

        self._engine = engine.options(stream=True)
        self._config = config
        self._app = serve.get_replica_context().app_name
        self._deployment = deployment
        self._live: dict[str, str] = {}

    async def _call(self, scope: dict[str, Any], body: bytes, route: Route) -> Any:
        return self._engine.asgi.remote(scope, body, route=route)

    async def _fetch(self, path: str, pin: str, timeout_s: float) -> tuple[int, bytes]:
        """One GET through the app of replica ``pin``: (status, body); (0, b"") on failure."""
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [],
            "client": None,
            "server": None,
        }
        gen = await self._call(scope, b"", Route(pin=pin))
        status, chunks = 0, []
        try:
            async with asyncio.timeout(timeout_s):
                async for item in gen:
                    if isinstance(item, tuple):
                        if item[1] != pin:
                            return 0, b""
                    elif item["type"] == "http.response.start":
                        status = int(item["status"])
                    elif item["type"] == "http.response.body":
                        chunks.append(item.get("body", b""))
        except Exception as e:
            logger.warning("replica %s did not answer %s: %r", pin, path, e)
            return 0, b""
        finally:
            gen.cancel()
        return status, b"".join(chunks)

    async def _replicas(self) -> list[str]:
        ids = replica_ids(self._app, self._deployment)
        if not ids:  # no call made yet: the handle's router starts with the first one
            await self._fetch("/health", "", 10.0)
            ids = replica_ids(self._app, self._deployment)
        return ids

    async def _each(self, path: str) -> dict[str, tuple[int, bytes]]:
        # One replica after the other: calls made while serving one request share its
        # internal request id, by which Serve's router hands a chosen replica to a waiting
        # call, so concurrent pinned calls could be handed each other's replica.
        return {r: await self._fetch(path, r, 10.0) for r in await self._replicas()}

    async def _health(self) -> Response:
        statuses: dict[str, str] = {}
        for replica, (code, raw) in (await self._each("/health")).items():
            try:
                statuses[replica] = str(json.loads(raw)["status"]) if code else "unreachable"
            except (ValueError, KeyError, TypeError):
                statuses[replica] = "unreachable"
        if any(s == "ok" for s in statuses.values()):
            return JSONResponse({"status": "ok", "replicas": statuses})
        first = next(iter(statuses.values()), "loading")
        return JSONResponse({"status": first, "replicas": statuses}, 503)

    async def _metrics(self) -> Response:
        texts = {
            r: raw.decode() for r, (code, raw) in (await self._each("/metrics")).items() if code
        }
        return Response(merge_metrics(texts), media_type=CONTENT_TYPE)

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._handle(request)
        except APIError as e:
            return e.response()

    async def _handle(self, request: Request) -> Response:
        t0 = time.monotonic()
        method = request.method
        # Under a route prefix (serve.run(..., route_prefix="/x")) Serve keeps it in the path
        # and names it in root_path: the app's routes are below it.
        path, root = request.scope["path"], request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if method == "GET" and path == "/health":
            return await self._health()
        if method == "GET" and path == "/metrics":
            return await self._metrics()
        headers = [(k.lower(), v) for k, v in request.scope.get("headers", [])]
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > self._config.max_body_bytes:  # the app refuses it (413)
                break
        route = Route()
        rid: str | None = None
        cancel = _CANCEL.fullmatch(path) if method == "POST" else None
        if cancel is not None:
            route = Route(pin=self._live.get(cancel.group(1)))
        elif method == "POST" and path in _ID_PREFIX:
            given = [v for k, v in headers if k == b"x-request-id"]
            if given:
                rid = given[0].decode("latin-1")
                if rid in self._live:
                    raise APIError(
                        409,
                        f"a request with id {rid!r} is already running",
                        param="X-Request-Id",
                        code="duplicate_request_id",
                    )
            else:
                rid = _serve_request_id() or f"{_ID_PREFIX[path]}-{uuid.uuid4().hex}"
                headers.append((b"x-request-id", rid.encode()))
            text = prompt_text(body)
            route = Route(prefix=tuple(prefix_hashes(text)) if text else ())
        deadline = t0 + self._config.request_timeout_s + _GRACE_S
        if rid is not None:
            self._live[rid] = ""
        try:
            return await self._forward(_scope(request, path, headers), body, route, rid, deadline)
        except BaseException:
            if rid is not None:
                self._live.pop(rid, None)
            raise

    async def _forward(
        self,
        scope: dict[str, Any],
        body: bytes,
        route: Route,
        rid: str | None,
        deadline: float,
    ) -> Response:
        gen = await self._call(scope, body, route)

        async def next_message() -> Any:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                return await gen.__anext__()

        async def close() -> None:
            gen.cancel()
            if rid is not None:
                self._live.pop(rid, None)

        try:
            first = await next_message()
            replica = str(first[1]) if isinstance(first, tuple) else ""
            if rid is not None:
                self._live[rid] = replica
            start = await next_message()
            # Which replica answered: for logs, and for a client that wants to know.
            # Serve's proxy adds X-Request-ID itself (the same id): not twice.
            kept = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"x-request-id"]
            start = {**start, "headers": [*kept, (b"x-poot-replica", replica.encode())]}
        except BaseException as e:
            await close()
            if isinstance(e, TimeoutError):
                raise _timed_out() from None
            if isinstance(e, StopAsyncIteration | Exception):
                logger.warning("engine replica failed before answering: %s", e)
                raise _replica_failed("failed before answering") from None
            raise
        return _Forwarded(start, gen, next_message, close)
