"""``poot-serve``'s sampling options end to end through the ``openai`` client: stop strings,
logprobs (both routes' formats), logit_bias, penalties and min_p, and a bad response_format
(guided JSON itself is tested on the default model, in test_server_limits.py). Each is checked
against ``poot.LLM`` on the same checkpoint where the result is exact (greedy), and by its
defining property otherwise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines  # noqa: E402

import poot  # noqa: E402

MODEL = "stories260K-f32"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
PROMPT = "Once upon a time"
FIELDS = {f.name for f in dataclasses.fields(poot.SamplingParams)}


def needs(*names: str) -> pytest.MarkDecorator:
    missing = [n for n in names if n not in FIELDS]
    return pytest.mark.skipif(
        bool(missing), reason=f"SamplingParams has no {', '.join(missing)} in this build"
    )


@pytest.fixture(scope="module")
def gguf(stories: Path) -> Path:
    return stories / "stories260K-f32.gguf"


@pytest.fixture(scope="module")
def server(gguf: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(["--model", str(gguf), "--threads", "1", "--chat-template", TEMPLATE])
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


@pytest.fixture(scope="module")
def llm(gguf: Path) -> Any:
    return poot.LLM(str(gguf), threads=1)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


@needs("stop")
def test_stop_strings(client: Any, llm: Any) -> None:
    full = llm.generate(PROMPT, poot.SamplingParams(max_tokens=40, temperature=0.0))
    text = full[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    want = text[: text.index(stop)]
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "zzzz"]
    )
    assert got.choices[0].text == want
    assert got.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


@needs("logprobs")
def test_completion_logprobs(client: Any) -> None:
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3
    )
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert "".join(lp.tokens) == got.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for chosen, tops in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and len(tops) == 3
        assert math.isclose(max(tops.values()), chosen, abs_tol=1e-5)  # greedy: rank 1
    streamed = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, stream=True
        )
    )
    tokens = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


@needs("logprobs")
def test_chat_logprobs(client: Any) -> None:
    got = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens == 6
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.bytes == list(entry.token.encode())
        assert math.isclose(entry.top_logprobs[0].logprob, entry.logprob, abs_tol=1e-5)


@needs("logit_bias")
def test_logit_bias_forces_a_token(client: Any, llm: Any) -> None:
    tid = llm.tokenizer.encode(" cat", add_special_tokens=False)[-1]
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logit_bias={str(tid): 100}
    )
    assert got.choices[0].text == llm.tokenizer.decode([tid] * 5)


@needs("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
def test_penalties_and_min_p_match_llm(client: Any, llm: Any) -> None:
    kw: dict[str, Any] = {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.3,
        "min_p": 0.1,
    }
    want = llm.generate(PROMPT, poot.SamplingParams(max_tokens=24, temperature=0.0, **kw))
    got = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.3, "min_p": 0.1},
    )
    assert got.choices[0].text == want[0].outputs[0].text


def test_unparsable_schema_is_a_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x"}},
        )
    assert e.value.param == "response_format.json_schema"
