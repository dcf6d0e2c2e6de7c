"""The families on the CUDA runtime, on the CPU emulation of the driver where no GPU exists.

Gemma 2 (windows, capped scores and logits, GeGLU), Gemma 3, Qwen3, Mistral's sliding window
and Phi-3 (fused projections cut by ``slice``; LongRoPE's factors and attention factor) on the
random-weight GGUFs of ``tests/family_models.py``: 32 greedy ids equal to the CPU runtime's
exact ones (the CUDA runtime has exact numerics only).
"""

from __future__ import annotations

from typing import Any

import pytest

import poot
from poot import _native, errors

PROMPT = [2, 17, 93, 5, 64, 120, 33, 8, 77, 200, 11, 42, 9]
GREEDY32 = poot.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def emulator() -> str:
    try:
        return _native._cuda_emulator()
    except (RuntimeError, errors.BackendNotCompiledError) as e:
        pytest.skip(f"no CPU emulation of the CUDA driver here ({e})")


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "qwen3", "mistral", "phi3", "phi3_long"])
def test_family_greedy_ids_on_the_emulated_runtime_equal_the_cpu(
    emulator: str, monkeypatch: pytest.MonkeyPatch, family_checkpoints: Any, family: str
) -> None:
    import poot.llm

    def make(timeout_s: float) -> _native.CudaRuntime:
        return _native.CudaRuntime(0, timeout_s, driver_library=emulator, nvrtc_library=emulator)

    monkeypatch.setattr(poot.llm, "_make_cuda_runtime", make)
    path = str(family_checkpoints(family)["gguf"])
    want = poot.LLM(path, numerics="exact", threads=1).generate([PROMPT], GREEDY32)
    cuda = poot.LLM(path, backend="cuda")
    got = cuda.generate([PROMPT], GREEDY32)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_cuda_says_what_it_supports(emulator: str) -> None:
    rt = _native.CudaRuntime(0, 60.0, driver_library=emulator, nvrtc_library=emulator)
    assert rt.supports("gelu") and rt.supports("softcap") and rt.supports("slice")
    assert not rt.supports("concat")
