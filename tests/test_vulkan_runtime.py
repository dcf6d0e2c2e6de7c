"""Raw Vulkan (``backend="vulkan"``, not production; lavapipe in CI) end to end against the CPU
runtime and wgpu: the same WGSL kernels and executor as wgpu, compiled to SPIR-V by naga and run
through ash, so its greedy ids equal the CPU runtime's where wgpu's do (stories260K in exact
numerics, SmolLM2 Q4_1 in exact and in ggml numerics, whose 32 ids are llama.cpp's reference),
and its outputs equal wgpu's bit for bit on lavapipe with the subgroup matmul off (one SPIR-V
compiler behind both; the subgroup matmul, on by default where the device runs it, adds each
row's lane sums in another order, so its logits stay within the conformance bounds instead).
``POOT_VK_STAGING=1`` (forcing weights and KV into device-local memory behind staged copies)
runs here per test, and the whole file can run under it.

Skips (with the reason) where the build or the machine has no raw Vulkan device; fails instead
under ``POOT_REQUIRE_WGPU=1`` (``make test-device-wgpu``, CI).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import poot
from poot import SamplingParams
from poot.cli import main
from poot.errors import (
    BackendNotCompiledError,
    DeviceTimeoutError,
    DeviceUnavailableError,
    RuntimePoisonedError,
)

pytestmark = pytest.mark.device_wgpu

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def vulkan_ok() -> None:
    from poot._native import WgpuRuntime

    try:
        WgpuRuntime(timeout_s=60.0, api="vulkan")
        return
    except BackendNotCompiledError as e:
        reason = f"the vulkan backend is not compiled into this build: {e}"
    except DeviceUnavailableError as e:
        reason = f"no raw Vulkan device on this machine (mesa-vulkan-drivers gives one): {e}"
    if os.environ.get("POOT_REQUIRE_WGPU") == "1":
        pytest.fail(f"POOT_REQUIRE_WGPU=1 but {reason}")
    pytest.skip(reason)


def _ids(llm: poot.LLM, prompt: Any, params: SamplingParams = GREEDY) -> list[int]:
    return list(llm.generate(prompt, params)[0].outputs[0].token_ids)


def test_the_runtime_says_what_it_is(vulkan_ok: None) -> None:
    from poot import _native

    rt = _native.WgpuRuntime(timeout_s=60.0, api="vulkan")
    assert rt.name == "vulkan"
    a = rt.adapter
    assert a["api"] == "vulkan" and a["backend"] == "Vulkan (ash)"
    assert isinstance(a["subgroup_ops"], list) and a["subgroup_size"] >= 0
    assert isinstance(a["cooperative_matrix"], bool)
    assert a["max_binding_bytes"] == min(a["max_storage_buffer_range"], (1 << 32) - 4) & ~3
    lo, hi = a["subgroup_size_range"]
    assert lo <= a["subgroup_size"] <= hi
    assert isinstance(a["subgroup_matvec"], bool) and isinstance(a["staging"], bool)
    if not a["local_heap_mappable"]:
        assert a["staging"]  # a discrete GPU's VRAM is reached only by staged copies
    assert any(d["name"] == a["name"] for d in _native.vulkan_devices())
    assert repr(rt) == 'WgpuRuntime(name="vulkan")'


def test_staged_weights_and_kv_give_the_cpu_ids_and_logits(
    vulkan_ok: None, stories: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced staging on a device whose memory the host could map (lavapipe): the weights and
    the KV pool live in unmapped device-local buffers, reached by copies on the queue."""
    monkeypatch.setenv("POOT_VK_STAGING", "1")
    path = str(stories / "stories260K-f32.gguf")
    vk = poot.LLM(path, backend="vulkan", numerics="exact")
    assert vk.runtime.adapter["staging"]
    cpu = poot.LLM(path, numerics="exact", threads=1)
    prompt = "Once upon a time"
    assert _ids(vk, prompt) == _ids(cpu, prompt)
    ids = cpu.tokenizer.encode(prompt)
    np.testing.assert_allclose(vk.logits(ids), cpu.logits(ids), rtol=0, atol=1e-4)


