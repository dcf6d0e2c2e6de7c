"""Packed mixture-of-experts on the wgpu backend (lavapipe in CI) against the CPU runtime.

Mixtral, Qwen3-MoE and OLMoE (``tests/family_models.py``) and Qwen2-MoE with its shared expert
(``tests/qwen2moe_model.py``), GGUF experts packed in place, and Qwen2-MoE's HF directory (its
experts one tensor each, gathered into the device upload). Bound: with ``numerics="exact"``
wgpu runs the CPU's arithmetic in another summation order (the op-level bounds are in
``crates/poot-wgpu/tests/conformance_moe.rs``): logits within 1e-4 of the CPU's and 32 greedy
ids equal, alone and with three prompts in one step.

Skips (with the reason) only where no wgpu adapter exists; ``POOT_REQUIRE_WGPU=1`` fails instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot

pytestmark = pytest.mark.device_wgpu

PROMPT = [1, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
GREEDY32 = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def wgpu_ok() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()


@pytest.fixture(scope="module")
def qwen2moe_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen2-MoE checkpoint's directory: ``q.gguf`` and the HF directory ``hf``."""
    from qwen2moe_model import make_weights, write_gguf, write_hf

    root = tmp_path_factory.mktemp("qwen2moe")
    w = make_weights(seed=0)
    write_gguf(root / "q.gguf", w)
    write_hf(root / "hf", w)
    return root


def _path(family: str, family_checkpoints: Any, qwen2moe: Path) -> str:
    if family == "qwen2moe":
        return str(qwen2moe / "q.gguf")
    if family == "qwen2moe-hf":  # experts one tensor each, gathered into the upload
        return str(qwen2moe / "hf")
    return str(family_checkpoints(family)["gguf"])


@pytest.mark.parametrize("family", ["mixtral", "qwen3moe", "olmoe", "qwen2moe", "qwen2moe-hf"])
def test_moe_on_wgpu_equals_the_cpu(
    wgpu_ok: None, family_checkpoints: Any, qwen2moe_gguf: Path, family: str
) -> None:
    path = _path(family, family_checkpoints, qwen2moe_gguf)
    cpu = poot.LLM(path, numerics="exact", threads=1)
    gpu = poot.LLM(path, backend="wgpu", numerics="exact")
    np.testing.assert_allclose(gpu.logits(PROMPT), cpu.logits(PROMPT), rtol=0, atol=1e-4)
    want = cpu.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids
    assert gpu.generate([PROMPT], GREEDY32)[0].outputs[0].token_ids == want


def test_a_batched_moe_step_on_wgpu_gives_the_cpus_ids(
    wgpu_ok: None, family_checkpoints: Any
) -> None:
    """Three prompts in one step: the kernel's tiles of slots per expert mix tokens of
    different sequences."""
    path = str(family_checkpoints("qwen3moe")["gguf"])
    prompts = [PROMPT, PROMPT[4:], [1, 250, 3, 3, 9, 44, 71, 5, 6, 120, 7]]
    params = poot.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    cpu = poot.LLM(path, numerics="exact", threads=1).generate(prompts, params)
    gpu = poot.LLM(path, backend="wgpu", numerics="exact").generate(prompts, params)
    assert [r.outputs[0].token_ids for r in gpu] == [r.outputs[0].token_ids for r in cpu]
