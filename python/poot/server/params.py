"""A validated request body turned into engine work: prompts as token ids, one
``SamplingParams`` per completion.

Everything that can be refused is refused here, before the request takes a queue slot:
unsupported options, a prompt that does not fit the context (the message names the prompt's
tokens, the completion's and the limit), and sampling values ``SamplingParams`` rejects.
``n`` completions of a prompt become ``n`` engine requests; with a ``seed``, completion ``i``
uses ``seed + i`` so they differ yet the whole response is reproducible.
Options that need a ``SamplingParams`` field this build lacks are refused with 400
``unsupported_parameter`` rather than ignored.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from poot.llm import LLM
from poot.sampling import SamplingParams
from poot.server.errors import APIError
from poot.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingRequest
from poot.server.state import check_chat_template
from poot.server.tools import ToolPlan, plan_tools, render_messages

__all__ = ["Job", "chat_job", "completion_job"]

_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams) if f.init)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class Job:
    """The engine work of one HTTP request.

    Attributes:
        prompts: each prompt's token ids.
        prompt_texts: each prompt's text (for ``echo``); None for token-id prompts.
        choices: per completion (choice index), its prompt's index and its params.
        logprobs: top alternatives per token (None: no logprobs).
        echo: prefix each completion with its prompt's text.
        include_usage: stream a last chunk with token counts.
        tools: how a chat request uses tools (its replies are parsed for calls), or None.
        prompt_logprobs: top alternatives per prompt token (``echo`` with ``logprobs``), or
            None.
        drop_output: the request asked for no completion tokens (``max_tokens: 0``): one is
            generated (the engine always samples one) and not returned.
    """

    prompts: list[list[int]]
    prompt_texts: list[str | None]
    choices: list[tuple[int, SamplingParams]]
    logprobs: int | None = None
    echo: bool = False
    include_usage: bool = False
    tools: ToolPlan | None = None
    prompt_logprobs: int | None = None
    drop_output: bool = False

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def _unsupported(name: str, why: str = "is not supported by this server") -> APIError:
    return APIError(400, f"{name} {why}", param=name, code="unsupported_parameter")


def _check_model(req: _SamplingRequest, served: str) -> None:
    if req.model != served:
        raise APIError(
            404,
            f"the model {req.model!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _max_tokens(
    requested: int | None, default: int | None, prompt_len: int, limit: int, param: str
) -> int:
    if prompt_len >= limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens, but the prompt has "
            f"{prompt_len} tokens (at least {prompt_len + 1} with one token of completion)",
            param=param,
            code="context_length_exceeded",
        )
    room = limit - prompt_len
    if requested is None:
        return room if default is None else min(default, room)
    if prompt_len + requested > limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens, but {prompt_len + requested}"
            f" were requested ({prompt_len} in the prompt, {requested} for the completion); "
            "shorten the prompt or lower max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def _options(req: _SamplingRequest, vocab: int) -> dict[str, Any]:
    """The ``SamplingParams`` keywords a request sets beyond the basic ones."""
    opts: dict[str, Any] = {}
    for name, neutral in (
        ("min_p", 0.0),
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
    ):
        value = getattr(req, name)
        if value is not None and value != neutral:
            opts[name] = value
    if req.logit_bias:
        bias: dict[int, float] = {}
        for key, value in req.logit_bias.items():
            try:
                tid = int(key)
            except ValueError:
                raise APIError(
                    400,
                    f"logit_bias keys must be token ids, got {key!r}",
                    param="logit_bias",
                    code="invalid_value",
                ) from None
            if not 0 <= tid < vocab:
                raise APIError(
                    400,
                    f"logit_bias token id {tid} is outside the vocabulary of {vocab}",
                    param="logit_bias",
                    code="invalid_value",
                )
            bias[tid] = value
        opts["logit_bias"] = bias
    if req.stop:
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if any(not s for s in stop):
            raise APIError(
                400, "stop strings must not be empty", param="stop", code="invalid_value"
            )
        opts["stop"] = stop
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        opts["json_object"] = True
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise APIError(
                400,
                "response_format json_schema needs json_schema.schema",
                param="response_format.json_schema",
                code="invalid_value",
            )
        opts["json_schema"] = json.dumps(fmt.json_schema.schema_)
    return opts


def _params(
    req: _SamplingRequest, max_tokens: int, n: int, extra: dict[str, Any]
) -> list[SamplingParams]:
    for name in extra:
        if name not in _FIELDS:
            param = "response_format" if name in ("json_object", "json_schema") else name
            raise _unsupported(param, "is not supported by this build of poot yet")
    base: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": 0 if req.top_k is None else req.top_k,
        "ignore_eos": req.ignore_eos,
        **extra,
    }
    from poot.errors import SamplingParamsError
    from poot.guidance import validate

    out = []
    for i in range(n):
        seed = None if req.seed is None else req.seed + i
        try:
            params = SamplingParams(seed=seed, **base)
            if i == 0:
                # The body's constraint compiles before any response starts (a 400, not an
                # error event in a stream); the engine compiles it again for the tokenizer.
                validate(params)
            out.append(params)
        except SamplingParamsError as e:
            raise APIError(400, str(e), param=e.field or None, code="invalid_value") from None
    return out


def _common_checks(req: _SamplingRequest, served: str, max_n: int) -> None:
    _check_model(req, served)
    if req.n > max_n:
        raise APIError(
            400, f"n must be at most {max_n}, got {req.n}", param="n", code="invalid_value"
        )
    if req.stream_options is not None and not req.stream:
        raise APIError(
            400, "stream_options needs stream=true", param="stream_options", code="invalid_value"
        )


def completion_job(req: CompletionRequest, llm: LLM, served: str, max_n: int) -> Job:
    """The job of a ``/v1/completions`` body."""
    _common_checks(req, served, max_n)
    if req.suffix:
        raise _unsupported("suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise _unsupported("best_of", "other than n is not supported by this server")
    drop = req.max_tokens == 0
    if drop and not req.echo:
        raise APIError(
            400, "max_tokens 0 needs echo=true", param="max_tokens", code="invalid_value"
        )
    if drop and req.stream:
        raise _unsupported("max_tokens", "0 is not supported with stream=true")
    prompt_lps = req.prompt_logprobs
    if req.echo and req.logprobs is not None:
        prompt_lps = max(req.logprobs, prompt_lps or 0)
    raw = req.prompt
    items: list[str | list[int]]
    if isinstance(raw, str):
        items = [raw]
    elif raw and isinstance(raw[0], int):
        items = [list(raw)]  # type: ignore[arg-type]
    else:
        items = list(raw)  # type: ignore[arg-type]
    vocab = llm.files.hparams.vocab_size
    prompts: list[list[int]] = []
    texts: list[str | None] = []
    for item in items:
        if isinstance(item, str):
            ids = llm.tokenizer.encode(item)
            texts.append(item)
        else:
            bad = [t for t in item if not 0 <= t < vocab]
            if bad:
                raise APIError(
                    400,
                    f"token id {bad[0]} is outside the vocabulary of {vocab}",
                    param="prompt",
                    code="invalid_value",
                )
            ids = list(item)
            texts.append(llm.tokenizer.decode(ids) if req.echo else None)
        if not ids:
            raise APIError(400, "the prompt has no tokens", param="prompt", code="invalid_value")
        prompts.append(ids)
    extra = _options(req, vocab)
    if req.logprobs is not None:
        extra["logprobs"] = req.logprobs
    if prompt_lps is not None:
        extra["prompt_logprobs"] = prompt_lps
    choices: list[tuple[int, SamplingParams]] = []
    requested = 1 if drop else req.max_tokens
    for p, ids in enumerate(prompts):
        limit = llm.max_model_len
        mt = _max_tokens(requested, COMPLETIONS_DEFAULT_MAX_TOKENS, len(ids), limit, "prompt")
        choices += [(p, sp) for sp in _params(req, mt, req.n, extra)]
    return Job(
        prompts,
        texts,
        choices,
        logprobs=req.logprobs,
        echo=req.echo,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        prompt_logprobs=prompt_lps,
        drop_output=drop,
    )


def chat_job(req: ChatCompletionRequest, llm: LLM, served: str, max_n: int) -> Job:
    """The job of a ``/v1/chat/completions`` body (the prompt is the rendered template)."""
    _common_checks(req, served, max_n)
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        if req.max_tokens != req.max_completion_tokens:
            raise APIError(
                400,
                "max_tokens and max_completion_tokens differ; give one",
                param="max_completion_tokens",
                code="invalid_value",
            )
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(
            400, "top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value"
        )
    check_chat_template(llm)
    templates = llm.tokenizer.chat_templates
    template = templates.get("tool_use") if req.tools else None
    template = template or llm.tokenizer.chat_template
    tools = plan_tools(req, template)
    messages, variables = render_messages(req.messages, tools, template)
    # A last assistant message is continued, except with tools: a reply that may be calls
    # starts a turn of its own.
    cont = messages[-1]["role"] == "assistant" and tools is None
    text = llm.tokenizer.apply_chat_template(
        messages, add_generation_prompt=not cont, continue_final_message=cont, **variables
    )
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise APIError(
            400, "the messages render to no tokens", param="messages", code="invalid_value"
        )
    requested = (
        req.max_completion_tokens if req.max_completion_tokens is not None else (req.max_tokens)
    )
    mt = _max_tokens(requested, None, len(ids), llm.max_model_len, "messages")
    extra = _options(req, llm.files.hparams.vocab_size)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    if logprobs is not None:
        extra["logprobs"] = logprobs
    if tools is not None:
        extra["grammar"] = tools.grammar(llm.tokenizer)
    try:
        choices = [(0, sp) for sp in _params(req, mt, req.n, extra)]
    except APIError as e:
        if tools is not None and e.param == "grammar":
            # The grammar is the tools' parameters schemas: one of them does not compile.
            raise APIError(
                400, e.message.replace("grammar", "tools", 1), param="tools", code="invalid_value"
            ) from None
        raise
    return Job(
        [ids],
        [None],
        choices,
        logprobs=logprobs,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        tools=tools,
    )
