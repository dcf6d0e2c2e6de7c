"""Train-step time of the tiny nanoGPT-style decoder (tests/test_torch_compile_gpt.py's ``Gpt``:
vocabulary 65, width 32, 4 heads, 2 blocks, 16 positions, batch 2): poot's
``CompiledModule.train_step`` (forward, cross-entropy, backward and AdamW as one graph on the
CPU runtime) against torch eager (forward, ``F.cross_entropy``, ``backward``,
``torch.optim.AdamW(foreach=False)``), both on ``THREADS`` threads (``torch.set_num_threads``;
poot's step takes the caller's torch thread count).

Run it on a quiet machine: ``python -m pytest benches/bench_torch_train.py`` (the summary
prints the ratio torch / poot; above 1 means poot's step is faster).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'poot[torch]')")
F = torch.nn.functional

import poot  # noqa: E402
from poot.torch_frontend import AdamW  # noqa: E402
from tests.test_torch_compile_gpt import Gpt  # noqa: E402

THREADS = 2
GROUP = f"tiny decoder train step (AdamW, batch 2 x 16, {THREADS} threads)"


@pytest.fixture(scope="module")
def batch() -> Any:
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    x = torch.randint(0, 65, (2, 16))
    return x, torch.roll(x, -1, dims=1)


def test_train_step_poot(benchmark: Any, batch: Any) -> None:
    x, y = batch
    torch.manual_seed(1)
    m = Gpt(sdpa=True).eval()
    compiled = poot.compile(m, example_inputs=(x,), config=poot.CompileConfig(allow_training=True))
    opt = AdamW(lr=1e-3)
    compiled.train_step(x, y, F.cross_entropy, optimizer=opt)  # traces and prepares the step
    benchmark.group = GROUP
    benchmark.extra_info["impl"] = "poot"
    loss = benchmark(compiled.train_step, x, y, F.cross_entropy, optimizer=opt)
    assert loss > 0


def test_train_step_peer(benchmark: Any, batch: Any) -> None:
    x, y = batch
    torch.manual_seed(1)
    m = copy.deepcopy(Gpt(sdpa=True).eval())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)

    def step() -> float:
        opt.zero_grad()
        logits = m(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return float(loss.detach())

    step()
    benchmark.group = GROUP
    benchmark.extra_info["impl"] = "peer"
    assert benchmark(step) > 0
