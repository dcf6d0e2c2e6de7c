"""The CPU runtime's tuning knobs are per runtime (``CpuSettings``), read from the environment
only as defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot import _native
from poot.config import CpuSettings, Settings
from poot.errors import ConfigError


def test_cpu_settings_from_env() -> None:
    assert CpuSettings.from_env({}) == CpuSettings()
    assert CpuSettings.from_env({}).runtime_kwargs() == {}
    s = Settings.from_env(
        {
            "POOT_CPU_ISA": "avx2",
            "POOT_CPU_SPIN_US": "50",
            "POOT_CPU_PREFETCH": "4096",
            "POOT_CPU_PREFETCH_FLOAT": "0",
            "POOT_CPU_PREFETCH_NEXT": "0",
            "POOT_CPU_PREFETCH_GAP": "65536",
            "POOT_CPU_THP": "0",
            "POOT_CPU_PROFILE": "1",
        }
    ).cpu
    assert s.runtime_kwargs() == {
        "isa": "avx2",
        "spin_us": 50,
        "prefetch": 4096,
        "prefetch_float": 0,
        "prefetch_next": False,
        "prefetch_gap": 65536,
        "huge_pages": False,
        "profile": True,
    }
    with pytest.raises(ConfigError, match="POOT_CPU_ISA"):
        CpuSettings.from_env({"POOT_CPU_ISA": "sse"})
    with pytest.raises(ConfigError, match="POOT_CPU_PREFETCH"):
        CpuSettings.from_env({"POOT_CPU_PREFETCH": "far"})
    with pytest.raises(ConfigError, match="POOT_CPU_PREFETCH_GAP"):
        CpuSettings.from_env({"POOT_CPU_PREFETCH_GAP": "-1"})


def test_two_runtimes_with_different_settings_coexist() -> None:
    scalar = _native.CpuRuntime(1, **CpuSettings(isa="scalar", huge_pages=False).runtime_kwargs())
    best = _native.CpuRuntime(1, **CpuSettings(prefetch=4096).runtime_kwargs())
    assert scalar.isa == "scalar"
    assert best.isa in ("scalar", "avx2", "avx512", "amx")
    # Building the second did not change the first.
    assert scalar.isa == "scalar"
    with pytest.raises(ValueError, match="isa"):
        _native.CpuRuntime(1, isa="sse")  # type: ignore[arg-type]


def test_an_llm_runs_on_the_settings_it_is_given(stories: Path) -> None:
    import poot

    path = str(stories / "stories260K-Q8_0.gguf")
    greedy = poot.SamplingParams(max_tokens=8, temperature=0.0)
    scalar = poot.LLM(path, num_blocks=16, cpu=CpuSettings(isa="scalar"))
    best = poot.LLM(path, num_blocks=16)
    assert scalar.runtime.isa == "scalar"  # type: ignore[union-attr]
    # Every code path gives the same tokens (tests/test_cpu_isa.py holds the logits to it).
    want = best.generate("Once upon a time", greedy)[0].outputs[0].token_ids
    assert scalar.generate("Once upon a time", greedy)[0].outputs[0].token_ids == want


def test_the_gap_prefetch_changes_no_logprob(stories: Path) -> None:
    import poot

    path = str(stories / "stories260K-Q8_0.gguf")
    greedy = poot.SamplingParams(max_tokens=12, temperature=0.0, logprobs=3)
    outs = []
    for gap in (0, 1 << 20):
        llm = poot.LLM(path, threads=2, num_blocks=16, cpu=CpuSettings(prefetch_gap=gap))
        out = llm.generate("Once upon a time", greedy)[0].outputs[0]
        outs.append((out.token_ids, out.logprobs, out.cumulative_logprob))
        del llm
    # Prefetching moves bytes into caches only: the same tokens and the same logprob bits.
    assert outs[0] == outs[1]
