"""Packed mixture-of-experts: Mixtral, Qwen3-MoE and OLMoE GGUFs (experts as 3-D tensors, in
place) and HF directories (experts one tensor each, read in place through the store's stacks).

Random-weight checkpoints from ``tests/family_models.py`` (``mixtral``: 4 experts, 2 per token;
``qwen3moe``: Qwen3-30B-A3B's layout scaled down, 8 experts of width 128, 2 per token;
``olmoe``: full-width q/k norms, weights not renormalised).
References: a float64 numpy forward written from transformers' Mixtral / Qwen3-MoE / OLMoE
blocks (softmax router, top-k, weights renormalised where the family does), and llama.cpp on
the GGUF where llama-cpp-python is importable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_llama_cpp import (
    assert_close_to_llama_cpp,
    assert_greedy_matches_llama_cpp,
    llama_cpp_logits,
)
from family_reference import reference_greedy, reference_logits

import poot

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
FAMILIES = ["mixtral", "qwen3moe", "olmoe"]
GREEDY32 = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_ids_match_numpy_forward(family_checkpoints: Any, family: str) -> None:
    m = family_checkpoints(family)
    llm = poot.LLM(str(m["gguf"]), threads=1, numerics="exact")
    assert llm.files.hparams.n_experts > 0
    ref = reference_logits(family, m["weights"], PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(family, m["weights"], PROMPT, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_matches_llama_cpp(family_checkpoints: Any, family: str) -> None:
    m = family_checkpoints(family)
    ref = llama_cpp_logits(m["gguf"], PROMPT)
    if ref is None:
        pytest.skip("llama-cpp-python is not importable (../shared/peers/llama-cpp.sh builds it)")
    llm = poot.LLM(str(m["gguf"]), threads=1, numerics="ggml")
    assert_close_to_llama_cpp(llm.logits(PROMPT), ref[-1])
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    # Qwen3-MoE's step 19 is a near-tie (87 vs 168, 9e-6 apart in float64).
    assert_greedy_matches_llama_cpp(list(got), m["gguf"], PROMPT)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_grouped_by_expert_give_each_prompts_own_ids(
    family_checkpoints: Any, family: str
) -> None:
    """Three prompts in one step (their tokens grouped by expert in every moe_matmul) give the
    ids each gets alone; chunked prefill through small blocks too."""
    path = str(family_checkpoints(family)["gguf"])
    prompts = [PROMPT, PROMPT[4:], [1, 250, 3, 3, 9, 44, 71, 5, 6, 120, 7]]
    params = poot.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    alone = [
        poot.LLM(path, threads=1, numerics="exact").generate([p], params)[0].outputs[0].token_ids
        for p in prompts
    ]
    llm = poot.LLM(path, threads=2, numerics="exact", block_size=4, max_step_tokens=8)
    together = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert [list(x) for x in together] == [list(x) for x in alone]


def test_inspect_names_the_moe_family(family_checkpoints: Any) -> None:
    from poot.checkpoints import resolve_model_files
    from poot.cli import inspect_report

    for family, name in (("mixtral", "mixtral"), ("qwen3moe", "qwen3moe"), ("olmoe", "olmoe")):
        files = resolve_model_files(str(family_checkpoints(family)["gguf"]))
        report = inspect_report(files, with_tensors=False)
        assert report["family"] == name
        assert report["hparams"]["n_experts"] > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_moe_directories_read_experts_in_place(family_checkpoints: Any, family: str) -> None:
    """Experts stored one tensor each (transformers' names) go to moe_matmul as the store's
    virtual stacks of the mapped tensors; logits and greedy ids as the float64 forward's."""
    m = family_checkpoints(family)
    llm = poot.LLM(str(m["hf"]), threads=1, numerics="exact")
    assert llm.files.hparams.n_experts > 0
    ref = reference_logits(family, m["weights"], PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=2e-4)
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(family, m["weights"], PROMPT, 32)


def test_moe_ops_are_supported_by_wgpu() -> None:
    """The MoE ops have WGSL kernels (tests/test_wgpu_moe.py runs them); sampling's logit ops
    run there only where the adapter has f64 (tests/test_wgpu_sampling.py)."""
    from poot import _native
    from poot.errors import BackendNotCompiledError, KernelError

    try:
        rt = _native.WgpuRuntime(timeout_s=60.0)
    except (BackendNotCompiledError, KernelError) as e:
        pytest.skip(f"no wgpu runtime here: {e}")
    for op in ("moe_matmul", "moe_combine", "gather_cols", "top_k"):
        assert rt.supports(op), op
    assert rt.supports("adjust_logits") == rt.adapter["samples_on_device"]


def test_numpy_interpreter_runs_the_moe_graph(family_checkpoints: Any, make_llm: Any) -> None:
    """tests/numpy_runtime.py interprets gather_cols / moe_matmul / moe_combine like the
    reference."""
    m = family_checkpoints("mixtral")
    llm = make_llm(m["gguf"], runtime="numpy")
    ref = reference_logits("mixtral", m["weights"], PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=1e-4)
