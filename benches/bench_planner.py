"""The planner's own costs on the default model (SmolLM2-135M-Instruct Q4_1), 2 threads.

- ``compile``: tracing the step for per-layer stats, the search and the simulation;
- decode 16 tokens resident on the direct path (ledger lease + span per step) and plain (no
  planner), the direct path's overhead being the difference;
- decode 16 tokens streamed under a device budget of 70% of the weights (double buffer).

No peer and no thresholds: the numbers are for comparing plans, and for the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

THREADS = 2
PARAMS = poot.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def _decode(llm: Any) -> int:
    return len(llm.generate(["Once upon a time"], PARAMS)[0].outputs[0].token_ids)


def test_compile(benchmark: Any, default_model_path: Path) -> None:
    benchmark.group = "planner compile"
    benchmark.extra_info["impl"] = "poot"
    c = benchmark.pedantic(poot.compile, (str(default_model_path),), rounds=3)
    assert c.direct


@pytest.mark.parametrize("mode", ["plain", "direct", "streamed"])
def test_decode(benchmark: Any, default_model_path: Path, tmp_path: Path, mode: str) -> None:
    benchmark.group = f"decode 16 tokens ({mode})"
    benchmark.extra_info["impl"] = "poot"
    benchmark.extra_info["tokens"] = 16
    config = None
    if mode == "direct":
        config = poot.CompileConfig()
    elif mode == "streamed":
        # The LLM's KV pool (f16 entries in ggml numerics), then 70% of the weights: it must
        # stream.
        plain = poot.LLM(str(default_model_path))
        layers, heads, dim = plain.definition.kv_shape
        entry = 2 if plain.numerics == "ggml" else 4
        kv = (plain.runner.num_blocks + 1) * plain.block_size * layers * 2 * heads * dim * entry
        budget = kv + default_model_path.stat().st_size * 7 // 10
        config = poot.CompileConfig(device_budget_bytes=budget, spill_dir=tmp_path)
    llm = poot.LLM(str(default_model_path), threads=THREADS, config=config)
    assert benchmark.pedantic(_decode, (llm,), rounds=3) == 16
