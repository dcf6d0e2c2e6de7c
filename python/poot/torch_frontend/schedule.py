"""A training step's settings (``TrainConfig``): gradient clipping by global norm, gradient
accumulation over micro-batches, and the learning-rate schedule.

The schedules reproduce ``torch.optim.lr_scheduler`` exactly: each is torch's own recursion
(``get_lr``, the chainable form ``scheduler.step()`` runs) in Python floats, so step ``n``
(from 1) trains at the learning rate torch's optimizer has after ``n - 1`` calls of
``scheduler.step()``, bit for bit. ``LinearWarmup`` is ``LinearLR``, ``CosineDecay`` is
``CosineAnnealingLR`` and ``StepDecay`` is ``StepLR``, with their defaults.

Invariants: every setting is checked when it is made (``ConfigError``); a schedule is a pure
function of (base learning rate, epoch), so a resumed run recomputes the same rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from poot.errors import ConfigError


@dataclass(frozen=True)
class LinearWarmup:
    """torch's ``LinearLR(start_factor, end_factor, total_iters)``: the rate scaled from
    ``start_factor`` to ``end_factor`` over ``total_iters`` steps, then held."""

    total_iters: int = 5
    start_factor: float = 1.0 / 3
    end_factor: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.start_factor <= 1 or not 0 <= self.end_factor <= 1:
            raise ConfigError(
                f"LinearWarmup needs 0 < start_factor <= 1 and 0 <= end_factor <= 1, got "
                f"{self.start_factor}, {self.end_factor}"
            )
        if self.total_iters < 1:
            raise ConfigError(f"LinearWarmup needs total_iters >= 1, got {self.total_iters}")

    def first(self, base: float) -> float:
        return base * self.start_factor

    def next(self, epoch: int, lr: float, base: float) -> float:
        if epoch > self.total_iters:
            return lr
        s, e = self.start_factor, self.end_factor
        return lr * (1.0 + (e - s) / (self.total_iters * s + (epoch - 1) * (e - s)))


@dataclass(frozen=True)
class CosineDecay:
    """torch's ``CosineAnnealingLR(T_max, eta_min)``: half a cosine from the base rate down
    to ``eta_min`` over ``t_max`` steps (and back up after, as torch's does)."""

    t_max: int
    eta_min: float = 0.0

    def __post_init__(self) -> None:
        if self.t_max < 1 or not self.eta_min >= 0:
            raise ConfigError(
                f"CosineDecay needs t_max >= 1 and eta_min >= 0, got {self.t_max}, {self.eta_min}"
            )

    def first(self, base: float) -> float:
        return base

    def next(self, epoch: int, lr: float, base: float) -> float:
        t, lo = self.t_max, self.eta_min
        if (epoch - 1 - t) % (2 * t) == 0:
            return lr + (base - lo) * (1 - math.cos(math.pi / t)) / 2
        return (1 + math.cos(math.pi * epoch / t)) / (1 + math.cos(math.pi * (epoch - 1) / t)) * (
            lr - lo
        ) + lo


@dataclass(frozen=True)
class StepDecay:
    """torch's ``StepLR(step_size, gamma)``: the rate times ``gamma`` every ``step_size``
    steps."""

    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        if self.step_size < 1 or not self.gamma > 0:
            raise ConfigError(
                f"StepDecay needs step_size >= 1 and gamma > 0, got {self.step_size}, {self.gamma}"
            )

    def first(self, base: float) -> float:
        return base

    def next(self, epoch: int, lr: float, base: float) -> float:
        return lr * self.gamma if epoch % self.step_size == 0 else lr


Schedule = LinearWarmup | CosineDecay | StepDecay


def lr_at(schedule: Schedule | None, base: float, epoch: int) -> float:
    """The learning rate after ``epoch`` scheduler steps (torch's recursion from 0)."""
    if schedule is None:
        return base
    lr = schedule.first(base)
    for e in range(1, epoch + 1):
        lr = schedule.next(e, lr, base)
    return lr


@dataclass
class LrTrack:
    """The last rate computed for one (schedule, base), so each step advances the recursion
    by one epoch instead of replaying it."""

    schedule: Schedule | None
    base: float
    epoch: int = 0
    lr: float = 0.0

    def __post_init__(self) -> None:
        self.lr = lr_at(self.schedule, self.base, 0)

    def at(self, epoch: int) -> float:
        if self.schedule is None:
            return self.base
        if epoch < self.epoch:
            self.epoch, self.lr = 0, self.schedule.first(self.base)
        while self.epoch < epoch:
            self.epoch += 1
            self.lr = self.schedule.next(self.epoch, self.lr, self.base)
        return self.lr


@dataclass(frozen=True)
class TrainConfig:
    """How ``train_step`` turns a batch into one optimizer update.

    Attributes:
        max_grad_norm: clip the gradients to this global 2-norm before the update (torch's
            ``clip_grad_norm_``); None: no clipping.
        accumulation_steps: split the batch along dim 0 into this many micro-batches, each
            of the compiled batch size; their gradients of ``loss / accumulation_steps`` are
            summed (torch's loop of ``(loss / k).backward()``), then one update.
        schedule: the learning-rate schedule over updates (``LinearWarmup``, ``CosineDecay``,
            ``StepDecay``); None: the optimizer's constant ``lr``.
    """

    max_grad_norm: float | None = None
    accumulation_steps: int = 1
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and not (
            math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0
        ):
            raise ConfigError(
                f"TrainConfig.max_grad_norm must be a finite number > 0 or None, got "
                f"{self.max_grad_norm}"
            )
        if not isinstance(self.accumulation_steps, int) or self.accumulation_steps < 1:
            raise ConfigError(
                f"TrainConfig.accumulation_steps must be an int >= 1, got "
                f"{self.accumulation_steps!r}"
            )
        if self.schedule is not None and not isinstance(
            self.schedule, (LinearWarmup, CosineDecay, StepDecay)
        ):
            raise ConfigError(
                "TrainConfig.schedule must be LinearWarmup, CosineDecay, StepDecay or None, "
                f"got {type(self.schedule).__name__}"
            )


def check_config(config: Any) -> TrainConfig:
    if config is None:
        return TrainConfig()
    if not isinstance(config, TrainConfig):
        raise ConfigError(
            f"train_step's config must be a poot.torch_frontend.TrainConfig, got "
            f"{type(config).__name__}"
        )
    return config
