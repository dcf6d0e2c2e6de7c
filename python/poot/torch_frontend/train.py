"""Training a compiled module: ``CompiledModule.train_step(inputs, targets, loss_fn,
optimizer=..., config=TrainConfig(...))`` runs one optimizer update (forward, loss, backward,
optional gradient accumulation and clipping, update) as poot graphs and returns the loss.

The graphs are traced in ``train_graph.py``; this module checks what may train, splits a
batch into micro-batches, feeds the graphs and applies their outputs. A step with
``accumulation_steps = k`` runs k graphs: the first returns its gradients, each later one
adds its own to those it is fed, and the last also clips and updates; the returned loss is
the mean of the k micro-batch losses. The learning rate of update ``n`` (from 1) is the
schedule's after ``n - 1`` epochs (``schedule.py``), fed to the graph as an input.

Invariants: training needs ``CompileConfig(allow_training=True)`` at compile time
(``TrainingNotAllowedError`` otherwise) and one in-process native runtime with resident
float32 parameters (``TrainingUnsupportedError`` for streamed or multi-device placements,
runtimes in other processes, other dtypes). The parameters live in the compiled module's
weight arrays (for a contiguous float32 parameter, the torch module's own storage: a step
updates the module as a torch optimizer would), written in place only after every graph of
the step ran, so a failed step changes nothing. The module's forward plan reads them as
inputs and is never prepared again. The step plans run on the module's runtime when one was
given, else on a ``CpuRuntime`` with ``torch.get_num_threads()`` threads (the caller's
budget); each kind of step graph is traced and prepared once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poot import _native
from poot.errors import TrainingNotAllowedError, TrainingUnsupportedError, UnsupportedFeatureError
from poot.torch_frontend.lower import numpy_input
from poot.torch_frontend.optim import Optimizer, check_optimizer
from poot.torch_frontend.schedule import LrTrack, Schedule, TrainConfig, check_config
from poot.torch_frontend.train_graph import (
    TARGET,
    StepGraph,
    StepKind,
    build_step,
    flat_targets,
    param_input,
)

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
class Trainer:
    """A module's training state: step graphs by kind, optimizer state and update counts by
    optimizer, learning-rate tracks."""

    compiled: Any
    plans: dict[StepKind, StepGraph] = field(default_factory=dict)
    state: dict[Optimizer, dict[str, np.ndarray[Any, Any]]] = field(default_factory=dict)
    steps: dict[Optimizer, int] = field(default_factory=dict)
    lrs: dict[tuple[Schedule | None, float], LrTrack] = field(default_factory=dict)
    runtime: Any = None

    def step(
        self, inputs: Any, targets: Any, loss_fn: Any, optimizer: Any, config: Any = None
    ) -> float:
        c = self.compiled
        check_trainable(c)
        opt = check_optimizer(optimizer)
        cfg = check_config(config)
        loss = loss_kind(loss_fn)
        n_out = len(c.graph.outputs())
        if n_out != 1:
            raise TrainingUnsupportedError(
                f"train_step needs a module with one output tensor, this one has {n_out}"
            )
        k = cfg.accumulation_steps
        # Every micro-batch is checked before anything runs.
        feeds = [self._feed(args, tgt, loss) for args, tgt in _micro_batches(inputs, targets, k, c)]
        kinds = _kinds(loss, opt, cfg)
        plans = [self._plan(kind) for kind in kinds]
        losses = []
        acc: dict[str, Any] = {}
        for feed, sg in zip(feeds, plans, strict=True):
            for n in sg.params:
                feed[param_input(n)] = c.arrays[n]
                if sg.kind.accumulated:
                    feed[f"acc:{n}"] = acc[n]
            if sg.kind.update:
                out = self._run_update(sg, feed, opt, cfg.schedule)
            else:
                out = sg.runtime.run(sg.plan, feed)
                acc = {n: np.asarray(out[f"acc:{n}"]) for n in sg.params}
            losses.append(float(np.asarray(out["loss"]).reshape(-1)[0]))
        return sum(losses) / k

    def _run_update(
        self, sg: StepGraph, feed: dict[str, Any], opt: Optimizer, schedule: Schedule | None
    ) -> Any:
        c = self.compiled
        state = self.state.setdefault(opt, {})
        for s in sg.states:
            pname = s.split(":", 1)[1]
            feed[s] = state.setdefault(s, np.zeros_like(c.arrays[pname]))
        step = self.steps.get(opt, 0) + 1
        track = self.lrs.get((schedule, opt.lr))
        if track is None:
            track = self.lrs[(schedule, opt.lr)] = LrTrack(schedule, opt.lr)
        for key, v in opt.step_inputs(step, track.at(step - 1)).items():
            feed[f"step.{key}"] = np.array([v], dtype=np.float32)
        out = sg.runtime.run(sg.plan, feed)
        # Only once every graph of the step ran: a failed step changes nothing.
        self.steps[opt] = step
        for n in sg.params:
            np.copyto(c.arrays[n], np.asarray(out[param_input(n)]).reshape(c.arrays[n].shape))
        for s in sg.states:
            state[s] = np.asarray(out[s]).reshape(state[s].shape).copy()
        return out

    def _feed(self, args: tuple[Any, ...], targets: Any, loss: str) -> dict[str, Any]:
        c = self.compiled
        if len(args) != len(c.inputs):
            raise UnsupportedFeatureError(
                f"{len(args)} inputs given, the module was compiled for {len(c.inputs)}"
            )
        feed = {
            name: numpy_input(name, a, dtype, shape)
            for a, (name, dtype, shape) in zip(args, c.inputs, strict=True)
        }
        feed[TARGET] = _target(targets, loss, tuple(c.graph.outputs()[0][2]))
        return feed

    def _plan(self, kind: StepKind) -> StepGraph:
        sg = self.plans.get(kind)
        if sg is None:
            sg = self.plans[kind] = build_step(self.compiled, kind, self._runtime())
        return sg

    def _runtime(self) -> Any:
        if self.runtime is None:
            if self.compiled.runtime_given:
                self.runtime = self.compiled.runtime
            else:
                import torch

                self.runtime = _native.CpuRuntime(threads=torch.get_num_threads())
        return self.runtime


def _kinds(loss: str, opt: Optimizer, cfg: TrainConfig) -> list[StepKind]:
    """The step graphs of one update, in order (see the module docs)."""
    k, clip = cfg.accumulation_steps, cfg.max_grad_norm
    if k == 1:
        return [StepKind(loss, opt, 1, accumulated=False, update=True, max_grad_norm=clip)]
    first = StepKind(loss, opt, k, accumulated=False, update=False)
    middle = StepKind(loss, opt, k, accumulated=True, update=False)
    last = StepKind(loss, opt, k, accumulated=True, update=True, max_grad_norm=clip)
    return [first, *[middle] * (k - 2), last]


def _micro_batches(inputs: Any, targets: Any, k: int, compiled: Any) -> list[tuple[Any, Any]]:
    """``(inputs, targets)`` split along dim 0 into ``k`` equal micro-batches (itself for 1);
    each part's shape is checked against the compiled one when it is fed."""
    args = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    if k == 1:
        return [(args, targets)]
    import torch

    def split(name: str, v: Any) -> list[Any]:
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v)
        if not isinstance(v, torch.Tensor) or v.ndim == 0 or v.shape[0] % k:
            got = list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise UnsupportedFeatureError(
                f"{name}: with accumulation_steps={k} dim 0 must split into {k} equal "
                f"micro-batches, got {got}"
            )
        return list(torch.split(v, v.shape[0] // k))

    if len(args) != len(compiled.inputs):
        raise UnsupportedFeatureError(
            f"{len(args)} inputs given, the module was compiled for {len(compiled.inputs)}"
        )
    parts = [split(f"input {n!r}", a) for a, (n, _, _) in zip(args, compiled.inputs, strict=True)]
    tparts = split("targets", targets)
    return [(tuple(p[i] for p in parts), tparts[i]) for i in range(k)]


def _target(targets: Any, loss: str, out_shape: tuple[int, ...]) -> Any:
    import torch

    if isinstance(targets, np.ndarray):
        targets = torch.from_numpy(targets)
    if not isinstance(targets, torch.Tensor):
        raise UnsupportedFeatureError(
            f"targets must be a torch tensor or numpy array, got {type(targets).__name__}"
        )
    if loss == "mse":
        return numpy_input("targets", targets, "f32", out_shape)
    c = out_shape[-1]
    rows = int(np.prod(out_shape)) // c
    if targets.numel() != rows or targets.dtype not in (torch.int64, torch.int32):
        raise UnsupportedFeatureError(
            f"cross_entropy targets must be {rows} class ids (int64 or int32), got "
            f"{targets.dtype} of shape {list(targets.shape)}"
        )
    ids = targets.reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= c):
        raise UnsupportedFeatureError(f"cross_entropy targets must lie in [0, {c})")
    return flat_targets(numpy_input("targets", ids, "i32", (rows,)), c)
