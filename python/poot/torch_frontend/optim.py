"""The optimizers a training step runs as graph ops: ``SGD`` and ``AdamW``, each traced after
the backward pass into the same graph, so one run reads the parameters and their state and
returns the updated ones.

Invariants: the update follows torch's single-tensor CPU implementation (``torch.optim.SGD``
and ``torch.optim.AdamW`` with ``foreach=False``) operation for operation, each one IEEE f32
rounding; what changes from step to step (the learning rate under a schedule, AdamW's bias
corrections) is a graph input computed in f64 on the host as torch computes it, so the graph
is traced once. Hyperparameters are checked when the optimizer is made (``ConfigError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from poot import _native
from poot.errors import ConfigError

Value = _native.Value


@dataclass(frozen=True)
class SGD:
    """``p -= lr * (g + weight_decay * p)``; with ``momentum``, through torch's buffer
    ``b = momentum * b + g`` (``b = g`` on the first step)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not (self.lr > 0 and self.momentum >= 0 and self.weight_decay >= 0):
            raise ConfigError(
                f"SGD needs lr > 0, momentum >= 0, weight_decay >= 0; got lr={self.lr}, "
                f"momentum={self.momentum}, weight_decay={self.weight_decay}"
            )

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def step_inputs(self, step: int, lr: float) -> dict[str, float]:
        """The graph inputs of step ``step`` (from 1) at learning rate ``lr``."""
        # The first step takes the gradient as the buffer (torch clones it); 0 * b + g is that
        # exactly, with the buffer starting at zero.
        keep = {"keep": 0.0 if step == 1 else self.momentum} if self.momentum else {}
        return {"neg_lr": -lr, **keep}

    def update(
        self, t: _native.Tracer, p: Value, g: Value, state: dict[str, Value], ins: dict[str, Value]
    ) -> tuple[Value, dict[str, Value]]:
        if self.weight_decay:
            g = t.binary(g, t.scalar(p, "mul", self.weight_decay), "add")
        new_state = {}
        if self.momentum:
            b = t.binary(t.binary(state["momentum"], ins["keep"], "mul"), g, "add")
            new_state["momentum"] = b
            g = b
        return t.binary(p, t.binary(g, ins["neg_lr"], "mul"), "add"), new_state


@dataclass(frozen=True)
class AdamW:
    """torch's AdamW: decoupled weight decay, bias-corrected moments."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def __post_init__(self) -> None:
        b1, b2 = self.betas
        if not (self.lr > 0 and 0 <= b1 < 1 and 0 <= b2 < 1 and self.eps > 0):
            raise ConfigError(
                f"AdamW needs lr > 0, 0 <= betas < 1, eps > 0; got lr={self.lr}, "
                f"betas={self.betas}, eps={self.eps}"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"AdamW needs weight_decay >= 0, got {self.weight_decay}")

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def step_inputs(self, step: int, lr: float) -> dict[str, float]:
        """The graph inputs of step ``step`` (from 1) at learning rate ``lr``."""
        b1, b2 = self.betas
        bias1 = 1 - b1**step
        bias2 = 1 - b2**step
        ins = {"neg_step_size": -(lr / bias1), "bias2_sqrt": bias2**0.5}
        if self.weight_decay:
            ins["decay"] = 1 - lr * self.weight_decay
        return ins

    def update(
        self, t: _native.Tracer, p: Value, g: Value, state: dict[str, Value], ins: dict[str, Value]
    ) -> tuple[Value, dict[str, Value]]:
        b1, b2 = self.betas
        if self.weight_decay:
            p = t.binary(p, ins["decay"], "mul")
        m, v = state["exp_avg"], state["exp_avg_sq"]
        # lerp(m, g, 1 - b1) = m + (1 - b1) (g - m), as torch's CPU lerp for weights < 0.5.
        m = t.binary(m, t.scalar(t.binary(g, m, "sub"), "mul", 1 - b1), "add")
        v = t.binary(t.scalar(v, "mul", b2), t.scalar(t.binary(g, g, "mul"), "mul", 1 - b2), "add")
        denom = t.scalar(t.binary(t.unary(v, "sqrt"), ins["bias2_sqrt"], "div"), "add", self.eps)
        step = t.binary(t.binary(m, denom, "div"), ins["neg_step_size"], "mul")
        return t.binary(p, step, "add"), {"exp_avg": m, "exp_avg_sq": v}


Optimizer = SGD | AdamW


def to_json(opt: Optimizer) -> dict[str, Any]:
    """The optimizer as plain data (a saved module's training state)."""
    if isinstance(opt, SGD):
        return {"kind": "SGD", "lr": opt.lr, "momentum": opt.momentum,
                "weight_decay": opt.weight_decay}  # fmt: skip
    return {"kind": "AdamW", "lr": opt.lr, "betas": list(opt.betas), "eps": opt.eps,
            "weight_decay": opt.weight_decay}  # fmt: skip


def from_json(data: Any) -> Optimizer:
    """The optimizer ``to_json`` wrote; ``ValueError`` (or ``ConfigError``) for anything
    else."""
    if not isinstance(data, dict):
        raise ValueError(f"an optimizer must be a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    fields = {k: v for k, v in data.items() if k != "kind"}
    if not all(isinstance(v, (int, float, list)) for v in fields.values()):
        raise ValueError(f"optimizer fields must be numbers, got {fields}")
    if kind == "SGD" and set(fields) == {"lr", "momentum", "weight_decay"}:
        return SGD(**fields)
    if kind == "AdamW" and set(fields) == {"lr", "betas", "eps", "weight_decay"}:
        betas = fields.pop("betas")
        if not (isinstance(betas, list) and len(betas) == 2):
            raise ValueError(f"AdamW betas must be two numbers, got {betas!r}")
        return AdamW(betas=(float(betas[0]), float(betas[1])), **fields)
    raise ValueError(f"unknown optimizer {kind!r} with fields {sorted(fields)}")


def check_optimizer(opt: Any) -> Optimizer:
    if not isinstance(opt, (SGD, AdamW)):
        raise ConfigError(
            f"optimizer must be poot.torch_frontend.SGD or AdamW, got {type(opt).__name__}"
        )
    return opt
