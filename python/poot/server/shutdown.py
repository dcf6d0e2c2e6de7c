"""Graceful shutdown: drain on the first SIGTERM/SIGINT, exit at once on the second.

On the first signal the server stops admitting (every new request, and every request still
waiting for a row, is answered 503 ``shutting_down`` with ``Retry-After``), lets running
requests finish for up to ``--shutdown-timeout`` seconds, then cancels the rest: each of
their streams ends with a final error event (``server_shutting_down``) and ``[DONE]``, and
each engine request is aborted, which frees its KV blocks. Then uvicorn closes the socket,
the engine stops and the process exits 0. A second signal while draining exits at once
(status 1) without waiting for anything.

Invariants: the drain runs once; after it no request is live and the scheduler holds no
block (the log's ``shutdown:`` line says how many requests finished and how many were
cancelled, and the blocks still used, which is 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from types import FrameType
from typing import TYPE_CHECKING

from poot.server.errors import APIError
from poot.server.uvicorn_core import Config, Server

if TYPE_CHECKING:
    from poot.server.state import ServerState

__all__ = ["DrainingServer", "drain", "shutting_down_error"]

logger = logging.getLogger("poot.server")

# How long cancelled streams get to write their final event before uvicorn takes over.
_CANCEL_GRACE_S = 5.0


def shutting_down_error() -> APIError:
    """The 503 a request gets once the server drains."""
    return APIError(
        503,
        "the server is shutting down",
        type="server_error",
        code="server_shutting_down",
        headers={"Retry-After": "5"},
    )


async def drain(state: ServerState, timeout_s: float) -> None:
    """Stops admitting, waits up to ``timeout_s`` for live requests, cancels the rest."""
    state.draining = True
    if state.admission is not None:
        state.admission.close()
    started = len(state.live)
    end = time.monotonic() + timeout_s
    while state.live and time.monotonic() < end:
        await asyncio.sleep(0.05)
    cancelled = len(state.live)
    for live in list(state.live.values()):
        live.shutdown = True
        if state.engine is not None:
            for eid in list(live.engine_ids):
                await state.engine.abort(eid)
    end = time.monotonic() + _CANCEL_GRACE_S
    while state.live and time.monotonic() < end:
        await asyncio.sleep(0.02)
    used = state.llm.scheduler.used_blocks if state.llm is not None else 0
    logger.info(
        "shutdown: %d requests finished, %d cancelled, %d KV blocks still used",
        started - cancelled,
        cancelled,
        used,
    )


class DrainingServer(Server):
    """uvicorn's server with poot's signal handling (see the module docs)."""

    def __init__(self, config: Config, state: ServerState, timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.timeout_s = timeout_s
        self._signalled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:
            logger.warning("second %s: exiting now", signal.Signals(sig).name)
            os._exit(1)
        self._signalled = True
        logger.info(
            "%s: draining (up to %g s), then exiting", signal.Signals(sig).name, self.timeout_s
        )
        if self._loop is None or self.state.status != "ok":
            self.should_exit = True  # nothing is served yet: nothing to drain
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        task = asyncio.ensure_future(self._drain())
        self.state.drain_task = task

    async def _drain(self) -> None:
        try:
            await drain(self.state, self.timeout_s)
        finally:
            self.should_exit = True
