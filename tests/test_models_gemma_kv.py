"""Gemma 2 / 3's interleaved sliding-window and global layers over the paged KV pool.

The design (docs/families.md, "Sliding windows and the paged KV pool"): one block table serves
every layer. The global layers read every position, so every block is kept; a windowed layer's
attention starts at its window and reads nothing below it (the kernel tests poison every slot
outside the window with NaN), so its entries behind the window are kept but never read. Blocks
go back to the pool only where every layer is windowed (``kv_window``).

Checked here on the random-weight checkpoints of ``tests/family_models.py`` (windows of 5 and
6, blocks of 4 slots, prefill chunks of 4 tokens, so windows cross block and chunk boundaries
many times): a run far past the window gives the float64 full-KV reference's logits and greedy
ids (transformers' forward: the whole sequence, windows as masks); the interleaved layers hold
every block the sequence fills; a Gemma 3 whose layers are all windowed releases them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from family_reference import reference_greedy, reference_logits

import poot
from poot.driver_options import DriverOptions
from poot.errors import ContextLengthError
from poot.llm import kv_window

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
N = 40
BLOCK = 4


def _run(llm: poot.LLM, prompt: list[int], n: int) -> tuple[list[int], int]:
    """Greedy ids of one request stepped by hand, and the most blocks it held at once."""
    params = poot.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    req = llm.make_request(prompt, params)
    core = llm.core
    core.add_request(req)
    peak = 0
    while core.has_unfinished():
        core.step()
        peak = max(peak, llm.scheduler.used_blocks)
    assert llm.scheduler.used_blocks == 0  # all back once it ends
    return list(req.out), peak


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_past_the_window_equals_the_full_kv_reference(family_checkpoints: Any, family: str) -> None:
    m = family_checkpoints(family)
    opts = DriverOptions(block_size=BLOCK, max_step_tokens=4, max_num_seqs=1)
    llm = poot.LLM(str(m["gguf"]), threads=1, numerics="exact", driver=opts)
    windows = llm.definition.hparams.layer_windows
    assert any(w > 0 for w in windows) and any(w == 0 for w in windows)
    assert kv_window(llm.definition) is None
    ids, peak = _run(llm, PROMPT, N)
    assert ids == reference_greedy(family, m["weights"], PROMPT, N)
    # Interleaved layers: the sequence holds every block it fills (nothing is released).
    assert peak == math.ceil((len(PROMPT) + N - 1) / BLOCK)
    # Logits at position 52, eight windows past the start, against the full-KV reference.
    seq = PROMPT + ids[:-1]
    ref = reference_logits(family, m["weights"], seq)[-1]
    np.testing.assert_allclose(llm.logits(seq), ref, rtol=0, atol=2e-4)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_interleaved_layers_keep_every_block(family_checkpoints: Any, family: str) -> None:
    """A pool of 6 blocks of 4 (24 slots) cannot hold 13 + 40 tokens when a global layer
    reads them all: the request is refused up front, not cut short."""
    m = family_checkpoints(family)
    opts = DriverOptions(num_blocks=6, block_size=BLOCK, max_step_tokens=4, max_num_seqs=1)
    llm = poot.LLM(str(m["gguf"]), threads=1, numerics="exact", driver=opts)
    params = poot.SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    with pytest.raises(ContextLengthError):
        llm.generate([PROMPT], params)
    assert llm.scheduler.used_blocks == 0


def test_every_layer_windowed_releases_blocks(
    family_checkpoints: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same Gemma 3 weights with every layer windowed (``layer_types`` all sliding): blocks
    behind the window go back after each step, so 13 + 40 tokens run through 6 blocks of 4 and
    give the float64 reference's ids under the same configuration."""
    import json
    import shutil

    import family_models

    m = family_checkpoints("gemma3")
    d = tmp_path / "all-sliding"
    shutil.copytree(m["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention"] * cfg["num_hidden_layers"]
    (d / "config.json").write_text(json.dumps(cfg))
    opts = DriverOptions(num_blocks=6, block_size=BLOCK, max_step_tokens=4, max_num_seqs=1)
    llm = poot.LLM(str(d), threads=1, numerics="exact", driver=opts)
    assert llm.definition.hparams.layer_windows == (6, 6, 6)
    assert kv_window(llm.definition) == 6
    ids, peak = _run(llm, PROMPT, N)
    # The window (6) plus a step's tokens (4) span at most 3 blocks of 4, plus one being filled.
    assert peak <= 4
    monkeypatch.setitem(family_models.FAMILIES, "gemma3", cfg)
    assert ids == reference_greedy("gemma3", m["weights"], PROMPT, N)
