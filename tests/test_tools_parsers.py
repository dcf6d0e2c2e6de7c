"""The tool-call formats (``poot.server.tool_parsers``) and the request side
(``poot.server.tools``): parsing whole and streamed replies of each family, the grammars run
through llguidance on the default model's tokenizer, and rendering a tool conversation with
templates that know tools and ones that do not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

llguidance = pytest.importorskip("llguidance")

from poot.server.protocol import ChatCompletionRequest  # noqa: E402
from poot.server.tool_parsers import (  # noqa: E402
    FORMATS,
    ParsedCall,
    ToolStream,
    closed,
    format_for_template,
)
from poot.server.tools import plan_tools, render_messages  # noqa: E402

H, L, M = FORMATS["hermes"], FORMATS["llama3"], FORMATS["mistral"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
FUNCTIONS = [
    {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
        },
    },
]

CASES: list[tuple[Any, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    (H, CALL, None, [("get_weather", {"city": "Paris"})]),
    (
        H,
        "Sure. " + CALL + "\n" + CALL2 + "\n",
        "Sure. ",
        [("get_weather", {"city": "Paris"}), ("add", {"a": 1})],
    ),
    (H, "a <tool b", "a <tool b", []),
    (H, "<tool_call>\n{bad", "<tool_call>\n{bad", []),
    (H, "plain text", "plain text", []),
    (
        L,
        '{"name": "add", "parameters": {"a": 2}}; {"name": "add", "parameters": {"a": 3}}',
        None,
        [("add", {"a": 2}), ("add", {"a": 3})],
    ),
    (L, '<|python_tag|>{"name": "add", "parameters": {"a": 2}}', None, [("add", {"a": 2})]),
    (L, "Hello {x}", "Hello {x}", []),
    (M, 'ok [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]', "ok ", [("add", {"a": 1})]),
    (M, '[TOOL_CALLS] [{"name": "add", "arguments": "{\\"a\\": 1}"}]', None, [("add", {"a": 1})]),
]


def _calls(calls: list[ParsedCall]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_parse_whole_and_streamed_alike(
    fmt: Any, text: str, content: str | None, calls: list[Any]
) -> None:
    got_content, got_calls = fmt.parse(text)
    assert got_content == content
    assert _calls(got_calls) == calls
    for step in (1, 2, 3, 5, 8, 13):
        stream = ToolStream(fmt)
        parts: list[Any] = []
        for i in range(0, len(text), step):
            parts += stream.feed(text[i : i + step])
        parts += stream.finish()
        text_parts = "".join(p for p in parts if isinstance(p, str))
        assert text_parts == (content or "") or (content is None and not text_parts.strip())
        assert _calls([p for p in parts if isinstance(p, ParsedCall)]) == calls


def test_a_call_is_handed_out_as_soon_as_it_is_complete() -> None:
    stream = ToolStream(H)
    assert stream.feed("Hi <tool") == ["Hi "]  # a prefix of the marker is held back
    parts = stream.feed(CALL[len("<tool") :])
    assert _calls([p for p in parts if isinstance(p, ParsedCall)]) == [
        ("get_weather", {"city": "Paris"})
    ]


def test_call_ids_are_unique_and_openai_shaped() -> None:
    _, calls = H.parse(CALL + "\n" + CALL)
    a, b = (c.openai() for c in calls)
    assert a["id"] != b["id"] and a["id"].startswith("call_")
    assert a["type"] == "function" and a["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("{{ '<tool_call>' }}{% for t in tools %}{% endfor %}", "hermes"),
        ("<|im_start|>{{ m }}", "hermes"),
        (None, "hermes"),
        ("{{ '<|python_tag|>' }}<|eot_id|>", "llama3"),
        ("{% if message.role == 'ipython' %}<|eot_id|>{% endif %}", "llama3"),
        ("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]", "mistral"),
    ],
)
def test_family_from_template(template: str | None, family: str) -> None:
    assert format_for_template(template).family == family


def test_closed_objects() -> None:
    schema = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "list": {"type": "array", "items": {"type": "object", "properties": {"y": {}}}},
        },
        "$defs": {"D": {"type": "object", "properties": {"z": {}}}},
    }
    got = closed(schema)
    assert got["additionalProperties"] is False
    assert got["properties"]["inner"]["additionalProperties"] is False
    assert got["properties"]["open"]["additionalProperties"] is True
    assert got["properties"]["list"]["items"]["additionalProperties"] is False
    assert got["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is not changed


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Any:
    from poot.checkpoints import resolve_model_files
    from poot.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model_files(str(default_model_path)))


@pytest.fixture(scope="module")
def lltok(tokenizer: Any) -> Any:
    from poot.guidance import Guide

    return Guide(tokenizer, 49152, tokenizer.eos_ids).lltokenizer()


GRAMMAR_CASES = [
    (H, True, False, CALL, True),
    (H, True, False, CALL + "\n" + CALL2, False),  # one call only
    (H, True, True, CALL + "\n" + CALL2, True),
    (H, True, False, "hi", False),
    (H, True, False, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "X"}}', False),
    (H, True, False, '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}', False),
    (H, False, True, "hi there <b>", True),
    (H, False, True, "", True),
    (H, False, True, "Sure. " + CALL, True),
    (H, False, True, '<tool_call>\n{"name": "nope"', False),
    (L, True, False, '{"name": "add", "parameters": {"a": 1}}', True),
    (L, True, False, "Hello", False),
    (L, False, False, "Hello", True),
    (M, True, True, '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]', True),
    (
        M,
        True,
        False,
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, '
        '{"name": "add", "arguments": {"a": 2}}]',
        False,
    ),
]


@pytest.mark.parametrize(("fmt", "forced", "parallel", "text", "ok"), GRAMMAR_CASES)
def test_grammars_accept_exactly_the_calls(
    tokenizer: Any, lltok: Any, fmt: Any, forced: bool, parallel: bool, text: str, ok: bool
) -> None:
    source = fmt.grammar(FUNCTIONS, forced=forced, parallel=parallel)
    m = llguidance.LLMatcher(lltok, llguidance.grammar_from("grammar", source), log_level=0)
    assert not m.is_error(), m.get_error()
    ids = tokenizer.encode_continuation(text)
    accepted = all(m.consume_token(t) for t in ids) and m.is_accepting()
    assert accepted == ok, source


def _req(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", **kw})


WEATHER = {"type": "function", "function": FUNCTIONS[0]}
HISTORY = [
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]
# A Qwen2.5-like template: it renders tools and the calls' arguments as objects.
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}"
    "</tool_call>{% endfor %}\n{% endfor %}"
)


def test_render_for_a_template_that_knows_tools(tokenizer: Any) -> None:
    req = _req(messages=HISTORY, tools=[WEATHER])
    plan = plan_tools(req, TOOL_TEMPLATE)
    assert plan is not None and plan.template_knows_tools and plan.choice == "auto"
    messages, variables = render_messages(req.messages, plan)
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}
    text = tokenizer.apply_chat_template(messages, chat_template=TOOL_TEMPLATE, **variables)
    assert text.startswith("TOOLS:get_weather;")
    assert '<tool_call>{"city": "Paris"}</tool_call>' in text


def test_render_for_a_template_without_tools(tokenizer: Any) -> None:
    req = _req(messages=HISTORY, tools=[WEATHER], tool_choice="required")
    plan = plan_tools(req, tokenizer.chat_template)
    assert plan is not None and not plan.template_knows_tools and plan.forced
    messages, variables = render_messages(req.messages, plan)
    assert variables == {}
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert '"name": "get_weather"' in messages[0]["content"]
    assert messages[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert messages[3]["content"] == "<tool_response>\n21 C\n</tool_response>"


def test_mistral_call_ids_are_nine_alphanumerics() -> None:
    template = "[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]"
    req = _req(messages=HISTORY, tools=[WEATHER])
    plan = plan_tools(req, template)
    assert plan is not None and plan.fmt.family == "mistral" and plan.template_knows_tools
    messages, _ = render_messages(req.messages, plan, template)
    # Mistral's templates raise on any other id; "call_1" maps to the same 9 characters in
    # the call and in its result.
    assert messages[1]["tool_calls"][0]["id"] == "0000call1"
    assert messages[2]["tool_call_id"] == "0000call1"


def test_no_tools_or_none_plans_nothing(tokenizer: Any) -> None:
    assert plan_tools(_req(messages=HISTORY[:1]), tokenizer.chat_template) is None
    none = _req(messages=HISTORY[:1], tools=[WEATHER], tool_choice="none")
    assert plan_tools(none, tokenizer.chat_template) is None


def test_named_choice_constrains_to_that_function(tokenizer: Any, lltok: Any) -> None:
    add = {"type": "function", "function": FUNCTIONS[1]}
    req = _req(
        messages=HISTORY[:1],
        tools=[WEATHER, add],
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
    )
    plan = plan_tools(req, tokenizer.chat_template)
    assert plan is not None and plan.choice == "add" and not plan.parallel
    m = llguidance.LLMatcher(lltok, llguidance.grammar_from("grammar", plan.grammar(tokenizer)))
    ids = tokenizer.encode_continuation(CALL)  # a call to get_weather
    assert not all(m.consume_token(t) for t in ids)
