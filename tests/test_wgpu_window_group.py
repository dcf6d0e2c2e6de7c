"""Gemma 2 / 3's windowed KV group on the wgpu backend (lavapipe in CI).

The windowed layers' KV lives in their own, smaller per-layer buffers with their own block
tables (``window_block_tables``); the shaders read each layer's pool with its own block
count. Checked against one block table for every layer on the same backend (equal greedy
ids, logits bit for bit: only where the KV lives changes) and against the CPU runtime's
window group (the bound of ``tests/test_wgpu_families.py``: logits within 1e-4, equal ids),
past the window, with every block back at the end.

Skips (with the reason) only where no wgpu adapter exists; ``POOT_REQUIRE_WGPU=1`` fails instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import poot
import poot.llm
from poot.driver_options import DriverOptions, kv_pool_bytes

pytestmark = pytest.mark.device_wgpu

PROMPT = [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
GREEDY = poot.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
OPTS = DriverOptions(block_size=4, max_step_tokens=4, max_num_seqs=2)


@pytest.fixture(scope="module")
def wgpu_ok() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()


def _ids(llm: poot.LLM) -> list[int]:
    ids = list(llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids)
    assert (llm.scheduler.used_blocks, llm.scheduler.used_window_blocks) == (0, 0)
    return ids


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_window_group_on_wgpu(
    wgpu_ok: None, family_checkpoints: Any, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(family_checkpoints(family)["gguf"])
    gpu = poot.LLM(path, backend="wgpu", numerics="exact", driver=OPTS)
    assert gpu.definition.window_group
    with monkeypatch.context() as m:
        m.setattr(poot.llm, "kv_group_window", lambda definition: None)
        single = poot.LLM(path, backend="wgpu", numerics="exact", driver=OPTS)
    assert not single.definition.window_group
    cpu = poot.LLM(path, numerics="exact", threads=1, driver=OPTS)
    # The pool on the device holds the windowed layers' smaller share.
    s, h = gpu.scheduler, gpu.definition.hparams
    want = kv_pool_bytes(
        h, 4, 4, s.pool_blocks, gpu.definition.kv_windowed_layers, s.window_pool_blocks
    )
    assert gpu.runtime.memory()["kv_bytes"] == want < single.runtime.memory()["kv_bytes"]
    ids = _ids(gpu)
    assert _ids(single) == ids
    assert _ids(cpu) == ids
    seq = PROMPT + ids[:-1]  # 36 positions, several windows past the start
    for n in (len(PROMPT), len(seq)):
        got = gpu.logits(seq[:n])
        np.testing.assert_array_equal(got, single.logits(seq[:n]))
        np.testing.assert_allclose(got, cpu.logits(seq[:n]), rtol=0, atol=1e-4)
