"""The vector-Jacobian products of the IR ops a lowered module uses, one rule per tracer
method: ``RULES[op](ops, record, g)`` returns the adjoint of each operand (``grad._operands``
order; None where an operand takes none) for the adjoint ``g`` of the record's result.

Each rule is written with IR ops only (``grad.Ops`` wraps the tracer), recomputing what it
needs from the record's operands (layer and RMS norm recompute their statistics; softmax,
exp, tanh and sigmoid reuse their result). Exact derivatives everywhere except where noted:
``abs`` takes 0 at 0 (torch's choice), relu's derivative at 0 is 0 (torch's), ``reduce`` of
kind ``max`` splits the gradient evenly over the tied maxima (torch's ``amax``), and the
stored-weight ops have none (``NoGradientError`` if a parameter reaches them through a
gradient path). A row gather's adjoint is ``scatter_add_rows`` (memory of the table's size,
no one-hot matrix), and the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from poot.torch_frontend.grad import Ops, Record, Value

Rule = Callable[[Ops, Record, Value], list[Value | None]]
RULES: dict[str, Rule] = {}

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_A = 0.044715


def _rule(name: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return deco


def _unary_grad(o: Ops, kind: str, x: Value, y: Value, g: Value) -> Value | None:
    t = o.t
    if kind == "relu":
        return o.mul(g, t.unary(x, "step"))
    if kind == "gelu_erf":
        return o.mul(g, t.unary(x, "gelu_erf_grad"))
    if kind == "tanh":
        # g * (1 - y^2)
        return o.mul(g, t.scalar(o.mul(y, y), "sub", 1.0, reverse=True))
    if kind == "sigmoid":
        return o.mul(g, o.mul(y, t.scalar(y, "sub", 1.0, reverse=True)))
    if kind == "neg":
        return t.unary(g, "neg")
    if kind == "exp":
        return o.mul(g, y)
    if kind == "sqrt":
        return t.binary(o.scale(g, 0.5), y, "div")
    if kind == "rsqrt":
        # d/dx x^-1/2 = -1/2 y^3
        return o.mul(g, o.scale(o.mul(y, o.mul(y, y)), -0.5))
    if kind == "abs":
        sign = t.binary(t.unary(x, "step"), t.unary(t.unary(x, "neg"), "step"), "sub")
        return o.mul(g, sign)
    if kind == "log":
        return t.binary(g, x, "div")
    if kind == "step":
        return None
    raise KeyError(kind)


@_rule("unary")
def _unary(o: Ops, r: Record, g: Value) -> list[Value | None]:
    x, kind = r.args[0], r.args[1]
    if kind == "gelu_erf_grad":
        from poot.errors import NoGradientError

        raise NoGradientError("op unary(gelu_erf_grad) has no vector-Jacobian product", op=kind)
    return [_unary_grad(o, kind, x, r.out, g), None]


@_rule("silu")
def _silu(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # d/dx x s(x) = s (1 + x (1 - s))
    x, t = r.args[0], o.t
    s = t.unary(x, "sigmoid")
    d = o.mul(s, t.scalar(o.mul(x, t.scalar(s, "sub", 1.0, reverse=True)), "add", 1.0))
    return [o.mul(g, d)]


@_rule("gelu")
def _gelu_tanh(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # y = x/2 (1 + tanh u), u = c (x + a x^3):
    # dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) c (1 + 3 a x^2)
    x, t = r.args[0], o.t
    x2 = o.mul(x, x)
    u = o.scale(o.mul(x, t.scalar(o.scale(x2, _GELU_A), "add", 1.0)), _SQRT_2_OVER_PI)
    th = t.unary(u, "tanh")
    first = o.scale(t.scalar(th, "add", 1.0), 0.5)
    sech2 = t.scalar(o.mul(th, th), "sub", 1.0, reverse=True)
    du = o.scale(t.scalar(o.scale(x2, 3 * _GELU_A), "add", 1.0), 0.5 * _SQRT_2_OVER_PI)
    d = t.binary(first, o.mul(o.mul(x, sech2), du), "add")
    return [o.mul(g, d)]


def _arith(o: Ops, kind: str, a: Value, b: Value, y: Value, g: Value) -> list[Value | None]:
    t = o.t
    if kind == "add":
        return [o.sum_to(g, a.shape), o.sum_to(g, b.shape)]
    if kind == "sub":
        return [o.sum_to(g, a.shape), o.sum_to(t.unary(g, "neg"), b.shape)]
    if kind == "mul":
        return [o.sum_to(o.mul(g, b), a.shape), o.sum_to(o.mul(g, a), b.shape)]
    if kind == "div":
        ga = t.binary(g, b, "div")
        # d(a/b)/db = -(a/b)/b
        gb = t.unary(t.binary(o.mul(g, y), b, "div"), "neg")
        return [o.sum_to(ga, a.shape), o.sum_to(gb, b.shape)]
    raise KeyError(kind)


@_rule("binary")
def _binary(o: Ops, r: Record, g: Value) -> list[Value | None]:
    a, b, kind = r.args[0], r.args[1], r.args[2]
    return [*_arith(o, kind, a, b, r.out, g), None]


@_rule("add")
def _add(o: Ops, r: Record, g: Value) -> list[Value | None]:
    return _arith(o, "add", r.args[0], r.args[1], r.out, g)


@_rule("mul")
def _mul(o: Ops, r: Record, g: Value) -> list[Value | None]:
    return _arith(o, "mul", r.args[0], r.args[1], r.out, g)


@_rule("scalar")
def _scalar(o: Ops, r: Record, g: Value) -> list[Value | None]:
    x, kind, value = r.args[0], r.args[1], float(r.args[2])
    reverse = bool(r.kwargs.get("reverse", False))
    t = o.t
    if kind == "add":
        gx = g
    elif kind == "sub":
        gx = t.unary(g, "neg") if reverse else g
    elif kind == "mul":
        gx = o.scale(g, value)
    elif kind == "div" and not reverse:
        gx = t.scalar(g, "div", value)
    else:
        # value / x: -(value / x) / x = -y / x
        gx = t.unary(t.binary(o.mul(g, r.out), x, "div"), "neg")
    return [gx, None, None]


@_rule("softmax")
def _softmax(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # y (g - sum(g y)) over the last dim
    y, t = r.out, o.t
    s = t.reduce(o.mul(g, y), "sum")
    return [o.mul(y, t.binary(g, s, "sub"))]


@_rule("causal_mask")
def _causal_mask(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # The masked entries take no gradient: exp(mask(0)) is 1 kept, 0 masked.
    t = o.t
    keep = t.unary(t.causal_mask(o.scale(g, 0.0)), "exp")
    return [o.mul(g, keep)]


@_rule("reshape")
def _reshape(o: Ops, r: Record, g: Value) -> list[Value | None]:
    return [o.t.reshape(g, list(r.args[0].shape)), None]


@_rule("permute")
def _permute(o: Ops, r: Record, g: Value) -> list[Value | None]:
    perm = list(r.args[1])
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return [o.t.permute(g, inv), None]


@_rule("slice")
def _slice(o: Ops, r: Record, g: Value) -> list[Value | None]:
    x, axis, start, end = r.args[0], int(r.args[1]), int(r.args[2]), int(r.args[3])
    n = x.shape[axis]
    parts = []
    for lo, hi in ((0, start), (end, n)):
        if hi > lo:
            shape = list(x.shape)
            shape[axis] = hi - lo
            parts.append(o.zeros(shape))
    parts.insert(1 if start > 0 else 0, g)
    return [parts[0] if len(parts) == 1 else o.t.concat(parts, axis), None, None, None]


@_rule("concat")
def _concat(o: Ops, r: Record, g: Value) -> list[Value | None]:
    xs, axis = r.args[0], int(r.args[1])
    out: list[Value | None] = []
    at = 0
    for x in xs:
        n = x.shape[axis]
        out.append(o.t.slice(g, axis, at, at + n))
        at += n
    return [*out, None]


@_rule("matmul")
def _matmul(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # x [T, K] w [N, K]^T: dx = g w, dw = g^T x
    x, w = r.args[0], r.args[1]
    if len(w.shape) != 2:
        return [o.t.batch_matmul(g, o.t.reshape(w, [1, w.shape[0]])), None]
    return [o.t.batch_matmul(g, w), o.t.batch_matmul(o.swap_last(g), x)]


@_rule("batch_matmul")
def _batch_matmul(o: Ops, r: Record, g: Value) -> list[Value | None]:
    a, b = r.args[0], r.args[1]
    ga = o.sum_to(o.t.batch_matmul(g, o.swap_last(b)), a.shape)
    gb = o.sum_to(o.t.batch_matmul(o.swap_last(a), g), b.shape)
    return [ga, gb]


def _row_sum(o: Ops, v: Value) -> Value:
    """``v`` [.., D] summed over every dim but the last -> [D]."""
    d = v.shape[-1]
    flat = o.t.reshape(v, [math.prod(v.shape[:-1]), d])
    return o.t.reshape(o.t.reduce(o.t.permute(flat, [1, 0]), "sum"), [d])


def _normalized(o: Ops, x: Value, eps: float, center: bool) -> tuple[Value, Value]:
    """``(xhat, rstd)``: x (less its mean when ``center``) times 1 / sqrt(var + eps), as the
    forward op computes them."""
    t = o.t
    xc = t.binary(x, t.reduce(x, "mean"), "sub") if center else x
    var = t.reduce(o.mul(xc, xc), "mean")
    rstd = t.unary(t.scalar(var, "add", eps), "rsqrt")
    return o.mul(xc, rstd), rstd


def _norm_grads(
    o: Ops, x: Value, w: Any, eps: float, g: Value, center: bool
) -> tuple[Value, Value | None, Value]:
    """``(dx, dw, xhat)`` of ``y = xhat * w (+ b)`` over the last dim."""
    t = o.t
    xhat, rstd = _normalized(o, x, eps, center)
    dxhat = o.mul(g, w) if w is not None else g
    # dx = rstd (dxhat - [mean(dxhat)] - xhat mean(dxhat xhat))
    inner = t.binary(dxhat, o.mul(xhat, t.reduce(o.mul(dxhat, xhat), "mean")), "sub")
    if center:
        inner = t.binary(inner, t.reduce(dxhat, "mean"), "sub")
    dx = o.mul(inner, rstd)
    dw = _row_sum(o, o.mul(g, xhat)) if w is not None else None
    return dx, dw, xhat


@_rule("layer_norm")
def _layer_norm(o: Ops, r: Record, g: Value) -> list[Value | None]:
    x, w, b, eps = r.args[0], r.args[1], r.args[2], float(r.args[3])
    dx, dw, _ = _norm_grads(o, x, w, eps, g, center=True)
    db = _row_sum(o, g) if b is not None else None
    return [dx, dw, db, None]


@_rule("rms_norm")
def _rms_norm(o: Ops, r: Record, g: Value) -> list[Value | None]:
    x, w, eps = r.args[0], r.args[1], float(r.args[2])
    dx, dw, _ = _norm_grads(o, x, w, eps, g, center=False)
    return [dx, dw, None]


@_rule("reduce")
def _reduce(o: Ops, r: Record, g: Value) -> list[Value | None]:
    x, kind, t = r.args[0], r.args[1], o.t
    if kind == "max":
        # torch's amax: the gradient split evenly over the elements equal to the maximum,
        # mask * (g / count). y - x >= 0, and step(y - x) is 0 exactly where x is a maximum.
        mask = t.scalar(t.unary(t.binary(r.out, x, "sub"), "step"), "sub", 1.0, reverse=True)
        count = t.reduce(mask, "sum")
        return [o.mul(mask, t.binary(g, count, "div")), None]
    if kind not in ("sum", "mean"):
        from poot.errors import NoGradientError

        raise NoGradientError(
            f"op reduce({kind}) has no vector-Jacobian product, and it lies on the path from "
            "the parameters to the loss",
            op=f"reduce_{kind}",
        )
    gx = o.broadcast_to(g, x.shape)
    if kind == "mean":
        gx = o.scale(gx, 1.0 / x.shape[-1])
    return [gx, None]


@_rule("gather_rows")
def _gather_rows(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # Picked rows (a trained embedding table's lookup): their adjoints added back by id.
    x, rows = r.args[0], r.args[1]
    return [o.t.scatter_add_rows(g, rows, x.shape[0]), None]


@_rule("scatter_add_rows")
def _scatter_add_rows(o: Ops, r: Record, g: Value) -> list[Value | None]:
    return [o.t.gather_rows(g, r.args[1]), None, None]


@_rule("embedding")
def _embedding(o: Ops, r: Record, g: Value) -> list[Value | None]:
    # A stored table and integer ids: neither takes a gradient (a trained table is traced
    # as a gather_rows of a parameter input instead).
    return [None, None]