@pytest.mark.parametrize("var", ["POOT_VK_STAGING", "POOT_VK_SUBGROUPS"])
def test_a_bad_vulkan_setting_is_a_typed_error(
    vulkan_ok: None, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    from poot._native import WgpuRuntime

    monkeypatch.setenv(var, "yes")
    with pytest.raises(DeviceUnavailableError, match=var):
        WgpuRuntime(timeout_s=60.0, api="vulkan")


def test_the_subgroup_matmul_can_be_turned_off(
    vulkan_ok: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from poot._native import WgpuRuntime

    monkeypatch.setenv("POOT_VK_SUBGROUPS", "0")
    assert not WgpuRuntime(timeout_s=60.0, api="vulkan").adapter["subgroup_matvec"]


def test_the_validation_note_says_what_the_runtime_uses() -> None:
    from poot.planner.validate_wgpu import vulkan_note

    assert vulkan_note({"api": "wgpu"}) == ""
    note = vulkan_note(
        {"api": "vulkan", "subgroup_matvec": True, "subgroup_size_range": (8, 8),
         "staging": False, "cooperative_matrix": False}
    )  # fmt: skip
    assert note == (
        "kernels: matmul rows reduced by subgroup shuffles (subgroups of 8..8 lanes); "
        "weights and KV in mapped memory; no cooperative matrix"
    )
    staged = vulkan_note({"api": "vulkan", "staging": True, "cooperative_matrix": True})
    assert "workgroup memory" in staged and "staged copies" in staged and "unused" in staged


def test_an_unknown_api_is_a_value_error() -> None:
    from poot import _native

    with pytest.raises(ValueError, match="api must be"):
        _native.WgpuRuntime(timeout_s=60.0, api="metal")  # type: ignore[arg-type]


def test_stories_greedy_ids_and_logits_equal_the_cpu(vulkan_ok: None, stories: Path) -> None:
    path = str(stories / "stories260K-f32.gguf")
    cpu = poot.LLM(path, numerics="exact", threads=1)
    vk = poot.LLM(path, backend="vulkan", numerics="exact")
    assert vk.backend == "vulkan" and vk.runtime.name == "vulkan"
    prompt = "Once upon a time"
    assert _ids(vk, prompt) == _ids(cpu, prompt)
    ids = cpu.tokenizer.encode(prompt)
    np.testing.assert_allclose(vk.logits(ids), cpu.logits(ids), rtol=0, atol=1e-4)


def test_stories_seeded_sampling_equals_the_cpu(vulkan_ok: None, stories: Path) -> None:
    """The sampling step on the device (lavapipe has f64) draws the CPU's tokens."""
    path = str(stories / "stories260K-f32.gguf")
    params = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=3)
    cpu = poot.LLM(path, numerics="exact", threads=1)
    vk = poot.LLM(path, backend="vulkan")
    assert vk.runtime.adapter["samples_on_device"]
    assert _ids(vk, "Once upon a time", params) == _ids(cpu, "Once upon a time", params)


@pytest.mark.parametrize("numerics", ["exact", "ggml"])
def test_smollm2_greedy_ids_equal_the_cpu(
    vulkan_ok: None, default_model_path: Path, shared_models: Path, numerics: str
) -> None:
    ref: dict[str, Any] = json.loads((shared_models / "smollm2" / "reference.json").read_text())
    run = ref["runs"][0]
    vk = poot.LLM(str(default_model_path), backend="vulkan", numerics=numerics)  # type: ignore[arg-type]
    cpu = poot.LLM(str(default_model_path), numerics=numerics)  # type: ignore[arg-type]
    got = _ids(vk, run["prompt_ids"])
    assert got == _ids(cpu, run["prompt_ids"])
    if numerics == "ggml":
        assert got == run["gen_ids"]  # llama.cpp's 32 ids


def test_a_stalled_step_times_out_and_poisons_the_llm(vulkan_ok: None, stories: Path) -> None:
    llm = poot.LLM(str(stories / "stories260K-f32.gguf"), backend="vulkan", timeout_s=0.2)
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    # As on wgpu (test_wgpu_runtime.py): grow the stall until a step outlives the deadline, so
    # a fast GPU is not mistaken for a missing timeout.
    raised = None
    for iters in (2, 16, 128, 1024):
        llm.runtime._inject_stall(iters)
        try:
            llm.generate("Once upon a time", greedy)
        except DeviceTimeoutError as e:
            raised = e
            break
    assert raised is not None, "no stall up to 1024 rows outlived a 0.2 s deadline"
    health = llm.runtime.health()
    assert health["status"] == "poisoned" and "deadline" in (health["reason"] or "")
    llm.runtime._inject_stall(0)
    with pytest.raises(RuntimePoisonedError):
        llm.generate("Once upon a time", greedy)


def test_a_lost_device_poisons_the_runtime(vulkan_ok: None, stories: Path) -> None:
    llm = poot.LLM(str(stories / "stories260K-f32.gguf"), backend="vulkan")
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    assert llm.generate("Once", greedy)[0].outputs[0].token_ids
    llm.runtime._inject_device_loss()
    with pytest.raises(RuntimePoisonedError, match="lost"):
        llm.generate("Once", greedy)
    assert llm.runtime.health()["status"] == "poisoned"


def test_generate_cli_backend_flag(
    vulkan_ok: None, stories: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(stories / "stories260K-f32.gguf")
    argv = ["generate", "Once upon a time", "--model", model, "--max-tokens", "12"]
    assert main([*argv, "--backend", "vulkan"]) == 0
    assert capsys.readouterr().out.startswith(", there was a little girl named Lily.")
