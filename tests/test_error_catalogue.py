"""The error catalogue: every typed error says what happened, with its numbers, and what to do.

Every ``PootError`` subclass must have a docstring (what triggers it) and a ``hint`` (what to do
next) that ``str(error)`` includes. Each error that carries numbers (limit, requested, total,
available...) is raised here by a real trigger, and its message must name every one of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import poot
from poot import _native, async_engine, errors

NUMERIC = ("limit", "total", "requested", "needed", "available")


def catalogue() -> list[type[errors.PootError]]:
    found = []
    for module in (errors, async_engine):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            # poot.errors re-exports the planner's and training's errors from their modules.
            home = (module.__name__, "poot._errors_planner", "poot._errors_training")
            if issubclass(cls, errors.PootError) and cls.__module__ in home:
                found.append(cls)
    return sorted(set(found), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", catalogue(), ids=lambda c: c.__name__)
def test_every_error_documents_its_trigger_and_remedy(cls: type[errors.PootError]) -> None:
    assert cls.__doc__ and len(cls.__doc__.strip()) > 20, "say what triggers it"
    if cls is errors.PootError:
        return
    assert cls.hint, f"{cls.__name__} needs a hint: what to do next"
    e = cls("something happened")
    assert str(e).startswith("something happened") and cls.hint in str(e)
    assert e.message == "something happened"


def _numbers(e: BaseException) -> dict[str, int]:
    return {k: getattr(e, k) for k in NUMERIC if isinstance(getattr(e, k, None), int)}


@pytest.fixture(scope="module")
def stories_gguf(stories: Path) -> Path:
    return stories / "stories260K-f32.gguf"


def _trace(path: Path, tokens: int, limits: Any) -> Any:
    w = _native.Weights(_native.GgufFile(str(path)))
    return _native.Tracer(w, tokens, limits), w


def trigger_trace_budget(path: Path) -> None:
    _trace(path, 64, _native.TraceLimits(max_tokens=16))


def trigger_artifact(path: Path) -> None:
    t, w = _trace(path, 4, None)
    x = t.input("x", "f32", [4, 64])
    t.output("y", t.matmul(x, t.weight("token_embd.weight")))
    _native.CpuRuntime(1).prepare(t.finish(), w, _native.CompileLimits(max_artifact_bytes=100))


def trigger_expansion(path: Path) -> None:
    t, w = _trace(path, 4, None)
    x = t.input("x", "f32", [4, 64])
    t.output("y", t.silu(t.silu(t.silu(x))))
    _native.CpuRuntime(1).prepare(t.finish(), w, _native.CompileLimits(max_equations=2))


def trigger_context(path: Path) -> None:
    llm = poot.LLM(str(path), max_model_len=32, num_blocks=8)
    llm.generate([5] * 40, poot.SamplingParams(max_tokens=4))


def trigger_prepared(path: Path) -> None:
    llm = poot.LLM(str(path), max_prepared_entries=1, prepared_policy="refuse", num_blocks=16)
    llm.generate(["Once", "upon a time there"], poot.SamplingParams(max_tokens=3))
    llm.generate("Lily", poot.SamplingParams(max_tokens=20, temperature=0.5, logprobs=2))


def trigger_kv_memory(path: Path) -> None:
    rt = _native.CpuRuntime(1)
    rt.configure_kv(n_layers=5, n_kv_heads=4, head_dim=8, block_size=16, num_blocks=2**31 - 1)


def trigger_capacity(path: Path) -> None:
    poot.compile(str(path), poot.CompileConfig(device_budget_bytes=0))


def trigger_cache_write(path: Path) -> None:
    from poot.checkpoints import cache

    cache.check_space(path.parent, 1 << 62)  # more than any disk holds


TRIGGERS: dict[type[errors.PootError], Callable[[Path], None]] = {
    errors.TraceBudgetError: trigger_trace_budget,
    errors.ArtifactTooLargeError: trigger_artifact,
    errors.CompileExpansionError: trigger_expansion,
    errors.ContextLengthError: trigger_context,
    errors.PreparedEntryLimitError: trigger_prepared,
    errors.DeviceMemoryError: trigger_kv_memory,
    errors.CapacityError: trigger_capacity,
    errors.CacheWriteError: trigger_cache_write,
}


def test_every_error_with_numbers_has_a_trigger() -> None:
    with_numbers = {
        cls
        for cls in catalogue()
        if any(k in inspect.signature(cls.__init__).parameters for k in NUMERIC)
    }
    # KernelBodyLimitError comes only from a backend that generates kernels (wgpu).
    missing = with_numbers - set(TRIGGERS) - {errors.KernelBodyLimitError}
    assert not missing, f"add real triggers for {sorted(c.__name__ for c in missing)}"


@pytest.mark.parametrize("cls", list(TRIGGERS), ids=lambda c: c.__name__)
def test_messages_name_their_numbers(cls: type[errors.PootError], stories_gguf: Path) -> None:
    with pytest.raises(cls) as info:
        TRIGGERS[cls](stories_gguf)
    e = info.value
    numbers = _numbers(e)
    assert numbers, f"{cls.__name__} carries no numbers"
    for name, value in numbers.items():
        assert str(value) in e.message or f"{value:,}" in e.message, (name, value, e.message)
    assert e.hint in str(e)


def test_sampling_and_input_errors_name_the_value(stories_gguf: Path) -> None:
    with pytest.raises(errors.SamplingParamsError) as e:
        poot.SamplingParams(top_p=1.5)
    assert "1.5" in e.value.message and "top_p" in e.value.message
    with pytest.raises(errors.GraphInputError) as g:
        poot.LLM(str(stories_gguf), num_blocks=8).generate([9999])
    assert "9999" in g.value.message and "512" in g.value.message


def test_the_docs_list_every_error_with_its_remedy() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    for cls in catalogue():
        if cls is not errors.PootError:
            assert f"`{cls.__name__}`" in page and cls.hint in page, cls.__name__
