"""Request bodies of the OpenAI routes, validated before anything runs.

Every body forbids unknown fields (a typo is a 400 naming the field, never silently ignored)
and is strict about JSON types (``"max_tokens": "5"`` is refused, not coerced). Ranges follow
OpenAI's API reference; the few extensions vLLM users expect (``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``) have the same names as in vLLM. Fields accepted for
compatibility but without effect are listed as such in their comments.

The validators are pydantic-core's, built from core schemas written out here (the schemas
pydantic would generate for the same models) rather than from pydantic models: the errors
(``pydantic_core.ValidationError``) are pydantic's, but pydantic's model machinery, a quarter
of ``poot-serve``'s start-up CPU, is never imported. Each body class declares its fields (with
their types, for readers and mypy); its schema, built next to it, gives their constraints and
defaults. ``model_validate_json``/``model_validate`` return an instance whose attributes are
the fields, every one set (defaults filled in).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

from pydantic_core import SchemaValidator

__all__ = [
    "Body",
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

Schema = dict[str, Any]
_B = TypeVar("_B", bound="Body")


class Body:
    """A validated body. pydantic-core makes instances without ``__init__`` (``__new__``, then
    their ``__dict__`` and its own bookkeeping attributes)."""

    __validator__: ClassVar[SchemaValidator]
    __schema__: ClassVar[Schema]

    @classmethod
    def model_validate_json(cls: type[_B], data: str | bytes) -> _B:
        """The body parsed from JSON and validated.

        Raises:
            pydantic_core.ValidationError: not JSON, or not a valid body.
        """
        body: _B = cls.__validator__.validate_json(data)
        return body

    @classmethod
    def model_validate(cls: type[_B], data: Any) -> _B:
        """The body validated from Python data (a dict, as parsed JSON gives)."""
        body: _B = cls.__validator__.validate_python(data)
        return body

    def fields(self) -> dict[str, Any]:
        """The fields and their values (pydantic-core's bookkeeping attributes left out)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("__pydantic")}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.fields().items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Body) or type(other) is not type(self):
            return False
        return other.fields() == self.fields()

    __hash__ = None  # type: ignore[assignment]


# ---- core-schema pieces ---------------------------------------------------------------------


def _int(**bounds: int) -> Schema:
    return {"type": "int", **bounds}


def _float(**bounds: float) -> Schema:
    return {"type": "float", **bounds}


_STR: Schema = {"type": "str"}
_BOOL: Schema = {"type": "bool"}
_ANY_DICT: Schema = {"type": "dict", "keys_schema": _STR, "values_schema": {"type": "any"}}


def _list(items: Schema, **lengths: int) -> Schema:
    return {"type": "list", "items_schema": items, **lengths}


def _union(*choices: Schema) -> Schema:
    return {"type": "union", "choices": list(choices)}


def _default(schema: Schema, default: Any) -> Schema:
    return {"type": "default", "schema": schema, "default": default}


def _optional(schema: Schema) -> Schema:
    """``X | None = None``."""
    return _default({"type": "nullable", "schema": schema}, None)


def _literal(*values: str) -> Schema:
    return {"type": "literal", "expected": list(values)}


def _model(cls: type[Body], fields: dict[str, Schema], **config: Any) -> Schema:
    """The schema of ``cls`` (strict, unknown fields forbidden); a field's schema may carry a
    ``validation_alias``."""
    model_fields = {}
    for name, schema in fields.items():
        field: Schema = {"type": "model-field", "schema": schema}
        if "validation_alias" in schema:
            field["validation_alias"] = schema.pop("validation_alias")
        model_fields[name] = field
    return {
        "type": "model",
        "cls": cls,
        "schema": {"type": "model-fields", "fields": model_fields, "model_name": cls.__name__},
        "config": {
            "title": cls.__name__,
            "strict": True,
            "extra_fields_behavior": "forbid",
            **config,
        },
    }


def _body(cls: type[_B], fields: dict[str, Schema], **config: Any) -> type[_B]:
    """Gives ``cls`` its schema and validator."""
    cls.__schema__ = _model(cls, fields, **config)
    cls.__validator__ = SchemaValidator(cls.__schema__)  # type: ignore[arg-type]
    return cls


# ---- the bodies -----------------------------------------------------------------------------


class StreamOptions(Body):
    include_usage: bool


_body(StreamOptions, {"include_usage": _default(_BOOL, False)})


class JsonSchemaSpec(Body):
    name: str
    description: str | None
    schema_: dict[str, Any] | None  # "schema" in JSON
    strict: bool | None  # accepted; the schema is always enforced


_body(
    JsonSchemaSpec,
    {
        "name": _default(_STR, "response"),
        "description": _optional(_STR),
        "schema_": {**_optional(_ANY_DICT), "validation_alias": "schema"},
        "strict": _optional(_BOOL),
    },
    validate_by_alias=True,
    validate_by_name=True,
)


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None


_body(
    ResponseFormat,
    {
        "type": _literal("text", "json_object", "json_schema"),
        "json_schema": _optional(JsonSchemaSpec.__schema__),
    },
)

_PROBABILITY = _float(ge=0.0, le=1.0)
_PENALTY = _float(ge=-2.0, le=2.0)
_STOP = _optional(_union(_STR, _list(_STR, max_length=MAX_STOP)))


class _SamplingRequest(Body):
    """The fields both routes share."""

    model: str
    n: int
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    repetition_penalty: float | None
    logit_bias: dict[str, float] | None
    seed: int | None
    stop: str | list[str] | None
    stream: bool
    stream_options: StreamOptions | None
    response_format: ResponseFormat | None
    ignore_eos: bool
    user: str | None  # accepted; not used


_SAMPLING: dict[str, Schema] = {
    "model": _STR,
    "n": _default(_int(ge=1), 1),
    "max_tokens": _optional(_int(ge=1)),
    "temperature": _optional(_float(ge=0.0, le=2.0)),
    "top_p": _optional(_float(gt=0.0, le=1.0)),
    "top_k": _optional(_int(ge=-1)),
    "min_p": _optional(_PROBABILITY),
    "presence_penalty": _optional(_PENALTY),
    "frequency_penalty": _optional(_PENALTY),
    "repetition_penalty": _optional(_float(gt=0.0)),
    "logit_bias": _optional(
        {"type": "dict", "keys_schema": _STR, "values_schema": _float(ge=-100.0, le=100.0)}
    ),
    "seed": _optional(_int()),
    "stop": _STOP,
    "stream": _default(_BOOL, False),
    "stream_options": _optional(StreamOptions.__schema__),
    "response_format": _optional(ResponseFormat.__schema__),
    "ignore_eos": _default(_BOOL, False),
    "user": _optional(_STR),
}


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None
    echo: bool
    # vLLM's extension: each prompt token's logprob and this many alternatives, as
    # ``choices[i].prompt_logprobs``.
    prompt_logprobs: int | None
    best_of: int | None
    suffix: str | None


_body(
    CompletionRequest,
    {
        **_SAMPLING,
        "prompt": _union(
            _STR,
            _list(_int(), min_length=1),
            _list(_STR, min_length=1),
            _list(_list(_int(), min_length=1), min_length=1),
        ),
        # 0 with ``echo``: score the prompt only (lm-evaluation-harness's loglikelihood shape).
        "max_tokens": _optional(_int(ge=0)),
        "logprobs": _optional(_int(ge=0, le=MAX_LOGPROBS)),
        "echo": _default(_BOOL, False),
        "prompt_logprobs": _optional(_int(ge=0, le=MAX_LOGPROBS)),
        "best_of": _optional(_int(ge=1)),
        "suffix": _optional(_STR),
    },
)


class TextPart(Body):
    type: Literal["text"]
    text: str


_body(TextPart, {"type": _literal("text"), "text": _STR})


class FunctionCall(Body):
    name: str
    arguments: str


_body(FunctionCall, {"name": _STR, "arguments": _STR})


class ToolCall(Body):
    """A call an assistant message made (the history of a tool-using conversation)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


_body(
    ToolCall,
    {
        "id": _STR,
        "type": _default(_literal("function"), "function"),
        "function": FunctionCall.__schema__,
    },
)


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None
    name: str | None
    tool_call_id: str | None
    tool_calls: list[ToolCall] | None
    refusal: str | None  # accepted on assistant messages (clients echo it back)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


_body(
    ChatMessage,
    {
        "role": _literal("system", "developer", "user", "assistant", "tool"),
        "content": _optional(_union(_STR, _list(TextPart.__schema__))),
        "name": _optional(_STR),
        "tool_call_id": _optional(_STR),
        "tool_calls": _optional(_list(ToolCall.__schema__)),
        "refusal": _optional(_STR),
    },
)


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None
    logprobs: bool
    top_logprobs: int | None
    # Checked field by field in ``poot.server.tools`` (a 400 names e.g. tools[0].function.name).
    tools: list[Any] | None
    tool_choice: str | dict[str, Any] | None
    parallel_tool_calls: bool | None


_body(
    ChatCompletionRequest,
    {
        **_SAMPLING,
        "messages": _list(ChatMessage.__schema__, min_length=1),
        "max_completion_tokens": _optional(_int(ge=1)),
        "logprobs": _default(_BOOL, False),
        "top_logprobs": _optional(_int(ge=0, le=MAX_LOGPROBS)),
        "tools": _optional(_list({"type": "any"}, max_length=128)),
        "tool_choice": _optional(_union(_STR, _ANY_DICT)),
        "parallel_tool_calls": _optional(_BOOL),
    },
)


class TokenizeRequest(Body):
    """``POST /tokenize`` (vLLM's shape): a ``prompt``, or chat ``messages`` rendered with
    the model's template first."""

    model: str | None
    prompt: str | None
    messages: list[ChatMessage] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


_body(
    TokenizeRequest,
    {
        "model": _optional(_STR),
        "prompt": _optional(_STR),
        "messages": _optional(_list(ChatMessage.__schema__)),
        "add_special_tokens": _default(_BOOL, True),
        "add_generation_prompt": _default(_BOOL, True),
        "return_token_strs": _default(_BOOL, False),
    },
)


class DetokenizeRequest(Body):
    """``POST /detokenize`` (vLLM's shape)."""

    model: str | None
    tokens: list[int]


_body(DetokenizeRequest, {"model": _optional(_STR), "tokens": _list(_int())})
