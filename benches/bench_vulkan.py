"""Raw Vulkan (``backend="vulkan"``, not production) against wgpu and poot's CPU runtime on
SmolLM2-135M Q4_1 and on a Qwen2.5-0.5B-shaped checkpoint: prefill of 64 tokens, greedy decode of
16, and a sampled decode of 16 (temperature 0.8, top-p 0.9, seeded) beside it.

The Qwen2.5-0.5B row is synthetic (``cpu_synthetic.QWEN2_05B``: Qwen2.5-0.5B has Qwen2-0.5B's
dims, 896 wide, 24 layers, 14/2 heads, FFN 4864, vocabulary 151936, q/k/v biases) in the type
mix of a real Qwen2.5-0.5B Q4_K_M (Q5_0 projections, Q8_0/Q5_0 v, Q6_K/Q4_K down, Q8_0 tied
embedding), random weights, cached under ``$XDG_CACHE_HOME/poot/bench-gguf``; speed depends on
shapes and types, not values. ``/work/shared/models`` holds no Qwen2.5 GGUF.

Every runtime runs exact numerics (f32 activations and KV), the arithmetic the subgroup matmul
serves (ggml numerics takes the Q8 integer kernels instead). Each workload has three groups,
raw Vulkan as ``impl="poot"`` in each:

- ``vulkan/wgpu``: against the wgpu runtime (``baseline``: the same kernels and executor
  through wgpu, so the ratio is what the thinner layer and its subgroup matmul save or cost);
- ``vulkan/cpu``: against the CPU runtime (``peer``: 2 threads);
- ``vulkan sub/wg``: against raw Vulkan with the subgroup matmul off (``baseline``,
  ``POOT_VK_SUBGROUPS=0``): what the subgroup reduction alone changes. Where the device cannot
  run the subgroup matmul both sides are the same kernel (the bench says so in ``extra_info``).

On lavapipe (no GPU) all of them run on the CPU's cores, so the GPU runtimes are expected to be
slower there; numbers are measured, not asserted. Run it alone on a quiet machine:

    .venv/bin/python -m pytest benches/bench_vulkan.py --benchmark-only -p no:randomly

(``-k smollm2`` or ``-k qwen25`` for one model; the Qwen file is written on first use, about
400 MB.) Add ``POOT_VK_STAGING=1`` to measure raw Vulkan with weights and KV staged into
device-local memory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import poot

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_synthetic as syn  # noqa: E402

THREADS = 2
MAX_LEN = 512
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


def _vulkan_without_subgroups(path: str) -> Any:
    """Raw Vulkan with the workgroup matmul: the setting is read when the runtime opens."""
    before = os.environ.get("POOT_VK_SUBGROUPS")
    os.environ["POOT_VK_SUBGROUPS"] = "0"
    try:
        return poot.LLM(path, backend="vulkan", numerics="exact", max_model_len=MAX_LEN)
    finally:
        if before is None:
            del os.environ["POOT_VK_SUBGROUPS"]
        else:
            os.environ["POOT_VK_SUBGROUPS"] = before


MODELS = ["smollm2", "qwen25"]


@pytest.fixture(scope="module", params=MODELS)
def llms(request: pytest.FixtureRequest, default_model_path: Path) -> Iterator[dict[str, Any]]:
    """The four runtimes on one model (one model's set alive at a time)."""
    _require("wgpu")
    _require("vulkan")
    if request.param == "smollm2":
        path = str(default_model_path)
    else:
        path = str(syn.synthetic_gguf(syn.QWEN2_05B, "mix", default_model_path))
    yield {
        "model": request.param,
        "vulkan": poot.LLM(path, backend="vulkan", numerics="exact", max_model_len=MAX_LEN),
        "vulkan-wg": _vulkan_without_subgroups(path),
        "wgpu": poot.LLM(path, backend="wgpu", numerics="exact", max_model_len=MAX_LEN),
        "cpu": poot.LLM(path, threads=THREADS, numerics="exact", max_model_len=MAX_LEN),
    }


WORKLOADS = [
    ("prefill 64", 64, 1, GREEDY),
    ("decode 16 greedy", 1, 16, GREEDY),
    ("decode 16 t0.8 p0.9", 1, 16, SAMPLED),
]
# (group prefix, runtime, impl label): raw Vulkan with its defaults is poot in every group.
PAIRS = [
    ("vulkan/wgpu", "vulkan", "poot"),
    ("vulkan/wgpu", "wgpu", "baseline"),
    ("vulkan/cpu", "vulkan", "poot"),
    ("vulkan/cpu", "cpu", "peer"),
    ("vulkan sub/wg", "vulkan", "poot"),
    ("vulkan sub/wg", "vulkan-wg", "baseline"),
]


# A lavapipe decode of the Qwen shape without the subgroup matmul takes ~80 s a round: four
# calls exceed the suite's 300 s case timeout.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("prefix", "runtime", "impl"), PAIRS)
@pytest.mark.parametrize(("name", "n_prompt", "max_tokens", "sampling"), WORKLOADS)
def test_vulkan(
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
    benchmark.group = f"{prefix} {llms['model']} {name}"
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["tokens"] = max(n_prompt, max_tokens)
    rt = llms[runtime].runtime
    adapter = rt.adapter if runtime.startswith("vulkan") else {}
    benchmark.extra_info["subgroup_matvec"] = bool(adapter.get("subgroup_matvec"))
    benchmark.extra_info["staging"] = bool(adapter.get("staging"))
    args = (llms[runtime], _prompt(n_prompt), max_tokens, sampling)
    assert benchmark.pedantic(_run, args, rounds=3, warmup_rounds=1) == max_tokens
