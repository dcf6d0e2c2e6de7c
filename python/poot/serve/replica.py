"""``PootReplica``: one poot engine in a Ray Serve replica, serving ``poot-serve``'s own app.

The replica loads the model in its constructor (so Serve routes to it only once it can serve),
then builds ``poot.server.create_app`` around it and enters the app's lifespan: the routes,
errors, API key, metrics, queue limits and cancel-by-id are ``poot-serve``'s, unchanged.
``asgi(scope, body)`` runs one HTTP request through that app and streams its ASGI messages
back; its first item names the replica (``("replica", id)``), so the ingress can send a cancel
to where the request runs. When the caller goes away (Serve cancels the stream), the app sees
``http.disconnect``, as under uvicorn, and releases the request's slots and KV blocks.

``check_health`` fails once the runtime is poisoned (a device wait missed its deadline), so
Serve replaces the replica. The ``route`` keyword of ``asgi`` is for the router
(``poot.serve.router``) and unused here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from poot.server.config import ServerConfig

__all__ = ["PootReplica"]

logger = logging.getLogger("poot.serve")

# How long an app given ``http.disconnect`` may take to clean up before it is cancelled.
_CLOSE_GRACE_S = 5.0


class PootReplica:
    """A Serve deployment class (``serve.deployment(PootReplica)``); module docs."""

    async def __init__(self, config: ServerConfig) -> None:  # type: ignore[misc]  # Serve awaits it
        from ray import serve

        from poot.server.app import create_app
        from poot.server.loading import load_llm

        llm = await asyncio.to_thread(load_llm, config)
        self._app = create_app(config, loader=lambda: llm)
        self._stack = contextlib.AsyncExitStack()
        await self._stack.enter_async_context(self._app.router.lifespan_context(self._app))
        state = self._app.state.poot
        while state.status == "loading":
            await asyncio.sleep(0.01)
        if state.status != "ok":
            raise RuntimeError(f"the model cannot be served: {state.error}")
        self.replica_id = serve.get_replica_context().replica_id.to_full_id_str()

    async def asgi(
        self, scope: dict[str, Any], body: bytes, route: Any = None
    ) -> AsyncIterator[Any]:
        """Runs one request through the app; yields ``("replica", id)``, then its messages."""
        yield ("replica", self.replica_id)
        out: asyncio.Queue[MutableMapping[str, Any] | None] = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            await out.put(message)

        task = asyncio.create_task(self._app(scope, receive, send))
        task.add_done_callback(lambda _: out.put_nowait(None))
        try:
            while (message := await out.get()) is not None:
                yield message
            await task
        finally:
            gone.set()
            if not task.done():
                # The caller is gone: the app saw http.disconnect and unwinds (slots, KV);
                # an app that does not is cut off.
                done, _ = await asyncio.wait({task}, timeout=_CLOSE_GRACE_S)
                if not done:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)

    def check_health(self) -> None:
        """Raises once the replica cannot serve (Serve then replaces it)."""
        status = self._app.state.poot.health()
        if status in ("dead", "failed"):
            raise RuntimeError(f"poot replica {self.replica_id} is {status}")

    async def __del__(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()
