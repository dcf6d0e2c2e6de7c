"""SmolLM2-135M-Instruct Q4_1 (the default model) against llama.cpp's greedy reference.

Bounds, on the CPU runtime (``numerics="auto"``, which is ``"ggml"`` for this quantized file):
all 32 greedy ids equal llama.cpp's; logits[0:32] equal llama.cpp's up to the reference's 5
decimals (poot reproduces llama.cpp's AVX2 arithmetic bit for bit: Q8_1-quantized activations
with integer dots, F16 KV cache, ggml's softmax, RoPE and SiLU). With ``numerics="exact"`` the
logits are within 0.35 (a faithful evaluation differs from llama.cpp's by up to ~0.3 here: the
numpy interpreter with exact dequantization 0.34, with llama.cpp's arithmetic mimicked 0.28),
and greedy ids follow llama.cpp only up to the first near-tie (step 5: 0.22 apart; step 14:
0.04), which is why the numpy check below asks only for the ids before the first of them.
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
REFERENCE_DECIMALS_ATOL = 1e-5


@pytest.fixture(scope="module")
def reference(shared_models: Path) -> dict[str, Any]:
    data = json.loads((shared_models / "smollm2" / "reference.json").read_text())
    run: dict[str, Any] = data["runs"][0]
    return run


def test_greedy_ids_and_logits(
    make_llm: Callable[..., Any], default_model_path: Path, reference: dict[str, Any]
) -> None:
    llm = make_llm(default_model_path, "cpu")
    assert llm.numerics == "ggml"
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out = llm.generate(reference["prompt"], params)[0]
    assert out.prompt_token_ids == reference["prompt_ids"]
    assert out.outputs[0].token_ids == reference["gen_ids"]
    logits = llm.logits(reference["prompt_ids"])
    assert logits.shape == (49152,) and logits.dtype == np.float32
    np.testing.assert_allclose(
        logits[:32],
        reference["logits_after_prompt_first32"],
        rtol=0,
        atol=REFERENCE_DECIMALS_ATOL,
    )


def test_exact_numerics_logits_close_to_llama_cpp(
    make_llm: Callable[..., Any], default_model_path: Path, reference: dict[str, Any]
) -> None:
    llm = make_llm(default_model_path, "cpu", numerics="exact")
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    ids = llm.generate(reference["prompt_ids"], params)[0].outputs[0].token_ids
    assert ids == reference["gen_ids"][:5]  # up to the step-5 near-tie
    logits = llm.logits(reference["prompt_ids"])
    np.testing.assert_allclose(
        logits[:32], reference["logits_after_prompt_first32"], rtol=0, atol=LOGITS_ATOL
    )


def test_default_llm_says_paris(default_model_path: Path) -> None:
    from conftest import cpu_runtime_or_skip

    cpu_runtime_or_skip(1)
    llm = poot.LLM()
    text = llm.generate("The capital of France is", SamplingParams(temperature=0))[0]
    assert text.outputs[0].text.startswith(" Paris.")


@pytest.mark.parametrize("numerics", ["exact", "ggml"])
def test_chunked_prefill_same_logits(
    make_llm: Callable[..., Any],
    default_model_path: Path,
    reference: dict[str, Any],
    numerics: str,
) -> None:
    """Every chunking gives the same bits, under both numerics, a one-token last chunk too
    (len(ids) % 16 == 1 here): the kernels keep one summation order whatever the step's token
    count (llama.cpp takes another for a one-token step)."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 8
    llm = make_llm(default_model_path, "cpu", max_step_tokens=512, numerics=numerics)
    ids = llm.tokenizer.encode(prompt)
    assert len(ids) > 64
    full = llm.logits(ids)
    for chunk in (16, 37, 64):
        kw = {"max_step_tokens": chunk, "numerics": numerics}
        chunked = make_llm(default_model_path, "cpu", **kw).logits(ids)
        np.testing.assert_array_equal(chunked, full, err_msg=f"{chunk=}")


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
