"""Sampling through ``poot.LLM``: validation, reproducibility, logprobs, stop strings,
non-finite logits, and guided decoding on real models."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from poot import LLM, SamplingParams, errors

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def llm(stories: Path) -> LLM:
    return LLM(str(stories / "stories260K-f32.gguf"), num_blocks=64, max_step_tokens=64)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
        ({"logprobs": 21}, "logprobs"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"logit_bias": {3: 101.0}}, "logit_bias"),
        ({"stop": [""]}, "stop"),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"regex": "a+", "json_object": True}, "json_object"),
    ],
)
def test_bad_settings_name_their_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SamplingParamsError) as e:
        SamplingParams(**kwargs)
    assert isinstance(e.value, ValueError) and e.value.field == field
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"regex": "(unclosed"}, "regex"),
        ({"json_schema": {"type": "nonsense"}}, "json_schema"),
        ({"grammar": "start: ("}, "grammar"),
    ],
)
def test_a_constraint_that_does_not_compile_is_refused_at_admission(
    llm: LLM, kwargs: dict[str, Any], field: str
) -> None:
    # The settings themselves are well formed; the constraint is compiled for the model's
    # tokenizer where the request is admitted, before any step or block.
    params = SamplingParams(**kwargs)
    before = llm.stats()["steps"]
    with pytest.raises(errors.SamplingParamsError) as e:
        llm.generate(PROMPT, params)
    assert isinstance(e.value, ValueError) and e.value.field == field
    assert field in str(e.value) and "does not compile" in str(e.value)
    assert llm.stats()["steps"] == before and llm.scheduler.used_blocks == 0


def test_a_bias_outside_the_vocabulary_fails_before_any_work(llm: LLM) -> None:
    before = llm.stats()["steps"]
    with pytest.raises(errors.SamplingParamsError) as e:
        llm.generate(PROMPT, SamplingParams(logit_bias={512: 1.0}))
    assert e.value.field == "logit_bias" and "512" in str(e.value)
    assert llm.stats()["steps"] == before and llm.scheduler.used_blocks == 0


def test_the_same_seed_gives_the_same_tokens_in_any_batch(llm: LLM) -> None:
    p = SamplingParams(
        max_tokens=24,
        temperature=0.9,
        top_p=0.95,
        min_p=0.02,
        seed=42,
        ignore_eos=True,
        presence_penalty=0.3,
        logit_bias={13: 1.5},
    )
    alone = llm.generate(PROMPT, p)[0].outputs[0].token_ids
    others = [
        ("Lily went", SamplingParams(max_tokens=7, temperature=1.2, seed=1)),
        ("The dog", SamplingParams(max_tokens=30, temperature=0, repetition_penalty=1.2)),
        ("Tim", SamplingParams(max_tokens=3, logprobs=5, seed=9)),
    ]
    for i in range(len(others) + 1):
        batch = [prompt for prompt, _ in others[:i]] + [PROMPT]
        params = [sp for _, sp in others[:i]] + [p]
        out = llm.generate(batch, params)
        assert out[-1].outputs[0].token_ids == alone, f"batch of {i + 1}"
    assert llm.scheduler.used_blocks == 0


def test_logprobs_match_log_softmax_of_the_reference_logits(stories: Path, make_llm: Any) -> None:
    """The f32 model's logprobs against a float64 numpy interpreter of the same graph."""
    path = stories / "stories260K-f32.gguf"
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=20, ignore_eos=True)
    got = make_llm(path).generate(PROMPT, params)[0].outputs[0]
    ref_llm = make_llm(path, runtime="numpy")
    ids = ref_llm.tokenizer.encode(PROMPT)
    assert got.logprobs is not None and len(got.logprobs) == 6
    for step, (token, entry) in enumerate(zip(got.token_ids, got.logprobs, strict=True)):
        logits = ref_llm.logits(ids + got.token_ids[:step]).astype(np.float64)
        ref = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert len(entry) == 20  # greedy: the chosen token is the top one
        assert entry[token].rank == 1
        for t, lp in entry.items():
            assert abs(lp.logprob - ref[t]) < 1e-4, (step, t)
        top = np.argsort(-ref, kind="stable")[:20]
        assert set(entry) == set(top.tolist())
    assert got.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for t, e in zip(got.token_ids, got.logprobs, strict=True))
    )


def test_stop_strings_end_the_text_before_them(llm: LLM) -> None:
    full = llm.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    text = full[0].outputs[0].text
    stop = text[12:15]
    assert stop and text.find(stop) == 12
    got = llm.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, stop=[stop, "zzz"]))
    c = got[0].outputs[0]
    assert c.text == text[:12] and c.finish_reason == "stop" and c.stop_reason == stop
    streamed = "".join(
        llm.generate_stream(PROMPT, SamplingParams(max_tokens=40, temperature=0, stop=stop))
    )
    assert streamed == text[:12]
    assert llm.scheduler.used_blocks == 0


def test_non_finite_logits_end_with_an_error_finish(stories: Path, tmp_path: Path) -> None:
    """A checkpoint whose final norm holds a NaN: every logit is NaN; no token comes out."""
    from safetensors.numpy import load_file, save_file

    src = stories / "hf"
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    for f in src.glob("*.safetensors"):
        tensors = load_file(f)
        if "model.norm.weight" in tensors:
            tensors["model.norm.weight"] = tensors["model.norm.weight"].copy()
            tensors["model.norm.weight"][0] = np.nan
        save_file(tensors, tmp_path / f.name, metadata={"format": "pt"})
    llm = LLM(str(tmp_path), num_blocks=16)
    for params in (
        SamplingParams(max_tokens=5, temperature=0),
        SamplingParams(max_tokens=5, temperature=0.8, seed=1, logprobs=2),
    ):
        c = llm.generate([PROMPT, "Tim"], params)
        for out in c:
            assert out.outputs[0].finish_reason == "error"
            assert out.outputs[0].token_ids == [] and out.outputs[0].text == ""
    assert llm.scheduler.used_blocks == 0


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smollm2(default_model_path: Path) -> LLM:
    return LLM(str(default_model_path), num_blocks=128, max_model_len=1024)


def test_guided_json_always_parses_and_validates(smollm2: LLM) -> None:
    prompt = smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a person as JSON."}], add_generation_prompt=True
    )
    params = [
        SamplingParams(max_tokens=96, temperature=1.0, seed=s, json_schema=SCHEMA)
        for s in range(12)
    ]
    outs = smollm2.generate([prompt] * len(params), params)
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
    obj = smollm2.generate(
        prompt, SamplingParams(max_tokens=96, temperature=0.7, seed=3, json_object=True)
    )[0].outputs[0]
    assert isinstance(json.loads(obj.text), dict)
    assert smollm2.scheduler.used_blocks == 0


def test_guided_regex_and_grammar_always_match(smollm2: LLM) -> None:
    regex = r"(red|green|blue) [0-9]{2,3} (apples|pears)"
    params = [SamplingParams(max_tokens=24, temperature=1.2, seed=s, regex=regex) for s in range(8)]
    for out in smollm2.generate(["My basket holds"] * 8, params):
        assert re.fullmatch(regex, out.outputs[0].text), out.outputs[0].text
    gbnf = 'root ::= "yes" | "no" | "maybe"'
    for s in range(4):
        text = (
            smollm2.generate(
                "Is it raining?",
                SamplingParams(max_tokens=8, temperature=1.0, seed=s, grammar=gbnf),
            )[0]
            .outputs[0]
            .text
        )
        assert text in {"yes", "no", "maybe"}
