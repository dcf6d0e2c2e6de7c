"""Phi-3 LongRoPE (Phi-3.5 / Phi-4-mini layout: partial rotary, short and long factors).

A random-weight checkpoint from ``tests/family_models.py`` (``phi3_long``: original context 64,
max 256, so ``max_model_len`` picks the factor set). References: the float64 numpy forward with
HF's LongRoPE recipe (its inverse frequencies and attention factor) for the chosen set, and
llama.cpp on the GGUF at ``n_ctx`` 256 (its long factors) where llama-cpp-python is importable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_llama_cpp import assert_close_to_llama_cpp, llama_cpp_greedy, llama_cpp_logits
from family_reference import reference_greedy, reference_logits

import poot

FAMILY = "phi3_long"
PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11]


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


@pytest.mark.parametrize("form", ["hf", "gguf"])
@pytest.mark.parametrize("max_model_len", [64, 256])
def test_logits_and_ids_match_numpy_forward(
    model: dict[str, Any], form: str, max_model_len: int
) -> None:
    long = max_model_len > 64
    llm = poot.LLM(str(model[form]), threads=1, numerics="exact", max_model_len=max_model_len)
    ref = reference_logits(FAMILY, model["weights"], PROMPT, long_rope=long)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(FAMILY, model["weights"], PROMPT, 32, long_rope=long)


def test_the_two_factor_sets_differ(model: dict[str, Any]) -> None:
    short = poot.LLM(str(model["hf"]), threads=1, max_model_len=64).logits(PROMPT)
    long = poot.LLM(str(model["hf"]), threads=1, max_model_len=256).logits(PROMPT)
    assert np.abs(short - long).max() > 1e-2


def test_gguf_matches_llama_cpp(model: dict[str, Any]) -> None:
    ref = llama_cpp_logits(model["gguf"], PROMPT)
    if ref is None:
        pytest.skip("llama-cpp-python is not importable (../shared/peers/llama-cpp.sh builds it)")
    llm = poot.LLM(str(model["gguf"]), threads=1, numerics="ggml", max_model_len=256)
    assert_close_to_llama_cpp(llm.logits(PROMPT), ref[-1])
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == llama_cpp_greedy(model["gguf"], PROMPT, 32)


def test_bad_factor_count_is_a_typed_error(model: dict[str, Any], tmp_path: Any) -> None:
    import json
    import shutil

    from poot.errors import CheckpointFormatError

    d = tmp_path / "bad"
    shutil.copytree(model["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"]["short_factor"] = [1.0] * 47
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointFormatError, match="short factors must be 48"):
        poot.LLM(str(d), threads=1)
