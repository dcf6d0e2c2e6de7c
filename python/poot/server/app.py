"""``create_app``: the ASGI application of ``poot-serve`` (Starlette).

The app owns one ``ServerState``: the model loads in a worker thread started by the lifespan,
so the socket answers (``/health`` 503 ``loading``) while it loads. On shutdown the engine ends
every request (their clients get an error) and its driver stops.

Starlette rather than FastAPI: the routes validate their bodies themselves (pydantic-core, into
OpenAI's error shape), so FastAPI's layer added nothing but its import, about a quarter of a
second of ``poot-serve``'s start (``docs/server.md``, start-up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware

from poot.llm import LLM
from poot.server.config import ServerConfig
from poot.server.errors import exception_handlers
from poot.server.limits import BodyLimit
from poot.server.metrics import Metrics
from poot.server.routes import routes
from poot.server.startup import mark
from poot.server.state import ServerState, load_llm, served_name

__all__ = ["create_app"]


def create_app(
    config: ServerConfig,
    *,
    loader: Callable[[], LLM] | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> Starlette:
    """The server's app.

    Args:
        config: the settings.
        loader: builds the ``LLM`` (default: ``load_llm(config)``); runs in a worker thread.
        on_fatal: called with a message when the model cannot be loaded.
    """
    state = ServerState(config, served_name(config), on_fatal=on_fatal)
    load = loader or (lambda: load_llm(config))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        mark("serving: the event loop runs")
        task = asyncio.create_task(state.load(load))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if state.engine is not None:
                await state.engine.shutdown()

    app = Starlette(
        routes=routes(),
        middleware=[Middleware(BodyLimit, max_bytes=config.max_body_bytes)],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.poot = state
    app.state.metrics = Metrics(state.engine_stats)
    return app
