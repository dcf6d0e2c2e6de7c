"""train_step on the wgpu runtime (lavapipe in CI): the step graph (forward, loss, backward,
optimizer) is ordinary IR, so a module compiled for wgpu trains there.

Bounds: 20 steps of SGD and of AdamW on the MLP, and 5 AdamW steps of the tiny decoder
(whose embeddings' gradients are scatter-adds), track torch's losses within 1e-4 relative (the
device sums layer norms, reductions and matmuls in f32 in its own order); scatter_add_rows
equals the CPU runtime's exactly (both add in order of the ids).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tests.torch_support import require_torch, wgpu_runtime

torch = require_torch()
F = torch.nn.functional

import poot  # noqa: E402
from poot.torch_frontend import SGD, AdamW  # noqa: E402
from tests.test_torch_train import Mlp  # noqa: E402

pytestmark = pytest.mark.device_wgpu


@pytest.fixture(scope="module")
def wgpu():
    return wgpu_runtime()


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


def test_scatter_add_rows_equals_the_cpu_exactly(wgpu):
    # Magnitudes over seven decades: a sum in another order would round differently.
    rng = np.random.default_rng(50)
    t, d, rows = 29, 6, 10
    src = (rng.standard_normal((t, d)) * 10.0 ** rng.integers(-3, 4, (t, 1))).astype(np.float32)
    ids = rng.integers(0, rows - 2, t).astype(np.int32)  # the last two rows stay zero
    weights = poot._native.Weights.from_arrays({"unused": np.zeros(1, np.float32)})
    tracer = poot._native.Tracer(weights, 1, poot._native.TraceLimits())
    s, i = tracer.input("src", "f32", [t, d]), tracer.input("ids", "i32", [t])
    tracer.output("y", tracer.scatter_add_rows(s, i, rows))
    graph = tracer.finish()
    feed = {"src": src, "ids": ids}
    cpu = poot._native.CpuRuntime(threads=1)
    want = cpu.run(cpu.prepare(graph, weights), feed)["y"]
    got = wgpu.run(wgpu.prepare(graph, weights), feed)["y"]
    np.testing.assert_array_equal(got, want)
    assert not want[-2:].any()


def test_tiny_decoder_trains_on_wgpu_through_scatter_add(wgpu):
    from tests.test_torch_compile_gpt import Gpt

    torch.manual_seed(51)
    m = Gpt(True, layers=1).eval()
    ref = copy.deepcopy(m)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, foreach=False)
    idx = torch.randint(0, 65, (2, 16))
    compiled = poot.compile(
        m, example_inputs=(idx,), config=poot.CompileConfig(allow_training=True), runtime=wgpu
    )
    got, want = [], []
    for i in range(5):
        y = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(i))
        got.append(compiled.train_step(idx, y, "cross_entropy", optimizer=AdamW(lr=3e-3)))
        opt.zero_grad()
        loss = F.cross_entropy(ref(idx).reshape(-1, 65), y.reshape(-1))
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, rel=1e-4)
    (sg,) = compiled.trainer.plans.values()
    assert "scatter_add_rows" in {op for op, *_ in sg.graph.equations()}
