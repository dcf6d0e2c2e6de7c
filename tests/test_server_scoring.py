"""Scoring prompts over HTTP: ``echo`` + ``logprobs`` (+ ``max_tokens`` 0 or 1) on
``/v1/completions``, as lm-evaluation-harness's ``local-completions`` model asks for
loglikelihoods; vLLM's ``prompt_logprobs``; ``/tokenize``, ``/detokenize`` and
``/v1/models``; against a real ``poot-serve`` process serving the default model.

lm-eval itself is not a test dependency (it pulls torch, transformers and datasets): the
requests below are its exact payload (``LocalCompletionsAPI._create_payload`` with
``generate=False``: token-id prompts, ``temperature`` 0, ``max_tokens`` 1, ``logprobs`` 1,
``seed`` 1234, ``echo``) and its parsing (``parse_logprobs``: the sum of
``token_logprobs[ctxlen:-1]`` and the greedy check against ``top_logprobs``). Every value is
compared bit for bit with ``LLM.logits`` in this process (the CPU numerics are batch- and
thread-count-invariant).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")

from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines  # noqa: E402

from poot import LLM  # noqa: E402
from poot.engine_core import log_softmax  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1"
CONTEXT = "Question: What is the capital of France?\nAnswer:"
CONTINUATIONS = [" Paris", " London", " the city of Lyon"]


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(["--model", str(default_model_path), "--threads", "2", "-q"])
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


@pytest.fixture(scope="module")
def llm(default_model_path: Path) -> LLM:
    return LLM(str(default_model_path), threads=1, progress=False)


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _requests(llm: LLM) -> list[tuple[list[int], int]]:
    """lm-eval's (context + continuation token ids, context length) per request."""
    ctx = llm.tokenizer.encode(CONTEXT)
    return [(ctx + llm.tokenizer.encode_continuation(c), len(ctx)) for c in CONTINUATIONS]


def _expected(llm: LLM, ids: list[int], ctxlen: int) -> tuple[list[float], bool]:
    lps, greedy = [], True
    for i in range(ctxlen, len(ids)):
        logits = llm.logits(ids[:i])
        lps.append(float(log_softmax(logits)[ids[i]]))
        greedy = greedy and int(np.argmax(logits)) == ids[i]
    return lps, greedy


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_lm_eval_loglikelihood_equals_llm_logits(
    server: ServerProcess, llm: LLM, max_tokens: int
) -> None:
    reqs = _requests(llm)
    body = {
        "model": MODEL,
        "prompt": [ids for ids, _ in reqs],
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert len(choices) == len(reqs)
    for choice, (ids, ctxlen) in zip(choices, reqs, strict=True):
        lp = choice["logprobs"]
        n = len(ids) + max_tokens
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        # lm-eval's parse_logprobs (it drops the one generated token with [:-1]).
        end = None if max_tokens == 0 else -1
        tokens_logprobs = lp["token_logprobs"][ctxlen:end]
        top_logprobs = lp["top_logprobs"][ctxlen:end]
        is_greedy = all(
            tok == max(top.values()) for tok, top in zip(tokens_logprobs, top_logprobs, strict=True)
        )
        want, want_greedy = _expected(llm, ids, ctxlen)
        assert tokens_logprobs == want  # float32 values, bit for bit
        assert sum(tokens_logprobs) == sum(want)
        assert is_greedy == want_greedy
        if max_tokens == 0:
            assert choice["finish_reason"] == "length"
            assert r.json()["usage"]["completion_tokens"] == 0


def test_prompt_logprobs_field_and_chunked_prefill(server: ServerProcess, llm: LLM) -> None:
    # Over 256 tokens: the server's prefill runs in several chunks.
    text = " ".join(f"word{i}" for i in range(120))
    ids = llm.tokenizer.encode(text)
    assert len(ids) > 300
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for i in (1, 100, 255, 256, 257, len(ids) - 1):
        lps = log_softmax(llm.logits(ids[:i]))
        entry = got[i]
        assert entry[str(ids[i])]["logprob"] == float(lps[ids[i]])
        top = sorted((v["rank"], int(k), v["logprob"]) for k, v in entry.items() if v["rank"] <= 2)
        assert [t for _, t, _ in top] == [int(t) for t in np.argsort(-lps, kind="stable")[:2]]


def test_streamed_echo_logprobs(server: ServerProcess, llm: LLM) -> None:
    ids, ctxlen = _requests(llm)[0]
    body = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": 1,
        "echo": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    import json

    chunks = [json.loads(line[6:]) for line in lines]
    first = chunks[0]["choices"][0]["logprobs"]
    assert first["token_logprobs"][0] is None
    assert first["token_logprobs"][1 : len(ids)] == [
        float(log_softmax(llm.logits(ids[:i]))[ids[i]]) for i in range(1, len(ids))
    ]
    assert chunks[0]["choices"][0]["text"].startswith(llm.tokenizer.decode(ids)[:5])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": "hi", "echo": True, "logprobs": 21}, "logprobs"),
    ],
)
def test_bad_scoring_requests_are_400(
    server: ServerProcess, body: dict[str, Any], param: str
) -> None:
    r = _post(server, "/v1/completions", {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tokenize_and_detokenize(server: ServerProcess, llm: LLM) -> None:
    text = "Hello world, how are you?"
    r = _post(server, "/tokenize", {"model": MODEL, "prompt": text})
    assert r.status_code == 200
    got = r.json()
    assert got["tokens"] == llm.tokenizer.encode(text)
    assert got["count"] == len(got["tokens"])
    assert got["max_model_len"] == llm.max_model_len
    strs = _post(server, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert strs["token_strs"] == [llm.tokenizer.id_to_token(t) for t in got["tokens"]]
    back = _post(server, "/detokenize", {"model": MODEL, "tokens": got["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}
    messages = [{"role": "user", "content": "Hi"}]
    chat = _post(server, "/tokenize", {"messages": messages}).json()
    rendered = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert chat["tokens"] == llm.tokenizer.encode(rendered, add_special_tokens=False)


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (
            "/tokenize",
            {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
            400,
            "prompt",
        ),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ],
)
def test_bad_tokenize_requests(
    server: ServerProcess, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_models_reports_max_model_len(server: ServerProcess, llm: LLM) -> None:
    data = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    assert data[0]["id"] == MODEL
    assert data[0]["max_model_len"] == llm.max_model_len
