"""``poot._native.StepDriver`` on its own: each request's sampling state between steps (numpy's
seeded stream continued draw for draw, penalty counts, logit bias) and a step's sampling
inputs, read from steps planned but not run (``step(fast=False)``), and its refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from poot import _native


def _unused_plan(key: Any, uses: Any) -> Any:
    raise AssertionError("a step planned with fast=False never asks for a plan")


def _unused_mask(rows: Any, seqs: int) -> Any:
    raise AssertionError("a step planned with fast=False never fills a mask")


def _driver(**kw: Any) -> _native.StepDriver:
    sched = _native.Scheduler(
        max_num_seqs=4,
        max_batched_tokens=16,
        max_step_tokens=16,
        max_model_len=64,
        block_size=4,
        num_blocks=32,
        **kw,
    )
    return _native.StepDriver(
        sched,
        None,
        _unused_plan,
        _unused_mask,
        timeout_s=1.0,
        samples_on_device=True,
        logprob_width=20,
    )


def _add(
    d: _native.StepDriver, rid: int, rng: np.random.Generator, prompt: list[int], **kw: Any
) -> None:
    settings: dict[str, Any] = dict(
        temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, repetition=1.0, presence=0.0,
        frequency=0.0, bias=[], logprobs=False, prompt_logprobs=False, guided=False,
    )  # fmt: skip
    settings.update(kw)
    d.add_request(
        rid, prompt, 8, eos_ids=[], stop_ids=[], ignore_eos=True,
        rng_state=rng.bit_generator.state, **settings,
    )  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**64 - 1, None])
@pytest.mark.parametrize("drawn", [0, 1, 3])
def test_draws_continue_numpy_s_stream_bit_for_bit(seed: int | None, drawn: int) -> None:
    # `drawn` floats taken before admission: an odd count hands over a half-used 64-bit draw.
    rng = np.random.default_rng(seed)
    rng.random(drawn, dtype=np.float32)
    ref = np.random.Generator(np.random.PCG64())
    ref.bit_generator.state = rng.bit_generator.state
    want = [ref.random(dtype=np.float32) for _ in range(8)]
    d = _driver()
    _add(d, 0, rng, [1, 2, 3])
    got = []
    for _ in range(8):
        out = d.step(False)
        assert out["ran"] is False and out["sample"] == [True]
        got.append(out["sampling"]["uniform"][0])
        d.update([(0, 5)])
    assert np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_prefill_chunks_draw_nothing() -> None:
    rng = np.random.default_rng(3)
    want = np.random.default_rng(3).random(dtype=np.float32)
    d = _driver()
    _add(d, 0, rng, list(range(1, 21)))  # 20 tokens: a 16-token chunk, then 4
    first = d.step(False)
    assert first["sample"] == [False] and first["prefill"] == [True]
    assert first["sampling"]["uniform"][0] == 0.0
    d.update([])
    second = d.step(False)
    assert second["sample"] == [True] and second["sampling"]["uniform"][0] == want
    assert d.prefill_tokens == 20 and d.decode_tokens == 0


def _entries(out: dict[str, Any], row: int) -> set[tuple[int, int, float]]:
    s = out["sampling"]
    return {
        (int(i), int(c), float(b))
        for i, c, b in zip(s["adj_ids"][row], s["adj_counts"][row], s["adj_bias"][row], strict=True)
        if i >= 0
    }


def test_adjust_lists_follow_penalties_bias_and_accepted_tokens() -> None:
    d = _driver()
    rng = np.random.default_rng(0)
    _add(d, 0, rng, [5, 6, 5], repetition=1.3, bias=[(6, 2.0), (9, -1.0)])
    _add(d, 1, rng, [1, 2], presence=0.5)
    _add(d, 2, rng, [3, 4])  # plain: adjusts nothing
    out = d.step(False)
    assert out["adjust"] == 16 and out["sampling"]["adj_ids"].shape == (4, 16)
    # Prompt tokens count 0 under a repetition penalty; a biased one keeps its count.
    assert _entries(out, 0) == {(5, 0, 0.0), (6, 0, 2.0), (9, -1, -1.0)}
    assert _entries(out, 1) == set()  # presence alone skips the prompt
    assert _entries(out, 2) == set() and _entries(out, 3) == set()  # plain and padding rows
    assert list(out["sampling"]["repetition"]) == pytest.approx([1.3, 1.0, 1.0, 1.0])
    d.update([(0, 6), (1, 7), (2, 8)])
    d.step(False)
    d.update([(0, 7), (1, 7), (2, 8)])
    out = d.step(False)
    assert _entries(out, 0) == {(5, 0, 0.0), (6, 1, 2.0), (7, 1, 0.0), (9, -1, -1.0)}
    assert _entries(out, 1) == {(7, 2, 0.0)}


def test_guided_and_logprob_rows_shape_the_step() -> None:
    d = _driver()
    rng = np.random.default_rng(0)
    _add(d, 0, rng, [1, 2], guided=True)
    _add(d, 1, rng, [3, 4], logprobs=True)
    out = d.step(False)
    assert out["ran"] is False and out["mask_rows"] == [0] and out["logprobs"] is True
    assert out["adjust"] == 0 and "adj_ids" not in out["sampling"]
    assert set(out["inputs"]) == {
        "ids", "positions", "slot_mapping", "token_seq", "block_tables", "last_rows",
    }  # fmt: skip


def test_a_prompt_logprob_request_reads_no_cached_prefix() -> None:
    # Every prompt position's logits must come from the request's own prefill.
    d = _driver(enable_prefix_caching=True)
    rng = np.random.default_rng(0)
    prompt = list(range(1, 11))  # two full blocks of 4 and two tokens
    for rid, kw in enumerate([{}, {}, {"prompt_logprobs": True}]):
        _add(d, rid, rng, prompt, **kw)
        out = d.step(False)
        assert out["request_ids"] == [rid]
        assert out["num_cached_tokens"] == [0, 8, 0][rid]
        d.update([(rid, 5)])
        assert d.abort(rid)  # its full blocks stay cached


def test_bad_requests_are_refused_and_lose_nothing() -> None:
    d = _driver()
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="PCG64"):
        _add(d, 0, np.random.Generator(np.random.MT19937(0)), [1, 2])
    _add(d, 0, rng, [1, 2])
    with pytest.raises(ValueError, match="already"):
        _add(d, 0, rng, [1, 2])
    with pytest.raises(ValueError, match="timeout_s"):
        _native.StepDriver(
            _native.Scheduler(
                max_num_seqs=1, max_batched_tokens=4, max_step_tokens=4, max_model_len=8,
                block_size=4, num_blocks=4,
            ),
            None, _unused_plan, _unused_mask, timeout_s=-1.0, samples_on_device=True,
            logprob_width=20,
        )  # fmt: skip
    out = d.step(False)  # the first request is still there, as it was
    assert out["request_ids"] == [0] and out["sample"] == [True]
    assert d.abort(0) and not d.abort(0)


def test_request_keywords_are_parsed_once_for_the_scheduler_and_the_driver() -> None:
    # Both add_request methods read their keywords with one parser: a misspelt, missing or
    # mistyped keyword is the TypeError a Python signature raises, and queues nothing.
    d = _driver()
    rng = np.random.default_rng(0)
    kw: dict[str, Any] = dict(
        temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition=1.0, presence=0.0,
        frequency=0.0, bias=[], rng_state=rng.bit_generator.state, logprobs=False,
        prompt_logprobs=False, guided=False,
    )  # fmt: skip
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        d.add_request(0, [1, 2], 8, **kw, temprature=0.5)
    with pytest.raises(TypeError, match="argument 'top_k'"):
        d.add_request(0, [1, 2], 8, **{**kw, "top_k": "many"})
    with pytest.raises(TypeError, match="argument 'eos_ids'"):
        d.add_request(0, [1, 2], 8, **kw, eos_ids="2")
    with pytest.raises(TypeError, match="missing required keyword argument 'guided'"):
        d.add_request(0, [1, 2], 8, **{k: v for k, v in kw.items() if k != "guided"})
    # The scheduler's keywords default (no EOS, none ignored) and the request runs.
    d.add_request(0, [1, 2], 8, **kw)
    assert d.step(False)["request_ids"] == [0]
    sched = _native.Scheduler(
        max_num_seqs=1, max_batched_tokens=4, max_step_tokens=4, max_model_len=8,
        block_size=4, num_blocks=4,
    )  # fmt: skip
    with pytest.raises(TypeError, match="unexpected keyword argument 'eos'"):
        sched.add_request(0, [1], 4, eos=[2])
    sched.add_request(0, [1], 4, eos_ids=[2])
    assert sched.has_unfinished_requests
