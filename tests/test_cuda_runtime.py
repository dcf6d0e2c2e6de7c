"""The CUDA runtime from Python: selection, typed errors where no device exists, and (on an
NVIDIA GPU, marker ``device_cuda``) graphs against the CPU runtime, the stall deadline and
poisoning. ``make test-device-cuda`` sets ``POOT_REQUIRE_CUDA=1`` so a missing device fails.

Deadlines here bound waits; they are not speed thresholds: the stall kernel spins for 3 s
against a 0.2 s deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import poot
from poot import _native, errors


def _has_device() -> bool:
    return bool(_native.cuda_devices())


def _require_device() -> None:
    if _has_device():
        return
    if os.environ.get("POOT_REQUIRE_CUDA") == "1":
        pytest.fail("POOT_REQUIRE_CUDA=1 but no CUDA device is visible")
    pytest.skip("no CUDA device on this machine (cuda_devices() is empty)")


def test_without_a_device_the_runtime_is_a_typed_error() -> None:
    if _has_device():
        pytest.skip("this machine has a CUDA device; the device tests below cover it")
    with pytest.raises((errors.DeviceUnavailableError, errors.BackendNotCompiledError)) as e:
        _native.CudaRuntime()
    assert e.value.backend == "cuda"
    if isinstance(e.value, errors.DeviceUnavailableError):
        # It names what is missing, first of all the driver library.
        assert e.value.missing and "missing" in str(e.value)


def test_llm_selects_cuda_and_refuses_ggml(stories: Path) -> None:
    model = str(stories / "stories260K-f32.gguf")
    with pytest.raises(errors.ConfigError, match="exact"):
        poot.LLM(model, backend="cuda", numerics="ggml")
    with pytest.raises(errors.ConfigError, match="cuda"):
        poot.LLM(model, backend="metal")  # type: ignore[arg-type]
    if not _has_device():
        with pytest.raises((errors.DeviceUnavailableError, errors.BackendNotCompiledError)):
            poot.LLM(model, backend="cuda")


def test_serve_refuses_cuda_without_a_device() -> None:
    if _has_device():
        pytest.skip("this machine has a CUDA device")
    proc = subprocess.run(
        [sys.executable, "-m", "poot.server.cli", "--backend", "cuda"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr


def _matmul_graph(stories: Path) -> tuple[_native.Graph, _native.Weights]:
    from poot._native import Tracer

    w = _native.Weights(_native.GgufFile(str(stories / "stories260K-f32.gguf")))
    t = Tracer(w, 3)
    x = t.input("x", "f32", [3, 64])
    y = t.matmul(x, t.weight("blk.0.attn_q.weight"))
    t.output("y", t.silu(y))
    return t.finish(), w


@pytest.mark.device_cuda
def test_a_graph_on_the_gpu_matches_the_cpu(stories: Path) -> None:
    _require_device()
    g, w = _matmul_graph(stories)
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    gpu = _native.CudaRuntime()
    assert gpu.name == "cuda" and gpu.device["compute_capability"]
    got = gpu.run(gpu.prepare(g, w), {"x": x})["y"]
    cpu = _native.CpuRuntime(1, "exact")
    want = cpu.run(cpu.prepare(g, w), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.device_cuda
def test_a_stalled_run_times_out_and_poisons(stories: Path) -> None:
    _require_device()
    g, w = _matmul_graph(stories)
    rt = _native.CudaRuntime()
    plan = rt.prepare(g, w)
    x = np.ones((3, 64), dtype=np.float32)
    rt.run(plan, {"x": x})
    rt._inject_stall(3.0)
    start = time.monotonic()
    with pytest.raises(errors.DeviceTimeoutError):
        rt.run(plan, {"x": x}, timeout_s=0.2)
    assert time.monotonic() - start < 2.0
    assert rt.health()["status"] == "poisoned"
    with pytest.raises(errors.RuntimePoisonedError):
        rt.run(plan, {"x": x})


# The CPU emulation of the driver (poot-cuda's shim library): the runtime's whole host path
# (plans, staging, KV pool, paged attention, host sampling) with the .cu kernels executed on
# the CPU. It proves the wiring and the kernels' numerics, not anything about a GPU.


@pytest.fixture(scope="module")
def emulator() -> str:
    try:
        return _native._cuda_emulator()
    except (RuntimeError, errors.BackendNotCompiledError) as e:
        pytest.skip(f"no CPU emulation of the CUDA driver here ({e})")


def _emulated(emulator: str, timeout_s: float = 600.0) -> _native.CudaRuntime:
    return _native.CudaRuntime(0, timeout_s, driver_library=emulator, nvrtc_library=emulator)


@pytest.mark.parametrize("name", ["stories260K-f32.gguf", "stories260K-Q8_0.gguf"])
def test_stories_greedy_ids_on_the_emulated_runtime_equal_the_cpu(
    stories: Path, emulator: str, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import poot.llm

    monkeypatch.setattr(poot.llm, "_make_cuda_runtime", lambda t: _emulated(emulator, t))
    path = str(stories / name)
    greedy = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    prompts = ["Once upon a time", "The cat"]
    want = [
        o.outputs[0].token_ids for o in poot.LLM(path, numerics="exact").generate(prompts, greedy)
    ]
    cuda = poot.LLM(path, backend="cuda")
    assert cuda.runtime.device["name"] == "poot CPU emulator"
    got = [o.outputs[0].token_ids for o in cuda.generate(prompts, greedy)]
    assert got == want


def test_the_emulated_runtime_times_out_and_poisons(stories: Path, emulator: str) -> None:
    g, w = _matmul_graph(stories)
    rt = _emulated(emulator)
    plan = rt.prepare(g, w)
    x = np.ones((3, 64), dtype=np.float32)
    cpu = _native.CpuRuntime(1, "exact")
    want = cpu.run(cpu.prepare(g, w), {"x": x})["y"]
    np.testing.assert_allclose(rt.run(plan, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    rt._inject_stall(3.0)
    with pytest.raises(errors.DeviceTimeoutError):
        rt.run(plan, {"x": x}, timeout_s=0.2)
    assert rt.health()["status"] == "poisoned"
    with pytest.raises(errors.RuntimePoisonedError):
        rt.prepare(g, w)


def test_penalties_and_logprobs_run_split_on_the_emulated_runtime(
    stories: Path, emulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime has no logit-op kernels (``supports`` says so), so the step runner runs
    the forward pass on it and the sampling step on a host CPU runtime: same ids as the CPU."""
    import poot.llm

    monkeypatch.setattr(poot.llm, "_make_cuda_runtime", lambda t: _emulated(emulator, t))
    path = str(stories / "stories260K-f32.gguf")
    params = poot.SamplingParams(
        max_tokens=16, temperature=0.8, seed=7, repetition_penalty=1.3, logprobs=2
    )
    cuda = poot.LLM(path, backend="cuda")
    assert not cuda.runtime.supports("adjust_logits") and cuda.runtime.supports("sample")
    assert cuda.runtime.kv_entry_bytes == 4
    got = cuda.generate("Once upon a time", params)[0].outputs[0]
    want = poot.LLM(path, numerics="exact").generate("Once upon a time", params)[0].outputs[0]
    assert got.token_ids == want.token_ids
    assert got.logprobs is not None and len(got.logprobs) == len(got.token_ids)
