"""Whether this machine can run the wgpu tests (shared by tests and benches)."""

from __future__ import annotations

import os

import pytest


def require_wgpu() -> None:
    """Skips (with the reason) where the wgpu backend is not compiled in or no adapter exists;
    fails instead when ``POOT_REQUIRE_WGPU=1`` (``make test-device-wgpu``): skips are not proof.
    """
    from poot._native import WgpuRuntime
    from poot.errors import BackendNotCompiledError, KernelError

    try:
        WgpuRuntime(timeout_s=60.0)
        return
    except BackendNotCompiledError as e:
        reason = f"the wgpu backend is not compiled into this build: {e}"
    except KernelError as e:
        reason = f"no wgpu (Vulkan) adapter on this machine (mesa-vulkan-drivers gives one): {e}"
    if os.environ.get("POOT_REQUIRE_WGPU") == "1":
        pytest.fail(f"POOT_REQUIRE_WGPU=1 but {reason}")
    pytest.skip(reason)
