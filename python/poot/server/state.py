"""The server's model and engine, loaded in the background, and its health.

The listening socket opens before the model loads: ``/health`` answers 503 ``loading`` until
the model is ready, then 200 ``ok``, and 503 ``dead`` once the runtime is poisoned (a device
wait missed its deadline; nothing can run on it again). The ``AsyncEngine`` is only touched
from the event loop. ``live`` maps each HTTP request's id to its engine request ids, for
``POST /v1/requests/{id}/cancel``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from poot.async_engine import AsyncEngine
from poot.checkpoints import DEFAULT_MODEL, DEFAULT_SPEC
from poot.errors import ChatTemplateError, PootError
from poot.llm import LLM
from poot.server.config import ServerConfig
from poot.server.errors import APIError
from poot.server.limits import Admission
from poot.server.loading import load_llm
from poot.server.startup import mark

__all__ = ["Live", "ServerState", "check_chat_template", "load_llm", "served_name"]

logger = logging.getLogger("poot.server")

Status = Literal["loading", "ok", "dead", "failed"]


def served_name(config: ServerConfig) -> str:
    """The model name clients pass (and ``/v1/models`` lists)."""
    if config.served_model_name:
        return config.served_model_name
    if config.model in (None, DEFAULT_SPEC):
        return Path(DEFAULT_MODEL.filename).stem
    path = Path(str(config.model))
    return path.stem if path.suffix == ".gguf" else (path.name or str(config.model))


@dataclass
class Live:
    """One HTTP request in flight: its engine request ids and whether it was cancelled."""

    engine_ids: list[str]
    cancelled: bool = False
    shutdown: bool = False  # cancelled by a graceful shutdown: streams end with an error


@dataclass
class ServerState:
    config: ServerConfig
    model_name: str
    status: Status = "loading"
    error: str | None = None
    llm: LLM | None = None
    engine: AsyncEngine | None = None
    admission: Admission | None = None
    live: dict[str, Live] = field(default_factory=dict)
    on_fatal: Callable[[str], None] | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False  # a graceful shutdown started: nothing new is admitted
    drain_task: asyncio.Future[None] | None = None

    async def load(self, loader: Callable[[], LLM]) -> None:
        """Loads the model in a worker thread; a failure is fatal (``on_fatal``)."""
        try:
            llm = await asyncio.to_thread(loader)
        except (PootError, OSError) as e:
            self._fatal(" ".join(str(e).split()) or type(e).__name__)
            return
        except Exception as e:
            logger.exception("loading the model failed")
            self._fatal(f"{type(e).__name__}: {e}")
            return
        self.llm = llm
        self.engine = AsyncEngine(llm)
        self.admission = Admission(llm.max_num_seqs, self.config.max_queue)
        self.status = "ok"
        mark("ready: /health answers 200")
        logger.info("ready: %r serving as %r", llm, self.model_name)

    def _fatal(self, message: str) -> None:
        self.status = "failed"
        self.error = message
        logger.error("cannot serve: %s", message)
        if self.on_fatal is not None:
            self.on_fatal(message)

    def health(self) -> Status:
        """``loading``, ``ok``, ``dead`` (the runtime is poisoned) or ``failed``."""
        if self.status == "ok" and self.llm is not None:
            if self.llm.runtime.health().get("status") != "ok":
                self.status = "dead"
        return self.status

    def ready(self) -> tuple[LLM, AsyncEngine, Admission]:
        """The model, engine and admission gate, or a 503 ``APIError`` when not serving."""
        if self.draining:
            from poot.server.shutdown import shutting_down_error

            raise shutting_down_error()
        status = self.health()
        if status == "ok":
            assert self.llm is not None and self.engine is not None
            assert self.admission is not None
            return self.llm, self.engine, self.admission
        if status == "loading":
            raise APIError(
                503,
                "the model is still loading",
                type="server_error",
                code="model_loading",
                headers={"Retry-After": "1"},
            )
        raise APIError(
            503,
            f"the server cannot serve: {self.error or 'the runtime is poisoned'}",
            type="server_error",
            code="runtime_dead",
        )

    def engine_stats(self) -> dict[str, int] | None:
        """The engine's counters for ``/metrics`` (None while loading)."""
        if self.llm is None:
            return None
        s = dict(self.llm.stats())
        if self.admission is not None:
            s["queue_depth"] = self.admission.waiting
            s["running"] = self.admission.in_use
        return s


def check_chat_template(llm: LLM) -> None:
    """Raises ``ChatTemplateError`` when the model has no chat template."""
    if llm.tokenizer.chat_template is None:
        raise ChatTemplateError(
            f"{llm.files.path} has no chat template; start the server with --chat-template "
            "or use /v1/completions"
        )
