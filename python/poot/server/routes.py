"""The HTTP routes: OpenAI's completions, chat completions and models, plus health, metrics,
cancel, and vLLM's tokenize and detokenize.

One request's life: validate the body (``poot.server.protocol``, 400) -> build its ``Job`` (400
for what the model or the build cannot do) -> take queue slots (429 full, 503 queue timeout) ->
run it, streamed or not, until it finishes, is cancelled, times out or its client disconnects ->
give the slots back and count its outcome (``poot_requests_total``). Each request counts exactly one
outcome, and its slots and engine requests are released in a ``finally`` on every path.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from pydantic_core import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HTTPRoute

from poot.llm import LLM
from poot.server.errors import APIError, from_exception, validation_error
from poot.server.generation import Event, run_job
from poot.server.limits import check_api_key
from poot.server.metrics import CONTENT_TYPE, Metrics
from poot.server.params import Job, chat_job, completion_job
from poot.server.protocol import (
    Body,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from poot.server.responses import Builder, Route, sse
from poot.server.state import Live, ServerState, check_chat_template
from poot.server.streaming import EventStream, until_disconnect
from poot.server.tools import render_messages

__all__ = ["routes"]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_DONE = b"data: [DONE]\n\n"

_Body = TypeVar("_Body", bound=Body)


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.poot
    return state


def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def _auth(request: Request) -> None:
    key = _state(request).config.api_key
    if key is not None:
        check_api_key(request.headers.get("authorization"), key)


class _Tracker:
    """Counts one request's outcome (once), its tokens, TTFT and inter-token gaps."""

    def __init__(self, metrics: Metrics, route: Route, t0: float, n: int) -> None:
        self.metrics = metrics
        self.route = route
        self.t0 = t0
        self.first: float | None = None
        self.last: list[float | None] = [None] * n
        self.outcome: str | None = None
        self.cancelled = False
        self.failed = False  # a completion ended with finish_reason "error" (non-finite logits)

    def event(self, ev: Event) -> None:
        if ev.finish_reason == "cancelled":
            self.cancelled = True
        elif ev.finish_reason == "error":
            self.failed = True
        if not ev.token_ids:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = now
            self.metrics.ttft.observe(now - self.t0)
        last = self.last[ev.index]
        if last is not None:
            gap = (now - last) / len(ev.token_ids)
            for _ in ev.token_ids:
                self.metrics.itl.observe(gap)
        self.last[ev.index] = now
        self.metrics.generated_tokens.inc(len(ev.token_ids))

    def finish(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.metrics.outcome(self.route, outcome)

    def fail(self, error: APIError) -> None:
        if error.code in ("request_timeout", "queue_timeout"):
            self.finish("timeout")
        elif error.status == 429:
            self.finish("rejected")
        else:
            self.finish("invalid" if error.status < 500 else "error")

    def done(self) -> None:
        self.finish("error" if self.failed else "cancelled" if self.cancelled else "ok")


async def _parse(request: Request, model: type[_Body], route: Route) -> _Body:
    """The body validated as ``model`` (JSON whatever the Content-Type says)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        error = validation_error(e.errors())
        _metrics(request).outcome(route, "invalid")
        raise error from None


async def _parse_plain(request: Request, model: type[_Body]) -> _Body:
    """The body validated as ``model`` (a 400 in OpenAI's shape; no route metrics)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def _check_name(given: str | None, served: str) -> None:
    if given is not None and given != served:
        raise APIError(
            404,
            f"the model {given!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _request_id(request: Request, prefix: str, state: ServerState) -> str:
    given = request.headers.get("x-request-id")
    if given is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if not _REQUEST_ID.fullmatch(given):
        raise APIError(
            400,
            "X-Request-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -",
            param="X-Request-Id",
            code="invalid_value",
        )
    if given in state.live:
        raise APIError(
            409,
            f"a request with id {given!r} is already running",
            param="X-Request-Id",
            code="duplicate_request_id",
        )
    return given


async def _serve(
    request: Request,
    route: Route,
    make_job: Callable[[LLM, str, int], Job],
    stream: bool,
) -> Response:
    t0 = time.monotonic()
    state, metrics = _state(request), _metrics(request)
    config = state.config
    prefix = "chatcmpl" if route == "chat" else "cmpl"
    prompt_param = "messages" if route == "chat" else "prompt"
    tracker = _Tracker(metrics, route, t0, 1)
    try:
        llm, engine, admission = state.ready()
        job = make_job(llm, state.model_name, config.max_n)
        rid = _request_id(request, prefix, state)
    except Exception as e:
        error = from_exception(e, prompt_param=prompt_param)
        tracker.fail(error)
        raise error from None
    tracker.last = [None] * len(job.choices)
    live = Live([])
    state.live[rid] = live
    deadline = t0 + config.request_timeout_s
    try:
        grant = await admission.acquire(
            len(job.choices), min(config.queue_timeout_s, max(deadline - time.monotonic(), 0.0))
        )
    except APIError as e:
        state.live.pop(rid, None)
        tracker.fail(e)
        raise
    except BaseException:
        state.live.pop(rid, None)
        tracker.finish("disconnected")
        raise
    metrics.prompt_tokens.inc(job.prompt_tokens)
    builder = Builder(route, rid, state.model_name, job, llm.tokenizer)
    events = run_job(engine, job, rid, live, deadline, prompt_param)
    headers = {"X-Request-Id": rid}

    def close() -> None:
        grant.release()
        state.live.pop(rid, None)

    if stream:

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for ev in events:
                    tracker.event(ev)
                    for chunk in builder.chunks(ev):
                        yield chunk
                if job.include_usage:
                    yield builder.usage_chunk()
                tracker.done()
            except APIError as e:
                tracker.fail(e)
                yield sse(e.body())
            finally:
                await events.aclose()
            yield _DONE

        return EventStream(
            body(),
            on_disconnect=lambda: tracker.finish("disconnected"),
            on_close=close,
            headers=headers,
        )

    async def collect() -> dict[str, Any]:
        try:
            async for ev in events:
                tracker.event(ev)
                builder.add(ev)
        finally:
            await events.aclose()
        return builder.response()

    try:
        result = await until_disconnect(request.receive, asyncio.ensure_future(collect()))
    except APIError as e:
        tracker.fail(e)
        raise
    except BaseException:
        tracker.finish("error")
        raise
    finally:
        close()
    if result is None:
        tracker.finish("disconnected")
        return Response(status_code=499)
    tracker.done()
    return JSONResponse(result, headers=headers)


def routes() -> list[HTTPRoute]:
    """The app's routes; ``/v1/*``, ``/tokenize`` and ``/detokenize`` check the API key."""

    async def completions(request: Request) -> Response:
        _auth(request)
        body = await _parse(request, CompletionRequest, "completions")
        return await _serve(
            request,
            "completions",
            lambda llm, name, n: completion_job(body, llm, name, n),
            body.stream,
        )

    async def chat_completions(request: Request) -> Response:
        _auth(request)
        body = await _parse(request, ChatCompletionRequest, "chat")
        return await _serve(
            request, "chat", lambda llm, name, n: chat_job(body, llm, name, n), body.stream
        )

    async def models(request: Request) -> Response:
        _auth(request)
        state = _state(request)
        entry: dict[str, Any] = {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "poot",
        }
        if state.llm is not None:
            entry["max_model_len"] = state.llm.max_model_len
        return JSONResponse({"object": "list", "data": [entry]})

    async def cancel(request: Request) -> Response:
        _auth(request)
        request_id = str(request.path_params["request_id"])
        state = _state(request)
        live = state.live.get(request_id)
        if live is None:
            raise APIError(
                404,
                f"no request with id {request_id!r} is running",
                param="request_id",
                code="request_not_found",
            )
        live.cancelled = True
        if state.engine is not None:
            for eid in list(live.engine_ids):
                await state.engine.abort(eid)
        return JSONResponse({"id": request_id, "object": "request.cancel", "cancelled": True})

    async def tokenize(request: Request) -> Response:
        _auth(request)
        body = await _parse_plain(request, TokenizeRequest)
        state = _state(request)
        llm = state.ready()[0]
        _check_name(body.model, state.model_name)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(
                400, "give one of prompt and messages", param="prompt", code="invalid_value"
            )
        if body.messages is not None:
            check_chat_template(llm)
            messages, _ = render_messages(body.messages, None)
            text = llm.tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt
            )
            ids = llm.tokenizer.encode(text, add_special_tokens=False)
        else:
            assert body.prompt is not None
            ids = llm.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        out: dict[str, Any] = {
            "count": len(ids),
            "max_model_len": llm.max_model_len,
            "tokens": ids,
        }
        if body.return_token_strs:
            out["token_strs"] = [llm.tokenizer.id_to_token(t) for t in ids]
        return JSONResponse(out)

    async def detokenize(request: Request) -> Response:
        _auth(request)
        body = await _parse_plain(request, DetokenizeRequest)
        state = _state(request)
        llm = state.ready()[0]
        _check_name(body.model, state.model_name)
        vocab = llm.files.hparams.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(
                400,
                f"token id {bad[0]} is outside the vocabulary of {vocab}",
                param="tokens",
                code="invalid_value",
            )
        return JSONResponse({"prompt": llm.tokenizer.decode(body.tokens)})

    async def health(request: Request) -> Response:
        if _state(request).draining:
            return JSONResponse({"status": "draining"}, 503, headers={"Retry-After": "5"})
        status = _state(request).health()
        code = 200 if status == "ok" else 503
        return JSONResponse({"status": "dead" if status == "failed" else status}, code)

    async def metrics(request: Request) -> Response:
        return Response(_metrics(request).render(), media_type=CONTENT_TYPE)

    post, get = ["POST"], ["GET"]
    return [
        HTTPRoute("/v1/completions", completions, methods=post),
        HTTPRoute("/v1/chat/completions", chat_completions, methods=post),
        HTTPRoute("/v1/models", models, methods=get),
        HTTPRoute("/v1/requests/{request_id}/cancel", cancel, methods=post),
        HTTPRoute("/tokenize", tokenize, methods=post),
        HTTPRoute("/detokenize", detokenize, methods=post),
        HTTPRoute("/health", health, methods=get),
        HTTPRoute("/metrics", metrics, methods=get),
    ]
