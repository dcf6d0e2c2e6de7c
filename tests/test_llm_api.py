"""The vLLM-shaped API: outputs, stop ids, max_tokens, streaming, batching, sampling params.

These run stories260K on the CPU runtime and on the numpy reference interpreter; the API logic
(chunking, block accounting, stopping, detokenizing) is the same on both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot
from poot import SamplingParams, errors

RUNTIMES = ["cpu", "numpy"]
PROMPT = "Once upon a time"
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(params=RUNTIMES)
def llm(request: pytest.FixtureRequest, make_llm: Callable[..., Any], stories: Path) -> Any:
    return make_llm(stories / "stories260K-f32.gguf", request.param, max_step_tokens=8)


def test_exports() -> None:
    assert poot.LLM is poot.llm.LLM
    assert poot.SamplingParams is SamplingParams
    assert {"LLM", "SamplingParams", "RequestOutput"} <= set(poot.__all__)


def test_output_shape(llm: Any) -> None:
    outs = llm.generate([PROMPT, [1, 403, 407]], GREEDY)
    assert len(outs) == 2
    first, second = outs
    assert isinstance(first, poot.RequestOutput)
    assert first.prompt == PROMPT and first.prompt_token_ids == [1, 403, 407, 261, 378]
    assert second.prompt is None and second.prompt_token_ids == [1, 403, 407]
    c = first.outputs[0]
    assert isinstance(c, poot.CompletionOutput)
    assert len(c.token_ids) == 24 and c.finish_reason == "length" and c.logprobs is None
    whole = llm.tokenizer.decode(first.prompt_token_ids + c.token_ids)
    assert c.text == whole[len(llm.tokenizer.decode(first.prompt_token_ids)) :]
    assert first.finished and first.request_id == "0" and second.request_id == "1"
    assert llm.scheduler.used_blocks == 0


def test_single_prompt_forms(llm: Any) -> None:
    a = llm.generate(PROMPT, GREEDY)
    b = llm.generate([1, 403, 407, 261, 378], GREEDY)
    assert len(a) == len(b) == 1
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids


def test_batch_equals_one_by_one(llm: Any) -> None:
    prompts = [PROMPT, "The cat", "Lily and Tom went to"]
    params = [GREEDY, SamplingParams(max_tokens=5, temperature=0), GREEDY]
    together = llm.generate(prompts, params)
    for p, sp, out in zip(prompts, params, together, strict=True):
        alone = llm.generate(p, sp)[0]
        assert alone.outputs[0].token_ids == out.outputs[0].token_ids
    assert [len(o.outputs[0].token_ids) for o in together] == [24, 5, 24]


def test_max_tokens(llm: Any) -> None:
    for n in (1, 3):
        c = llm.generate(PROMPT, SamplingParams(max_tokens=n, temperature=0))[0].outputs[0]
        assert len(c.token_ids) == n and c.finish_reason == "length"


def test_stop_token_ids(llm: Any) -> None:
    ids = llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    stop = ids[5]
    first = ids.index(stop)
    c = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0, stop_token_ids=[stop]))
    out = c[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == ids[: first + 1]  # the stopping id is kept ...
    assert (
        out.text
        == llm.tokenizer.decode([1, 403, 407, 261, 378, *ids[:first]])[
            len(llm.tokenizer.decode([1, 403, 407, 261, 378])) :
        ]
    )  # ... its text is not


def test_eos_stops_unless_ignored(llm: Any) -> None:
    assert 2 in llm.eos_ids  # </s>
    ids = llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    # Greedy stories rarely reach </s>; treat a token it does generate as end-of-sequence.
    llm.eos_ids = frozenset({ids[4]})
    params = SamplingParams(max_tokens=24, temperature=0)
    c = llm.generate(PROMPT, params)[0].outputs[0]
    assert c.finish_reason == "stop" and c.token_ids == ids[: ids.index(ids[4]) + 1]
    c2 = llm.generate(PROMPT, GREEDY)[0].outputs[0]
    assert c2.token_ids == ids and c2.finish_reason == "length"


def test_streaming_equals_generate(llm: Any) -> None:
    for params in (GREEDY, SamplingParams(max_tokens=30, temperature=0.8, seed=3)):
        text = llm.generate(PROMPT, params)[0].outputs[0].text
        deltas = list(llm.generate_stream(PROMPT, params))
        assert "".join(deltas) == text
        assert all(deltas) and len(deltas) > 1


def test_closing_a_stream_frees_its_blocks(llm: Any) -> None:
    it = llm.generate_stream(PROMPT, GREEDY)
    next(it)
    assert llm.scheduler.used_blocks > 0
    it.close()
    assert llm.scheduler.used_blocks == 0


def test_seeded_sampling_is_reproducible(llm: Any) -> None:
    p = SamplingParams(max_tokens=20, temperature=1.0, top_k=40, top_p=0.9, seed=7)
    a = llm.generate(PROMPT, p)[0].outputs[0].token_ids
    b = llm.generate([PROMPT, "The cat"], [p, GREEDY])[0].outputs[0].token_ids
    assert a == b
    others = {
        tuple(llm.generate(PROMPT, SamplingParams(max_tokens=20, seed=s))[0].outputs[0].token_ids)
        for s in range(4)
    }
    assert len(others) > 1  # different seeds, different samples


def test_logits_are_float32_vocab(llm: Any) -> None:
    logits = llm.logits([1, 403, 407])
    assert logits.dtype == np.float32 and logits.shape == (512,)
    greedy = llm.generate([1, 403, 407], SamplingParams(max_tokens=1, temperature=0))
    assert greedy[0].outputs[0].token_ids == [int(np.argmax(logits))]
    assert llm.scheduler.used_blocks == 0


def test_sample_steps_read_back_only_token_ids(llm: Any) -> None:
    llm.generate(PROMPT, GREEDY)
    kinds = {s.kind for s in llm.runner.cached_plans}
    assert kinds == {"sample"}
    llm.logits([1, 2, 3])
    assert "logits" in {s.kind for s in llm.runner.cached_plans}


def test_prompt_errors(llm: Any) -> None:
    with pytest.raises(errors.ContextLengthError):
        llm.generate([[]], GREEDY)
    with pytest.raises(errors.ContextLengthError):
        llm.generate([1] * llm.max_model_len, GREEDY)
    with pytest.raises(errors.GraphInputError):
        llm.generate([1, 99999], GREEDY)
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [GREEDY, GREEDY, GREEDY])


def test_generation_stops_at_max_model_len(make_llm: Callable[..., Any], stories: Path) -> None:
    llm = make_llm(stories / "stories260K-f32.gguf", "numpy", max_model_len=12)
    c = llm.generate(PROMPT, SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    assert len(c[0].outputs[0].token_ids) == 12 - 5
    assert c[0].outputs[0].finish_reason == "length"


def test_bad_llm_settings(stories: Path) -> None:
    path = str(stories / "stories260K-f32.gguf")
    with pytest.raises(errors.ConfigError):
        poot.LLM(path, max_step_tokens=1024)
    with pytest.raises(errors.ConfigError):
        poot.LLM(path, max_model_len=100000)
    with pytest.raises(errors.ConfigError):
        poot.LLM(path, block_size=0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"stop_token_ids": [1, -3]}, "stop_token_ids"),
        ({"stop_token_ids": "12"}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SamplingParamsError) as e:
        SamplingParams(**kwargs)
    assert e.value.field == field and isinstance(e.value, ValueError)


def test_sampling_params_defaults() -> None:
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p) == (16, 1.0, 0, 1.0)
    assert p.seed is None and p.stop_ids == frozenset() and not p.ignore_eos and not p.greedy
    assert SamplingParams(temperature=0, stop_token_ids=[5, 6]).stop_ids == {5, 6}
    assert SamplingParams(top_k=-1).top_k == -1


def test_loading_prepares_the_weights_so_the_first_request_does_not(
    make_llm: Callable[..., Any], stories: Path
) -> None:
    # Q8_0 under ggml numerics: every matmul weight is re-laid 8 rows at a time, which a
    # plan's first compile does; the model's load now runs it (outside the plan cache).
    llm = make_llm(stories / "stories260K-Q8_0.gguf")
    prepared = llm.runtime.memory()["weight_bytes"]
    assert llm.numerics == "ggml" and prepared > 0
    assert llm.stats()["prepared_entries"] == 0
    llm.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0.0))
    assert llm.runtime.memory()["weight_bytes"] == prepared
    assert llm.stats()["prepared_entries"] > 0
