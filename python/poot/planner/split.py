"""Running a plan whose segments sit on more than one device (CPU + wgpu).

Each segment of the placement (units ``[start, end)`` on one device; a placement never uses a
device twice) is a ``Part``: its own runtime, its own KV pool holding only its layers
(``trace_units(kv_base=...)``), and either a resident plan per step shape (traced over its units
and compiled once on its runtime, then cached with the step shape like any plan) or, for a CPU
segment that streams, the ``StreamingRuntime`` that runs its chunks. A step runs the parts in
order; the hidden state crosses from one device to the next through the host (the one array
each run returns, fed as the next part's ``"hidden"`` input).

Invariants: the chained parts compute exactly the graph of one whole step (the same
``trace_units`` contract streaming relies on), so greedy ids equal a single-device run's; each
part's KV stays on its device and the scheduler's block tables index every part's pool alike;
late inputs (the token mask) and the sampling step go to the last part only; the step's name is
the last part's runtime's, so a step with logit ops ending on wgpu samples on the host as
``runner`` does for a wgpu-only model. Every forward leases its activation bytes, runs under
its own generation (cancel stops it at the next part boundary) and records one span per part.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from poot._native import (
    CompileLimits,
    CpuRuntime,
    LateInput,
    Plan,
    TraceLimits,
    Tracer,
    Weights,
    WgpuRuntime,
)
from poot.models.step import StepShape
from poot.planner.ledger import CapacityLedger, Generations
from poot.planner.record import Recorder
from poot.planner.streaming import SegmentedPlan, StreamingRuntime

__all__ = ["Part", "SplitPlan", "SplitRuntime"]


@dataclass
class Part:
    """One segment: units ``[start, end)`` on ``device`` (a key such as ``"wgpu:0"``).

    Attributes:
        runtime: the device's runtime.
        layers: the model layers in the segment, ``(first, count)``; its KV pool holds these.
        streaming: set for a streamed (CPU) segment: it runs the segment's chunks.
        chunks, labels: the streamed segment's chunks and their names.
        label: the segment's units in words (its span's label).
    """

    device: str
    start: int
    end: int
    runtime: CpuRuntime | WgpuRuntime
    layers: tuple[int, int]
    streaming: StreamingRuntime | None = None
    chunks: tuple[tuple[int, int], ...] = ()
    labels: tuple[str, ...] = ()
    label: str = ""


@dataclass
class SplitPlan:
    """One step shape: per part a compiled plan (resident) or a segmented plan (streamed)."""

    shape: StepShape
    plans: list[Plan | SegmentedPlan]
    inputs: list[frozenset[str]]

    @property
    def artifact_bytes(self) -> int:
        return sum(p.artifact_bytes for p in self.plans)


class SplitRuntime:
    """Runs ``SplitPlan``s over the parts' runtimes; stands in for a ``StepRunner``'s runtime
    (``configure_kv``, ``run``, ``memory``, ``health``; ``prepare`` replaces ``compile``)."""

    def __init__(
        self,
        parts: list[Part],
        definition: Any,
        weights: Weights,
        ledger: CapacityLedger,
        generations: Generations,
        *,
        trace_limits: TraceLimits,
        compile_limits: CompileLimits,
        recorder: Recorder | None = None,
        activation_bytes: int = 0,
        stall_timeout_s: float = 30.0,
    ) -> None:
        self.parts = parts
        self.definition = definition
        self.weights = weights
        self.ledger = ledger
        self.generations = generations
        self.trace_limits = trace_limits
        self.compile_limits = compile_limits
        self.recorder = recorder
        self.activation_bytes = activation_bytes
        self.stall_timeout_s = stall_timeout_s
        # The last part runs the sampling head: its backend names the whole.
        self.name = parts[-1].runtime.name
        # Each part's pool holds its own kind of element; the widest bounds them all.
        self.kv_entry_bytes = max(int(p.runtime.kv_entry_bytes) for p in parts)
        self.current_generation = 0

    def supports(self, op: str) -> bool:
        """Whether the last part (which runs the sampling head) compiles ops of kind ``op``."""
        return bool(self.parts[-1].runtime.supports(op))

    def configure_kv(self, *, n_layers: int, **kw: int) -> None:
        """Gives each part a pool for its own layers (at least one: a pool must exist)."""
        for p in self.parts:
            p.runtime.configure_kv(n_layers=max(1, p.layers[1]), **kw)

    def memory(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for p in self.parts:
            for k, v in p.runtime.memory().items():
                total[k] = total.get(k, 0) + v
        return total

    def health(self) -> dict[str, str | None]:
        """The first part that is not ok, else ok."""
        for p in self.parts:
            h = p.runtime.health()
            if h.get("status") != "ok":
                return {"status": h.get("status"), "reason": f"{p.device}: {h.get('reason')}"}
        return {"status": "ok", "reason": None}

    def prepare(self, shape: StepShape) -> SplitPlan:
        """Traces and compiles each resident part for ``shape``; streamed parts only find their
        chunks' tensors (their chunks compile as they stream)."""
        plans: list[Plan | SegmentedPlan] = []
        inputs: list[frozenset[str]] = []
        for p in self.parts:
            if p.streaming is not None:
                seg = p.streaming.prepare(shape, list(p.chunks), list(p.labels))
                plans.append(seg)
                t = Tracer(self.weights, shape.tokens, self.trace_limits)
                self.definition.trace_units(t, shape, p.start, p.end, p.layers[0])
                inputs.append(frozenset(x[0] for x in t.finish().inputs()))
                continue
            t = Tracer(self.weights, shape.tokens, self.trace_limits)
            self.definition.trace_units(t, shape, p.start, p.end, p.layers[0])
            graph = t.finish()
            inputs.append(frozenset(x[0] for x in graph.inputs()))
            plans.append(p.runtime.prepare(graph, self.weights, self.compile_limits))
        return SplitPlan(shape, plans, inputs)

    def run(
        self,
        plan: SplitPlan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Runs the parts in order, the hidden state passed through the host."""
        gen = self.generations.begin()
        self.current_generation = gen
        rec = self.recorder
        if rec is not None:
            rec.begin_step()
        try:
            with self.ledger.lease(host=self.activation_bytes, wait_s=self.stall_timeout_s):
                out: dict[str, npt.NDArray[Any]] = {}
                hidden: npt.NDArray[Any] | None = None
                last = len(self.parts) - 1
                for i, (p, compiled) in enumerate(zip(self.parts, plan.plans, strict=True)):
                    self.generations.check(gen)
                    feed = {k: v for k, v in inputs.items() if k in plan.inputs[i]}
                    if hidden is not None:
                        feed["hidden"] = hidden
                    t0 = time.perf_counter()
                    if isinstance(compiled, SegmentedPlan):
                        assert p.streaming is not None
                        out = p.streaming.run(
                            compiled, feed, timeout_s, late if i == last else None, generation=gen
                        )
                    else:
                        out = p.runtime.run(compiled, feed, timeout_s, late if i == last else None)
                        if rec is not None:
                            rec.span(p.device, p.label, t0, time.perf_counter(), "compute")
                    hidden = out.get("hidden")
                self.generations.check(gen)
                return out
        finally:
            self.generations.end(gen)
