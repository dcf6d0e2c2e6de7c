"""The graphs training traces: the module's forward with its parameters as graph inputs, and
the step graphs (forward, loss, gradients, then either the accumulated gradients or the
clipped optimizer update).

How the forward is traced (``trace_forward``): the module's lowered program is replayed with
every trainable parameter a graph input ``param:<name>``, so one prepared plan serves every
step and every forward after one (the parameters are fed at each run from the arrays a step
updates in place); a stored-weight matmul of a parameter becomes ``batch_matmul`` with its
transpose, and an embedding of a trained table a ``gather_rows`` of it (its gradient is
``scatter_add_rows``, memory of the table's size).

A step graph (``build_step``) adds the loss (``mse``, or ``cross_entropy`` with the picked
logits gathered by flat index ``row * classes + target``: no one-hot matrix), traces the
gradients of the loss scaled by ``1 / micro_batches`` (torch's ``(loss / k).backward()``),
adds them to the gradients accumulated so far (inputs ``acc:<name>``) when there are any,
and then either returns the sums (``acc:<name>`` outputs: a micro-batch before the last) or
clips them by their global norm (torch's ``clip_grad_norm_``) and traces the optimizer's
update (outputs ``param:<name>`` and ``state.<s>:<name>``). Every step graph outputs the
micro-batch's unscaled ``loss``.

Invariants: nothing here reads parameter values (shapes only); the traced graphs depend on
the loss kind, the optimizer, the accumulation role and the clip norm, never on the step
number or learning rate (those are graph inputs, see ``optim.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from poot import _native
from poot.errors import TrainingUnsupportedError
from poot.torch_frontend.grad import Ops, Tape, Value
from poot.torch_frontend.optim import Optimizer
from poot.torch_frontend.program import ALLOWED, Ref

TARGET = "_train.target"


def param_input(name: str) -> str:
    return f"param:{name}"


def frozen_weights(compiled: Any) -> _native.Weights:
    """A store of the module's weights that are not trained (the graphs' parameters are
    inputs)."""
    trainable = set(compiled.trainable)
    arrays = {n: a for n, a in compiled.arrays.items() if n not in trainable}
    dtypes = {n: d for n, d in compiled.dtypes.items() if n in arrays}
    return _native.Weights.from_arrays(arrays, dtypes=dtypes)


def trace_forward(compiled: Any, tape: Tape) -> tuple[list[tuple[str, Value]], dict[str, Value]]:
    """Replays the module's program on ``tape`` (see the module docs): its outputs by name,
    and the parameter inputs by parameter name."""
    trainable = set(compiled.trainable)
    tracer = tape.tracer
    params: dict[str, Value] = {}
    values: list[Any] = []
    outputs: list[tuple[str, Value]] = []

    def res(a: Any) -> Any:
        if isinstance(a, Ref):
            return values[a.index]
        if isinstance(a, list):
            return [res(x) for x in a]
        return a

    def is_param(v: Any) -> bool:
        return isinstance(v, Value) and any(p.id == v.id for p in params.values())

    for method, args, kwargs in compiled.program.calls:
        if method not in ALLOWED:
            raise ValueError(f"program calls unknown tracer method {method!r}")
        a = res(args)
        v: Any = None
        if method == "output":
            outputs.append((a[0], a[1]))
        elif method == "weight" and a[0] in trainable:
            v = params.get(a[0])
            if v is None:
                shape = list(compiled.arrays[a[0]].shape)
                v = tape.parameter(tracer.input(param_input(a[0]), "f32", shape))
                params[a[0]] = v
        elif method == "matmul" and is_param(a[1]):
            w = a[1]
            # A stored [N, K] is x @ w^T; a stored 1-D [K] is one row (N = 1).
            wt = (
                tape.call("permute", w, [1, 0])
                if len(w.shape) == 2
                else tape.call("reshape", w, [w.shape[0], 1])
            )
            v = tape.call("batch_matmul", a[0], wt)
        elif method == "embedding" and is_param(a[0]):
            v = tape.call("gather_rows", a[0], a[1])
        elif method in ("input", "weight", "literal"):
            v = getattr(tracer, method)(*a, **kwargs)
        else:
            v = tape.call(method, *a, **kwargs)
        values.append(v)
    return outputs, params


def forward_graph(compiled: Any) -> tuple[_native.Graph, _native.Weights]:
    """The module's forward with its parameters as inputs (see the module docs)."""
    weights = frozen_weights(compiled)
    tracer = _native.Tracer(weights, 1, compiled.trace_limits)
    outputs, _ = trace_forward(compiled, Tape(tracer))
    for name, v in outputs:
        tracer.output(name, v)
    return tracer.finish(), weights


@dataclass(frozen=True)
class StepKind:
    """What one step graph does: the loss, the optimizer, how many micro-batches make an
    update, whether gradients accumulated so far come in, whether it updates (the last
    micro-batch) or hands the sums back, and the clip norm of the update."""

    loss: str
    optimizer: Optimizer
    micro_batches: int = 1
    accumulated: bool = False
    update: bool = True
    max_grad_norm: float | None = None


@dataclass
class StepGraph:
    """A traced and prepared step graph."""

    kind: StepKind
    plan: Any
    graph: _native.Graph
    inputs: list[tuple[str, str, tuple[int, ...]]]
    target_shape: tuple[int, ...]
    params: list[str]
    states: list[str]
    step_inputs: list[str]
    runtime: Any
    # The weights the plan reads (held so the store outlives it).
    weights: _native.Weights


