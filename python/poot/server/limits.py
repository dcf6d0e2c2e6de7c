"""Admission, body size and API keys: what the server refuses before any work starts.

``Admission`` is the bounded queue in front of the engine. A request takes as many slots as
completions it asks for (``n`` per prompt); ``slots`` of them run at once (the engine's rows),
and at most ``max_waiting`` requests wait, first come first served. One more is refused at once
with 429 and ``Retry-After``; a request that waits longer than its queue timeout gets 503.
Invariants: slots taken equal slots released (``release`` is called exactly once per grant, in
a ``finally``), and a waiter that gives up (timeout, disconnect) leaves no slot behind.

``BodyLimit`` is pure ASGI middleware: a declared ``Content-Length`` above the limit is refused
before the body is read, and a chunked body is counted as it arrives and cut off at the limit,
so a huge body never sits in memory.

``check_api_key`` compares the bearer token in constant time (``hmac.compare_digest``), so the
time to refuse a key says nothing about how much of it was right.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import deque
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from poot.server.errors import APIError, error_body

__all__ = ["Admission", "BodyLimit", "Grant", "check_api_key"]


@dataclass
class Grant:
    """Slots held by one admitted request; ``release`` gives them back once."""

    admission: Admission
    slots: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release(self.slots)


class Admission:
    """A FIFO gate of ``slots`` concurrent units with at most ``max_waiting`` waiters."""

    def __init__(self, slots: int, max_waiting: int, retry_after_s: int = 1) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self._free = slots
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.closed = False

    def close(self) -> None:
        """Refuses every waiter and later request with 503 ``server_shutting_down``."""
        from poot.server.shutdown import shutting_down_error

        self.closed = True
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(shutting_down_error())

    @property
    def waiting(self) -> int:
        """Requests waiting for slots."""
        return len(self._waiters)

    @property
    def in_use(self) -> int:
        """Slots held by running requests."""
        return self.slots - self._free

    async def acquire(self, n: int, timeout_s: float) -> Grant:
        """Waits for ``n`` slots (at most ``slots``; a bigger ask takes them all).

        Raises:
            APIError: 429 when the queue is full; 503 after ``timeout_s`` of waiting.
        """
        n = max(1, min(n, self.slots))
        if self.closed:
            from poot.server.shutdown import shutting_down_error

            raise shutting_down_error()
        if not self._waiters and self._free >= n:
            self._free -= n
            return Grant(self, n)
        if len(self._waiters) >= self.max_waiting:
            raise APIError(
                429,
                f"the server's queue is full ({self.max_waiting} requests waiting); retry later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except BaseException as e:
            if fut.done() and not fut.cancelled():
                if fut.exception() is None:
                    self._release(n)  # granted just as we gave up: hand the slots on
            else:
                fut.cancel()
                self._waiters.remove(entry)
                self._wake()
            if isinstance(e, TimeoutError):
                raise APIError(
                    503,
                    f"the request waited {timeout_s:g} s in the queue without being scheduled",
                    type="server_error",
                    code="queue_timeout",
                    headers={"Retry-After": str(self.retry_after_s)},
                ) from None
            raise
        return Grant(self, n)

    def _release(self, n: int) -> None:
        self._free += n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._free:
            n, fut = self._waiters.popleft()
            self._free -= n
            fut.set_result(None)


class BodyLimit:
    """Refuses request bodies above ``max_bytes`` with 413 in OpenAI's error shape."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.max_bytes:
                    await self._refuse(send, declared)
                    return
        seen = 0
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted_receive, guarded_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, seen)

    async def _refuse(self, send: Send, size: int) -> None:
        what = f"{size} bytes" if size >= 0 else "an invalid Content-Length"
        body = json.dumps(
            error_body(
                f"the request body ({what}) is larger than the limit of {self.max_bytes} bytes",
                code="request_too_large",
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def check_api_key(authorization: str | None, api_key: str) -> None:
    """Raises a 401 ``APIError`` unless ``authorization`` is ``Bearer <api_key>``."""
    given = b""
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer":
            given = token.strip().encode()
    if not hmac.compare_digest(given, api_key.encode()):
        raise APIError(
            401,
            "missing or incorrect API key; send it as 'Authorization: Bearer <key>'",
            code="invalid_api_key",
        )
