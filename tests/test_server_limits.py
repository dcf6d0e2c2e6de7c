"""``poot-serve`` on the default model (SmolLM2-135M-Instruct): its limits (a full queue
answers 429 with Retry-After, a request that waits too long 503 ``queue_timeout``, one that
runs too long ends with ``request_timeout``), the real chat template, and response_format
(json_schema, json_object). Real server processes on loopback."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines

import poot

openai = pytest.importorskip("openai")

NAME = "smol"
# One row: the server's own fit would find room for many (POOT_SERVE_MAX_ROWS, docs/server.md).
ONE_ROW = {"POOT_SERVE_MAX_ROWS": "1"}


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        [
            "--model",
            str(default_model_path),
            "--served-model-name",
            NAME,
            "--max-model-len",
            "4096",
            "--max-queue",
            "1",
            # B must still be waiting when the test has seen it queued and sent C (the queue
            # timeout), and A still running when B gives up (the request timeout): windows of
            # seconds, not one, so a loaded machine does not turn them into a race.
            "--queue-timeout",
            "3",
            "--request-timeout",
            "8",
            "--threads",
            "1",
        ],
        env=ONE_ROW,
    )
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


@pytest.fixture(scope="module")
def patient_server(default_model_path: Path) -> Iterator[ServerProcess]:
    """One row and a one-request queue, with the default (long) queue and request timeouts:
    a request waits in the queue for as long as the running one holds the row."""
    srv = ServerProcess(
        [
            "--model", str(default_model_path), "--served-model-name", NAME,
            "--max-model-len", "4096", "--max-queue", "1", "--threads", "1",
        ],
        env=ONE_ROW,
    )  # fmt: skip
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return dict(r.json()["error"])


def test_a_full_queue_answers_429(patient_server: ServerProcess) -> None:
    """Event-ordered, no race with a timer: A holds the only row until the test closes its
    stream (it asks for 4000 tokens), so B stays queued (60 s queue timeout) and C meets a full
    queue however loaded the machine is; closing A hands the row to B."""
    srv = patient_server
    long = {"model": NAME, "prompt": "Tell me a story.", "max_tokens": 4000, "ignore_eos": True}
    queued: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        with http.stream("POST", "/v1/completions", json={**long, "stream": True}) as a:
            lines = a.iter_lines()  # kept: dropping it would close A's stream
            first = next(line for line in lines if line.startswith("data: "))
            assert '"finish_reason":null' in first, first  # A runs
            b = threading.Thread(
                target=lambda: queued.setdefault(
                    "r", http.post("/v1/completions", json={**long, "max_tokens": 2})
                )
            )
            b.start()
            assert srv.wait_metric("poot_queue_depth", 1) == 1, queued  # B waits
            c = http.post("/v1/completions", json={**long, "max_tokens": 2})
            err = _error(c, 429)
            assert err["code"] == "queue_full" and err["type"] == "rate_limit_error"
            assert int(c.headers["retry-after"]) >= 1
        b.join(120)  # A's stream closed: the server drops it and B gets the row
    assert queued["r"].status_code == 200, queued["r"].text
    assert srv.metric("poot_requests_total", 'outcome="rejected",route="completions"') == 1
    assert srv.wait_metric("poot_kv_blocks_used", 0) == 0
    assert srv.metric("poot_queue_depth") == 0


def test_queue_timeout_and_request_timeout(server: ServerProcess) -> None:
    # Far more tokens than fit in the request timeout, however fast the machine.
    long = {"model": NAME, "prompt": "Tell me a story.", "max_tokens": 4000, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        events: list[Any] = []
        with http.stream("POST", "/v1/completions", json={**long, "stream": True}) as a:
            lines = a.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            events.append(json.loads(first[6:]))  # A holds the only row
            queued: dict[str, httpx.Response] = {}
            b = threading.Thread(
                target=lambda: queued.setdefault(
                    "r", http.post("/v1/completions", json={**long, "max_tokens": 2})
                )
            )
            b.start()
            assert server.wait_metric("poot_queue_depth", 1) == 1  # B waits
            b.join(30)
            err = _error(queued["r"], 503)  # B gave up after --queue-timeout 3
            assert err["code"] == "queue_timeout"
            for line in lines:  # A runs into --request-timeout 8
                if line.startswith("data: "):
                    data = line[6:]
                    events.append(data if data == "[DONE]" else json.loads(data))
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "request_timeout"
        # Non-streamed, the same timeout is a 504.
        err = _error(http.post("/v1/completions", json=long), 504)
        assert err["code"] == "request_timeout"
    assert server.metric("poot_requests_total", 'outcome="timeout",route="completions"') == 3
    assert server.wait_metric("poot_kv_blocks_used", 0) == 0
    assert server.metric("poot_queue_depth") == 0


def test_chat_uses_the_models_template(server: ServerProcess, default_model_path: Path) -> None:
    llm = poot.LLM(str(default_model_path), threads=1, max_model_len=1024)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    ids = llm.tokenizer.encode(
        llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True),
        add_special_tokens=False,
    )
    want = llm.generate(ids, poot.SamplingParams(max_tokens=12, temperature=0.0))[0].outputs[0]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        got = client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=12, temperature=0
        )
    assert got.usage.prompt_tokens == len(ids)
    assert got.choices[0].message.content == want.text
    assert got.choices[0].finish_reason == want.finish_reason


@pytest.mark.skipif(
    not {"json_object", "json_schema"} <= {f.name for f in dataclasses.fields(poot.SamplingParams)},
    reason="SamplingParams has no json_object/json_schema in this build",
)
def test_response_format(server: ServerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        got = client.chat.completions.create(
            model=NAME,
            messages=messages,
            max_tokens=40,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        )
        assert got.choices[0].finish_reason == "stop"
        value = json.loads(got.choices[0].message.content)
        assert set(value) == {"ok"} and isinstance(value["ok"], bool)
        # Greedy on this prompt the object closes after 8 tokens ({"name": "Paris"}), so the
        # parse below always runs (the sky prompt above recurses past any limit in json_object).
        named = [
            {"role": "user", "content": 'Give me a JSON object with the key "name" set to "Paris".'}
        ]
        got = client.chat.completions.create(
            model=NAME,
            messages=named,
            max_tokens=40,
            temperature=0,
            response_format={"type": "json_object"},
        )
        text = got.choices[0].message.content
        assert text.lstrip().startswith("{")  # guided from the first token
        assert got.choices[0].finish_reason == "stop", text
        assert set(json.loads(text)) == {"name"}
