"""``LLM`` over the Rust scheduler (``poot._native.Scheduler``): batching, block accounting on
every way out, preemption, and the native bindings' errors and step layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runtime_hooks import HookedRuntime

from poot import SamplingParams, _native, errors

PROMPTS = [
    "Once upon a time",
    "The cat",
    "Lily and Tom went to",
    "One day, a little bird",
    [1, 403, 407],
]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture(params=["cpu", "numpy"])
def llm(request: pytest.FixtureRequest, make_llm: Callable[..., Any], stories: Path) -> Any:
    return make_llm(stories / "stories260K-f32.gguf", request.param, max_step_tokens=8)


def test_batched_equals_one_at_a_time(llm: Any) -> None:
    together = llm.generate(PROMPTS, GREEDY)
    assert llm.scheduler.used_blocks == 0
    for prompt, out in zip(PROMPTS, together, strict=True):
        alone = llm.generate(prompt, GREEDY)[0]
        assert alone.outputs[0].token_ids == out.outputs[0].token_ids
        assert len(out.outputs[0].token_ids) == 20
    assert llm.scheduler.stats()["steps"] > 0


def test_preemption_keeps_greedy_output(make_llm: Callable[..., Any], stories: Path) -> None:
    path = stories / "stories260K-f32.gguf"
    kw = {"max_step_tokens": 8, "max_model_len": 48, "block_size": 4}
    roomy = make_llm(path, "cpu", **kw)
    tight = make_llm(path, "cpu", num_blocks=14, **kw)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, params)]
    got = [o.outputs[0].token_ids for o in tight.generate(PROMPTS, params)]
    assert got == want
    assert tight.scheduler.stats()["preemptions"] > 0
    assert tight.scheduler.used_blocks == 0


def test_blocks_return_after_finish(llm: Any) -> None:
    llm.generate(PROMPTS, GREEDY)
    assert llm.scheduler.used_blocks == 0
    llm.logits([1, 403, 407])
    assert llm.scheduler.used_blocks == 0
    assert not llm.scheduler.has_unfinished_requests


def test_blocks_return_after_closed_stream_mid_decode(llm: Any) -> None:
    it = llm.generate_stream(PROMPTS[0], SamplingParams(max_tokens=40, temperature=0.0))
    for _ in range(3):
        next(it)
    assert llm.scheduler.used_blocks > 0
    it.close()
    assert llm.scheduler.used_blocks == 0
    assert not llm.scheduler.has_unfinished_requests
    assert not llm.scheduler.step_in_flight


@pytest.mark.parametrize("abort", [GeneratorExit, KeyboardInterrupt])
def test_blocks_return_after_abort_mid_prefill(
    make_llm: Callable[..., Any], stories: Path, monkeypatch: pytest.MonkeyPatch, abort: type
) -> None:
    # A 60-token prompt in steps of 4: the stream is ended (GeneratorExit is what close()
    # delivers; KeyboardInterrupt a Ctrl-C) on its 5th prefill step, before its first token.
    llm = make_llm(stories / "stories260K-f32.gguf", "cpu", max_step_tokens=4, block_size=4)
    prompt = [1, *range(300, 359)]
    used = -1

    def aborting(calls: int) -> None:
        nonlocal used
        if calls == 5:
            used = llm.scheduler.used_blocks
            raise abort()

    runtime = llm.runner.runtime
    monkeypatch.setattr(llm.runner, "runtime", HookedRuntime(runtime, aborting))
    it = llm.generate_stream(prompt, SamplingParams(max_tokens=8, temperature=0.0))
    with pytest.raises(abort):
        next(it)
    assert used >= 5  # blocks were held mid-prefill
    assert llm.stats()["prefill_computed_tokens"] == 20 < len(prompt)
    assert llm.scheduler.used_blocks == 0
    assert not llm.scheduler.has_unfinished_requests
    assert not llm.scheduler.step_in_flight
    monkeypatch.setattr(llm.runner, "runtime", runtime)
    assert len(llm.generate(prompt, GREEDY)[0].outputs[0].token_ids) == 20
    assert llm.scheduler.used_blocks == 0


def test_blocks_return_after_an_error(llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    want = llm.generate(PROMPTS[:2], GREEDY)

    def failing(calls: int) -> None:
        if calls == 4:
            raise errors.DeviceTimeoutError("injected", during="run")

    runtime = llm.runner.runtime
    monkeypatch.setattr(llm.runner, "runtime", HookedRuntime(runtime, failing))
    with pytest.raises(errors.DeviceTimeoutError):
        llm.generate(PROMPTS[:2], GREEDY)
    monkeypatch.setattr(llm.runner, "runtime", runtime)
    assert llm.scheduler.used_blocks == 0
    assert not llm.scheduler.has_unfinished_requests
    assert not llm.scheduler.step_in_flight
    again = llm.generate(PROMPTS[:2], GREEDY)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in want]


def test_request_too_big_for_the_pool(make_llm: Callable[..., Any], stories: Path) -> None:
    llm = make_llm(
        stories / "stories260K-f32.gguf", "numpy", max_model_len=64, block_size=4, num_blocks=4
    )
    with pytest.raises(errors.ContextLengthError):
        llm.generate([1] * 20, GREEDY)
    assert llm.scheduler.used_blocks == 0
    assert llm.scheduler.num_blocks == 4


def _scheduler(**kw: Any) -> _native.Scheduler:
    settings: dict[str, Any] = {
        "max_num_seqs": 4,
        "max_batched_tokens": 8,
        "max_step_tokens": 8,
        "max_model_len": 32,
        "block_size": 4,
        "num_blocks": 16,
    }
    settings.update(kw)
    return _native.Scheduler(**settings)


def test_native_scheduler_errors() -> None:
    s = _scheduler()
    with pytest.raises(errors.ContextLengthError):
        s.add_request(0, [1] * 32, 4)
    with pytest.raises(errors.ContextLengthError):
        s.add_request(0, [], 4)
    with pytest.raises(errors.ContextLengthError):
        _scheduler(num_blocks=2).add_request(0, [1] * 20, 4)
    with pytest.raises(errors.SamplingParamsError):
        s.add_request(0, [1, 2], 0)
    s.add_request(0, [1, 2], 4)
    with pytest.raises(ValueError, match="already"):
        s.add_request(0, [1, 2], 4)
    with pytest.raises(ValueError):
        s.update([])  # no step in flight
    with pytest.raises(errors.ConfigError):
        _scheduler(max_num_seqs=0)


def test_native_plan_layout() -> None:
    s = _scheduler()
    s.add_request(7, list(range(10, 20)), 2, eos_ids=[99])
    plan = s.schedule()
    assert plan["request_ids"] == [7] and plan["row_tokens"] == [8] and plan["sample"] == [False]
    assert plan["num_tokens"] == 8 and plan["preempted"] == [] and plan["dims"] == (8, 1, 2)
    f = plan["inputs"]
    assert f["ids"].tolist() == list(range(10, 18))
    assert f["positions"].tolist() == list(range(8))
    assert f["block_tables"].shape == (1, 2) and f["block_tables"].dtype == np.int32
    table = f["block_tables"][0]
    assert 0 not in table.tolist()  # the null block is never handed out
    assert f["slot_mapping"].tolist() == [int(table[p // 4]) * 4 + p % 4 for p in range(8)]
    assert s.update([]) == []
    plan = s.schedule()
    assert plan["row_tokens"] == [2] and plan["sample"] == [True]
    # Padded to the graph's dims: 2 tokens stay 2, the third block's column pads to 4.
    f = plan["inputs"]
    assert plan["dims"] == (2, 1, 4) and f["last_rows"].tolist() == [1]
    assert f["block_tables"][0].tolist()[3:] == [0]  # padding columns point at the null block
    assert s.update([(7, 5)]) == [(7, 5, None)]
    s.schedule()
    assert s.update([(7, 99)]) == [(7, 99, "stop")]
    assert s.used_blocks == 0 and not s.has_unfinished_requests


def test_native_abort_mid_step() -> None:
    s = _scheduler()
    s.add_request(1, [1, 2, 3], 4)
    s.schedule()
    assert s.used_blocks > 0
    assert s.abort(1) and not s.abort(1)
    assert s.update([]) == []
    assert s.used_blocks == 0
