"""Request bodies of the OpenAI routes, validated by pydantic before anything runs.

Every model forbids unknown fields (a typo is a 400 naming the field, never silently ignored)
and is strict about JSON types (``"max_tokens": "5"`` is refused, not coerced). Ranges follow
OpenAI's API reference; the few extensions vLLM users expect (``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``) have the same names as in vLLM. Fields accepted for
compatibility but without effect are listed as such in their comments.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "ToolCall",
    "CompletionRequest",
    "DetokenizeRequest",
    "TokenizeRequest",
    "ResponseFormat",
    "StreamOptions",
]

# Generous bounds on list lengths, so a body within the size limit cannot ask for absurd work.
MAX_STOP = 16
MAX_LOGPROBS = 20


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Model):
    include_usage: bool = False


class JsonSchemaSpec(_Model):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # accepted; the schema is always enforced

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopField = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None


class _SamplingRequest(_Model):
    """The fields both routes share."""

    model: str
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    seed: int | None = None
    stop: StopField = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    ignore_eos: bool = False
    user: str | None = None  # accepted; not used


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``."""

    prompt: (
        str
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    # 0 with ``echo``: score the prompt only (lm-evaluation-harness's loglikelihood shape).
    max_tokens: int | None = Field(default=None, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    # vLLM's extension: each prompt token's logprob and this many alternatives, as
    # ``choices[i].prompt_logprobs``.
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None


class TextPart(_Model):
    type: Literal["text"]
    text: str


class FunctionCall(_Model):
    name: str
    arguments: str


class ToolCall(_Model):
    """A call an assistant message made (the history of a tool-using conversation)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None  # accepted on assistant messages (clients echo it back)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Checked field by field in ``poot.server.tools`` (a 400 names e.g. tools[0].function.name).
    tools: list[Any] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class TokenizeRequest(_Model):
    """``POST /tokenize`` (vLLM's shape): a ``prompt``, or chat ``messages`` rendered with
    the model's template first."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Model):
    """``POST /detokenize`` (vLLM's shape)."""

    model: str | None = None
    tokens: list[int]
