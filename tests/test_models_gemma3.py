"""Gemma 3: per-head q/k norms (1 + w), a local RoPE base on windowed layers, a global layer.

Random-weight checkpoints from ``tests/family_models.py`` (HF directory and GGUF of the same
weights). References: a float64 numpy forward written from transformers' Gemma3 modeling code
(both layouts, exact numerics), and llama.cpp on the GGUF where llama-cpp-python is importable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_llama_cpp import assert_close_to_llama_cpp, llama_cpp_greedy, llama_cpp_logits
from family_reference import reference_greedy, reference_logits

import poot

FAMILY = "gemma3"
# Longer than the window (6), so the windowed layers drop positions during the prompt.
PROMPT = [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


def test_hparams_from_both_sources(model: dict[str, Any]) -> None:
    from poot.checkpoints import resolve_model_files

    hf = resolve_model_files(str(model["hf"])).hparams
    gg = resolve_model_files(str(model["gguf"])).hparams
    assert hf.architecture == gg.architecture == "gemma3"
    assert hf.head_dim == gg.head_dim == 256
    assert (hf.n_heads, hf.n_kv_heads, hf.rope_theta) == (gg.n_heads, gg.n_kv_heads, gg.rope_theta)
    assert hf.layer_windows == gg.layer_windows == (6, 6, 0)
    assert hf.attn_logit_softcap is gg.attn_logit_softcap is None
    assert hf.final_logit_softcap is gg.final_logit_softcap is None
    assert hf.rope_local_theta == gg.rope_local_theta == 10000.0
    assert hf.query_pre_attn_scalar == gg.query_pre_attn_scalar == 256.0
    assert hf.embedding_scale and gg.embedding_scale


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_logits_match_numpy_forward(model: dict[str, Any], form: str) -> None:
    llm = poot.LLM(str(model[form]), threads=1, numerics="exact")
    ref = reference_logits(FAMILY, model["weights"], PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_greedy_ids_match_numpy_forward(model: dict[str, Any], form: str) -> None:
    llm = poot.LLM(str(model[form]), threads=1, numerics="exact")
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
