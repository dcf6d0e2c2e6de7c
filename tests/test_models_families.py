"""Every dense family against its references, the same checks for each (family-specific ones
are in ``test_models_<family>.py``): poot's logits and 32 greedy ids equal to a float64 numpy
forward written from transformers' modeling code, from the HF directory and the GGUF of the same
random weights (``tests/family_models.py``), in exact numerics; and the GGUF under ggml numerics
against llama.cpp where llama-cpp-python is importable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_llama_cpp import assert_close_to_llama_cpp, llama_cpp_greedy, llama_cpp_logits
from family_reference import reference_greedy, reference_logits

import poot

# The Gemma prompts (BOS 2) are longer than the window (7), so windowed layers drop positions
# during the prompt.
PROMPTS = {
    "qwen3": [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11],
    "phi3": [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11],
    "gemma2": [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9],
    "gemma3": [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9],
}


@pytest.fixture(scope="module", params=sorted(PROMPTS))
def family(request: pytest.FixtureRequest, family_checkpoints: Any) -> tuple[str, dict[str, Any]]:
    return request.param, family_checkpoints(request.param)


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_logits_match_numpy_forward(family: tuple[str, dict[str, Any]], form: str) -> None:
    name, model = family
    prompt = PROMPTS[name]
    llm = poot.LLM(str(model[form]), threads=1, numerics="exact")
    ref = reference_logits(name, model["weights"], prompt)[-1]
    np.testing.assert_allclose(llm.logits(prompt), ref, rtol=0, atol=2e-4)


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_greedy_ids_match_numpy_forward(family: tuple[str, dict[str, Any]], form: str) -> None:
    name, model = family
    prompt = PROMPTS[name]
    llm = poot.LLM(str(model[form]), threads=1, numerics="exact")
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(name, model["weights"], prompt, 32)


def test_gguf_matches_llama_cpp(family: tuple[str, dict[str, Any]]) -> None:
    name, model = family
    prompt = PROMPTS[name]
    ref = llama_cpp_logits(model["gguf"], prompt)
    if ref is None:
        pytest.skip("llama-cpp-python is not importable (../shared/peers/llama-cpp.sh builds it)")
    llm = poot.LLM(str(model["gguf"]), threads=1, numerics="ggml")
    assert_close_to_llama_cpp(llm.logits(prompt), ref[-1])
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert list(got) == llama_cpp_greedy(model["gguf"], prompt, 32)
