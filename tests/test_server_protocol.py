"""``poot.server.protocol``: request bodies validated by pydantic-core from written-out core
schemas. The HTTP tests check the 400s a client sees; these check the bodies themselves:
defaults filled in, strict types, unknown fields refused, the ``schema`` alias, and the
errors in pydantic's shape (which ``poot.server.errors.validation_error`` reads)."""

from __future__ import annotations

import json

import pytest
from pydantic_core import ValidationError

from poot.server.errors import validation_error
from poot.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponseFormat,
    TokenizeRequest,
)


def _errors(cls: type, body: object) -> list[tuple[str, tuple[object, ...]]]:
    with pytest.raises(ValidationError) as e:
        cls.model_validate_json(json.dumps(body))  # type: ignore[attr-defined]
    return [(d["type"], tuple(d["loc"])) for d in e.value.errors()]


def test_defaults_are_filled_in_and_given_fields_kept() -> None:
    req = CompletionRequest.model_validate_json(b'{"model": "m", "prompt": [1, 2], "n": 2}')
    assert req.prompt == [1, 2] and req.n == 2
    assert req.max_tokens is None and req.stream is False and req.echo is False
    assert req.stop is None and req.stream_options is None and req.logit_bias is None
    fields = req.fields()
    assert "n" in fields and not any(k.startswith("__") for k in fields)
    assert req == CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "n": 2})
    assert req != CompletionRequest.model_validate({"model": "m", "prompt": [1, 2]})
    assert repr(req).startswith("CompletionRequest(model='m', n=2,")


def test_nested_bodies_are_objects_with_their_own_defaults() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
                },
            ],
            "stream_options": {"include_usage": True},
        }
    )
    user, assistant = req.messages
    assert user.text() == "ab" and assistant.text() == ""
    assert assistant.tool_calls is not None and assistant.tool_calls[0].type == "function"
    assert assistant.tool_calls[0].function.name == "f"
    assert req.stream_options is not None and req.stream_options.include_usage is True


def test_json_schema_takes_its_alias_and_its_field_name() -> None:
    for key in ("schema", "schema_"):
        fmt = ResponseFormat.model_validate(
            {"type": "json_schema", "json_schema": {key: {"type": "object"}}}
        )
        assert fmt.json_schema is not None and fmt.json_schema.schema_ == {"type": "object"}
        assert fmt.json_schema.name == "response"


def test_types_are_strict_and_unknown_fields_refused() -> None:
    assert _errors(CompletionRequest, {"model": "m", "prompt": "p", "max_tokens": "5"}) == [
        ("int_type", ("max_tokens",))
    ]
    assert _errors(CompletionRequest, {"model": "m", "prompt": "p", "n": 0}) == [
        ("greater_than_equal", ("n",))
    ]
    assert _errors(ChatCompletionRequest, {"model": "m", "messages": [], "bogus": 1}) == [
        ("too_short", ("messages",)),
        ("extra_forbidden", ("bogus",)),
    ]
    errors = _errors(
        ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": 5}]}
    )
    # A union reports each member, tagged (the 400 drops the tags: messages.0.content).
    assert errors == [
        ("string_type", ("messages", 0, "content", "str")),
        ("list_type", ("messages", 0, "content", "list[TextPart]")),
    ]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"{not json", "invalid_json", None),
        (b"[]", "invalid_json", None),
        (b'{"model": "m", "prompt": "p", "frobnicate": 1}', "unknown_parameter", "frobnicate"),
        (b'{"model": "m", "prompt": "p", "stop": ["a", 1]}', "invalid_value", "stop"),
        (b'{"model": "m", "prompt": 3}', "invalid_value", "prompt"),
    ],
)
def test_errors_become_typed_400s(body: bytes, code: str, param: str | None) -> None:
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate_json(body)
    error = validation_error(e.value.errors())
    assert (error.status, error.code, error.param) == (400, code, param)


def test_tokenize_bodies() -> None:
    assert TokenizeRequest.model_validate({"prompt": "x"}).add_special_tokens is True
    assert DetokenizeRequest.model_validate({"tokens": [1, 2]}).tokens == [1, 2]
    assert _errors(DetokenizeRequest, {"tokens": [1.5]}) == [("int_type", ("tokens", 0))]
