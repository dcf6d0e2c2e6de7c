"""Qwen3 (dense): per-head q/k RMSNorm, head_dim 128 wider than hidden / heads, tied head.

Random-weight checkpoints from ``tests/family_models.py`` (HF directory and GGUF of the same
weights). References: a float64 numpy forward written from transformers' Qwen3 modeling code
(both layouts, exact numerics), and llama.cpp on the GGUF where llama-cpp-python is importable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_llama_cpp import assert_close_to_llama_cpp, llama_cpp_greedy, llama_cpp_logits
from family_reference import reference_greedy, reference_logits

import poot

FAMILY = "qwen3"
PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11]


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


def test_hparams_from_both_sources(model: dict[str, Any]) -> None:
    from poot.checkpoints import resolve_model_files

    hf = resolve_model_files(str(model["hf"])).hparams
    gg = resolve_model_files(str(model["gguf"])).hparams
    assert hf.architecture == gg.architecture == "qwen3"
    assert hf.head_dim == gg.head_dim == 128
    assert (hf.n_heads, hf.n_kv_heads, hf.rope_theta) == (gg.n_heads, gg.n_kv_heads, gg.rope_theta)
    assert hf.layer_windows == gg.layer_windows == ()


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


def test_inspect_shows_the_family(model: dict[str, Any]) -> None:
    import io

    from poot.checkpoints import resolve_model_files
    from poot.cli import inspect_report, print_inspect

    for form, arch in (("hf", "Qwen3ForCausalLM"), ("gguf", "qwen3")):
        report = inspect_report(resolve_model_files(str(model[form])), with_tensors=False)
        assert (report["family"], report["architecture"]) == ("qwen3", arch)
        out = io.StringIO()
        print_inspect(report, out)
        assert f"family      qwen3 (architecture {arch})" in out.getvalue()
