"""The families on the wgpu backend (lavapipe in CI) against the CPU runtime.

Gemma 2 (sliding windows, soft-capped scores and logits, GeGLU), Gemma 3 (per-head q/k norms,
local RoPE base), Qwen3, Phi-3 with LongRoPE's attention factor, and Mistral's
sliding window, on the random-weight checkpoints of ``tests/family_models.py``. Bound: with
``numerics="exact"`` wgpu runs the CPU's arithmetic in another summation order (and the
shader's ``tanh``): logits within 1e-4 of the CPU's and 32 greedy ids equal.

Skips (with the reason) only where no wgpu adapter exists; ``POOT_REQUIRE_WGPU=1`` fails instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import poot

pytestmark = pytest.mark.device_wgpu

PROMPT = [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
GREEDY32 = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def wgpu_ok() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "qwen3", "phi3", "mistral"])
def test_family_on_wgpu_equals_the_cpu(wgpu_ok: None, family_checkpoints: Any, family: str) -> None:
    path = str(family_checkpoints(family)["gguf"])
    cpu = poot.LLM(path, numerics="exact", threads=1)
    gpu = poot.LLM(path, backend="wgpu", numerics="exact")
    np.testing.assert_allclose(gpu.logits(PROMPT), cpu.logits(PROMPT), rtol=0, atol=1e-4)
    want = cpu.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert gpu.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids == want


def test_longrope_attention_factor_on_wgpu_equals_the_cpu(
    wgpu_ok: None, family_checkpoints: Any
) -> None:
    """Phi-3 with LongRoPE's attention factor (every cos and sin scaled on the host, as the
    CPU runtime scales them)."""
    path = str(family_checkpoints("phi3_long")["gguf"])
    cpu = poot.LLM(path, numerics="exact", threads=1)
    gpu = poot.LLM(path, backend="wgpu", numerics="exact")
    np.testing.assert_allclose(gpu.logits(PROMPT), cpu.logits(PROMPT), rtol=0, atol=1e-4)
    want = cpu.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert gpu.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids == want
