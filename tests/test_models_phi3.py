"""Phi-3: fused qkv and gate_up projections (sliced after one matmul), head_dim 96, untied head.

Random-weight checkpoints from ``tests/family_models.py`` (HF directory and GGUF of the same
weights). References: a float64 numpy forward written from transformers' Phi3 modeling code
(both layouts, exact numerics), and llama.cpp on the GGUF where llama-cpp-python is importable;
those checks, the same for every family, are in ``test_models_families.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

FAMILY = "phi3"


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


def test_hparams_from_both_sources(model: dict[str, Any]) -> None:
    from poot.checkpoints import resolve_model_files

    hf = resolve_model_files(str(model["hf"])).hparams
    gg = resolve_model_files(str(model["gguf"])).hparams
    assert hf.architecture == gg.architecture == "phi3"
    assert hf.head_dim == gg.head_dim == 96
    assert (hf.n_heads, hf.n_kv_heads, hf.rope_theta) == (gg.n_heads, gg.n_kv_heads, gg.rope_theta)
    assert hf.layer_windows == gg.layer_windows == ()
