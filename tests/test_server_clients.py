"""The libraries people put in front of an OpenAI-compatible server, unchanged, against a real
``poot-serve`` on loopback serving the default model: langchain-openai (``bind_tools``,
``with_structured_output`` by function calling and by JSON schema, streaming) and instructor
(its default TOOLS mode and JSON_SCHEMA mode).

The model is tiny, so calls are forced (a named ``tool_choice``) where a test needs one; what is
asserted is that each library gets what it parses: validated arguments, pydantic objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines

MODEL = "SmolLM2-135M-Instruct.Q4_1"
ASK = "What is the weather like in Paris? Answer in celsius."


class Weather(BaseModel):
    """The weather report for a city."""

    city: str = Field(max_length=40)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(["--model", str(default_model_path), "--threads", "2", "-q"])
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


@pytest.fixture
def chat_model(server: ServerProcess) -> Any:
    lc = pytest.importorskip("langchain_openai")
    return lc.ChatOpenAI(
        model=MODEL,
        base_url=f"{server.url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=80,
        max_retries=0,
    )


def get_weather(city: str, unit: str) -> str:
    """The current weather in a city.

    Args:
        city: the city.
        unit: celsius or fahrenheit.
    """
    return f"21 {unit} in {city}"


def test_langchain_bind_tools(chat_model: Any) -> None:
    bound = chat_model.bind_tools([get_weather], tool_choice="get_weather")
    msg = bound.invoke(ASK)
    assert len(msg.tool_calls) >= 1
    call = msg.tool_calls[0]
    assert call["name"] == "get_weather"
    assert set(call["args"]) == {"city", "unit"}
    assert call["id"].startswith("call_")
    assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_bind_tools_streaming(chat_model: Any) -> None:
    bound = chat_model.bind_tools([get_weather], tool_choice="get_weather")
    merged = None
    chunks = 0
    for chunk in bound.stream(ASK):
        merged = chunk if merged is None else merged + chunk
        chunks += 1
    assert merged is not None and chunks > 1
    assert merged.tool_calls and merged.tool_calls[0]["name"] == "get_weather"
    assert set(merged.tool_calls[0]["args"]) == {"city", "unit"}


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_structured_output(chat_model: Any, method: str) -> None:
    structured = chat_model.with_structured_output(Weather, method=method)
    got = structured.invoke(ASK)
    assert isinstance(got, Weather)


def test_langchain_plain_streaming(chat_model: Any) -> None:
    text = "".join(str(c.content) for c in chat_model.stream("Say hello."))
    assert text


@pytest.fixture
def openai_client(server: ServerProcess) -> Iterator[Any]:
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor(openai_client: Any, mode: str) -> None:
    instructor = pytest.importorskip("instructor")
    client = instructor.from_openai(openai_client, mode=getattr(instructor.Mode, mode))
    got = client.chat.completions.create(
        model=MODEL,
        response_model=Weather,
        messages=[{"role": "user", "content": ASK}],
        temperature=0,
        max_tokens=80,
        max_retries=0,
    )
    assert isinstance(got, Weather)
