"""A request's output must not depend on who else shares its steps (issue 26).

Each request runs alone, then among others, with other chunk sizes, and through preemption, on
the default model (SmolLM2 Q4_1 with a Q8_0 head) and on a small Qwen2 GGUF this test writes
with the quant mix of Qwen2's Q4_K_M files (Q5_0, Q8_0, Q4_K, Q6_K); under the default
(ggml) numerics and the exact one. Compared bit for bit: the token ids and every chosen
token's log-probability (which carries the logits' bits), for greedy and for seeded sampled
requests. The kernels keep one summation order per weight whatever the token count
(``crates/poot-cpu`` ``matmul/invariance_tests.rs`` checks each dtype); this checks the whole
engine: attention, the scheduler's batching and padding, sampling.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from poot import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
from cpu_synthetic import Shape, synthetic_gguf  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The best way to learn",
    "In 1492,",
    "Water boils at",
    "My favourite colour is",
    "The quick brown fox jumps over the lazy dog and keeps on running far away",
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, logprobs=0, ignore_eos=True)
SEEDED = SamplingParams(
    max_tokens=16, temperature=0.9, top_p=0.95, seed=7, logprobs=0, ignore_eos=True
)
# dim 256 and FFN 512 (whole k-quant super-blocks), head_dim 64, GQA 2:1, q/k/v biases.
QWEN2_TINY = Shape("qwen2", 256, 2, 4, 2, 512, 49152, 1000000.0, qkv_bias=True, tag="qwen2-test")


@pytest.fixture(scope="module")
def qwen2_mix(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small Qwen2 GGUF, written under this module's temporary directory (never the
    user's cache)."""
    import os

    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("gguf"))
    try:
        return synthetic_gguf(QWEN2_TINY, "mix", default_model_path)
    finally:
        if old is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = old


def _model(name: str, default_model_path: Path, qwen2_mix: Path) -> Path:
    return default_model_path if name == "smollm2" else qwen2_mix


def _runs(outs: list[Any]) -> list[tuple[list[int], list[float]]]:
    """Each request's ids and chosen log-probabilities (floats compare by value, so equal lists
    mean equal bits for finite values)."""
    runs = []
    for o in outs:
        c = o.outputs[0]
        lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs, strict=True)]
        runs.append((list(c.token_ids), lps))
    return runs


def _alone(llm: LLM, params: SamplingParams) -> list[tuple[list[int], list[float]]]:
    return [_runs(llm.generate(p, params))[0] for p in PROMPTS]


@pytest.mark.parametrize("numerics", ["auto", "exact"])
@pytest.mark.parametrize("model", ["smollm2", "qwen2-mix"])
def test_outputs_do_not_depend_on_batch_chunking_or_preemption(
    model: str, numerics: str, default_model_path: Path, qwen2_mix: Path
) -> None:
    path = _model(model, default_model_path, qwen2_mix)
    base = {"numerics": numerics, "max_model_len": 256}
    llm = LLM(str(path), **base)
    if numerics == "auto":
        assert llm.numerics == "ggml"
    alone_of = {}
    for params in (GREEDY, SEEDED):
        alone = alone_of[params.temperature] = _alone(llm, params)
        assert all(len(ids) == 16 for ids, _ in alone)
        # All eight in one batch: decode steps of eight rows, prefill rows of all of them.
        assert _runs(llm.generate(PROMPTS, params)) == alone, f"{params.temperature=} batched"
        # The same prompts in another order, so each shares its steps with other neighbours.
        order = [5, 0, 7, 2, 6, 1, 3, 4]
        mixed = _runs(llm.generate([PROMPTS[i] for i in order], params))
        assert [mixed[order.index(i)] for i in range(8)] == alone, "reordered"
        assert llm.scheduler.used_blocks == 0
    # Chunked prefill: steps of 3 and 7 tokens (a prompt's last chunk may be one token), and
    # preemption: 8 blocks of 8 tokens for eight requests of up to about 30 tokens each.
    for kw in ({"max_step_tokens": 3}, {"max_step_tokens": 7}, {"num_blocks": 9, "block_size": 8}):
        other = LLM(str(path), **base, **kw)
        for params in (GREEDY, SEEDED):
            got = _runs(other.generate(PROMPTS, params))
            assert got == alone_of[params.temperature], f"{kw} {params.temperature=}"
        if "num_blocks" in kw:
            assert other.scheduler.stats()["preemptions"] > 0
        assert other.scheduler.used_blocks == 0


def test_wgpu_outputs_do_not_depend_on_batch_or_chunking(default_model_path: Path) -> None:
    """The same on the wgpu backend (lavapipe in CI), under its default numerics: its WGSL
    matmuls and attention take one order per output whatever the step's row count. Fewer and
    shorter requests than on the CPU: a software Vulkan device is slow."""
    from wgpu_util import require_wgpu

    require_wgpu()
    prompts = PROMPTS[:3] + PROMPTS[-1:]
    few = {"max_tokens": 8, "logprobs": 0, "ignore_eos": True}
    cases = (
        SamplingParams(temperature=0.0, **few),
        SamplingParams(temperature=0.9, top_p=0.95, seed=7, **few),
    )
    llm = LLM(str(default_model_path), backend="wgpu", max_model_len=256)
    chunked = LLM(str(default_model_path), backend="wgpu", max_model_len=256, max_step_tokens=3)
    for params in cases:
        alone = [_runs(llm.generate(p, params))[0] for p in prompts]
        assert _runs(llm.generate(prompts, params)) == alone, f"{params.temperature=} batched"
        got = _runs(chunked.generate(prompts, params))
        assert got == alone, f"{params.temperature=} chunked by 3"
    assert llm.scheduler.used_blocks == 0 and chunked.scheduler.used_blocks == 0
