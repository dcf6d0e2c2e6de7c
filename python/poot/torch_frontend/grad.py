"""Reverse-mode differentiation over poot's graph IR, built with the tracer.

A ``Tape`` wraps one ``Tracer``: every call made through ``Tape.call`` is traced as usual,
and when one of its operands depends on a value marked as requiring a gradient (a parameter)
the call is recorded (its op, operands and result). ``Tape.backward(loss, wrt)`` then walks
the records in reverse and traces, on the same tracer, each op's vector-Jacobian product as
IR ops (the rules in ``vjp.py``), summing the adjoints of values used more than once.

Invariants: the backward graph is made of ordinary IR ops, so it runs on any runtime that
has them; only recorded calls are differentiated (a call on constants only is never
recorded, and ``Tape.detached`` traces a call whose result is treated as a constant);
a recorded op with no rule is ``NoGradientError`` naming it, raised before anything runs.
A parameter no recorded op reads gets a zero gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from poot import _native
from poot.errors import NoGradientError

Value = _native.Value


@dataclass
class Record:
    """One differentiable call: the tracer method, its arguments as passed, its result."""

    op: str
    args: list[Any]
    kwargs: dict[str, Any]
    out: Value


def _values(a: Any) -> list[Value]:
    if isinstance(a, Value):
        return [a]
    if isinstance(a, (list, tuple)):
        return [v for x in a for v in _values(x)]
    return []


@dataclass
class Tape:
    """A tracer that records what the gradient needs (see the module docs)."""

    tracer: _native.Tracer
    records: list[Record] = field(default_factory=list)
    requires: set[int] = field(default_factory=set)

    def parameter(self, v: Value) -> Value:
        """Marks ``v`` (an input) as a value the gradient is taken with respect to."""
        self.requires.add(v.id)
        return v

    def call(self, op: str, *args: Any, **kwargs: Any) -> Value:
        out = getattr(self.tracer, op)(*args, **kwargs)
        if any(v.id in self.requires for v in _values(list(args))):
            self.requires.add(out.id)
            self.records.append(Record(op, list(args), dict(kwargs), out))
        return out

    def detached(self, op: str, *args: Any, **kwargs: Any) -> Value:
        """Traces a call whose result the gradient treats as a constant (a max subtracted
        for numerical range, whose exact derivative is zero)."""
        out: Value = getattr(self.tracer, op)(*args, **kwargs)
        return out

    def backward(self, loss: Value, wrt: Sequence[Value], seed: Value | None = None) -> list[Value]:
        """The gradients of ``loss`` with respect to ``wrt``, traced as IR ops: of a loss of
        one element, or the vector-Jacobian product with ``seed`` (the loss's shape)."""
        from poot.torch_frontend.vjp import RULES

        ops = Ops(self.tracer)
        if seed is None:
            if math.prod(loss.shape) != 1:
                raise ValueError(f"the loss must have one element, got {list(loss.shape)}")
            seed = ops.fill(1.0, loss.shape)
        elif tuple(seed.shape) != tuple(loss.shape):
            raise ValueError(f"seed {list(seed.shape)} for a loss of {list(loss.shape)}")
        adjoint: dict[int, Value] = {loss.id: seed}
        for rec in reversed(self.records):
            g = adjoint.pop(rec.out.id, None)
            if g is None:
                continue
            rule = RULES.get(rec.op)
            if rule is None:
                raise NoGradientError(
                    f"op {_op_name(rec)} has no vector-Jacobian product, and it lies on the "
                    f"path from the parameters to the loss",
                    op=_op_name(rec),
                )
            grads = rule(ops, rec, g)
            operands = _operands(rec)
            for v, gv in zip(operands, grads, strict=True):
                if gv is None or v is None or v.id not in self.requires:
                    continue
                prev = adjoint.get(v.id)
                adjoint[v.id] = gv if prev is None else ops.t.binary(prev, gv, "add")
        out = []
        for p in wrt:
            g = adjoint.get(p.id)
            out.append(g if g is not None else ops.zeros(p.shape))
        return out


def _operands(rec: Record) -> list[Value | None]:
    """The operands a rule returns gradients for, in its order: the positional arguments
    (a list argument, as `concat`'s, spread out), anything else as None."""
    out: list[Value | None] = []
    for a in rec.args:
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, Value) for x in a):
            out.extend(a)
        else:
            out.append(a if isinstance(a, Value) else None)
    return out


def _op_name(rec: Record) -> str:
    kind = rec.args[1] if len(rec.args) > 1 and isinstance(rec.args[1], str) else None
    if rec.op in ("unary", "reduce") and kind:
        return f"{rec.op}({kind})"
    return rec.op


class Ops:
    """Tracer calls the rules share: broadcasting sums, fills, transposes."""

    def __init__(self, tracer: _native.Tracer) -> None:
        self.t = tracer

    def fill(self, value: float, shape: Sequence[int]) -> Value:
        n = math.prod(shape)
        if n <= 4096:
            return self.t.literal([value] * n, list(shape))
        return self.t.reshape(self._spread(self.t.literal([value], [1]), n), list(shape))

    def zeros(self, shape: Sequence[int]) -> Value:
        return self.fill(0.0, shape)

    def _spread(self, one: Value, n: int) -> Value:
        """A [1] literal repeated to [n] by doubling concats (log2 n equations, no big
        literal)."""
        v = one
        parts = []
        while n:
            if n & 1:
                parts.append(v)
            n >>= 1
            if n:
                v = self.t.concat([v, v], 0)
        return parts[0] if len(parts) == 1 else self.t.concat(parts, 0)

    def broadcast_to(self, g: Value, shape: Sequence[int]) -> Value:
        """``g`` (whose shape broadcasts to ``shape``) repeated to ``shape``."""
        if tuple(g.shape) == tuple(shape):
            return g
        return self.t.binary(self.zeros(shape), g, "add")

    def sum_to(self, g: Value, shape: Sequence[int]) -> Value:
        """``g`` summed over the dims numpy broadcasting stretched to reach it from
        ``shape`` (the adjoint of a broadcast)."""
        gs, shape = list(g.shape), list(shape)
        if gs == shape:
            return g
        lead = len(gs) - len(shape)
        dims = list(range(lead)) + [
            lead + i for i, n in enumerate(shape) if n == 1 and gs[lead + i] != 1
        ]
        if not dims:
            return self.t.reshape(g, shape)
        return self.t.reshape(self.sum_dims(g, dims), shape)

    def sum_dims(self, g: Value, dims: list[int]) -> Value:
        """``g`` summed over ``dims``: those moved last, flattened, one reduction; the result
        keeps the other dims in order, with a trailing 1."""
        gs = list(g.shape)
        keep = [d for d in range(len(gs)) if d not in dims]
        v = g
        if keep + dims != list(range(len(gs))):
            v = self.t.permute(v, keep + dims)
        v = self.t.reshape(v, [gs[d] for d in keep] + [math.prod(gs[d] for d in dims)])
        return self.t.reduce(v, "sum")

    def swap_last(self, v: Value) -> Value:
        r = len(v.shape)
        perm = list(range(r))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return self.t.permute(v, perm)

    def mul(self, a: Value, b: Value) -> Value:
        return self.t.binary(a, b, "mul")

    def scale(self, a: Value, s: float) -> Value:
        return self.t.scalar(a, "mul", s)
