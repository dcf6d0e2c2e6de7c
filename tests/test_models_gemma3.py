"""Gemma 3: per-head q/k norms (1 + w), a local RoPE base on windowed layers, a global layer.

Random-weight checkpoints from ``tests/family_models.py`` (HF directory and GGUF of the same
weights). References: a float64 numpy forward written from transformers' Gemma3 modeling code
(both layouts, exact numerics), and llama.cpp on the GGUF where llama-cpp-python is importable;
those checks, the same for every family, are in ``test_models_families.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

FAMILY = "gemma3"
# Longer than the window (6), so the windowed layers drop positions during the prompt.


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
