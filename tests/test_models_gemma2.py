"""Gemma 2: GeGLU, four norms per block, soft-capped scores and logits, alternating windows.

Random-weight checkpoints from ``tests/family_models.py`` (HF directory and GGUF of the same
weights). References: a float64 numpy forward written from transformers' Gemma2 modeling code
(both layouts, exact numerics), and llama.cpp on the GGUF where llama-cpp-python is importable;
those checks, the same for every family, are in ``test_models_families.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_reference import reference_logits

FAMILY = "gemma2"
# Longer than the window (7), so the windowed layers drop positions during the prompt.
PROMPT = [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


def test_hparams_from_both_sources(model: dict[str, Any]) -> None:
    from poot.checkpoints import resolve_model_files

    hf = resolve_model_files(str(model["hf"])).hparams
    gg = resolve_model_files(str(model["gguf"])).hparams
    assert hf.architecture == gg.architecture == "gemma2"
    assert hf.head_dim == gg.head_dim == 256
    assert (hf.n_heads, hf.n_kv_heads, hf.rope_theta) == (gg.n_heads, gg.n_kv_heads, gg.rope_theta)
    assert hf.layer_windows == gg.layer_windows == (7, 0, 7)
    assert hf.attn_logit_softcap == gg.attn_logit_softcap == 50.0
    assert hf.final_logit_softcap == gg.final_logit_softcap == 30.0
    assert hf.query_pre_attn_scalar == gg.query_pre_attn_scalar == 256.0
    assert hf.embedding_scale and gg.embedding_scale


def test_numpy_interpreter_runs_the_graph(model: dict[str, Any], make_llm: Any) -> None:
    """tests/numpy_runtime.py interprets the windowed, soft-capped graph like the reference."""
    llm = make_llm(model["hf"], runtime="numpy")
    ref = reference_logits(FAMILY, model["weights"], PROMPT)[-1]
    np.testing.assert_allclose(llm.logits(PROMPT), ref, rtol=0, atol=1e-4)
