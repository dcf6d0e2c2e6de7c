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
from poot.errors import NoGradientError, TraceError  # noqa: E402
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


def _run_tape(build, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Traces ``build(tape, inputs)`` -> (out, params, seed input) and runs out and the
    gradients of the params on the CPU runtime."""
    weights = _native.Weights.from_arrays({"unused": np.zeros(1, np.float32)})
    tracer = _native.Tracer(weights, 1, _native.TraceLimits())
    tape = Tape(tracer)
    ins = {
        n: tracer.input(n, "i32" if a.dtype == np.int32 else "f32", list(a.shape))
        for n, a in feeds.items()
    }
    out, params, seed = build(tape, ins)
    grads = tape.backward(out, [ins[n] for n in params], seed=ins[seed])
    tracer.output("out", out)
    for n, gv in zip(params, grads, strict=True):
        tracer.output(f"d_{n}", gv)
    rt = _native.CpuRuntime(threads=1)
    return rt.run(rt.prepare(tracer.finish(), weights), feeds)


def test_max_splits_the_gradient_evenly_over_ties_as_torch_amax():
    # Rows with one, two and three maxima (and a row of equal values).
    x = np.array(
        [[1.0, 3.0, 2.0, -1.0], [3.0, 0.5, 3.0, 2.0], [2.0, 2.0, 1.0, 2.0], [4.0, 4.0, 4.0, 4.0]],
        np.float32,
    )
    g = np.array([[0.7], [-1.3], [0.9], [2.0]], np.float32)

    def build(tape, v):
        tape.parameter(v["x"])
        return tape.call("reduce", v["x"], "max"), ["x"], "g"

    got = _run_tape(build, {"x": x, "g": g})
    xt = torch.tensor(x, requires_grad=True)
    out = xt.amax(dim=-1, keepdim=True)
    out.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(got["out"], out.detach().numpy())
    # mask * (g / count), one rounding each, as torch's: equal, not just close.
    np.testing.assert_array_equal(got["d_x"], xt.grad.numpy())


def test_gather_rows_and_scatter_add_rows_are_each_others_adjoint():
    rng = np.random.default_rng(7)
    table = rng.standard_normal((9, 5)).astype(np.float32)
    ids = np.array([3, 0, 3, 8, 3, 1, 0], np.int32)  # repeats: their adjoints add
    g = rng.standard_normal((7, 5)).astype(np.float32)

    def gather(tape, v):
        tape.parameter(v["table"])
        return tape.call("gather_rows", v["table"], v["ids"]), ["table"], "g"

    got = _run_tape(gather, {"table": table, "ids": ids, "g": g})
    tt = torch.tensor(table, requires_grad=True)
    out = F.embedding(torch.from_numpy(ids).long(), tt)
    out.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(got["out"], out.detach().numpy())
    np.testing.assert_allclose(got["d_table"], tt.grad.numpy(), atol=1e-6, rtol=1e-6)

    # scatter_add_rows forward is torch's index_add into zeros; its adjoint a gather.
    src = rng.standard_normal((7, 5)).astype(np.float32)
    g2 = rng.standard_normal((9, 5)).astype(np.float32)

    def scatter(tape, v):
        tape.parameter(v["src"])
        return tape.call("scatter_add_rows", v["src"], v["ids"], 9), ["src"], "g"

    got = _run_tape(scatter, {"src": src, "ids": ids, "g": g2})
    st = torch.tensor(src, requires_grad=True)
    out = torch.zeros(9, 5).index_add(0, torch.from_numpy(ids).long(), st)
    out.backward(torch.from_numpy(g2))
    np.testing.assert_allclose(got["out"], out.detach().numpy(), atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(got["d_src"], st.grad.numpy())


def test_scatter_add_rows_refuses_bad_ids_with_a_typed_error():
    from poot.errors import KernelError

    weights = _native.Weights.from_arrays({"unused": np.zeros(1, np.float32)})
    tracer = _native.Tracer(weights, 1, _native.TraceLimits())
    src = tracer.input("src", "f32", [3, 2])
    ids = tracer.input("ids", "i32", [3])
    tracer.output("y", tracer.scatter_add_rows(src, ids, 4))
    other = _native.Tracer(weights, 1, _native.TraceLimits())
    with pytest.raises(TraceError, match="ids"):
        other.scatter_add_rows(other.input("s", "f32", [3, 2]), other.input("i", "i32", [2]), 4)
    rt = _native.CpuRuntime(threads=1)
    plan = rt.prepare(tracer.finish(), weights)
    src_v = np.ones((3, 2), np.float32)
    for bad in ([0, 4, 1], [-1, 0, 0]):
        with pytest.raises(KernelError, match="scatter_add_rows"):
            rt.run(plan, {"src": src_v, "ids": np.array(bad, np.int32)})
    out = rt.run(plan, {"src": src_v, "ids": np.array([2, 2, 0], np.int32)})["y"]
    np.testing.assert_array_equal(out, [[1, 1], [0, 0], [2, 2], [0, 0]])


def test_an_op_without_a_vjp_is_a_typed_error_naming_it():
    weights = _native.Weights.from_arrays({"unused": np.zeros(1, np.float32)})
    tracer = _native.Tracer(weights, 1, _native.TraceLimits())
    tape = Tape(tracer)
    x = tape.parameter(tracer.input("x", "f32", [2, 3]))
    out = tape.call("unary", tape.call("unary", x, "exp"), "gelu_erf_grad")
    with pytest.raises(NoGradientError, match=r"gelu_erf_grad") as e:
        tape.backward(out, [x], seed=tracer.input("g", "f32", [2, 3]))
    assert e.value.op == "gelu_erf_grad"
