"""``poot.AsyncEngine``: an ``LLM`` driven from asyncio, for the server.

``engine.add_request(prompt, params)`` is an async iterator of ``StreamOutput`` (each step's
text delta and new token ids; the last one carries ``finish_reason``). Concurrent requests share
steps (continuous batching): one driver task per event loop runs ``EngineCore.step``
(``llm.core``) in a worker thread (``asyncio.to_thread``; the runtime releases the GIL), one
step at a time, and hands each request its outputs between steps. The engine is a client of
the core and of ``LLM.make_request`` (admission): it touches nothing private of either.

Invariants:
    - The core is only touched by the driver between steps, or by ``EngineCore.step`` in the
      worker thread: requests are added and aborted between steps, never during one.
    - Every request's KV blocks return to the pool however it ends: finished, aborted
      (``abort``), its consumer gone (task cancelled, iterator closed), a failed step,
      ``shutdown``.
    - A request that fails (a bad prompt, a request too big for the pool, a failed step) raises
      its typed error to its own consumer; other requests go on.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from poot.errors import PootError
from poot.llm import LLM, PromptType
from poot.outputs import FinishReason, Logprob
from poot.request import Request
from poot.sampling import SamplingParams

__all__ = ["AsyncEngine", "EngineClosedError", "RequestAbortedError", "StreamOutput"]


class EngineClosedError(PootError, RuntimeError):
    """The engine was shut down before the request finished."""

    hint = "Send the request to a running engine (or restart the server)."


class RequestAbortedError(PootError, RuntimeError):
    """The request was ended by ``AsyncEngine.abort``."""

    hint = "Nothing to fix: the request was cancelled on purpose; send it again if needed."


@dataclass
class StreamOutput:
    """One increment of a streamed request.

    Attributes:
        request_id: the request's id.
        text: the text completed since the previous output (may be empty).
        token_ids: the token ids sampled since the previous output.
        finish_reason: ``"stop"``, ``"length"`` or ``"error"`` (non-finite logits) on the
            last output, else None.
        logprobs: with ``SamplingParams.logprobs`` set, one dict per id in ``token_ids`` (the
            chosen id and the top alternatives); else None.
        stop_reason: on the last output, the stop id or string that ended it, if any.
        prompt_logprobs: with ``SamplingParams.prompt_logprobs`` set, on the first output:
            one entry per prompt token (``RequestOutput.prompt_logprobs``); else None.
    """

    request_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class _Stream:
    request_id: str
    req: Request
    queue: asyncio.Queue[StreamOutput | BaseException]
    added: bool = False
    done: bool = False
    emitted: int = 0


class AsyncEngine:
    """Serves concurrent streamed requests on one ``LLM``.

    The ``LLM`` must not be used directly while the engine has requests.
    """

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._streams: dict[str, _Stream] = {}
        self._to_add: list[_Stream] = []
        self._to_abort: list[_Stream] = []
        self._ids = itertools.count()
        self._stepping = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None

    # ---- public API -----------------------------------------------------------------------

    async def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[StreamOutput]:
        """Yields the request's outputs as steps produce them.

        Raises:
            ContextLengthError, GraphInputError: the prompt is bad, or too big for the pool.
            ValueError: ``request_id`` is already in use.
            EngineClosedError: the engine is shut down.
            PootError: any error of a step the request was in (its blocks are freed).
        """
        if self._closed:
            raise EngineClosedError("the engine is shut down")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in use")
        req = self.llm.make_request(prompt, params or SamplingParams())
        stream = _Stream(rid, req, asyncio.Queue())
        self._streams[rid] = stream
        self._to_add.append(stream)
        self._ensure_driver()
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if not stream.done:
                self._request_abort(stream)

    async def abort(self, request_id: str) -> None:
        """Ends a request and frees its blocks (after the step in flight, if any).

        Its consumer's iteration raises ``RequestAbortedError``. Unknown ids are ignored.
        """
        stream = self._streams.get(request_id)
        if stream is None:
            return
        stream.queue.put_nowait(RequestAbortedError(f"request {request_id!r} was aborted"))
        self._request_abort(stream)
        while request_id in self._streams and self._task is not None and not self._task.done():
            await self._between_steps()

    async def shutdown(self) -> None:
        """Ends every request (their consumers get ``EngineClosedError``) and stops the driver."""
        self._closed = True
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(EngineClosedError("the engine was shut down"))
            self._request_abort(stream)
        if self._task is not None and not self._task.done():
            assert self._wake is not None
            self._wake.set()
            await self._task
        self._apply_aborts()

    @property
    def num_requests(self) -> int:
        """Requests not yet ended."""
        return len(self._streams)

    # ---- the driver -----------------------------------------------------------------------

    def _ensure_driver(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._idle = asyncio.Event()
            self._task = loop.create_task(self._drive())
        assert self._wake is not None
        self._wake.set()

    async def _between_steps(self) -> None:
        assert self._idle is not None
        self._idle.clear()
        await self._idle.wait()

    def _request_abort(self, stream: _Stream) -> None:
        stream.done = True
        self._to_abort.append(stream)
        if not self._stepping:
            self._apply_aborts()
        elif self._wake is not None:
            self._wake.set()

    def _apply_aborts(self) -> None:
        assert not self._stepping
        for stream in self._to_abort:
            if stream in self._to_add:
                self._to_add.remove(stream)
            if stream.added:
                self.llm.core.abort(stream.req.request_id)
            self._streams.pop(stream.request_id, None)
        self._to_abort.clear()

    def _apply_adds(self) -> None:
        for stream in self._to_add:
            try:
                self.llm.core.add_request(stream.req)
            except Exception as e:  # e.g. a request too big for the whole pool
                self._fail(stream, e)
            else:
                stream.added = True
        self._to_add.clear()

    def _fail(self, stream: _Stream, error: BaseException) -> None:
        stream.done = True
        stream.queue.put_nowait(error)
        self._streams.pop(stream.request_id, None)

    def _deliver(self) -> None:
        for stream in list(self._streams.values()):
            req = stream.req
            if stream.done or not stream.added or not req.pending:
                continue
            text = "".join(req.pending)
            req.pending.clear()
            tokens = req.out[stream.emitted :]
            lps = None if req.logprobs is None else req.logprobs[stream.emitted :]
            stream.emitted = len(req.out)
            finish: FinishReason | None = req.finish_reason  # type: ignore[assignment]
            stop = req.stop_reason if finish is not None else None
            # The prompt is whole by the first token: its logprobs go with the first output.
            prompt_lps = req.prompt_logprobs if stream.emitted == len(tokens) else None
            stream.queue.put_nowait(
                StreamOutput(stream.request_id, text, tokens, finish, lps, stop, prompt_lps)
            )
            if finish is not None:
                stream.done = True
                self._streams.pop(stream.request_id, None)

    async def _drive(self) -> None:
        assert self._wake is not None and self._idle is not None
        core = self.llm.core
        while True:
            self._apply_aborts()
            if self._closed:
                self._idle.set()
                return
            self._apply_adds()
            self._idle.set()
            if not core.has_unfinished():
                self._wake.clear()
                if not self._to_add and not self._to_abort:
                    await self._wake.wait()
                continue
            self._stepping = True
            try:
                await asyncio.to_thread(core.step)
            except Exception as e:
                # The step's requests were ended by the core: fail their consumers.
                for stream in list(self._streams.values()):
                    req = stream.req
                    if stream.added and not stream.done and not core.is_live(req.request_id):
                        if req.finish_reason is None:
                            self._fail(stream, e)
            finally:
                self._stepping = False
            self._deliver()
