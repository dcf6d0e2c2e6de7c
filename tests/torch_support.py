"""torch for the torch front end's tests: skipped with the reason where torch is missing,
a failure instead under ``POOT_REQUIRE_TORCH=1`` (CI sets it, so a skip there proves nothing)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pytest


def require_torch() -> ModuleType:
    if os.environ.get("POOT_REQUIRE_TORCH") == "1":
        return importlib.import_module("torch")
    return pytest.importorskip(
        "torch",
        reason="torch is not installed (pip install 'poot[torch]'); "
        "POOT_REQUIRE_TORCH=1 turns this skip into a failure",
    )


def wgpu_runtime() -> Any:
    """A new ``WgpuRuntime`` for a test module's fixture: skipped, with the reason, where the
    wgpu backend is not compiled in or no adapter exists; a failure instead under
    ``POOT_REQUIRE_WGPU=1`` (``wgpu_util.require_wgpu``)."""
    from wgpu_util import require_wgpu

    from poot import _native

    require_wgpu()
    return _native.WgpuRuntime(timeout_s=60.0)


def eager_chain(mods: Sequence[Any], x: Any) -> np.ndarray:
    """torch eager's output (numpy) of ``mods`` applied in turn to ``x``, without autograd."""
    torch = require_torch()
    with torch.no_grad():
        for m in mods:
            x = m(x)
    return np.asarray(x.numpy())
