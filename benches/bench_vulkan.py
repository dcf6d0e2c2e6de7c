"""Raw Vulkan (``backend="vulkan"``, not production) against wgpu and poot's CPU runtime on
SmolLM2-135M Q4_1: prefill of 64 tokens, greedy decode of 16, and a sampled decode of 16
(temperature 0.8, top-p 0.9, seeded) beside it.

Each workload has two groups, both with raw Vulkan as ``impl="poot"``: ``vulkan/wgpu ...``
against the wgpu runtime (``baseline``: the same kernels and executor through wgpu, so the ratio
is what the thinner layer saves or costs) and ``vulkan/cpu ...`` against the CPU runtime
(``peer``: 2 threads, exact numerics, the arithmetic both GPU runtimes run). On lavapipe (no GPU)
all three run on the CPU's cores, so the GPU runtimes are expected to be slower there; numbers
are measured, not asserted. Run it alone on a quiet machine:

    .venv/bin/python -m pytest benches/bench_vulkan.py --benchmark-only -p no:randomly
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

THREADS = 2
GREEDY = {"temperature": 0.0}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}


def _require(api: str) -> None:
    from poot._native import WgpuRuntime
    from poot.errors import BackendNotCompiledError, DeviceUnavailableError, KernelError

    try:
        WgpuRuntime(timeout_s=60.0, api=api)  # type: ignore[arg-type]
    except (BackendNotCompiledError, DeviceUnavailableError, KernelError) as e:
        pytest.skip(f"no {api} backend or device: {e}")


def _prompt(n: int) -> list[int]:
    return [1] + [(i * 7919) % 40000 + 1000 for i in range(n - 1)]


def _run(llm: Any, prompt: list[int], max_tokens: int, sampling: dict[str, Any]) -> int:
    params = poot.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    return len(llm.generate([prompt], params)[0].outputs[0].token_ids)


@pytest.fixture(scope="module")
def llms(default_model_path: Path) -> dict[str, Any]:
    _require("wgpu")
    _require("vulkan")
    path = str(default_model_path)
    return {
        "vulkan": poot.LLM(path, backend="vulkan", max_model_len=512),
        "wgpu": poot.LLM(path, backend="wgpu", max_model_len=512),
        "cpu": poot.LLM(path, threads=THREADS, numerics="exact", max_model_len=512),
    }


WORKLOADS = [
    ("smollm2 prefill 64", 64, 1, GREEDY),
    ("smollm2 decode 16 greedy", 1, 16, GREEDY),
    ("smollm2 decode 16 t0.8 p0.9", 1, 16, SAMPLED),
]
# (group prefix, runtime, impl label): raw Vulkan is poot in both groups of a workload.
PAIRS = [
    ("vulkan/wgpu", "vulkan", "poot"),
    ("vulkan/wgpu", "wgpu", "baseline"),
    ("vulkan/cpu", "vulkan", "poot"),
    ("vulkan/cpu", "cpu", "peer"),
]


@pytest.mark.parametrize(("prefix", "runtime", "impl"), PAIRS)
@pytest.mark.parametrize(("name", "n_prompt", "max_tokens", "sampling"), WORKLOADS)
def test_smollm2(
    benchmark: Any,
    llms: dict[str, Any],
    prefix: str,
    runtime: str,
    impl: str,
    name: str,
    n_prompt: int,
    max_tokens: int,
    sampling: dict[str, Any],
) -> None:
    benchmark.group = f"{prefix} {name}"
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["tokens"] = max(n_prompt, max_tokens)
    args = (llms[runtime], _prompt(n_prompt), max_tokens, sampling)
    assert benchmark.pedantic(_run, args, rounds=3, warmup_rounds=1) == max_tokens
