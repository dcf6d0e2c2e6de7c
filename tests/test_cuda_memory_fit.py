"""The CUDA KV pool's size comes from the memory the driver says is free, not the total: a GPU
shared with another process must not be sized as if it were empty.

The driver calls run against poot-cuda's CPU emulation of the driver API (it says nothing
about a GPU; the H200 runs are in docs/performance.md); without a host C++ compiler to build
it, those tests skip and say so.
"""

from __future__ import annotations

import pytest

from poot import _native
from poot.errors import DeviceUnavailableError
from poot.server.loading import cuda_kv_bytes

GIB = 1 << 30


def test_pool_is_bounded_by_free_memory_when_another_process_holds_some() -> None:
    # 80 GiB card, 30 GiB taken by someone else: 50 GiB free is the bound, not 72 (90%).
    assert cuda_kv_bytes(2 * GIB, free=50 * GIB, total=80 * GIB) == 48 * GIB
    # An idle card: 90% of it (vLLM's gpu_memory_utilization default).
    assert cuda_kv_bytes(2 * GIB, free=80 * GIB, total=80 * GIB) == int(72 * GIB) - 2 * GIB
    # Weights larger than what is free: nothing left, never negative.
    assert cuda_kv_bytes(60 * GIB, free=50 * GIB, total=80 * GIB) == 0


@pytest.fixture(scope="module")
def emulator() -> str:
    try:
        return _native._cuda_emulator()
    except RuntimeError as e:
        pytest.skip(f"no CPU emulation of the CUDA driver here ({e})")


def test_cuda_memory_asks_the_driver(emulator: str) -> None:
    free, total = _native.cuda_memory(0, driver_library=emulator)
    # The emulator reports a 4 GiB device with all of it free (its cuMemGetInfo).
    assert (free, total) == (4 * GIB, 4 * GIB)


def test_cuda_memory_errors_are_typed(emulator: str, tmp_path: object) -> None:
    with pytest.raises(DeviceUnavailableError):
        _native.cuda_memory(99, driver_library=emulator)
    with pytest.raises(DeviceUnavailableError):
        _native.cuda_memory(0, driver_library="/nonexistent/libcuda.so.1")
