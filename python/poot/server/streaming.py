"""An SSE response that notices a client disconnect at once and always cleans up.

Starlette's ``StreamingResponse`` (ASGI 2.4) notices a disconnect only at its next write, and
leaves closing the body's async generator to the garbage collector. ``EventStream`` listens for
``http.disconnect`` while it streams, cancels the stream on one, closes the body generator
itself, and calls ``on_close`` exactly once however the response ends, so a request's queue
slots and engine requests are released when its client goes away, not one token later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["EventStream", "until_disconnect"]

logger = logging.getLogger("poot.server")

T = TypeVar("T")


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStream(Response):
    """``text/event-stream`` from an async generator of encoded events."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        *,
        on_disconnect: Callable[[], None],
        on_close: Callable[[], None],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self._on_disconnect = on_disconnect
        self._on_close = on_close
        self.init_headers({"Cache-Control": "no-cache", **(headers or {})})

    async def _stream(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.create_task(self._stream(send))
        watching = asyncio.create_task(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({streaming, watching}, return_when=asyncio.FIRST_COMPLETED)
            if streaming not in done:
                self._on_disconnect()
            streaming.cancel()
            watching.cancel()
            await asyncio.gather(streaming, watching, return_exceptions=True)
            if streaming in done and not streaming.cancelled():
                error = streaming.exception()
                if isinstance(error, OSError):  # the write failed: the client is gone
                    self._on_disconnect()
                elif error is not None:
                    logger.error("streaming a response failed", exc_info=error)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self._on_close()


async def until_disconnect(receive: Receive, work: asyncio.Future[T]) -> T | None:
    """Awaits ``work``; returns None (``work`` cancelled and awaited) if the client goes away
    first."""
    watching = asyncio.create_task(_wait_disconnect(receive))
    try:
        both: set[asyncio.Future[Any]] = {work, watching}
        done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return None
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
