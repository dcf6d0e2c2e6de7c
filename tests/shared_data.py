"""Where the tests find ``../shared`` (real checkpoints and references) and what a missing
file means.

Invariant: every test that needs a file from ``../shared`` asks ``require_shared``. It skips with
the reason on a machine without the folder, and fails instead under ``POOT_REQUIRE_SHARED=1``
(``.ci/run`` sets it), so a green CI run proves the reference checks actually ran.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SHARED_MODELS = SHARED / "models"


def shared_required() -> bool:
    """True under ``POOT_REQUIRE_SHARED=1``: a missing shared fixture is a failure."""
    return os.environ.get("POOT_REQUIRE_SHARED") == "1"


def missing_shared(reason: str) -> NoReturn:
    """Skips with ``reason``, or fails with it under ``POOT_REQUIRE_SHARED=1``."""
    if shared_required():
        pytest.fail(f"POOT_REQUIRE_SHARED=1 but {reason}")
    pytest.skip(reason)


def require_shared(path: Path, what: str | None = None) -> Path:
    """``path`` (a file or folder under ``../shared``) if it exists; else skip or fail.

    Args:
        path: the file or folder the test needs.
        what: a short name for the message (default: the path).
    """
    if not path.exists():
        missing_shared(f"{what or 'shared fixture'} not found at {path}")
    return path
