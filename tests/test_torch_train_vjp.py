"""Each IR op's vector-Jacobian product (poot.torch_frontend.vjp) against torch autograd.

One op at a time: its operands are graph inputs marked as parameters, the upstream adjoint
``g`` is a random graph input (``Tape.backward(..., seed=g)``), and the traced gradient runs
on the CPU runtime. Bounds, |poot - torch| <= atol + rtol |torch| elementwise: arithmetic,
moves and the elementwise functions 1e-6 + 1e-5 relative (one f32 rounding, or libm against
torch's vectorized exp/tanh/log); ops that sum (softmax, matmuls, norms, reductions, the
broadcast sums) 1e-5 + 1e-5 relative on values of order 1, as their summation order differs
from torch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.torch_support import require_torch

torch = require_torch()
F = torch.nn.functional

from poot import _native  # noqa: E402
from poot.errors import NoGradientError  # noqa: E402
from poot.torch_frontend.grad import Tape  # noqa: E402

EXACT = (1e-6, 1e-5)
SUMS = (1e-5, 1e-5)


def _check(
    shapes: dict[str, tuple[int, ...]],
    poot_op: Callable[[Any, dict[str, Any]], Any],
    torch_op: Callable[..., Any],
    bound: tuple[float, float],
    *,
    seed: int = 0,
    positive: tuple[str, ...] = (),
) -> None:
    rng = np.random.default_rng(seed)
    arrays = {}
    for n, s in shapes.items():
        a = rng.standard_normal(s).astype(np.float32)
        arrays[n] = np.abs(a) + 0.5 if n in positive else a
    weights = _native.Weights.from_arrays({"unused": np.zeros(1, np.float32)})
    tracer = _native.Tracer(weights, 1, _native.TraceLimits())
    tape = Tape(tracer)
    vals = {n: tape.parameter(tracer.input(n, "f32", list(a.shape))) for n, a in arrays.items()}
    out = poot_op(tape, vals)
    g = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    seed_v = tracer.input("_g", "f32", list(g.shape))
    grads = tape.backward(out, list(vals.values()), seed=seed_v)
    tracer.output("out", out)
    for n, gv in zip(vals, grads, strict=True):
        tracer.output(f"d_{n}", gv)
    rt = _native.CpuRuntime(threads=1)
    got = rt.run(rt.prepare(tracer.finish(), weights), {**arrays, "_g": g})
    ts = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    want = torch_op(*ts.values())
    want.backward(torch.from_numpy(g))
    atol, rtol = bound
    np.testing.assert_allclose(got["out"], want.detach().numpy(), atol=atol, rtol=rtol)
    for n, t in ts.items():
        assert t.grad is not None
        np.testing.assert_allclose(
            got[f"d_{n}"], t.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"gradient of {n}"
        )


UNARY = {
    "relu": torch.relu,
    "gelu_erf": F.gelu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "neg": torch.neg,
    "exp": torch.exp,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "abs": torch.abs,
    "log": torch.log,
}


@pytest.mark.parametrize("kind", sorted(UNARY))
def test_unary(kind):
    positive = ("x",) if kind in ("sqrt", "rsqrt", "log") else ()
    _check(
        {"x": (3, 7)},
        lambda t, v: t.call("unary", v["x"], kind),
        UNARY[kind],
        EXACT,
        positive=positive,
    )


def test_silu_and_tanh_gelu():
    _check({"x": (4, 9)}, lambda t, v: t.call("silu", v["x"]), F.silu, EXACT)
    _check(
        {"x": (4, 9)},
        lambda t, v: t.call("gelu", v["x"]),
        lambda x: F.gelu(x, approximate="tanh"),
        EXACT,
    )


BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


@pytest.mark.parametrize("kind", sorted(BINARY))
@pytest.mark.parametrize("b_shape", [(2, 3, 5), (3, 1), (5,)], ids=["same", "col", "row"])
def test_binary_broadcasts(kind, b_shape):
    _check(
        {"a": (2, 3, 5), "b": b_shape},
        lambda t, v: t.call("binary", v["a"], v["b"], kind),
        BINARY[kind],
        SUMS,
        positive=("b",) if kind == "div" else (),
    )


@pytest.mark.parametrize("kind", sorted(BINARY))
@pytest.mark.parametrize("reverse", [False, True])
def test_scalar(kind, reverse):
    def ref(x):
        return BINARY[kind](torch.tensor(1.75), x) if reverse else BINARY[kind](x, 1.75)

    _check(
        {"x": (3, 4)},
        lambda t, v: t.call("scalar", v["x"], kind, 1.75, reverse=reverse),
        ref,
        EXACT,
        positive=("x",),
    )


def test_row_add_and_mul():
    _check({"a": (4, 6), "b": (6,)}, lambda t, v: t.call("add", v["a"], v["b"]), torch.add, SUMS)
    _check({"a": (4, 6), "b": (6,)}, lambda t, v: t.call("mul", v["a"], v["b"]), torch.mul, SUMS)


def test_softmax_and_causal_mask():
    _check(
        {"x": (2, 5, 5)},
        lambda t, v: t.call("softmax", t.call("causal_mask", v["x"])),
        lambda x: torch.softmax(
            x.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf")), dim=-1
        ),
        SUMS,
    )


def test_moves():
    _check(
        {"x": (2, 3, 4)},
        lambda t, v: t.call("permute", t.call("reshape", v["x"], [6, 4]), [1, 0]),
        lambda x: x.reshape(6, 4).permute(1, 0),
        EXACT,
    )
    _check(
        {"x": (3, 8)},
        lambda t, v: t.call("slice", v["x"], 1, 2, 5),
        lambda x: x[:, 2:5],
        EXACT,
    )
    _check(
        {"a": (2, 3), "b": (2, 4)},
        lambda t, v: t.call("concat", [v["a"], v["b"], v["a"]], 1),
        lambda a, b: torch.cat([a, b, a], 1),
        EXACT,
    )


def test_matmuls():
    _check(
        {"a": (2, 3, 5, 4), "b": (3, 4, 6)},
        lambda t, v: t.call("batch_matmul", v["a"], v["b"]),
        torch.matmul,
        SUMS,
    )


def test_matmul_of_a_stored_weight():
    # x [T, K] times a stored (constant) weight [N, K]: only x takes a gradient.
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    g = rng.standard_normal((3, 6)).astype(np.float32)
    weights = _native.Weights.from_arrays({"w": w})
    tracer = _native.Tracer(weights, 1, _native.TraceLimits())
    tape = Tape(tracer)
    xv = tape.parameter(tracer.input("x", "f32", [3, 4]))
    out = tape.call("matmul", xv, tracer.weight("w"))
    (dx,) = tape.backward(out, [xv], seed=tracer.input("g", "f32", [3, 6]))
    tracer.output("dx", dx)
    rt = _native.CpuRuntime(threads=1)
    got = rt.run(rt.prepare(tracer.finish(), weights), {"x": x, "g": g})
    np.testing.assert_allclose(got["dx"], g @ w, atol=1e-5, rtol=1e-5)


def test_norms():
    _check(
        {"x": (5, 16), "w": (16,), "b": (16,)},
        lambda t, v: t.call("layer_norm", v["x"], v["w"], v["b"], 1e-5),
        lambda x, w, b: F.layer_norm(x, (16,), w, b, 1e-5),
        SUMS,
    )
    _check(
        {"x": (5, 16), "w": (16,)},
        lambda t, v: t.call("rms_norm", v["x"], v["w"], 1e-6),
        lambda x, w: F.rms_norm(x, (16,), w, 1e-6),
        SUMS,
    )


@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_reductions(kind):
    _check(
        {"x": (3, 4, 7)},
        lambda t, v: t.call("reduce", v["x"], kind),
        lambda x: getattr(torch, kind)(x, dim=-1, keepdim=True),
        SUMS,
    )


def test_an_op_without_a_vjp_is_a_typed_error_naming_it():
    weights = _native.Weights.from_arrays({"unused": np.zeros(1, np.float32)})
    tracer = _native.Tracer(weights, 1, _native.TraceLimits())
    tape = Tape(tracer)
    x = tape.parameter(tracer.input("x", "f32", [2, 3]))
    out = tape.call("reduce", tape.call("unary", x, "exp"), "max")
    with pytest.raises(NoGradientError, match=r"reduce\(max\)") as e:
        tape.backward(out, [x], seed=tracer.input("g", "f32", [2, 1]))
    assert e.value.op == "reduce_max"
