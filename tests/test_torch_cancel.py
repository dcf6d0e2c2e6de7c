"""``CompiledModule.forward_with_cancel_token``: generation-scoped cancel on the CPU runtime.

The concurrent cases hold each run at a gate (``GatedRuntime``: the real ``CpuRuntime``, whose
``run`` first waits for the test to open the gate), so "cancelled while in flight" is an
ordering the test sets, not a timing it hopes for. Results that are not cancelled are checked
against torch eager within 1e-5 (matmuls: summation order differs from torch's BLAS).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import poot
from poot import _native
from poot.errors import Cancelled, ConfigError
from tests.torch_support import require_torch

# Every wait in this file is bounded so a regression fails instead of hanging the suite.
_WAIT_S = 60.0


@pytest.fixture(scope="module")
def torch() -> Any:
    return require_torch()


class GatedRuntime:
    """The CPU runtime with a gate in front of ``run``: each run announces itself on
    ``entered`` and waits for ``gate`` before running for real."""

    def __init__(self) -> None:
        self.inner = _native.CpuRuntime(threads=1)
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.runs = 0
        self._lock = threading.Lock()

    def prepare(self, graph: Any, weights: Any, limits: Any = None) -> Any:
        return self.inner.prepare(graph, weights, limits)

    def run(self, plan: Any, inputs: Any, timeout_s: float = 600.0) -> Any:
        self.entered.release()
        assert self.gate.wait(_WAIT_S), "the test never opened the gate"
        with self._lock:
            self.runs += 1
        return self.inner.run(plan, inputs, timeout_s)


def _mlp(torch: Any, runtime: Any = None) -> tuple[Any, Any, Any]:
    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3)).eval()
    x = torch.randn(4, 6)
    return m, x, poot.compile(m, (x,), runtime=runtime)


def _eager(torch: Any, m: Any, x: Any) -> Any:
    with torch.no_grad():
        return m(x).numpy()


def _same(got: Any, want: Any) -> None:
    np.testing.assert_allclose(got.cpu(), want, rtol=0, atol=1e-5)


def test_token_generations() -> None:
    token = poot.CancelToken()
    assert token.generation == 0
    early = token.admit()
    assert token.cancel() == 1
    late = token.admit()
    assert early.cancelled and not late.cancelled
    with pytest.raises(Cancelled) as e:
        early.check("here")
    assert e.value.generation == 0
    late.check("here")  # a cancel issued before it started is not its own


def test_cancel_one_of_two_concurrent_forwards(torch: Any) -> None:
    rt = GatedRuntime()
    m, x, compiled = _mlp(torch, rt)
    x2 = torch.randn(4, 6)
    a, b = poot.CancelToken(), poot.CancelToken()
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(compiled.forward_with_cancel_token, a, x)
        fb = pool.submit(compiled.forward_with_cancel_token, b, x2)
        for _ in range(2):  # both forwards are in their runs
            assert rt.entered.acquire(timeout=_WAIT_S)
        a.cancel()
        rt.gate.set()
        with pytest.raises(Cancelled):
            fa.result(timeout=_WAIT_S)
        _same(fb.result(timeout=_WAIT_S), _eager(torch, m, x2))
    assert rt.runs == 2
    # Neither token is left cancelled: both run the next forward.
    _same(compiled.forward_with_cancel_token(a, x), _eager(torch, m, x))
    _same(compiled.forward_with_cancel_token(b, x2), _eager(torch, m, x2))


def test_one_token_cancels_every_forward_in_flight_on_it(torch: Any) -> None:
    rt = GatedRuntime()
    _m, x, compiled = _mlp(torch, rt)
    token = poot.CancelToken()
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(compiled.forward_with_cancel_token, token, x) for _ in range(2)]
        for _ in range(2):
            assert rt.entered.acquire(timeout=_WAIT_S)
        token.cancel()
        rt.gate.set()
        for f in futs:
            with pytest.raises(Cancelled):
                f.result(timeout=_WAIT_S)


def test_cancel_before_start_does_not_cancel(torch: Any) -> None:
    m, x, compiled = _mlp(torch)
    token = poot.CancelToken()
    token.cancel()
    token.cancel()
    _same(compiled.forward_with_cancel_token(token, x), _eager(torch, m, x))


def test_cancel_after_finish_does_not_affect_next_forward(torch: Any) -> None:
    m, x, compiled = _mlp(torch)
    token = poot.CancelToken()
    first = compiled.forward_with_cancel_token(token, x)
    token.cancel()  # too late for the first; must not stick to the second
    _same(first, _eager(torch, m, x))
    x2 = torch.randn(4, 6)
    _same(compiled.forward_with_cancel_token(token, x2), _eager(torch, m, x2))
    _same(compiled(x2), _eager(torch, m, x2))  # the plain call takes no token


def test_bad_token_is_a_typed_error(torch: Any) -> None:
    _m, x, compiled = _mlp(torch)
    with pytest.raises(ConfigError, match="CancelToken"):
        compiled.forward_with_cancel_token(threading.Event(), x)
