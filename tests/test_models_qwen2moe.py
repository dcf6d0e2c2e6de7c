"""Qwen2-MoE / Qwen1.5-MoE GGUFs: routed experts without renormalisation plus the shared
expert behind its sigmoid gate (a 1-D weight read by ``matmul`` as one row).

The checkpoint and the float64 reference are ``tests/qwen2moe_model.py``'s (written from
transformers' ``modeling_qwen2_moe``); llama.cpp on the GGUF where llama-cpp-python is
importable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from family_llama_cpp import (
    assert_close_to_llama_cpp,
    assert_greedy_matches_llama_cpp,
    llama_cpp_logits,
)
from qwen2moe_model import (
    CONFIG,
    make_weights,
    reference_greedy,
    reference_logits,
    write_gguf,
    write_hf,
)

import poot
from poot.errors import UnsupportedArchitectureError

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
GREEDY32 = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen2moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("qwen2moe")
    w = make_weights(seed=0)
    return {
        "weights": w,
        "gguf": write_gguf(root / "qwen2moe-tiny-f32.gguf", w),
        "hf": write_hf(root / "hf", w),
        "root": root,
    }


def test_logits_and_greedy_ids_match_the_float64_forward(qwen2moe: dict[str, Any]) -> None:
    llm = poot.LLM(str(qwen2moe["gguf"]), threads=1, numerics="exact")
    ref = reference_logits(qwen2moe["weights"], PROMPT)
    np.testing.assert_allclose(llm.logits(PROMPT), ref[-1], rtol=0, atol=1e-4)
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(qwen2moe["weights"], PROMPT, 32)


def test_the_shared_expert_and_unrenormalised_weights_matter(qwen2moe: dict[str, Any]) -> None:
    """The reference without the shared expert, or with the top-k weights renormalised, is
    far from poot's logits: the test above would catch either mistake."""
    import qwen2moe_model as qm

    llm = poot.LLM(str(qwen2moe["gguf"]), threads=1, numerics="exact")
    got = llm.logits(PROMPT)
    w = dict(qwen2moe["weights"])
    for i in range(CONFIG["num_hidden_layers"]):
        w[f"model.layers.{i}.mlp.shared_expert.down_proj.weight"] = np.zeros_like(
            w[f"model.layers.{i}.mlp.shared_expert.down_proj.weight"]
        )
    assert np.abs(got - reference_logits(w, PROMPT)[-1]).max() > 1e-2
    qm.CONFIG["norm_topk_prob"] = True
    try:
        renormed = reference_logits(qwen2moe["weights"], PROMPT)[-1]
    finally:
        qm.CONFIG["norm_topk_prob"] = False
    assert np.abs(got - renormed).max() > 1e-2


def test_a_batched_step_gives_each_prompts_own_ids(qwen2moe: dict[str, Any]) -> None:
    path = str(qwen2moe["gguf"])
    prompts = [PROMPT, PROMPT[4:], [1, 250, 3, 3, 9, 44, 71, 5, 6, 120, 7]]
    params = poot.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = [
        list(
            poot.LLM(path, threads=1, numerics="exact")
            .generate([p], params)[0]
            .outputs[0]
            .token_ids
        )
        for p in prompts
    ]
    llm = poot.LLM(path, threads=2, numerics="exact", block_size=4, max_step_tokens=8)
    assert [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params)] == alone


def test_gguf_matches_llama_cpp(qwen2moe: dict[str, Any]) -> None:
    ref = llama_cpp_logits(qwen2moe["gguf"], PROMPT)
    if ref is None:
        pytest.skip("llama-cpp-python is not importable (../shared/peers/llama-cpp.sh builds it)")
    llm = poot.LLM(str(qwen2moe["gguf"]), threads=1, numerics="ggml")
    assert_close_to_llama_cpp(llm.logits(PROMPT), ref[-1])
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert_greedy_matches_llama_cpp(list(got), qwen2moe["gguf"], PROMPT)


def test_hparams_agree_between_gguf_and_config_json(qwen2moe: dict[str, Any]) -> None:
    from poot.checkpoints import resolve_model_files
    from poot.cli import inspect_report

    gg = resolve_model_files(str(qwen2moe["gguf"])).hparams
    hf = resolve_model_files(str(qwen2moe["hf"])).hparams
    for h in (gg, hf):
        assert h.architecture == "qwen2moe"
        assert (h.n_experts, h.n_experts_used) == (8, 4)
        assert (h.expert_ff, h.expert_shared_ff) == (128, 384)
    report = inspect_report(resolve_model_files(str(qwen2moe["gguf"])), with_tensors=False)
    assert report["family"] == "qwen2moe"


def test_a_qwen2moe_gguf_without_a_shared_expert_is_a_typed_error(
    qwen2moe: dict[str, Any],
) -> None:
    path = write_gguf(Path(qwen2moe["root"]) / "no-shexp.gguf", qwen2moe["weights"], shared=False)
    with pytest.raises(UnsupportedArchitectureError, match="shared expert"):
        poot.LLM(str(path), threads=1)


def test_the_hf_directory_reads_experts_in_place(qwen2moe: dict[str, Any]) -> None:
    """Experts stored one tensor each: the store's virtual [E, N, K] stack of the mapped
    tensors goes to moe_matmul; logits and greedy ids as the float64 forward's."""
    from poot import _native

    st = _native.SafetensorsModel(str(qwen2moe["hf"] / "model.safetensors"))
    dtype, shape = _native.Weights(st).describe("model.layers.1.mlp.experts.down_proj.weight")
    assert (dtype, tuple(shape)) == ("F32", (8, 256, 128))
    llm = poot.LLM(str(qwen2moe["hf"]), threads=1, numerics="exact")
    ref = reference_logits(qwen2moe["weights"], PROMPT)
    np.testing.assert_allclose(llm.logits(PROMPT), ref[-1], rtol=0, atol=1e-4)
    got = llm.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(qwen2moe["weights"], PROMPT, 32)


def test_hf_norm_topk_prob_is_read_from_config_json(qwen2moe: dict[str, Any]) -> None:
    import qwen2moe_model as qm

    path = write_hf(
        Path(qwen2moe["root"]) / "renorm", qwen2moe["weights"], {**CONFIG, "norm_topk_prob": True}
    )
    qm.CONFIG["norm_topk_prob"] = True
    try:
        ref = reference_logits(qwen2moe["weights"], PROMPT)[-1]
    finally:
        qm.CONFIG["norm_topk_prob"] = False
    llm = poot.LLM(str(path), threads=1, numerics="exact")
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=1e-4)


def test_hf_dense_layers_and_missing_experts_are_typed_errors(qwen2moe: dict[str, Any]) -> None:
    root = Path(qwen2moe["root"])
    dense = write_hf(root / "dense", qwen2moe["weights"], {**CONFIG, "mlp_only_layers": [1]})
    with pytest.raises(UnsupportedArchitectureError, match="dense layers"):
        poot.LLM(str(dense), threads=1)
    # Expert 3 of layer 0 missing: the stack is incomplete, so the traced weight is unknown.
    w = {k: v for k, v in qwen2moe["weights"].items() if ".experts.3.gate_proj" not in k}
    with pytest.raises(poot.errors.PootError, match="experts.gate_proj"):
        poot.LLM(str(write_hf(root / "holey", w)), threads=1).logits(PROMPT)
