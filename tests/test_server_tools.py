"""Function calling through the official ``openai`` client against a real ``poot-serve``
process on loopback, serving the default model (SmolLM2-135M-Instruct, a ChatML template
without tools, so the Hermes form is written into the prompt).

A model this small rarely chooses to call a tool by itself, so the calls asserted here are
forced (``tool_choice`` ``required`` or a named function), where the grammar guarantees them;
the ``auto`` test checks whichever branch the model took and says which.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
httpx = pytest.importorskip("httpx")

from pydantic import BaseModel  # noqa: E402
from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": WEATHER_PARAMS,
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(["--model", str(default_model_path), "--threads", "2", "-q"])
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def _check_call(call: Any, name: str, schema: dict[str, Any]) -> dict[str, Any]:
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    return args


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_call_parses_and_validates(client: Any, choice: Any) -> None:
    got = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, ADD] if choice == "required" else [ADD, WEATHER],
        tool_choice=choice,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    msg = got.choices[0].message
    assert got.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert len(msg.tool_calls) == 1
    name = msg.tool_calls[0].function.name
    if choice == "required":
        assert name in ("get_weather", "add")
        schema = WEATHER_PARAMS if name == "get_weather" else ADD["function"]["parameters"]
    else:
        assert name == "get_weather"
        schema = WEATHER_PARAMS
    _check_call(msg.tool_calls[0], name, schema)


def test_sampled_forced_calls_always_validate(client: Any) -> None:
    got = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        temperature=1.0,
        seed=3,
        n=3,
        max_tokens=120,
    )
    for choice in got.choices:
        assert choice.finish_reason == "tool_calls", choice
        for call in choice.message.tool_calls:
            _check_call(call, "get_weather", WEATHER_PARAMS)


def test_streamed_tool_call_deltas(client: Any) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 80,
    }
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert calls[0].index == 0 and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"
    assert all(tc.index == 0 for tc in calls)
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == json.loads(
        whole.choices[0].message.tool_calls[0].function.arguments
    )
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_stream_accumulates_with_the_sdk_helper(client: Any) -> None:
    with client.chat.completions.stream(
        model=MODEL,
        messages=ASK,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required",
        temperature=0,
        max_tokens=80,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "Weather"
    assert isinstance(call.function.parsed_arguments, Weather)


class Weather(BaseModel):
    city: str
    unit: str


def test_parse_with_a_pydantic_tool(client: Any) -> None:
    got = client.chat.completions.parse(
        model=MODEL,
        messages=ASK,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        temperature=0,
        max_tokens=80,
    )
    parsed = got.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, Weather)


def test_auto_is_the_models_choice(client: Any) -> None:
    got = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=40
    )
    choice = got.choices[0]
    if choice.message.tool_calls:
        # The model called: the call started with the marker and was constrained from there.
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            _check_call(call, "get_weather", WEATHER_PARAMS)
    else:
        # The model answered in text (SmolLM2's greedy choice for this prompt).
        assert choice.message.content
        assert "<tool_call>" not in choice.message.content
        assert choice.finish_reason in ("stop", "length")


def test_tool_history_round_trip(client: Any) -> None:
    first = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        parallel_tool_calls=False,
        max_tokens=80,
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    got = client.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=24,
    )
    assert got.choices[0].message.content
    assert got.choices[0].message.tool_calls is None
    alone = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=1
    )
    # The call and its result reach the prompt (written in the Hermes form for this template).
    call_text = json.dumps(
        {"name": call.function.name, "arguments": json.loads(call.function.arguments)}
    )
    extra = got.usage.prompt_tokens - alone.usage.prompt_tokens
    assert extra > len(call_text) // 8


def _post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "function", "function": {"name": "bad name"}}], None, "tools[0].function.name"),
        ([{"type": "retrieval"}], None, "tools[0].type"),
        ([{"type": "function"}], None, "tools[0].function"),
        (
            [WEATHER, {"type": "function", "function": {"name": "x", "parameters": []}}],
            None,
            "tools[1].function.parameters",
        ),
        ([WEATHER, WEATHER], None, "tools[1].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "colour": 1}}],
            None,
            "tools[0].function.colour",
        ),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "required", "tool_choice"),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "integer", "minimum": "x"}},
                        },
                    },
                }
            ],
            "required",
            "tools",
        ),
    ],
)
def test_bad_tools_are_400_naming_the_field(
    server: ServerProcess, tools: Any, choice: Any, param: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": ASK, "max_tokens": 4}
    if tools is not None:
        body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    r = _post(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_bad_history_arguments_are_400(server: ServerProcess) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{"},
    }
    body = {
        "model": MODEL,
        "messages": [*ASK, {"role": "assistant", "tool_calls": [call]}],
        "tools": [WEATHER],
        "max_tokens": 4,
    }
    r = _post(server, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"


def test_tools_with_response_format_is_400(server: ServerProcess) -> None:
    body = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "response_format": {"type": "json_object"},
    }
    r = _post(server, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format"
