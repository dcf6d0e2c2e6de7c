"""torch for the torch front end's tests: skipped with the reason where torch is missing,
a failure instead under ``POOT_REQUIRE_TORCH=1`` (CI sets it, so a skip there proves nothing)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require_torch() -> ModuleType:
    if os.environ.get("POOT_REQUIRE_TORCH") == "1":
        return importlib.import_module("torch")
    return pytest.importorskip(
        "torch",
        reason="torch is not installed (pip install 'poot[torch]'); "
        "POOT_REQUIRE_TORCH=1 turns this skip into a failure",
    )
