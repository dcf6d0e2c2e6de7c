"""train_step on the wgpu runtime (lavapipe in CI): the step graph (forward, loss, backward,
optimizer) is ordinary IR, so a module compiled for wgpu trains there.

Bound: 20 steps of SGD and of AdamW on the MLP track torch's losses within 1e-4 relative
(the device sums layer norms, reductions and matmuls in f32 in its own order).
"""

from __future__ import annotations

import copy

import pytest

from tests.torch_support import require_torch

torch = require_torch()
F = torch.nn.functional

import poot  # noqa: E402
from poot.torch_frontend import SGD, AdamW  # noqa: E402
from tests.test_torch_train import Mlp  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    from wgpu_util import require_wgpu

    require_wgpu()
    return poot._native.WgpuRuntime(timeout_s=60.0)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (SGD(lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05, foreach=False)),
        (AdamW(lr=3e-3), lambda p: torch.optim.AdamW(p, lr=3e-3, foreach=False)),
    ],
    ids=["sgd", "adamw"],
)
def test_mlp_trains_on_wgpu(wgpu, ours, theirs):
    torch.manual_seed(12)
    m = Mlp()
    ref = copy.deepcopy(m)
    opt = theirs(ref.parameters())
    x0 = torch.randn(16, 12)
    compiled = poot.compile(
        m, example_inputs=(x0,), config=poot.CompileConfig(allow_training=True), runtime=wgpu
    )
    got, want = [], []
    for _ in range(20):
        x, y = torch.randn(16, 12), torch.randn(16, 5)
        got.append(compiled.train_step(x, y, F.mse_loss, optimizer=ours))
        opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, rel=1e-4)
