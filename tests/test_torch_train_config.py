"""train_step's TrainConfig against torch: gradient clipping by global norm
(``clip_grad_norm_``), gradient accumulation over micro-batches (``(loss / k).backward()``
k times, then one step), and learning-rate schedules (``torch.optim.lr_scheduler``).

Bounds: the learning rates are torch's exactly (the same recursion in Python floats); losses
within 1e-5 relative of torch's over the run and parameters within 1e-6 absolute plus 1e-5
relative after it (gradients sum in another order than torch's, and the clip norm sums in
another order too).
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
from poot.errors import ConfigError, UnsupportedFeatureError  # noqa: E402
from poot.torch_frontend import (  # noqa: E402
    SGD,
    AdamW,
    CosineDecay,
    LinearWarmup,
    StepDecay,
    TrainConfig,
)
from poot.torch_frontend.schedule import lr_at  # noqa: E402
from tests.test_torch_train import Mlp  # noqa: E402

TRAIN = poot.CompileConfig(allow_training=True)
REL = 1e-5


def _pair(seed: int):
    torch.manual_seed(seed)
    m = Mlp()
    return m, copy.deepcopy(m)


def _close_params(m, ref):
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), atol=1e-6, rtol=1e-5, err_msg=name
        )


@pytest.mark.parametrize(
    "schedule, theirs",
    [
        (LinearWarmup(total_iters=4, start_factor=0.25),
         lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=4)),
        (CosineDecay(t_max=6, eta_min=1e-4),
         lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=6, eta_min=1e-4)),
        (StepDecay(step_size=3, gamma=0.5),
         lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
    ],
    ids=["linear_warmup", "cosine", "step"],
)  # fmt: skip
def test_schedules_give_torchs_learning_rates_and_track_its_losses(schedule, theirs):
    m, ref = _pair(20)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=False)
    sched = theirs(opt)
    w = torch.randn(12, 5)
    cfg = TrainConfig(schedule=schedule)
    compiled = None
    got, want = [], []
    for step in range(14):  # past the cosine's t_max: torch's goes back up, and so does ours
        assert lr_at(schedule, 0.01, step) == opt.param_groups[0]["lr"]
        x = torch.randn(16, 12)
        y = torch.tanh(x @ w)
        if compiled is None:
            compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
        got.append(compiled.train_step(x, y, "mse", optimizer=AdamW(lr=0.01), config=cfg))
        opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        opt.step()
        sched.step()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, rel=REL)
    _close_params(m, ref)


@pytest.mark.parametrize("max_norm", [0.05, 100.0], ids=["clipped", "under_the_norm"])
def test_clipping_by_global_norm_matches_clip_grad_norm(max_norm):
    m, ref = _pair(21)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=False)
    x, y = torch.randn(16, 12), torch.randn(16, 5)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    cfg = TrainConfig(max_grad_norm=max_norm)
    norms = []
    for _ in range(3):
        got = compiled.train_step(x, y, "mse", optimizer=SGD(lr=0.1, momentum=0.9), config=cfg)
        opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)))
        opt.step()
        assert got == pytest.approx(float(loss.detach()), rel=REL)
    _close_params(m, ref)
    # The case it claims: the first gradients' norm is above 0.05 and below 100.
    assert 0.05 < norms[0] < 100.0


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_over_micro_batches_matches_torchs_loop(k):
    m, ref = _pair(22)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=False)
    compiled = poot.compile(m, example_inputs=(torch.randn(8, 12),), config=TRAIN)
    cfg = TrainConfig(accumulation_steps=k, max_grad_norm=1.0, schedule=StepDecay(2, 0.5))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for step in range(4):
        x, y = torch.randn(8 * k, 12), torch.randn(8 * k, 5)
        got = compiled.train_step(x, y, F.mse_loss, optimizer=AdamW(lr=0.01), config=cfg)
        opt.zero_grad()
        losses = []
        for xs, ys in zip(torch.split(x, 8), torch.split(y, 8), strict=True):
            loss = F.mse_loss(ref(xs), ys)
            (loss / k).backward()
            losses.append(float(loss.detach()))
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        sched.step()
        assert got == pytest.approx(sum(losses) / k, rel=REL), step
    _close_params(m, ref)
    # One update per call: AdamW's count is the number of calls, not of micro-batches.
    assert compiled.trainer.steps[AdamW(lr=0.01)] == 4


def test_accumulation_with_cross_entropy_splits_class_targets():
    m, ref = _pair(23)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, foreach=False)
    compiled = poot.compile(m, example_inputs=(torch.randn(4, 12),), config=TRAIN)
    x, y = torch.randn(12, 12), torch.randint(0, 5, (12,))
    got = compiled.train_step(
        x, y, "cross_entropy", optimizer=SGD(lr=0.1), config=TrainConfig(accumulation_steps=3)
    )
    opt.zero_grad()
    losses = []
    for xs, ys in zip(torch.split(x, 4), torch.split(y, 4), strict=True):
        loss = F.cross_entropy(ref(xs), ys)
        (loss / 3).backward()
        losses.append(float(loss.detach()))
    opt.step()
    assert got == pytest.approx(sum(losses) / 3, rel=REL)
    _close_params(m, ref)


def test_bad_configs_and_batches_are_typed_errors_and_change_nothing():
    m, _ = _pair(24)
    x = torch.randn(8, 12)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    before = [p.detach().clone() for p in m.parameters()]
    for bad in (
        lambda: TrainConfig(max_grad_norm=0.0),
        lambda: TrainConfig(max_grad_norm=float("inf")),
        lambda: TrainConfig(accumulation_steps=0),
        lambda: TrainConfig(schedule="cosine"),
        lambda: LinearWarmup(start_factor=0.0),
        lambda: CosineDecay(t_max=0),
        lambda: StepDecay(step_size=2, gamma=0.0),
    ):
        with pytest.raises(ConfigError):
            bad()
    with pytest.raises(ConfigError, match="TrainConfig"):
        compiled.train_step(x, torch.randn(8, 5), "mse", optimizer=SGD(lr=0.1), config={})
    two = TrainConfig(accumulation_steps=2)
    sgd = SGD(lr=0.1)
    with pytest.raises(UnsupportedFeatureError, match="micro-batches"):
        compiled.train_step(torch.randn(9, 12), torch.randn(9, 5), optimizer=sgd, config=two)
    # Splits evenly, but into parts of the wrong size: refused before any graph runs.
    with pytest.raises(UnsupportedFeatureError, match="shape"):
        compiled.train_step(torch.randn(8, 12), torch.randn(8, 5), optimizer=sgd, config=two)
    # Bad targets: checked for every micro-batch before the first one runs.
    with pytest.raises(UnsupportedFeatureError, match="shape"):
        compiled.train_step(torch.randn(16, 12), torch.randn(16, 4), optimizer=sgd, config=two)
    assert compiled.trainer is None or not compiled.trainer.steps
    for p, q in zip(m.parameters(), before, strict=True):
        assert torch.equal(p.detach(), q)