def build_step(compiled: Any, kind: StepKind, runtime: Any) -> StepGraph:
    """Traces and prepares one step graph (see the module docs)."""
    out_specs = compiled.graph.outputs()
    if len(out_specs) != 1:
        raise TrainingUnsupportedError(
            f"train_step needs a module with one output tensor, this one has {len(out_specs)}"
        )
    weights = frozen_weights(compiled)
    tracer = _native.Tracer(weights, 1, compiled.trace_limits)
    tape = Tape(tracer)
    outputs, params = trace_forward(compiled, tape)
    loss_v, target_shape = _trace_loss(tape, outputs[0][1], kind.loss)
    names = sorted(params)
    ops = Ops(tracer)
    seed = None if kind.micro_batches == 1 else ops.fill(1.0 / kind.micro_batches, loss_v.shape)
    grads = tape.backward(loss_v, [params[n] for n in names], seed=seed)
    tracer.output("loss", loss_v)
    if kind.accumulated:
        grads = [
            tracer.binary(tracer.input(f"acc:{n}", "f32", list(params[n].shape)), g, "add")
            for n, g in zip(names, grads, strict=True)
        ]
    states: list[str] = []
    step_ins: dict[str, Value] = {}
    if not kind.update:
        for n, g in zip(names, grads, strict=True):
            tracer.output(f"acc:{n}", g)
    else:
        if kind.max_grad_norm is not None:
            grads = clip_by_global_norm(ops, grads, kind.max_grad_norm)
        opt = kind.optimizer
        probe = opt.step_inputs(1, opt.lr)
        step_ins = {k: tracer.input(f"step.{k}", "f32", [1]) for k in probe}
        for n, g in zip(names, grads, strict=True):
            p = params[n]
            state = {}
            for s in opt.state_names:
                state[s] = tracer.input(f"state.{s}:{n}", "f32", list(p.shape))
                states.append(f"state.{s}:{n}")
            new_p, new_state = opt.update(tracer, p, g, state, step_ins)
            tracer.output(param_input(n), new_p)
            for s, v in new_state.items():
                tracer.output(f"state.{s}:{n}", v)
    graph = tracer.finish()
    plan = runtime.prepare(graph, weights, compiled.compile_limits)
    return StepGraph(
        kind=kind,
        plan=plan,
        graph=graph,
        inputs=list(compiled.inputs),
        target_shape=target_shape,
        params=names,
        states=states,
        step_inputs=list(step_ins),
        runtime=runtime,
        weights=weights,
    )


def clip_by_global_norm(ops: Ops, grads: list[Value], max_norm: float) -> list[Value]:
    """torch's ``clip_grad_norm_(max_norm)`` (2-norm): each gradient's norm, the norm of
    those, ``coef = max_norm / (total + 1e-6)`` clamped to at most 1, every gradient times
    it (also when it is 1, as torch does)."""
    t = ops.t
    if not grads:
        return grads
    norms = []
    for g in grads:
        flat = t.reshape(g, [1, math.prod(g.shape)])
        norms.append(t.unary(t.reduce(ops.mul(flat, flat), "sum"), "sqrt"))
    stacked = norms[0] if len(norms) == 1 else t.concat(norms, 1)
    total = t.unary(t.reduce(ops.mul(stacked, stacked), "sum"), "sqrt")
    coef = t.scalar(t.scalar(total, "add", 1e-6), "div", float(max_norm), reverse=True)
    # min(coef, 1) with no rounding: above 1 is coef * 0 + 1, else coef * 1 + 0.
    above = t.unary(t.scalar(coef, "sub", 1.0), "step")
    below = t.scalar(above, "sub", 1.0, reverse=True)
    clamped = t.binary(ops.mul(coef, below), above, "add")
    out = []
    for g in grads:
        c = t.reshape(clamped, [1] * len(g.shape))
        out.append(ops.mul(g, c))
    return out


def _trace_loss(tape: Tape, out: Value, loss: str) -> tuple[Value, tuple[int, ...]]:
    """The mean loss as a [1, 1] value and the target input's shape."""
    t, shape = tape.tracer, tuple(out.shape)
    n = math.prod(shape)
    if loss == "mse":
        target = t.input(TARGET, "f32", list(shape))
        d = tape.call("binary", out, target, "sub")
        sq = tape.call("binary", d, d, "mul")
        return tape.call("reduce", tape.call("reshape", sq, [1, n]), "mean"), shape
    if len(shape) < 2:
        raise TrainingUnsupportedError(
            f"cross_entropy needs logits with a class dim last, got shape {list(shape)}"
        )
    c = shape[-1]
    rows = n // c
    x = tape.call("reshape", out, [rows, c])
    # The target input holds row * c + class: the picked logit is one gathered element.
    flat_ids = t.input(TARGET, "i32", [rows])
    # log-sum-exp less its max (a constant to the gradient: the exact derivative is zero).
    m = tape.detached("reduce", x, "max")
    e = tape.call("unary", tape.call("binary", x, m, "sub"), "exp")
    lse = tape.call("binary", tape.call("unary", tape.call("reduce", e, "sum"), "log"), m, "add")
    picked = tape.call("gather_rows", tape.call("reshape", x, [rows * c, 1]), flat_ids)
    per_row = tape.call("binary", lse, picked, "sub")
    return tape.call("reduce", tape.call("reshape", per_row, [1, rows]), "mean"), (rows,)


def flat_targets(ids: np.ndarray[Any, Any], classes: int) -> np.ndarray[Any, Any]:
    """Class ids [rows] as the cross-entropy target input: ``row * classes + id``."""
    rows = np.arange(ids.shape[0], dtype=np.int64)
    flat = rows * classes + ids.astype(np.int64)
    if flat.size and int(flat.max()) >= 2**31:
        raise TrainingUnsupportedError(
            f"cross_entropy over {ids.shape[0]} rows of {classes} classes exceeds int32 ids"
        )
    return flat.astype(np.int32)
