"""``poot-serve``: an OpenAI-compatible HTTP server over ``poot.AsyncEngine``.

Modules: ``config`` (``ServerConfig``), ``protocol`` (request bodies), ``params`` (bodies to
engine work), ``generation`` (running it), ``responses`` (OpenAI response and chunk shapes),
``routes``, ``streaming`` (SSE with disconnect detection), ``limits`` (queue, body size, API
key), ``errors`` (OpenAI's error shape), ``metrics`` (Prometheus), ``tools`` and
``tool_parsers`` (function calling: the request side, the families' formats), ``loading`` (the
model sized to memory and budgets), ``state`` (the model, loaded in the background, and
health), ``shutdown`` (draining on SIGTERM), ``app`` (``create_app``), ``startup`` (the
start-up trace), ``uvicorn_core`` (uvicorn's server without its command line) and ``cli``
(``poot-serve``).
Nothing outside this package imports it.
"""

from __future__ import annotations

from poot.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> object:
    if name == "create_app":
        from poot.server.app import create_app

        return create_app
    raise AttributeError(f"module 'poot.server' has no attribute {name!r}")
