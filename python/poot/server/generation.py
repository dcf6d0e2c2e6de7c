"""Running one HTTP request's engine requests and merging their outputs.

``run_job`` starts one task per completion (``n`` per prompt), each iterating
``AsyncEngine.add_request``, and yields their outputs as ``Event``s in arrival order. It ends
in exactly one of: every completion finished (``stop``, ``length``, ``error``, or ``cancelled``
when ``POST /v1/requests/{id}/cancel`` ended it), an ``APIError`` (a typed engine error, or the
request's total timeout), or the consumer stopping early (a disconnect). However it ends, every
task is cancelled and awaited before ``run_job`` returns, and a cancelled task's engine request
is aborted by ``add_request`` itself, so its KV blocks go back to the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from poot.async_engine import AsyncEngine, RequestAbortedError, StreamOutput
from poot.server.errors import APIError, from_exception
from poot.server.params import Job
from poot.server.shutdown import shutting_down_error
from poot.server.state import Live

__all__ = ["Event", "run_job"]


@dataclass
class Event:
    """New output of one completion.

    Attributes:
        index: the completion's choice index.
        text: text completed since its previous event.
        token_ids: tokens sampled since its previous event.
        logprobs: one dict per new token (chosen id and alternatives), or None.
        finish_reason: set on its last event: ``stop``, ``length``, ``error`` or ``cancelled``.
        prompt_logprobs: on its first event, with prompt logprobs asked for: one entry per
            prompt token (None for the first).
    """

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Any]] | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[int, Any] | None] | None = None


_Item = tuple[int, StreamOutput | BaseException | None]


async def _pump(
    engine: AsyncEngine, job: Job, index: int, rid: str, live: Live, sink: asyncio.Queue[_Item]
) -> None:
    prompt_index, params = job.choices[index]
    if live.shutdown:
        sink.put_nowait((index, shutting_down_error()))
        return
    if live.cancelled:  # cancelled while queued: never reaches the engine
        sink.put_nowait((index, None))
        return
    try:
        async for out in engine.add_request(job.prompts[prompt_index], params, request_id=rid):
            sink.put_nowait((index, out))
    except RequestAbortedError as e:
        if live.shutdown:
            sink.put_nowait((index, shutting_down_error()))
        else:
            sink.put_nowait((index, None if live.cancelled else e))
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # a typed engine error: the consumer raises it
        sink.put_nowait((index, e))


async def run_job(
    engine: AsyncEngine,
    job: Job,
    request_id: str,
    live: Live,
    deadline: float,
    prompt_param: str = "prompt",
) -> AsyncGenerator[Event, None]:
    """Yields the job's outputs until every completion has finished.

    Raises:
        APIError: an engine error (mapped by ``from_exception``) or the deadline
            (``time.monotonic()`` based) passed: 504 ``request_timeout``.
    """
    sink: asyncio.Queue[_Item] = asyncio.Queue()
    n = len(job.choices)
    live.engine_ids = [f"{request_id}-{i}" for i in range(n)]
    tasks = [
        asyncio.create_task(_pump(engine, job, i, rid, live, sink))
        for i, rid in enumerate(live.engine_ids)
    ]
    try:
        remaining = n
        while remaining:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                # Not asyncio.wait_for: up to Python 3.11 it can swallow this task's cancellation
                # (a disconnect) when the item arrives in the same loop turn, and the stream then
                # runs on to its end for a client that is gone, holding its row.
                async with asyncio.timeout(left):
                    index, item = await sink.get()
            except TimeoutError:
                raise APIError(
                    504,
                    "the request took longer than the server's request timeout",
                    type="server_error",
                    code="request_timeout",
                ) from None
            if item is None:
                remaining -= 1
                yield Event(index, "", [], None, "cancelled")
                continue
            if isinstance(item, BaseException):
                raise from_exception(item, prompt_param=prompt_param)
            if item.finished:
                remaining -= 1
            yield Event(
                index,
                item.text,
                list(item.token_ids),
                getattr(item, "logprobs", None),
                item.finish_reason,
                getattr(item, "prompt_logprobs", None),
            )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
