"""Llama 3.1-style GGUF: per-pair RoPE frequency divisors in ``rope_freqs.weight``.

A random-weight ``llama`` GGUF from ``tests/family_models.py`` (``llama31``: divisors from 1 to
16 across the pairs). References: the float64 numpy forward with those divisors, and llama.cpp
where llama-cpp-python is importable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_llama_cpp import assert_close_to_llama_cpp, llama_cpp_greedy, llama_cpp_logits
from family_reference import reference_greedy, reference_logits

import poot

FAMILY = "llama31"
PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11]


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


def test_logits_and_ids_match_numpy_forward(model: dict[str, Any]) -> None:
    llm = poot.LLM(str(model["gguf"]), threads=1, numerics="exact")
    ref = reference_logits(FAMILY, model["weights"], PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(FAMILY, model["weights"], PROMPT, 32)


def test_gguf_matches_llama_cpp(model: dict[str, Any]) -> None:
    ref = llama_cpp_logits(model["gguf"], PROMPT)
    if ref is None:
        pytest.skip("llama-cpp-python is not importable (../shared/peers/llama-cpp.sh builds it)")
    llm = poot.LLM(str(model["gguf"]), threads=1, numerics="ggml")
    assert_close_to_llama_cpp(llm.logits(PROMPT), ref[-1])
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == llama_cpp_greedy(model["gguf"], PROMPT, 32)
