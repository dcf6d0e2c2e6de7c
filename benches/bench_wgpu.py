"""The wgpu backend against poot's CPU runtime on this machine (lavapipe where no GPU exists:
Vulkan on the CPU, so wgpu is expected to be slower there; the number is measured, not
asserted).

Each group pairs ``impl="poot"`` (the wgpu runtime) with ``impl="peer"`` (here: poot's own CPU
runtime, 2 threads, exact numerics, the arithmetic wgpu runs), so the summary's peer/poot ratio
is cpu/wgpu time (above 1: wgpu faster). Default model (SmolLM2-135M Q4_1) prefill of 64
tokens and decode of 16; stories260K f32 decode of 64.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

THREADS = 2
STORIES = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "stories260K"


def _require_wgpu() -> None:
    from poot._native import WgpuRuntime
    from poot.errors import BackendNotCompiledError, KernelError

    try:
        WgpuRuntime(timeout_s=60.0)
    except (BackendNotCompiledError, KernelError) as e:
        pytest.skip(f"no wgpu backend or adapter: {e}")


def _prompt(n: int) -> list[int]:
    return [1] + [(i * 7919) % 40000 + 1000 for i in range(n - 1)]


def _run(llm: Any, prompt: list[int], max_tokens: int) -> int:
    params = poot.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return len(llm.generate([prompt], params)[0].outputs[0].token_ids)


@pytest.fixture(scope="module")
def smollm2(default_model_path: Path) -> dict[str, Any]:
    _require_wgpu()
    path = str(default_model_path)
    return {
        "poot": poot.LLM(path, backend="wgpu", max_model_len=512),
        "peer": poot.LLM(path, threads=THREADS, numerics="exact", max_model_len=512),
    }


@pytest.fixture(scope="module")
def stories() -> dict[str, Any]:
    _require_wgpu()
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is absent")
    path = str(STORIES / "stories260K-f32.gguf")
    return {
        "poot": poot.LLM(path, backend="wgpu"),
        "peer": poot.LLM(path, threads=THREADS, numerics="exact"),
    }


@pytest.mark.parametrize("impl", ["poot", "peer"])
@pytest.mark.parametrize(
    ("group", "n_prompt", "max_tokens"),
    [("wgpu/cpu smollm2 prefill 64", 64, 1), ("wgpu/cpu smollm2 decode 16", 1, 16)],
)
def test_smollm2(
    benchmark: Any, smollm2: dict[str, Any], impl: str, group: str, n_prompt: int, max_tokens: int
) -> None:
    benchmark.group = group
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["tokens"] = max(n_prompt, max_tokens)
    args = (smollm2[impl], _prompt(n_prompt), max_tokens)
    assert benchmark.pedantic(_run, args, rounds=2, warmup_rounds=1) == max_tokens


@pytest.mark.parametrize("impl", ["poot", "peer"])
def test_stories_decode(benchmark: Any, stories: dict[str, Any], impl: str) -> None:
    benchmark.group = "wgpu/cpu stories260K decode 64"
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["tokens"] = 64
    args = (stories[impl], [1], 64)
    assert benchmark.pedantic(_run, args, rounds=2, warmup_rounds=1) == 64
