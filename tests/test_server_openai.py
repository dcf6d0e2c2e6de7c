"""``poot-serve`` through the official ``openai`` client, sync and async, streamed and not,
on both routes, against a real server process on loopback.

Greedy outputs are checked token for token against ``poot.LLM`` run in this process on the
same checkpoint; the chat route is checked on the default model with its own template.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines  # noqa: E402

import poot  # noqa: E402

MODEL = "stories260K-f32"
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPTS = ["Once upon a time", "The cat sat", "Lily and Tom went to the park"]


@pytest.fixture(scope="module")
def gguf(stories: Path) -> Path:
    return stories / "stories260K-f32.gguf"


@pytest.fixture(scope="module")
def server(gguf: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(["--model", str(gguf), "--chat-template", TEMPLATE, "--threads", "1"])
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log())


@pytest.fixture(scope="module")
def llm(gguf: Path) -> Any:
    return poot.LLM(str(gguf), threads=1)


@pytest.fixture
def client(server: ServerProcess) -> Any:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def _greedy(llm: Any, prompt: Any, n: int) -> Any:
    return llm.generate(prompt, poot.SamplingParams(max_tokens=n, temperature=0.0))[0]


def test_models_lists_the_served_model(client: Any) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_matches_llm(client: Any, llm: Any) -> None:
    for prompt in PROMPTS:
        want = _greedy(llm, prompt, 24)
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        assert got.object == "text_completion"
        assert got.choices[0].text == want.outputs[0].text
        assert got.choices[0].finish_reason == want.outputs[0].finish_reason
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == len(want.outputs[0].token_ids)
        assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens


def test_completion_token_id_prompts_and_batches(client: Any, llm: Any) -> None:
    ids = llm.tokenizer.encode(PROMPTS[0])
    got = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert got.choices[0].text == _greedy(llm, ids, 8).outputs[0].text
    batch = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [_greedy(llm, p, 8).outputs[0].text for p in PROMPTS]


def test_completion_stream_matches_non_stream(client: Any) -> None:
    kw: dict[str, Any] = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 30, "temperature": 0}
    whole = client.completions.create(**kw)
    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_echo_and_max_tokens(client: Any) -> None:
    got = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=5, temperature=0, echo=True
    )
    assert got.choices[0].text.startswith(PROMPTS[0])
    assert got.usage.completion_tokens == 5


def test_n_and_seed(client: Any) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "prompt": PROMPTS[0],
        "max_tokens": 16,
        "temperature": 1.0,
        "seed": 7,
    }
    a = client.completions.create(**kw, n=3)
    b = client.completions.create(**kw, n=3)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # reproducible
    assert 3 <= a.usage.completion_tokens <= 3 * 16
    single = client.completions.create(**kw)  # seed + 0 is choice 0's seed
    assert single.choices[0].text == a.choices[0].text


def test_chat_sync_and_stream(client: Any, llm: Any) -> None:
    messages = [{"role": "user", "content": "Once upon a time"}]
    got = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=20, temperature=0
    )
    prompt = llm.tokenizer.apply_chat_template(messages, chat_template=TEMPLATE)
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    want = _greedy(llm, ids, 20).outputs[0]
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.usage.prompt_tokens == len(ids)
    assert got.usage.completion_tokens == len(want.token_ids)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == want.finish_reason
    assert chunks[-1].usage.total_tokens == len(ids) + len(want.token_ids)


def test_async_client_concurrent_streams(server: ServerProcess, client: Any) -> None:
    def want(prompt: str) -> str:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
        return str(r.choices[0].text)

    def want_chat(prompt: str) -> str:
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=20,
            temperature=0,
        )
        return str(r.choices[0].message.content)

    async def main() -> tuple[list[str], list[str], list[str]]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0
        ) as ac:

            async def one(prompt: str) -> str:
                stream = await ac.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True
                )
                return "".join([c.choices[0].text async for c in stream])

            async def chat(prompt: str) -> str:
                stream = await ac.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=20,
                    temperature=0,
                    stream=True,
                )
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            async def whole(prompt: str) -> str:
                r = await ac.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=20, temperature=0
                )
                return str(r.choices[0].text)

            return await asyncio.gather(
                asyncio.gather(*(one(p) for p in PROMPTS)),
                asyncio.gather(*(chat(p) for p in PROMPTS)),
                asyncio.gather(*(whole(p) for p in PROMPTS)),
            )

    streamed, chats, wholes = asyncio.run(main())
    assert streamed == [want(p) for p in PROMPTS]
    assert wholes == streamed
    assert chats == [want_chat(p) for p in PROMPTS]


def test_client_sees_typed_errors(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[1] * 600, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    assert "512" in e.value.message and "600" in e.value.message
    with pytest.raises(openai.NotFoundError) as nf:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=4)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    assert bad.value.param == "messages"
