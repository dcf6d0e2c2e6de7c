"""The wgpu runtime from Python: selection, bounded waits and poisoning with real faults on the
device (a kernel that spins past the deadline, a destroyed device), error types, the CLI flag.

Deadlines here bound waits; they are not speed thresholds: the stall kernel runs for seconds
on lavapipe (and any GPU), far past the 0.2 s deadlines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import poot
from poot import SamplingParams
from poot.cli import main
from poot.errors import DeviceTimeoutError, RuntimePoisonedError

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module", autouse=True)
def _wgpu() -> None:
    from wgpu_util import require_wgpu

    require_wgpu()


def test_adapter_and_discovery() -> None:
    from poot._native import WgpuRuntime, wgpu_adapters

    adapters = wgpu_adapters()
    assert adapters and all(a["backend"] == "Vulkan" for a in adapters)
    rt = WgpuRuntime()
    assert rt.name == "wgpu" and rt.health() == {"status": "ok", "reason": None}
    assert rt.adapter["name"] == adapters[0]["name"] or rt.adapter["name"] in {
        a["name"] for a in adapters
    }
    assert rt.adapter["max_binding_bytes"] > 0
    assert rt.adapter["numerics"] == "exact"


def test_numerics_selection(stories: Path) -> None:
    from poot._native import WgpuRuntime

    assert WgpuRuntime(numerics="ggml").adapter["numerics"] == "ggml"
    with pytest.raises(ValueError, match="numerics"):
        WgpuRuntime(numerics="fast")  # type: ignore[arg-type]
    # "auto" follows the CPU: ggml for quantized checkpoints, exact for float ones.
    q = poot.LLM(str(stories / "stories260K-Q8_0.gguf"), backend="wgpu")
    assert q.numerics == "ggml" and q.runtime.adapter["numerics"] == "ggml"
    f = poot.LLM(str(stories / "stories260K-f32.gguf"), backend="wgpu")
    assert f.numerics == "exact" and f.runtime.adapter["numerics"] == "exact"
    e = poot.LLM(str(stories / "stories260K-Q8_0.gguf"), backend="wgpu", numerics="exact")
    assert e.runtime.adapter["numerics"] == "exact"


def test_a_stalled_step_times_out_and_poisons_the_llm(stories: Path) -> None:
    llm = poot.LLM(str(stories / "stories260K-f32.gguf"), backend="wgpu", timeout_s=0.2)
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    # The stall's length depends on the adapter: 2 rows take seconds on lavapipe and about
    # 40 ms on an H200. Grow it until a step outlives the deadline (at most 1024 rows, a few
    # seconds of a big GPU's atomics), so a fast GPU is not mistaken for a missing timeout.
    raised = None
    for iters in (2, 16, 128, 1024):
        llm.runtime._inject_stall(iters)
        try:
            llm.generate("Once upon a time", greedy)
        except DeviceTimeoutError as e:
            raised = e
            break
    assert raised is not None, "no stall up to 1024 rows outlived a 0.2 s deadline"
    assert isinstance(raised, TimeoutError)
    health = llm.runtime.health()
    assert health["status"] == "poisoned" and "deadline" in (health["reason"] or "")
    # Poisoned for good: later steps fail fast, even with the fault gone.
    llm.runtime._inject_stall(0)
    with pytest.raises(RuntimePoisonedError):
        llm.generate("Once upon a time", greedy)


def test_a_lost_device_poisons_the_runtime(stories: Path) -> None:
    llm = poot.LLM(str(stories / "stories260K-f32.gguf"), backend="wgpu")
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    assert llm.generate("Once", greedy)[0].outputs[0].token_ids
    llm.runtime._inject_device_loss()
    with pytest.raises(RuntimePoisonedError) as e:
        llm.generate("Once", greedy)
    assert "lost" in str(e.value)
    assert llm.runtime.health()["status"] == "poisoned"


def test_generate_cli_backend_flag(stories: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(stories / "stories260K-f32.gguf")
    argv = ["generate", "Once upon a time", "--model", model, "--max-tokens", "12"]
    assert main([*argv, "--backend", "wgpu"]) == 0
    assert capsys.readouterr().out.startswith(", there was a little girl named Lily.")
