"""CompiledModule.train_step on the CPU runtime: one step against torch's, the parameters it
writes, and every refusal as its typed error.

Bounds: after one step, the loss within 1e-5 relative of torch's and each parameter within
1e-6 absolute plus 1e-5 relative (the gradients sum in another order than torch's BLAS; the
update itself is torch's operation for operation).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.errors import (  # noqa: E402
    ConfigError,
    TrainingNotAllowedError,
    TrainingUnsupportedError,
    UnsupportedFeatureError,
)
from poot.planner.cost import Placement, Segment  # noqa: E402
from poot.torch_frontend import SGD, AdamW  # noqa: E402
from poot.torch_frontend.train import check_placement  # noqa: E402

TRAIN = poot.CompileConfig(allow_training=True)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(F.silu(self.norm(F.relu(self.fc1(x)))))


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    m = Mlp()
    return m, copy.deepcopy(m)


def _torch_step(m, opt, x, y, loss_fn) -> float:
    opt.zero_grad()
    loss = loss_fn(m(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1, foreach=False)),
        (
            SGD(lr=0.05, momentum=0.9, weight_decay=0.01),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False),
        ),
        (AdamW(lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01, foreach=False)),
    ],
    ids=["sgd", "sgd_momentum_decay", "adamw"],
)
def test_steps_match_torch(ours, theirs):
    m, ref = _pair()
    x, y = torch.randn(16, 12), torch.randn(16, 5)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    opt = theirs(ref.parameters())
    for _ in range(2):  # the second step reads the optimizer's state
        got = compiled.train_step(x, y, F.mse_loss, optimizer=ours)
        want = _torch_step(ref, opt, x, y, F.mse_loss)
        assert got == pytest.approx(want, rel=1e-5)
    # The module's own parameters were updated in place, as torch's optimizer would.
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), atol=1e-6, rtol=1e-5, err_msg=name
        )
    # The forward plan sees the new parameters.
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x).cpu(), ref(x).numpy(), atol=1e-5)


def test_cross_entropy_loss_and_int32_targets():
    m, ref = _pair(1)
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, foreach=False)
    got = compiled.train_step(x, y.int(), nn.CrossEntropyLoss(), optimizer=SGD(lr=0.1))
    want = _torch_step(ref, opt, x, y, F.cross_entropy)
    assert got == pytest.approx(want, rel=1e-5)


def test_training_needs_allow_training():
    m, _ = _pair()
    x = torch.randn(16, 12)
    compiled = poot.compile(m, (x,))
    with pytest.raises(TrainingNotAllowedError, match="allow_training"):
        compiled.train_step(x, torch.randn(16, 5), "mse", optimizer=SGD(lr=0.1))
    assert issubclass(TrainingNotAllowedError, ConfigError)


class PassThrough:
    """A runtime that is not an in-process poot runtime (a stand-in for a worker proxy): it
    forwards to a CpuRuntime, so the module compiles and runs forwards."""

    def __init__(self) -> None:
        self.inner = poot._native.CpuRuntime(threads=1)

    def prepare(self, *args):
        return self.inner.prepare(*args)

    def run(self, *args):
        return self.inner.run(*args)


def test_other_runtimes_streamed_and_multi_device_placements_are_refused():
    m, _ = _pair()
    x = torch.randn(16, 12)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN, runtime=PassThrough())
    compiled(x)  # forwards run there
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(TrainingUnsupportedError, match="PassThrough"):
        compiled.train_step(x, torch.randn(16, 5), "mse", optimizer=SGD(lr=0.1))
    for p, q in zip(m.parameters(), before, strict=True):
        assert torch.equal(p.detach(), q)
    streamed = Placement((Segment("cpu", 0, 2), Segment("cpu", 2, 4, residency="host")))
    with pytest.raises(TrainingUnsupportedError, match="stream"):
        check_placement(streamed)
    split = Placement((Segment("cpu", 0, 2), Segment("wgpu:0", 2, 4)))
    with pytest.raises(TrainingUnsupportedError, match="spans cpu, wgpu:0"):
        check_placement(split)
    check_placement(Placement((Segment("cpu", 0, 4),)))


def test_bad_losses_targets_and_optimizers_are_typed_errors():
    m, _ = _pair()
    x = torch.randn(16, 12)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    y = torch.randn(16, 5)
    with pytest.raises(UnsupportedFeatureError, match="loss"):
        compiled.train_step(x, y, F.l1_loss, optimizer=SGD(lr=0.1))
    with pytest.raises(UnsupportedFeatureError, match="shape"):
        compiled.train_step(x, torch.randn(16, 4), "mse", optimizer=SGD(lr=0.1))
    with pytest.raises(UnsupportedFeatureError, match=r"\[0, 5\)"):
        compiled.train_step(x, torch.full((16,), 5), "cross_entropy", optimizer=SGD(lr=0.1))
    with pytest.raises(ConfigError, match="optimizer"):
        compiled.train_step(x, y, "mse", optimizer=torch.optim.SGD)
    with pytest.raises(ConfigError, match="lr"):
        SGD(lr=-1.0)
    with pytest.raises(ConfigError, match="betas"):
        AdamW(betas=(0.9, 1.0))
    # Nothing above changed the parameters: a step still matches a fresh torch step.
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, foreach=False)
    got = compiled.train_step(x, y, "mse", optimizer=SGD(lr=0.1))
    assert got == pytest.approx(_torch_step(ref, opt, x, y, F.mse_loss), rel=1e-5)


class MaxPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(x).amax(dim=-1, keepdim=True)


def test_amax_trains_like_torch():
    # amax's gradient goes to the maxima (split evenly over ties, as torch's).
    torch.manual_seed(2)
    m = MaxPool()
    ref = copy.deepcopy(m)
    x, y = torch.randn(3, 6), torch.randn(3, 1)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, foreach=False)
    for _ in range(3):
        got = compiled.train_step(x, y, "mse", optimizer=SGD(lr=0.1))
        assert got == pytest.approx(_torch_step(ref, opt, x, y, F.mse_loss), rel=1e-5)
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), atol=1e-6, rtol=1e-5)


def test_a_module_compiled_for_training_runs_forwards_like_eager():
    # Trained parameters are lowered, never folded: the decoder's position embedding of a
    # constant arange becomes a one-hot matmul, the token embedding a row gather of a
    # parameter input (within the decoder's 1e-5 bound).
    from tests.test_torch_compile_gpt import Gpt

    torch.manual_seed(3)
    m = Gpt(True).eval()
    idx = torch.randint(0, 65, (2, 16))
    compiled = poot.compile(m, example_inputs=(idx,), config=TRAIN)
    assert "wpe.weight" in compiled.trainable and "lm_head.weight" in compiled.trainable
    with torch.no_grad():
        want = m(idx).numpy()
    np.testing.assert_allclose(compiled(idx).cpu(), want, rtol=0, atol=1e-5)
