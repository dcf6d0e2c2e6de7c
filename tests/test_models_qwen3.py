"""Qwen3 (dense): per-head q/k RMSNorm, head_dim 128 wider than hidden / heads, tied head.

Random-weight checkpoints from ``tests/family_models.py`` (HF directory and GGUF of the same
weights). References: a float64 numpy forward written from transformers' Qwen3 modeling code
(both layouts, exact numerics), and llama.cpp on the GGUF where llama-cpp-python is importable;
those checks, the same for every family, are in ``test_models_families.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

FAMILY = "qwen3"


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
