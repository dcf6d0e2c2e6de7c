"""50 training steps of SGD and of AdamW on an MLP (MSE) and on a tiny nanoGPT-style decoder
(cross-entropy), poot's train_step against torch's autograd and optimizer on a copy of the
same module (same initial parameters, same batches, dropout off).

Bound: every step's loss within 1e-5 relative of torch's (the two differ only in summation
order, f32 roundings that compound over the steps), and the last loss below the first (the
run trains).
"""

from __future__ import annotations

import copy

import pytest

from tests.torch_support import require_torch

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

import poot  # noqa: E402
from poot.torch_frontend import SGD, AdamW  # noqa: E402
from tests.test_torch_compile_gpt import Gpt  # noqa: E402
from tests.test_torch_train import Mlp  # noqa: E402

STEPS = 50
REL = 1e-5
TRAIN = poot.CompileConfig(allow_training=True)

OPTIMIZERS = {
    "sgd": (SGD(lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05, foreach=False)),
    "adamw": (AdamW(lr=3e-3), lambda p: torch.optim.AdamW(p, lr=3e-3, foreach=False)),
}


def _track(m, batches, loss_fn, name, reshape=lambda out, y: (out, y)):
    ref = copy.deepcopy(m)
    ours, theirs = OPTIMIZERS[name]
    opt = theirs(ref.parameters())
    compiled = poot.compile(m, example_inputs=(batches[0][0],), config=TRAIN)
    got, want = [], []
    for x, y in batches:
        got.append(compiled.train_step(x, y, loss_fn, optimizer=ours))
        opt.zero_grad()
        loss = loss_fn(*reshape(ref(x), y))
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, rel=REL)
    assert got[-1] < got[0]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_tracks_torch(name):
    torch.manual_seed(10)
    m = Mlp()
    w = torch.randn(12, 5)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(16, 12)
        batches.append((x, torch.tanh(x @ w)))
    _track(m, batches, F.mse_loss, name)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_tiny_decoder_tracks_torch(name):
    torch.manual_seed(11)
    m = Gpt(sdpa=True).eval()  # eval: dropout off in both
    text = torch.arange(400) * 7 % 65  # a learnable sequence: each id the last plus 7
    batches = []
    for i in range(STEPS):
        at = torch.randint(0, 400 - 17, (2,), generator=torch.Generator().manual_seed(i))
        x = torch.stack([text[a : a + 16] for a in at])
        y = torch.stack([text[a + 1 : a + 17] for a in at])
        batches.append((x, y))
    _track(
        m,
        batches,
        F.cross_entropy,
        name,
        reshape=lambda out, y: (out.reshape(-1, out.shape[-1]), y.reshape(-1)),
    )
