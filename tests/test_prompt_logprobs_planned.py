"""Prompt logprobs through the planner's runners: a streamed plan (weights through a double
buffer, CPU) and a plan split over the CPU and a wgpu adapter (lavapipe here) give the same
prompt logprobs as the resident single-runtime run.

The streamed plan runs the CPU's kernels over the same layers in segments, so its values are
the resident run's bit for bit. The split plan runs part of the model on the adapter, whose
float order differs: its values are held to 1e-4 and its ranks must agree where the gap
between neighbours is wider than that. The split test skips without a wgpu adapter;
``POOT_REQUIRE_WGPU=1`` fails instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot
from poot import SamplingParams
from poot.planner.compiled import CompileConfig

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside"
PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=5)


def _prompt_logprobs(llm: poot.LLM) -> list[Any]:
    out = llm.generate([PROMPT], PARAMS)[0]
    assert out.prompt_logprobs is not None
    return out.prompt_logprobs


def _values(entries: list[Any]) -> list[dict[int, tuple[float, int | None]]]:
    assert entries[0] is None
    return [{t: (lp.logprob, lp.rank) for t, lp in e.items()} for e in entries[1:]]


@pytest.fixture(scope="module")
def stories_q8(stories: Path) -> Path:
    return stories / "stories260K-Q8_0.gguf"


@pytest.fixture(scope="module")
def resident(stories_q8: Path) -> list[dict[int, tuple[float, int | None]]]:
    got = _values(_prompt_logprobs(poot.LLM(stories_q8)))
    assert len(got) > 10
    return got


def test_streamed_plan_gives_the_resident_values(
    stories_q8: Path, tmp_path: Path, resident: list[Any]
) -> None:
    from planner_fixtures import llm_kv_bytes

    budget = llm_kv_bytes(stories_q8) + stories_q8.stat().st_size // 2
    cfg = CompileConfig(allow_gpu=False, device_budget_bytes=budget, spill_dir=tmp_path)
    llm = poot.LLM(stories_q8, config=cfg)
    assert llm.compiled is not None and llm.compiled.streams
    assert _values(_prompt_logprobs(llm)) == resident


@pytest.fixture(scope="module")
def wgpu_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from wgpu_util import require_wgpu

    from poot.cli import main

    require_wgpu()
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POOT_CACHE_DIR", str(root))
        assert main(["validate-hardware", "--quick"]) == 0
        yield root


@pytest.mark.device_wgpu
@pytest.mark.parametrize(
    "spec",
    [(("cpu", 0, 3), ("wgpu:0", 3, 7)), (("wgpu:0", 0, 4), ("cpu", 4, 7))],
    ids=["cpu-then-wgpu", "wgpu-then-cpu"],
)
def test_split_plan_gives_the_resident_values(
    wgpu_cache: Path, stories: Path, spec: tuple[tuple[str, int, int], ...]
) -> None:
    from poot.planner.runners import SplitStepRunner

    f32 = stories / "stories260K-f32.gguf"
    want = _values(_prompt_logprobs(poot.LLM(f32)))
    llm = poot.LLM(f32, config=CompileConfig(force_placement=spec))
    assert isinstance(llm.runner, SplitStepRunner)
    got = _values(_prompt_logprobs(llm))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        # The prompt's own token at each position is in both; top-5 sets agree where the
        # 5th and 6th candidates are not within the bound of each other.
        for t in g.keys() & w.keys():
            assert abs(g[t][0] - w[t][0]) < 1e-4, (i, t, g[t], w[t])
        lps = np.asarray(sorted((v[0] for v in w.values()), reverse=True))
        if len(lps) < 2 or np.min(np.abs(np.diff(lps))) > 2e-4:
            assert {t: v[1] for t, v in g.items()} == {t: v[1] for t, v in w.items()}, i
