"""``poot-serve`` over raw HTTP: every bad input is a 4xx in OpenAI's error shape, the API key,
/health (ok, dead), /metrics, cancel by id and client disconnects, against real server
processes on loopback."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import CLEAN_EXIT, ServerProcess, unexpected_log_lines

MODEL = "stories260K-f32"
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def gguf(stories: Path) -> Path:
    return stories / "stories260K-f32.gguf"


@pytest.fixture(scope="module")
def server(gguf: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        [
            "--model",
            str(gguf),
            "--threads",
            "1",
            "--max-body-bytes",
            str(BODY_LIMIT),
            "--max-n",
            "4",
        ]
    )
    yield srv
    assert srv.stop() in CLEAN_EXIT, srv.log()
    assert not unexpected_log_lines(srv.log()), srv.log()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


def _complete(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, **kw}


# ---- bad input ---------------------------------------------------------------------------


def test_malformed_json(http: httpx.Client) -> None:
    for raw in (b"{bad", b"", b'{"model": "x",}', b"\xff\xfe"):
        err = _error(http.post("/v1/completions", content=raw), 400)
        assert err["code"] == "invalid_json"
        assert err["type"] == "invalid_request_error"
    for raw in (b"[1, 2]", b'"text"', b"null"):
        err = _error(http.post("/v1/chat/completions", content=raw), 400)
        assert err["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "5"),
        ("max_tokens", 2.5),
        ("temperature", "hot"),
        ("prompt", 5),
        ("prompt", [1, "a"]),
        ("prompt", []),
        ("stream", "yes"),
        ("n", True),
        ("stop", [1, 2]),
        ("logit_bias", {"5": "x"}),
        ("seed", 1.5),
    ],
)
def test_wrong_types(http: httpx.Client, field: str, value: Any) -> None:
    err = _error(http.post("/v1/completions", json=_complete(**{field: value})), 400)
    assert err["param"] is not None and err["param"].split(".")[0] == field
    assert err["code"] == "invalid_value"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", -1),
        ("max_tokens", 0),
        ("temperature", -0.5),
        ("temperature", 3.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("n", 0),
        ("presence_penalty", 5.0),
        ("logprobs", 21),
        ("logit_bias", {"5": 101}),
    ],
)
def test_out_of_range(http: httpx.Client, field: str, value: Any) -> None:
    err = _error(http.post("/v1/completions", json=_complete(**{field: value})), 400)
    assert err["param"] is not None and err["param"].split(".")[0] == field


def test_semantic_refusals(http: httpx.Client) -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        (_complete(n=5), "n", "invalid_value"),  # above --max-n 4
        (_complete(logit_bias={"abc": 1}), "logit_bias", "invalid_value"),
        (_complete(logit_bias={"99999": 1}), "logit_bias", "invalid_value"),
        (_complete(prompt=[1, 512]), "prompt", "invalid_value"),  # vocab is 512
        (_complete(suffix="x"), "suffix", "unsupported_parameter"),
        (_complete(best_of=3), "best_of", "unsupported_parameter"),
        (_complete(stop=["ok", ""]), "stop", "invalid_value"),
        (_complete(stream_options={"include_usage": True}), "stream_options", "invalid_value"),
    ]
    for body, param, code in cases:
        err = _error(http.post("/v1/completions", json=body), 400)
        assert (err["param"], err["code"]) == (param, code), (body, err)


def test_unknown_fields(http: httpx.Client) -> None:
    err = _error(http.post("/v1/completions", json=_complete(frobnicate=1)), 400)
    assert err["param"] == "frobnicate" and err["code"] == "unknown_parameter"
    err = _error(
        http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x", "mood": 1}]},
        ),
        400,
    )
    assert err["param"] == "messages.0.mood"
    err = _error(
        http.post("/v1/completions", json=_complete(stream=True, stream_options={"x": 1})), 400
    )
    assert err["param"] == "stream_options.x"


def test_chat_bad_messages(http: httpx.Client) -> None:
    for messages, param in (
        ([], "messages"),
        ([{"role": "wizard", "content": "x"}], "messages.0.role"),
        ([{"content": "x"}], "messages.0.role"),
        ("hello", "messages"),
    ):
        body = {"model": MODEL, "messages": messages}
        err = _error(http.post("/v1/chat/completions", json=body), 400)
        assert err["param"] == param, err
    # stories260K has no chat template: a typed 400, not a 500.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    err = _error(http.post("/v1/chat/completions", json=body), 400)
    assert err["code"] == "chat_template_error"


def test_over_long_prompt_names_both_numbers(http: httpx.Client) -> None:
    err = _error(http.post("/v1/completions", json=_complete(prompt=[1] * 700)), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "512" in err["message"] and "700" in err["message"]
    err = _error(
        http.post("/v1/completions", json=_complete(prompt=[1] * 100, max_tokens=500)), 400
    )
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert all(str(n) in err["message"] for n in (512, 100, 500))


def test_huge_bodies(server: ServerProcess, http: httpx.Client) -> None:
    big = json.dumps(_complete(prompt="x" * (BODY_LIMIT + 10))).encode()
    err = _error(http.post("/v1/completions", content=big), 413)
    assert err["code"] == "request_too_large" and str(BODY_LIMIT) in err["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    err = _error(http.post("/v1/completions", content=chunks()), 413)
    assert err["code"] == "request_too_large"
    assert http.get("/health").status_code == 200


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert _error(http.get("/v1/nothing"), 404)["code"] == "not_found"
    assert _error(http.get("/v1/completions"), 405)["code"] == "method_not_allowed"
    err = _error(http.post("/v1/requests/nope/cancel"), 404)
    assert err["code"] == "request_not_found"


# ---- health, metrics, cancel, disconnect -------------------------------------------------------


def test_health_and_metrics(server: ServerProcess, http: httpx.Client) -> None:
    r = http.get("/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    http.post("/v1/completions", json=_complete())
    text = http.get("/metrics").text
    for name in (
        'poot_requests_total{outcome="ok",route="completions"}',
        "poot_prompt_tokens_total",
        "poot_generation_tokens_total",
        "poot_time_to_first_token_seconds_bucket",
        "poot_inter_token_latency_seconds_bucket",
        "poot_kv_blocks_used",
        "poot_queue_depth",
        "poot_prepared_entry_hits_total",
    ):
        assert name in text, name
    assert server.metric("poot_generation_tokens_total") >= 4
    assert server.wait_metric("poot_kv_blocks_used", 0) == 0


def _stream_lines(r: httpx.Response) -> Iterator[dict[str, Any] | str]:
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def test_cancel_by_request_id(server: ServerProcess, http: httpx.Client) -> None:
    body = _complete(max_tokens=400, ignore_eos=True, stream=True, temperature=0)
    before = server.metric("poot_requests_total", 'outcome="cancelled",route="completions"')
    with http.stream(
        "POST", "/v1/completions", json=body, headers={"X-Request-Id": "req-cancel-1"}
    ) as r:
        assert r.headers["x-request-id"] == "req-cancel-1"
        events = []
        for event in _stream_lines(r):
            events.append(event)
            if len(events) == 3:
                dup = http.post(
                    "/v1/completions", json=_complete(), headers={"X-Request-Id": "req-cancel-1"}
                )
                assert _error(dup, 409)["code"] == "duplicate_request_id"
                c = http.post("/v1/requests/req-cancel-1/cancel")
                assert c.status_code == 200 and c.json()["cancelled"] is True
    assert events[-1] == "[DONE]"
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if isinstance(e, dict)]
    assert finishes[-1] == "cancelled" and len(finishes) < 400
    after = server.metric("poot_requests_total", 'outcome="cancelled",route="completions"')
    assert after == before + 1
    assert server.wait_metric("poot_kv_blocks_used", 0) == 0
    # The id is free again.
    assert _error(http.post("/v1/requests/req-cancel-1/cancel"), 404)["code"] == "request_not_found"


def test_bad_request_id(http: httpx.Client) -> None:
    err = _error(
        http.post("/v1/completions", json=_complete(), headers={"X-Request-Id": "a b"}), 400
    )
    assert err["param"] == "X-Request-Id"


def test_disconnect_cancels(server: ServerProcess) -> None:
    before = server.metric("poot_requests_total", 'outcome="disconnected",route="completions"')
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps(_complete(max_tokens=480, ignore_eos=True, stream=True)).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    end = time.monotonic() + 30
    label = 'outcome="disconnected",route="completions"'
    while server.metric("poot_requests_total", label) != before + 1 and time.monotonic() < end:
        time.sleep(0.05)
    assert server.metric("poot_requests_total", label) == before + 1
    assert server.wait_metric("poot_kv_blocks_used", 0) == 0


# ---- API key -----------------------------------------------------------------------------------


def test_api_key(gguf: Path) -> None:
    srv = ServerProcess(["--model", str(gguf), "--threads", "1"], env={"POOT_API_KEY": "s3cret"})
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            assert http.get("/health").status_code == 200  # health needs no key
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "s3cret"},
                {"Authorization": "Basic s3cret"},
            ):
                for path in ("/v1/models", "/v1/completions"):
                    r = http.request(
                        "GET" if path == "/v1/models" else "POST",
                        path,
                        json=_complete(),
                        headers=headers,
                    )
                    assert _error(r, 401)["code"] == "invalid_api_key"
            ok = {"Authorization": "Bearer s3cret"}
            assert http.get("/v1/models", headers=ok).status_code == 200
            assert http.post("/v1/completions", json=_complete(), headers=ok).status_code == 200
    finally:
        assert srv.stop() in CLEAN_EXIT


# ---- a poisoned runtime ------------------------------------------------------------------------


def test_poisoned_runtime_reports_dead(gguf: Path) -> None:
    # A step deadline no step can meet: the first step poisons the runtime for real.
    srv = ServerProcess(["--model", str(gguf), "--threads", "1", "--step-timeout", "1e-9"])
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            err = _error(http.post("/v1/completions", json=_complete()), 503)
            assert err["code"] == "runtime_dead" and err["type"] == "server_error"
            r = http.get("/health")
            assert (r.status_code, r.json()) == (503, {"status": "dead"})
            err = _error(http.post("/v1/completions", json=_complete()), 503)
            assert err["code"] == "runtime_dead"
    finally:
        assert srv.stop() in CLEAN_EXIT
