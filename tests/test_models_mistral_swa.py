"""Mistral with sliding-window attention (Mistral 7B v0.1's layout: every layer windowed).

Random-weight checkpoints from ``tests/family_models.py`` with a window of 5 positions, so the
prompt and the generation cross it many times. Reference: the float64 numpy forward written
from transformers' Mistral modeling code (its sliding-window causal mask). llama.cpp is no
reference here: its ``llama`` architecture ignores ``llama.attention.sliding_window``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from family_reference import reference_greedy, reference_logits

import poot

FAMILY = "mistral"
PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11]


@pytest.fixture(scope="module")
def model(family_checkpoints: Any) -> dict[str, Any]:
    return family_checkpoints(FAMILY)


def test_hparams_from_both_sources(model: dict[str, Any]) -> None:
    from poot.checkpoints import resolve_model_files

    hf = resolve_model_files(str(model["hf"])).hparams
    gg = resolve_model_files(str(model["gguf"])).hparams
    assert hf.layer_windows == gg.layer_windows == (5, 5)


@pytest.mark.parametrize("form", ["hf", "gguf"])
@pytest.mark.parametrize("numerics", ["exact", "ggml"])
def test_logits_match_numpy_forward(model: dict[str, Any], form: str, numerics: str) -> None:
    llm = poot.LLM(str(model[form]), threads=1, numerics=numerics)
    ref = reference_logits(FAMILY, model["weights"], PROMPT)
    # exact: f32 throughout; ggml: an f16 KV cache and f16 softmax weights (relative 2^-11).
    atol = 2e-4 if numerics == "exact" else 5e-4 * float(np.abs(ref[-1]).max()) + 1e-3
    np.testing.assert_allclose(llm.logits(PROMPT), ref[-1], rtol=0, atol=atol)


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_greedy_ids_match_numpy_forward(model: dict[str, Any], form: str) -> None:
    llm = poot.LLM(str(model[form]), threads=1, numerics="exact")
    params = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(FAMILY, model["weights"], PROMPT, 32)


def test_window_changes_the_answer(model: dict[str, Any], tmp_path: Any) -> None:
    """The same weights without the window give other logits: the window is applied."""
    import json
    import shutil

    d = tmp_path / "nowindow"
    shutil.copytree(model["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    windowed = poot.LLM(str(model["hf"]), threads=1, numerics="exact").logits(PROMPT)
    full = poot.LLM(str(d), threads=1, numerics="exact").logits(PROMPT)
    assert np.abs(windowed - full).max() > 1e-2


def test_batched_chunked_and_paged_runs_give_the_single_run_ids(model: dict[str, Any]) -> None:
    """Three prompts together, prefilled in chunks of 4 tokens through blocks of 4 slots (the
    window spans block boundaries and chunk boundaries): each gets its own greedy ids."""
    prompts = [PROMPT, PROMPT[3:], [1, 250, 3, 3, 3, 9, 44, 71, 5, 6, 120, 7, 8, 19]]
    params = poot.SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    alone = [
        poot.LLM(str(model["gguf"]), threads=1, numerics="exact")
        .generate([p], params)[0]
        .outputs[0]
        .token_ids
        for p in prompts
    ]
    llm = poot.LLM(str(model["gguf"]), threads=2, numerics="exact", block_size=4, max_step_tokens=4)
    together = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert [list(x) for x in together] == [list(x) for x in alone]
    assert list(alone[0]) == reference_greedy(FAMILY, model["weights"], PROMPT, 20)


def test_blocks_behind_the_window_go_back_to_the_pool(model: dict[str, Any], tmp_path: Any) -> None:
    """Every layer windowed: a pool of 6 blocks of 4 slots runs 11 + 40 tokens (13 blocks'
    worth), because blocks wholly behind the window are released after each step; the ids
    are the float64 reference's. Without the window the same request is refused."""
    import json
    import shutil

    from poot.driver_options import DriverOptions
    from poot.errors import ContextLengthError
    from poot.llm import kv_window

    opts = DriverOptions(num_blocks=6, block_size=4, max_step_tokens=4, max_num_seqs=1)
    params = poot.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    llm = poot.LLM(str(model["gguf"]), threads=1, numerics="exact", driver=opts)
    assert kv_window(llm.definition) == 5
    got = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    assert list(got) == reference_greedy(FAMILY, model["weights"], PROMPT, 40)
    assert llm.scheduler.used_blocks == 0

    d = tmp_path / "nowindow"
    shutil.copytree(model["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    full = poot.LLM(str(d), threads=1, numerics="exact", driver=opts)
    assert kv_window(full.definition) is None
    with pytest.raises(ContextLengthError):
        full.generate([PROMPT], params)
