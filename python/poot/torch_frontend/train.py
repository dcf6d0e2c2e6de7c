"""Training a compiled module: ``CompiledModule.train_step(inputs, targets, loss_fn,
optimizer=...)`` runs one step (forward, loss, backward, optimizer update) as one poot graph
and returns the loss.

How the step graph is built (``build_step``): the module's lowered program is replayed on a
``grad.Tape`` with every trainable parameter turned into a graph input (so one prepared plan
serves every step), a stored-weight matmul of a parameter becoming ``batch_matmul`` with its
transpose and an embedding of a trained table a one-hot ``batch_matmul`` (the table's rows
picked by ``embedding`` of an identity matrix, whose gradient is that one-hot's transpose
times the output's: [V, V] floats of identity per table, so the vocabulary stays small); the
loss is traced on top; ``Tape.backward`` traces the gradients; the optimizer (``optim.py``)
traces the update. Outputs: the loss, each parameter's new value, each optimizer state's.

Invariants: training needs ``CompileConfig(allow_training=True)`` at compile time
(``TrainingNotAllowedError`` otherwise) and one in-process native runtime with resident
float32 parameters (``TrainingUnsupportedError`` for streamed or multi-device placements,
runtimes in other processes, other dtypes). The parameters live in the compiled module's
weight arrays (for a contiguous float32 parameter, the torch module's own storage: a step
updates the module as a torch optimizer would); after a step the forward plan is prepared
again before its next call. The step plan runs on the module's runtime when one was given,
else on a ``CpuRuntime`` with ``torch.get_num_threads()`` threads (the caller's budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poot import _native
from poot.errors import TrainingNotAllowedError, TrainingUnsupportedError, UnsupportedFeatureError
from poot.torch_frontend.grad import Tape, Value
from poot.torch_frontend.lower import numpy_input
from poot.torch_frontend.optim import Optimizer, check_optimizer
from poot.torch_frontend.program import ALLOWED, Ref

LOSSES = ("mse", "cross_entropy")


def loss_kind(loss_fn: Any) -> str:
    """``"mse"`` or ``"cross_entropy"`` for a name, ``F.mse_loss`` / ``F.cross_entropy``, or
    ``nn.MSELoss()`` / ``nn.CrossEntropyLoss()`` with their default settings."""
    import torch

    f, nn = torch.nn.functional, torch.nn
    if isinstance(loss_fn, str) and loss_fn in LOSSES:
        return loss_fn
    if loss_fn is f.mse_loss:
        return "mse"
    if loss_fn is f.cross_entropy:
        return "cross_entropy"
    if isinstance(loss_fn, nn.MSELoss) and loss_fn.reduction == "mean":
        return "mse"
    if (
        isinstance(loss_fn, nn.CrossEntropyLoss)
        and loss_fn.reduction == "mean"
        and loss_fn.weight is None
        and loss_fn.label_smoothing == 0.0
    ):
        return "cross_entropy"
    raise UnsupportedFeatureError(
        f"loss {loss_fn!r} is not supported: train_step takes 'mse' or 'cross_entropy' "
        "(or F.mse_loss, F.cross_entropy, nn.MSELoss(), nn.CrossEntropyLoss() with mean "
        "reduction, no class weights, no label smoothing)"
    )


def check_placement(placement: Any) -> None:
    """Refuses a planner ``Placement`` a step cannot train on: weights streamed, or units
    spread over several devices or nodes (a step's gradients and updates stay on one)."""
    streamed = [s for s in placement.segments if s.streamed]
    if streamed:
        raise TrainingUnsupportedError(
            f"training needs resident parameters; {len(streamed)} segment(s) stream their "
            f"weights (first on {streamed[0].device}, from {streamed[0].residency})"
        )
    devices = placement.devices
    if len(devices) > 1:
        raise TrainingUnsupportedError(
            f"training runs on one device; this placement spans {', '.join(devices)}"
        )


def check_trainable(compiled: Any) -> None:
    """The refusals of the module docs, before anything is traced."""
    config = getattr(compiled, "config", None)
    if config is None or not getattr(config, "allow_training", False):
        raise TrainingNotAllowedError(
            "this module was compiled without CompileConfig(allow_training=True)"
        )
    placement = getattr(compiled, "placement", None)
    if placement is not None:
        check_placement(placement)
    native = tuple(
        c for c in (getattr(_native, n, None) for n in ("CpuRuntime", "WgpuRuntime")) if c
    )
    if not isinstance(compiled.runtime, native):
        raise TrainingUnsupportedError(
            f"training runs on an in-process CpuRuntime or WgpuRuntime, not on "
            f"{type(compiled.runtime).__name__} (a worker in another process, a remote node "
            "or a streaming runtime)"
        )
    for name in compiled.trainable:
        a = compiled.arrays[name]
        if a.dtype != np.float32 or name in compiled.dtypes:
            raise TrainingUnsupportedError(
                f"parameter {name!r} is stored as {compiled.dtypes.get(name, a.dtype)}; "
                "training updates float32 parameters only"
            )


@dataclass
class StepGraph:
    """A traced and prepared training step."""

    plan: Any
    inputs: list[tuple[str, str, tuple[int, ...]]]
    target: tuple[str, tuple[int, ...]]
    params: list[str]
    states: list[str]
    step_inputs: list[str]
    runtime: Any


def _eye_name(n: int) -> str:
    return f"_train.eye.{n}"


def build_step(compiled: Any, loss: str, opt: Optimizer, runtime: Any) -> StepGraph:
    """Traces and prepares the step graph (see the module docs)."""
    trainable = set(compiled.trainable)
    arrays = {n: a for n, a in compiled.arrays.items() if n not in trainable}
    out_names = [o[0] for o in compiled.graph.outputs()]
    if len(out_names) != 1:
        raise TrainingUnsupportedError(
            f"train_step needs a module with one output tensor, this one has {len(out_names)}"
        )
    out_shape = tuple(compiled.graph.outputs()[0][2])
    eyes = {a.shape[0] for n, a in compiled.arrays.items() if n in trainable and a.ndim == 2}
    if loss == "cross_entropy":
        eyes.add(out_shape[-1])
    for n in eyes:
        arrays[_eye_name(n)] = np.eye(n, dtype=np.float32)
    dtypes = {n: d for n, d in compiled.dtypes.items() if n in arrays}
    weights = _native.Weights.from_arrays(arrays, dtypes=dtypes)
    tracer = _native.Tracer(weights, 1, compiled.trace_limits)
    tape = Tape(tracer)
    params: dict[str, Value] = {}
    values: list[Any] = []
    out: Value | None = None

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
            out = a[1]
        elif method == "weight" and a[0] in trainable:
            shape = list(compiled.arrays[a[0]].shape)
            v = params.get(a[0]) or tape.parameter(tracer.input(f"param:{a[0]}", "f32", shape))
            params[a[0]] = v
        elif method == "matmul" and is_param(a[1]) and len(a[1].shape) == 2:
            v = tape.call("batch_matmul", a[0], tape.call("permute", a[1], [1, 0]))
        elif method == "embedding" and is_param(a[0]):
            onehot = tracer.embedding(tracer.weight(_eye_name(a[0].shape[0])), a[1])
            v = tape.call("batch_matmul", onehot, a[0])
        elif method in ("input", "weight", "literal"):
            v = getattr(tracer, method)(*a, **kwargs)
        else:
            v = tape.call(method, *a, **kwargs)
        values.append(v)
    assert out is not None
    target_name = "_train.target"
    loss_v, target_shape = _trace_loss(tape, out, loss, target_name)
    names = sorted(params)
    grads = tape.backward(loss_v, [params[n] for n in names])
    tracer.output("loss", loss_v)
    step_ins = {k: tracer.input(f"step.{k}", "f32", [1]) for k in opt.step_inputs(1)}
    states = []
    for n, g in zip(names, grads, strict=True):
        p = params[n]
        state = {}
        for s in opt.state_names:
            state[s] = tracer.input(f"state.{s}:{n}", "f32", list(p.shape))
            states.append(f"state.{s}:{n}")
        new_p, new_state = opt.update(tracer, p, g, state, step_ins)
        tracer.output(f"param:{n}", new_p)
        for s, v in new_state.items():
            tracer.output(f"state.{s}:{n}", v)
    graph = tracer.finish()
    plan = runtime.prepare(graph, weights, compiled.compile_limits)
    return StepGraph(
        plan=plan,
        inputs=list(compiled.inputs),
        target=(target_name, target_shape),
        params=names,
        states=states,
        step_inputs=list(step_ins),
        runtime=runtime,
    )


def _trace_loss(tape: Tape, out: Value, loss: str, name: str) -> tuple[Value, tuple[int, ...]]:
    """The mean loss as a [1, 1] value and the target input's shape."""
    t, shape = tape.tracer, tuple(out.shape)
    n = math.prod(shape)
    if loss == "mse":
        target = t.input(name, "f32", list(shape))
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
    ids = t.input(name, "i32", [rows])
    onehot = t.embedding(t.weight(_eye_name(c)), ids)
    # log-sum-exp less its max (a constant to the gradient: the exact derivative is zero).
    m = tape.detached("reduce", x, "max")
    e = tape.call("unary", tape.call("binary", x, m, "sub"), "exp")
    lse = tape.call("binary", tape.call("unary", tape.call("reduce", e, "sum"), "log"), m, "add")
    picked = tape.call("reduce", tape.call("binary", x, onehot, "mul"), "sum")
    per_row = tape.call("binary", lse, picked, "sub")
    return tape.call("reduce", tape.call("reshape", per_row, [1, rows]), "mean"), (rows,)


@dataclass
class Trainer:
    """A module's training state: step plans by loss and optimizer, optimizer state, step
    counts."""

    compiled: Any
    plans: dict[tuple[str, Optimizer], StepGraph] = field(default_factory=dict)
    state: dict[Optimizer, dict[str, np.ndarray[Any, Any]]] = field(default_factory=dict)
    steps: dict[Optimizer, int] = field(default_factory=dict)
    runtime: Any = None

    def step(self, inputs: Any, targets: Any, loss_fn: Any, optimizer: Any) -> float:
        c = self.compiled
        check_trainable(c)
        opt = check_optimizer(optimizer)
        loss = loss_kind(loss_fn)
        key = (loss, opt)
        sg = self.plans.get(key)
        if sg is None:
            sg = build_step(c, loss, opt, self._runtime())
            self.plans[key] = sg
        args = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
        if len(args) != len(sg.inputs):
            raise UnsupportedFeatureError(
                f"{len(args)} inputs given, the module was compiled for {len(sg.inputs)}"
            )
        feed = {
            name: numpy_input(name, a, dtype, shape)
            for a, (name, dtype, shape) in zip(args, sg.inputs, strict=True)
        }
        feed[sg.target[0]] = _target(targets, loss, sg.target[1], c)
        for n in sg.params:
            feed[f"param:{n}"] = c.arrays[n]
        state = self.state.setdefault(opt, {})
        for s in sg.states:
            pname = s.split(":", 1)[1]
            feed[s] = state.setdefault(s, np.zeros_like(c.arrays[pname]))
        step = self.steps.get(opt, 0) + 1
        for k, v in opt.step_inputs(step).items():
            feed[f"step.{k}"] = np.array([v], dtype=np.float32)
        out = sg.runtime.run(sg.plan, feed)
        # Only once the run succeeded: a failed step changes nothing.
        self.steps[opt] = step
        for n in sg.params:
            np.copyto(c.arrays[n], np.asarray(out[f"param:{n}"]).reshape(c.arrays[n].shape))
        for s in sg.states:
            state[s] = np.asarray(out[s]).reshape(state[s].shape).copy()
        c.parameters_changed()
        return float(np.asarray(out["loss"]).reshape(-1)[0])

    def _runtime(self) -> Any:
        if self.runtime is None:
            if self.compiled.runtime_given:
                self.runtime = self.compiled.runtime
            else:
                import torch

                self.runtime = _native.CpuRuntime(threads=torch.get_num_threads())
        return self.runtime


def _target(targets: Any, loss: str, shape: tuple[int, ...], compiled: Any) -> Any:
    import torch

    if isinstance(targets, np.ndarray):
        targets = torch.from_numpy(targets)
    if not isinstance(targets, torch.Tensor):
        raise UnsupportedFeatureError(
            f"targets must be a torch tensor or numpy array, got {type(targets).__name__}"
        )
    if loss == "mse":
        return numpy_input("targets", targets, "f32", shape)
    if targets.numel() != shape[0] or targets.dtype not in (torch.int64, torch.int32):
        raise UnsupportedFeatureError(
            f"cross_entropy targets must be {shape[0]} class ids (int64 or int32), got "
            f"{targets.dtype} of shape {list(targets.shape)}"
        )
    ids = targets.reshape(-1)
    c = compiled.graph.outputs()[0][2][-1]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= c):
        raise UnsupportedFeatureError(f"cross_entropy targets must lie in [0, {c})")
    return numpy_input("targets", ids, "i32", (shape[0],))
