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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from poot.async_engine import AsyncEngine
from poot.checkpoints import DEFAULT_MODEL, DEFAULT_SPEC, resolve_model_files
from poot.driver_options import DriverOptions, kv_block_bytes
from poot.errors import ChatTemplateError, PootError
from poot.llm import LLM
from poot.numerics import numerics_for
from poot.server.config import ServerConfig
from poot.server.errors import APIError
from poot.server.limits import Admission

__all__ = ["Live", "ServerState", "check_chat_template", "load_llm", "served_name"]

logger = logging.getLogger("poot.server")

Status = Literal["loading", "ok", "dead", "failed"]


def _available_bytes() -> int:
    """Memory the OS can give without swapping (MemAvailable), or 0 where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def load_llm(config: ServerConfig) -> LLM:
    """Resolves (pulling the default model if needed) and loads the model, its KV pool sized by
    ``DriverOptions.fit`` to the memory free after the weights, capped by
    ``config.kv_cache_bytes``; with progress bars where ``config.progress``.

    Raises:
        PootError: the model cannot be found or loaded, or the memory does not hold one
            sequence.
    """
    files = resolve_model_files(config.model, progress=config.progress)
    h = files.hparams
    max_model_len = config.max_model_len or min(h.context_length, 4096)
    entry_bytes = 2 if numerics_for("auto", files) == "ggml" else 4
    reserve = 0.1
    block_size = DriverOptions().block_size
    # fit keeps ``reserve`` of what it is given back, so the cap is scaled up to stay exact.
    free = int(config.kv_cache_bytes / (1 - reserve))
    available = _available_bytes() - files.total_bytes
    if available > 0:
        free = min(free, available)
    # No more than ``max_num_seqs`` full-length sequences can use: the pool is allocated
    # (and touched) up front, so a tiny model must not take the whole cap.
    blocks = config.max_num_seqs * -(-max_model_len // block_size)
    free = min(free, int(blocks * kv_block_bytes(h, block_size, entry_bytes) / (1 - reserve)) + 1)
    opts = DriverOptions.fit(
        h,
        free,
        reserve,
        max_model_len=max_model_len,
        entry_bytes=entry_bytes,
        block_size=block_size,
        max_rows=config.max_num_seqs,
    )
    # fit counts rows as full-length sequences; most requests are far shorter, so the rows
    # asked for are kept and the scheduler preempts if the pool ever runs out.
    opts = opts.with_overrides(max_num_seqs=min(config.max_num_seqs, opts.max_step_tokens))
    llm = LLM(
        str(files.path),
        threads=config.threads,
        max_model_len=max_model_len,
        driver=opts,
        timeout_s=config.step_timeout_s,
        backend="cuda"
        if config.backend == "cuda"
        else "wgpu"
        if config.backend == "wgpu"
        else "cpu",
        progress=config.progress,
    )
    if config.chat_template is not None:
        llm.tokenizer.chat_templates["default"] = config.chat_template
    return llm


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
