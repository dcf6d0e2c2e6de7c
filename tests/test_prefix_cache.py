"""Prefix caching in ``LLM`` (poot-engine's scheduler with ``enable_prefix_caching``): reused
KV blocks give the same logits and greedy ids as computing them, the prefill tokens computed
drop by exactly the shared full blocks, blocks come back, and the model key separates
checkpoints and numerics modes.

Each case runs on the CPU runtime, the numpy reference interpreter and the wgpu runtime
(lavapipe in CI; skipped, saying why, where no adapter exists, and failed instead under
``POOT_REQUIRE_WGPU=1``), with the same assertions: on the device the reused blocks are the
pool's own KV entries, so bit-identical logits there mean the device kernels write and read
them in one order whatever the step's composition."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot
from poot import SamplingParams
from poot.checkpoints import resolve_model_files
from poot.numerics import model_key

BLOCK = 4
STEP = 8
# 19 tokens: 4 full blocks of 4 (the last token is never taken from the cache).
PREFIX = [1, 403, 407, 385, 260, 310, 411, 299, 265, 303, 271, 420, 402, 292, 263, 288, 300]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(params=["cpu", "numpy", pytest.param("wgpu", marks=pytest.mark.device_wgpu)])
def runtime(request: pytest.FixtureRequest) -> str:
    if request.param == "wgpu":
        from wgpu_util import require_wgpu

        require_wgpu()
    return str(request.param)


@pytest.fixture
def build(make_llm: Callable[..., Any], stories: Path, runtime: str) -> Callable[..., Any]:
    def make(caching: bool) -> Any:
        kw: dict[str, Any] = {
            "block_size": BLOCK,
            "max_step_tokens": STEP,
            "enable_prefix_caching": caching,
        }
        path = stories / "stories260K-f32.gguf"
        if runtime == "wgpu":
            llm = poot.LLM(str(path), backend="wgpu", **kw)
            assert llm.backend == "wgpu"
            return llm
        return make_llm(path, runtime, **kw)

    return make


def _delta(llm: Any, run: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    before = llm.stats()
    out = run()
    after = llm.stats()
    return out, {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("extra", [[290], [290, 318, 327], [290, 318, 327, 270, 340, 333]])
def test_logits_equal_with_and_without_reuse(build: Callable[..., Any], extra: list[int]) -> None:
    # The cached prefix ends on a block boundary (16 tokens) that is also a chunk boundary
    # (STEP=8), so the remaining tokens run in the same chunks either way and every KV entry is
    # computed from the same inputs by the same arithmetic: bit-identical.
    on, off = build(True), build(False)
    prompt = PREFIX[:16] + extra
    want = off.logits(prompt)
    on.logits(PREFIX[:16] + [291, 292])  # warms the cache with the 4 shared blocks
    got, d = _delta(on, lambda: on.logits(prompt))
    assert d["prefill_cached_tokens"] == 16
    assert d["prefill_computed_tokens"] == len(extra)
    assert np.array_equal(got, want)
    assert on.stats()["used_blocks"] == 0


def test_logits_equal_when_chunks_shift(build: Callable[..., Any]) -> None:
    # A 12-token cached prefix moves the chunk boundaries (12, 20 instead of 8, 16). Both
    # runtimes compute each token's row (projections, attention over its own prefix) the same
    # way whatever else shares the step, so this is bit-identical too; a kernel that blocked
    # its reductions by the step's row count could differ by float rounding (~1e-7) here.
    on, off = build(True), build(False)
    prompt = PREFIX[:12] + [290, 318, 327, 270, 340, 333, 301, 302]
    want = off.logits(prompt)
    on.logits(PREFIX[:12] + [5])
    got, d = _delta(on, lambda: on.logits(prompt))
    assert d["prefill_cached_tokens"] == 12
    assert np.array_equal(got, want)


def test_prefill_drops_by_shared_blocks(build: Callable[..., Any]) -> None:
    on, off = build(True), build(False)
    first = PREFIX + [290, 318]  # 19 tokens: 4 full blocks
    second = PREFIX + [300, 301, 302, 303, 304]  # shares the first 4 blocks (16 tokens)
    _, d1 = _delta(on, lambda: on.generate(first, GREEDY))
    assert d1["prefill_computed_tokens"] == len(first)
    assert d1["prefill_cached_tokens"] == 0
    _, d_off = _delta(off, lambda: off.generate(second, GREEDY))
    _, d_on = _delta(on, lambda: on.generate(second, GREEDY))
    shared = 4
    assert d_off["prefill_computed_tokens"] - d_on["prefill_computed_tokens"] == shared * BLOCK
    assert d_on["prefill_cached_tokens"] == shared * BLOCK
    assert d_on["decode_tokens"] == d_off["decode_tokens"] == GREEDY.max_tokens - 1
    assert on.stats()["used_blocks"] == 0


def test_greedy_ids_equal_with_caching(build: Callable[..., Any]) -> None:
    on, off = build(True), build(False)
    prompts = [PREFIX[:n] + tail for n in (8, 12, 16) for tail in ([290], [318, 327, 270])]
    want = [o.outputs[0].token_ids for o in off.generate(prompts, GREEDY)]
    # Batched (later prompts may hit blocks the earlier ones cached), then one at a time.
    got = [o.outputs[0].token_ids for o in on.generate(prompts, GREEDY)]
    assert got == want
    for prompt, ids in zip(prompts, want, strict=True):
        assert on.generate(prompt, GREEDY)[0].outputs[0].token_ids == ids
    stats = on.stats()
    assert stats["prefill_cached_tokens"] > 0
    assert stats["used_blocks"] == 0
    assert not on.scheduler.has_unfinished_requests
    assert off.stats()["prefill_cached_tokens"] == 0


def test_blocks_return_after_reuse_and_abort(build: Callable[..., Any]) -> None:
    on = build(True)
    on.generate([PREFIX + [290, 318]] * 3, GREEDY)
    assert on.stats()["used_blocks"] == 0
    it = on.generate_stream(PREFIX + [290, 300], SamplingParams(max_tokens=30, temperature=0.0))
    next(it)
    assert on.stats()["used_blocks"] > 0
    it.close()
    assert on.stats()["used_blocks"] == 0
    assert on.scheduler.free_blocks == on.scheduler.num_blocks


def testmodel_key(stories: Path, tmp_path: Path) -> None:
    files = resolve_model_files(stories / "stories260K-f32.gguf")
    exact = model_key(files, "exact")
    assert exact == model_key(resolve_model_files(stories / "stories260K-f32.gguf"), "exact")
    assert 0 <= exact < 1 << 64
    assert model_key(files, "ggml") != exact
    copy = tmp_path / "copy.gguf"
    shutil.copy(stories / "stories260K-f32.gguf", copy)
    assert model_key(resolve_model_files(copy), "exact") != exact
