"""Outputs stay where the schedule put them: a module compiled for the wgpu runtime (lavapipe
in CI) returns device-resident ``PootTensor``s; only ``cpu()`` copies one to the host, and
DLPack or ``numpy.asarray`` on one is a typed error naming ``cpu()`` (DLPack cannot describe a
Vulkan buffer to torch or numpy). Host outputs export through DLPack without a copy.

Bound: 1e-5 absolute against torch eager (float32), as tests/test_torch_compile_wgpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import DeviceTensorExportError, UnsupportedFeatureError  # noqa: E402


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc2(F.silu(self.fc1(x)))
        return h, torch.softmax(h, dim=-1)


def test_host_outputs_export_without_a_copy():
    torch.manual_seed(4)
    m = Mlp().eval()
    x = torch.randn(4, 16)
    h, p = poot.compile(m, (x,))(x)
    assert h.device == "cpu" and h.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(h)
    assert t.data_ptr() == h.cpu().ctypes.data  # the same memory
    assert np.from_dlpack(p).ctypes.data == p.cpu().ctypes.data


@pytest.mark.device_wgpu
def test_wgpu_outputs_stay_on_the_device_until_cpu():
    from wgpu_util import require_wgpu

    require_wgpu()
    rt = poot._native.WgpuRuntime(timeout_s=60.0)
    torch.manual_seed(5)
    m = Mlp().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        want_h, want_p = (t.numpy() for t in m(x))
    compiled = poot.compile(m, (x,), runtime=rt)
    before = rt.stats()["readback_bytes"]
    h, p = compiled(x)
    assert rt.stats()["readback_bytes"] == before  # no automatic copy
    assert (h.device, h.shape, h.dtype, h.nbytes) == ("wgpu:0", (4, 8), np.float32, 4 * 8 * 4)
    assert "device='wgpu:0'" in repr(h)
    np.testing.assert_allclose(h.cpu(), want_h, rtol=0, atol=1e-5)
    assert rt.stats()["readback_bytes"] == before + h.nbytes  # cpu() copied it, once
    np.testing.assert_allclose(p.cpu(), want_p, rtol=0, atol=1e-5)
    assert h.__dlpack_device__() == (7, 0)  # kDLVulkan
    for export in (torch.from_dlpack, np.from_dlpack, np.asarray):
        with pytest.raises(DeviceTensorExportError, match=r"on wgpu:0.*\.cpu\(\)"):
            export(h)
    with pytest.raises(DeviceTensorExportError):
        h.numpy()
    # A typed error of the documented kinds: unsupported, and a BufferError for DLPack callers.
    assert issubclass(DeviceTensorExportError, UnsupportedFeatureError)
    assert issubclass(DeviceTensorExportError, BufferError)
    # The host copy is an ordinary array, exported without another copy.
    host = h.cpu()
    assert torch.from_dlpack(host).data_ptr() == host.ctypes.data


@pytest.mark.device_wgpu
def test_native_run_on_device_keeps_outputs():
    from wgpu_util import require_wgpu

    require_wgpu()
    rt = poot._native.WgpuRuntime(timeout_s=60.0)
    w = poot._native.Weights.from_arrays({"w": np.ones((8, 4), np.float32)})
    tr = poot._native.Tracer(w, 2, poot._native.TraceLimits())
    tr.output("y", tr.silu(tr.matmul(tr.input("x", "f32", [2, 4]), tr.weight("w"))))
    plan = rt.prepare(tr.finish(), w)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    want = rt.run(plan, {"x": x})["y"]
    out = rt.run_on_device(plan, {"x": x})
    y = out["y"]
    assert isinstance(y, poot._native.WgpuTensor)
    assert (y.shape, y.dtype, y.nbytes) == ([2, 8], "f32", 64)
    np.testing.assert_array_equal(y.to_numpy(), want)
    with pytest.raises(ValueError, match="timeout_s"):
        y.to_numpy(timeout_s=-1.0)
