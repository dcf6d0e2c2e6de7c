"""Device outputs fed back as inputs (issue 34 item 4): a wgpu ``PootTensor`` given to a module
compiled for the same ``WgpuRuntime`` (directly, or as the next node of a ``ModuleGraph``) is
bound as it lies: the runtime's counters show no readback and no upload for it. On any other
device it is ``DeviceMismatchError`` when called directly, and a counted, recorded transfer
through the host inside a graph. Shape and dtype checks still raise ``UnsupportedFeatureError``.

Bound: 2e-5 absolute against torch eager (float32), as tests/test_torch_modgraph_wgpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.torch_support import eager_chain, require_torch, wgpu_runtime

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import (  # noqa: E402
    DeviceMismatchError,
    GraphInputError,
    UnsupportedFeatureError,
)
from poot.planner import CompileConfig  # noqa: E402
from tests.planner_fixtures import cpu, lavapipe  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    return wgpu_runtime()


class Up(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)

    def forward(self, x):
        return F.silu(self.fc(x))


class Chain(nn.Module):
    """Same-sized elementwise steps after the input's last read: a pooled input buffer would be
    reused, and overwritten, by a later step."""

    def forward(self, x):
        a = torch.tanh(x)
        b = a * 2.0 + 1.0
        return torch.sigmoid(b) - a


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)


def _counters(rt):
    s = rt.stats()
    return s["readback_bytes"], s["upload_bytes"]


def test_a_device_output_is_bound_as_the_next_modules_input(wgpu):
    torch.manual_seed(1)
    up, chain = Up().eval(), Chain().eval()
    x = torch.randn(4, 16)
    a = poot.compile(up, (x,), runtime=wgpu)
    with torch.no_grad():
        y_eager = up(x)
    b = poot.compile(chain, (y_eager,), runtime=wgpu)
    read0, up0 = _counters(wgpu)
    y = a(x)
    assert _counters(wgpu) == (read0, up0 + x.numel() * 4)  # x uploaded, nothing read back
    z = b(y)
    assert _counters(wgpu) == (read0, up0 + x.numel() * 4)  # y bound: no readback, no upload
    assert z.device == "wgpu:0"
    np.testing.assert_allclose(z.cpu(), eager_chain([up, chain], x), rtol=0, atol=2e-5)
    # The bound buffer was only read: y still holds the first module's output.
    np.testing.assert_allclose(y.cpu(), y_eager.numpy(), rtol=0, atol=2e-5)
    # The same input from the host costs one upload of its bytes: the counter is real.
    host = y.cpu()
    read1, up1 = _counters(wgpu)
    b(host)
    assert _counters(wgpu) == (read1, up1 + y.nbytes)


def test_a_bound_input_is_checked_like_a_host_one(wgpu):
    torch.manual_seed(2)
    up = Up().eval()
    x = torch.randn(4, 16)
    y = poot.compile(up, (x,), runtime=wgpu)(x)  # [4, 32] on the device
    other_shape = poot.compile(Chain().eval(), (torch.randn(2, 32),), runtime=wgpu)
    with pytest.raises(UnsupportedFeatureError, match=r"shape \[4, 32\].*\[2, 32\]"):
        other_shape(y)
    emb = nn.Embedding(40, 8).eval()
    ids = torch.randint(0, 40, (4, 32))
    wants_ids = poot.compile(emb, (ids,), runtime=wgpu)
    with pytest.raises(UnsupportedFeatureError, match=r"dtype float32 on wgpu:0.*int32 ids"):
        wants_ids(y)
    # The native check behind it: a WgpuTensor of the wrong shape is the typed input error.
    plan = other_shape.plan
    with pytest.raises(GraphInputError):
        wgpu.run_on_device(plan, {other_shape.inputs[0][0]: y._on_device})


def test_another_device_is_a_typed_error_never_a_silent_copy(wgpu):
    torch.manual_seed(3)
    up, head = Up().eval(), Head().eval()
    x = torch.randn(4, 16)
    y = poot.compile(up, (x,), runtime=wgpu)(x)
    with torch.no_grad():
        y_eager = up(x)
    on_cpu = poot.compile(head, (y_eager,))
    other = poot._native.WgpuRuntime(timeout_s=60.0)  # the same adapter, another device
    on_other = poot.compile(head, (y_eager,), runtime=other)
    read0 = wgpu.stats()["readback_bytes"]
    for c in (on_cpu, on_other):
        with pytest.raises(DeviceMismatchError, match=r"on wgpu:0.*\.cpu\(\)"):
            c(y)
    assert wgpu.stats()["readback_bytes"] == read0  # nothing was copied
    assert issubclass(DeviceMismatchError, UnsupportedFeatureError)
    with pytest.raises(ValueError, match="another WgpuRuntime"):
        other.run_on_device(on_other.plan, {on_other.inputs[0][0]: y._on_device})
    # The explicit copy works on both.
    want = eager_chain([up, head], x)
    np.testing.assert_allclose(on_cpu(y.cpu()).cpu(), want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(on_other(y.cpu()).cpu(), want, rtol=0, atol=2e-5)


def test_a_module_sequence_on_one_device_moves_no_bytes_between_modules(wgpu):
    torch.manual_seed(4)
    mods = [Up().eval(), Chain().eval(), Head().eval()]
    x = torch.randn(4, 16)
    cfg = CompileConfig(force_placement=(("wgpu:0", 0, 3),))
    compiled = poot.compile_modules(
        mods, (x,), cfg, profiles=[cpu(), lavapipe()], runtimes={"wgpu:0": wgpu}
    )
    read0, up0 = _counters(wgpu)
    got = compiled(x)
    # Only the graph's input went up; the modules handed each other device buffers.
    assert _counters(wgpu) == (read0, up0 + x.numel() * 4)
    assert compiled.transfer_bytes == 0
    np.testing.assert_allclose(got.cpu(), eager_chain(mods, x), rtol=0, atol=2e-5)


def test_a_graph_crossing_devices_counts_and_records_each_transfer(wgpu, tmp_path):
    torch.manual_seed(5)
    mods = [Up().eval(), Chain().eval(), Head().eval()]
    x = torch.randn(4, 16)
    cfg = CompileConfig(force_placement=(("wgpu:0", 0, 2), ("cpu", 2, 3)))
    compiled = poot.compile_modules(
        mods, (x,), cfg, profiles=[cpu(), lavapipe()], runtimes={"wgpu:0": wgpu}
    )
    read0, up0 = _counters(wgpu)
    got = compiled(x)
    hop = 4 * 32 * 4  # Chain's output, read back once for the CPU head
    assert _counters(wgpu) == (read0 + hop, up0 + x.numel() * 4)
    assert compiled.transfer_bytes == hop
    np.testing.assert_allclose(got.cpu(), eager_chain(mods, x), rtol=0, atol=2e-5)
    page = compiled.visualize(tmp_path / "m.html", measured=True).read_text()
    assert 'data-lane="cpu link" data-label="wgpu:0-&gt;cpu"' in page
