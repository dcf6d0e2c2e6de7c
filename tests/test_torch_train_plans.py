"""What training prepares and holds: the forward plan is prepared once and reads the updated
parameters in place (counted, not timed); each kind of step graph is prepared once; an
embedding's gradient is a scatter-add whose memory scales with the table, not with
vocabulary x vocabulary.

Bounds: forwards after steps within 1e-5 absolute of torch's module after the same steps
(the steps track torch's within 1e-6 + 1e-5 relative per parameter); the large-vocabulary
decoder's loss after one step within 1e-5 relative of torch's.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
F = torch.nn.functional

import poot  # noqa: E402
from poot.torch_frontend import SGD, AdamW, TrainConfig  # noqa: E402
from tests.test_torch_compile_gpt import Gpt  # noqa: E402
from tests.test_torch_train import Mlp  # noqa: E402

TRAIN = poot.CompileConfig(allow_training=True)


def test_forward_plan_is_prepared_once_and_sees_every_step():
    torch.manual_seed(40)
    m = Mlp()
    ref = copy.deepcopy(m)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=False)
    x, y = torch.randn(16, 12), torch.randn(16, 5)
    compiled = poot.compile(m, example_inputs=(x,), config=TRAIN)
    plan = compiled.plan
    for _ in range(5):
        compiled.train_step(x, y, "mse", optimizer=AdamW(lr=0.01))
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
        with torch.no_grad():
            np.testing.assert_allclose(compiled(x).cpu(), ref(x).numpy(), atol=1e-5)
    assert compiled.prepare_count == 1
    assert compiled.plan is plan
    # One step graph for the one (loss, optimizer, config) used; another config adds one.
    assert len(compiled.trainer.plans) == 1
    compiled.train_step(x, y, "mse", optimizer=AdamW(lr=0.01), config=TrainConfig(max_grad_norm=1))
    compiled.train_step(x, y, "mse", optimizer=AdamW(lr=0.01), config=TrainConfig(max_grad_norm=1))
    assert len(compiled.trainer.plans) == 2
    assert compiled.prepare_count == 1


def _largest_value(graph) -> int:
    return max(math.prod(shape) for *_, shape in graph.equations())


def test_embedding_gradient_memory_scales_with_the_table_not_vocab_squared():
    v, c, t = 2048, 16, 8
    torch.manual_seed(41)
    m = Gpt(True, v=v, c=c, h=2, layers=1, t=t).eval()
    ref = copy.deepcopy(m)
    idx = torch.randint(0, v, (1, t))
    idx[0, 3] = idx[0, 5] = idx[0, 1]  # repeated ids: their rows' gradients add
    y = torch.randint(0, v, (1, t))
    compiled = poot.compile(m, example_inputs=(idx,), config=TRAIN)
    got = compiled.train_step(idx, y, "cross_entropy", optimizer=SGD(lr=0.5))
    opt = torch.optim.SGD(ref.parameters(), lr=0.5, foreach=False)
    loss = F.cross_entropy(ref(idx).reshape(-1, v), y.reshape(-1))
    loss.backward()
    opt.step()
    assert got == pytest.approx(float(loss.detach()), rel=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(
            p.detach().numpy(), q.detach().numpy(), atol=1e-6, rtol=1e-5, err_msg=name
        )
    (sg,) = compiled.trainer.plans.values()
    ops = {op for op, *_ in sg.graph.equations()}
    assert "scatter_add_rows" in ops and "gather_rows" in ops
    # The largest value is a [V, C] table or its gradient, or the [T, V] logits; a one-hot
    # gradient held a [V, V] identity (4M floats here).
    assert _largest_value(sg.graph) <= max(v * c, t * v)
    assert sg.weights.total_bytes < 4 * v * c  # no identity stored beside the weights
    assert sg.plan.artifact_bytes < v * v  # a quarter of the identity alone
