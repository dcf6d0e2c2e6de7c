"""How a ``CompiledModel`` runs inside ``poot.LLM``: direct, streamed or split over devices.

``plan_runner(runner, files, config, backend, numerics)`` compiles the model of a plain step
runner (its definition and weights), refuses a plan this build cannot run (a CUDA device;
weights streamed to a non-CPU device) before touching anything, and builds the runner the
engine core then uses (``PlannedRunner``); ``poot.LLM`` asks for it, and this module never
sees the ``LLM``:

- direct path (one resident segment): the runner keeps its plans and the runtime of that
  segment's device (the LLM's own, or a new one that takes over with the KV pool); each run
  only leases the step's activation bytes from the ledger and records its spans (per layer
  and op kind from the CPU runtime's span recorder, ``op_spans``; one step span on a runtime
  without one) and the ledger's bytes in use (no segmenting, loader or buffer);
- streaming (one streamed CPU segment): the runner's plans become ``SegmentedPlan``s run by
  ``StreamingRuntime``;
- split (segments on several devices, e.g. CPU + wgpu): ``SplitPlan``s run by ``SplitRuntime``,
  each device with its own runtime and the KV of its own layers.
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
    CudaRuntime,
    Graph,
    LateInput,
    Plan,
    Weights,
    WgpuRuntime,
)
from poot.checkpoints import ModelFiles
from poot.errors import BackendNotCompiledError, PlannerError
from poot.models.step import StepShape
from poot.planner.compiled import CompileConfig, CompiledModel, compile
from poot.planner.cost import Segment
from poot.planner.op_spans import run_spans
from poot.planner.simulate import Span
from poot.planner.split import Part, SplitPlan, SplitRuntime
from poot.planner.streaming import SegmentedPlan, StreamingRuntime
from poot.runner import StepRunner
from poot.runtimes import Runtime

__all__ = [
    "LeasedRuntime",
    "PlannedRunner",
    "SplitStepRunner",
    "StreamingStepRunner",
    "plan_runner",
]


@dataclass
class PlannedRunner:
    """What ``plan_runner`` builds.

    Attributes:
        runner: the step runner to run steps with (the given one on the direct path).
        runtime: the device runtime the model's steps run on (the given one, or the one of
            the device the whole model was placed on).
        backend: that runtime's kind (``"cpu"``, ``"wgpu"``, ``"vulkan"``).
        compiled: the plan.
    """

    runner: StepRunner
    runtime: Runtime
    backend: str
    compiled: CompiledModel


class LeasedRuntime:
    """A runtime whose every run leases its activation bytes and records its span."""

    def __init__(
        self,
        inner: CpuRuntime | WgpuRuntime,
        compiled: CompiledModel,
        activation_bytes: int,
        lane: str = "cpu",
    ) -> None:
        self.inner = inner
        self.compiled = compiled
        self.activation_bytes = activation_bytes
        self.name = inner.name
        self.lane = lane
        self.kv_entry_bytes = inner.kv_entry_bytes
        # The CPU runtime times each equation for the timeline's layer and op lanes.
        record = getattr(inner, "record_spans", None)
        if record is not None:
            record(True)
        self._units: dict[int, Any] = {}

    def supports(self, op: str) -> bool:
        return self.inner.supports(op)

    def configure_kv(self, **kw: int) -> None:
        self.inner.configure_kv(**kw)

    def prepare(self, graph: Graph, weights: Weights, limits: CompileLimits | None = None) -> Plan:
        return self.inner.prepare(graph, weights, limits)

    def run(
        self,
        plan: Plan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        c = self.compiled
        gen = c.generations.begin()
        try:
            with c.ledger.lease(host=self.activation_bytes, wait_s=c.config.stall_timeout_s):
                c.generations.check(gen)
                c.recorder.begin_step(held=_in_use(c))
                t0 = time.perf_counter()
                out = self.inner.run(plan, inputs, timeout_s, late)
                t1 = time.perf_counter()
                spans = run_spans(self.inner, plan, t0, self.lane, self._units)
                for s in spans or [Span(self.lane, "step", t0, t1)]:
                    c.recorder.span(s.lane, s.label, s.start, s.end, s.kind)
                return out
        finally:
            c.generations.end(gen)
            c.recorder.sample(_in_use(c))

    def memory(self) -> dict[str, int]:
        return self.inner.memory()

    def health(self) -> dict[str, str | None]:
        return self.inner.health()


class StreamingStepRunner(StepRunner):
    """A ``StepRunner`` whose plans are chunked and streamed (``StreamingRuntime``)."""

    runtime: StreamingRuntime  # type: ignore[assignment]

    def __init__(self, *args: Any, compiled: CompiledModel, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.compiled = compiled
        seg = next(s for s in compiled.placement.segments if s.streamed)
        self.chunks = list(seg.chunks)
        self.labels = _chunk_labels(compiled, seg.chunks)

    def _prepare(self, shape: StepShape) -> Plan:
        plan: SegmentedPlan = self.runtime.prepare(shape, self.chunks, self.labels)
        return plan  # type: ignore[return-value]


class SplitStepRunner(StepRunner):
    """A ``StepRunner`` whose plans run over several devices (``SplitRuntime``)."""

    runtime: SplitRuntime  # type: ignore[assignment]

    def _prepare(self, shape: StepShape) -> Plan:
        plan: SplitPlan = self.runtime.prepare(shape)
        return plan  # type: ignore[return-value]


def _layers(compiled: CompiledModel, start: int, end: int) -> tuple[int, int]:
    """The model layers in units ``[start, end)``: (first, count)."""
    n = compiled.stats.n_layers
    first = max(0, start - 1)
    return first, max(0, min(n, end - 1) - first)


@dataclass
class _Base:
    """The plain runner's setting that the planned runner inherits."""

    runner: StepRunner
    files: ModelFiles
    backend: str
    numerics: str

    @property
    def runtime(self) -> Any:
        return self.runner.runtime


def _runtime_for(base: _Base, compiled: CompiledModel, key: str) -> Any:
    """The runtime a plan's device runs on: the base runner's where it is that device's kind."""
    p = compiled.profiles[key]
    if p.kind == base.backend:
        return base.runtime
    if p.kind == "cpu":
        return CpuRuntime(None, base.numerics)  # type: ignore[arg-type]
    api = "vulkan" if p.kind == "vulkan" else "wgpu"
    rt = WgpuRuntime(base.runner.timeout_s, numerics=base.numerics, api=api)  # type: ignore[arg-type]
    opened = rt.adapter.get("name")
    if opened != p.name:
        raise PlannerError(
            f"the plan places work on {key} ({p.name}) but the wgpu runtime opens {opened!r}",
            reasons={key: f"the wgpu runtime opens {opened!r}"},
        )
    return rt


def _check_runnable(compiled: CompiledModel) -> None:
    """Refuses a plan this build cannot run, before anything is rewired."""
    for s in compiled.placement.segments:
        kind = compiled.profiles[s.device].kind
        if kind not in ("cpu", "wgpu", "vulkan"):
            raise BackendNotCompiledError(
                f"the plan places work on {s.device}, which this build cannot run yet "
                f"({compiled.placement.describe(compiled.stats)}); use "
                "CompileConfig(allow_gpu=False)",
                backend=kind,
            )
        if s.streamed and kind != "cpu":
            raise BackendNotCompiledError(
                f"the plan streams weights to {s.device}; streaming runs on the CPU only in this "
                f"build ({compiled.placement.describe(compiled.stats)}); raise "
                "device_budget_bytes or use CompileConfig(allow_gpu=False)",
                backend=kind,
            )


def plan_runner(
    runner: StepRunner, files: ModelFiles, config: CompileConfig, backend: str, numerics: str
) -> PlannedRunner:
    """Compiles ``runner``'s model under ``config`` and builds the runner that runs the plan:
    the direct path (one resident segment, on whichever device), streaming (one CPU segment)
    or a split over devices (``split``).

    Args:
        runner: the plain step runner (its runtime, KV pool and limits are the model's).
        files: the model's checkpoint files.
        config: what the planner may use.
        backend: the kind of ``runner``'s runtime.
        numerics: the resolved numerics (``"ggml"`` or ``"exact"``).
    """
    base = _Base(runner, files, backend, numerics)
    old = runner
    # The KV pool every device holds (for its own layers) is the runner's: its blocks, with
    # each device kind's KV element, as each runtime kind states it (the base runtime's own).
    positions = old.pool_blocks * old.block_size
    entries = {
        "cpu": CpuRuntime.kv_entry_bytes_for(numerics),
        "wgpu": WgpuRuntime.kv_entry_bytes_for(numerics),
        "vulkan": WgpuRuntime.kv_entry_bytes_for(numerics),
        "cuda": CudaRuntime.kv_entry_bytes_for(numerics),
    }
    entries[backend] = int(old.runtime.kv_entry_bytes)
    compiled = compile(
        files, config, definition=old.definition, weights=old.weights,
        kv_pool=(positions, entries),
    )  # fmt: skip
    _check_runnable(compiled)
    act = 4 * old.max_step_tokens * files.hparams.hidden_size * 2
    segments = compiled.placement.segments
    runtimes = {s.device: _runtime_for(base, compiled, s.device) for s in segments}
    n_layers, n_kv_heads, head_dim = old.definition.kv_shape
    kv = dict(n_kv_heads=n_kv_heads, head_dim=head_dim, block_size=old.block_size)
    kv["num_blocks"] = old.pool_blocks
    common = dict(
        block_size=old.block_size, pool_blocks=old.pool_blocks,
        max_step_tokens=old.max_step_tokens, trace_limits=old.trace_limits,
        compile_limits=old.compile_limits, timeout_s=old.timeout_s,
    )  # fmt: skip
    if compiled.direct:
        rt = runtimes[segments[0].device]
        kind = backend
        if rt is not base.runtime:
            # The whole model on another device: its runtime takes over (with the KV pool).
            rt.configure_kv(n_layers=n_layers, **kv)
            kind = compiled.profiles[segments[0].device].kind
        old.runtime = LeasedRuntime(rt, compiled, act, segments[0].device)
        return PlannedRunner(old, rt, kind, compiled)
    if len(segments) == 1:
        assert compiled.spill_dir is not None
        runtime = _streaming(base, compiled, segments[0], act, 0)
        streaming = StreamingStepRunner(
            old.definition, old.weights, runtime, compiled=compiled,
            **common,  # type: ignore[arg-type]
        )  # fmt: skip
        return PlannedRunner(streaming, base.runtime, backend, compiled)
    parts = []
    units = compiled.stats.units
    for s in segments:
        first, count = _layers(compiled, s.start, s.end)
        label = units[s.start].name + ("" if s.end - s.start == 1 else f"..{units[s.end - 1].name}")
        part = Part(s.device, s.start, s.end, runtimes[s.device], (first, count), label=label)
        if s.streamed:
            part.streaming = _streaming(base, compiled, s, act, first, runtimes[s.device])
            part.chunks = s.chunks
            part.labels = tuple(_chunk_labels(compiled, s.chunks))
        parts.append(part)
    split = SplitRuntime(
        parts, old.definition, old.weights, compiled.ledger, compiled.generations,
        trace_limits=old.trace_limits, compile_limits=old.compile_limits,
        recorder=compiled.recorder, activation_bytes=act, stall_timeout_s=config.stall_timeout_s,
    )  # fmt: skip
    planned = SplitStepRunner(
        old.definition, old.weights, split, **common,  # type: ignore[arg-type]
    )  # fmt: skip
    return PlannedRunner(planned, base.runtime, backend, compiled)


def _chunk_labels(compiled: CompiledModel, chunks: tuple[tuple[int, int], ...]) -> list[str]:
    units = compiled.stats.units
    return [
        units[a].name if b - a == 1 else f"{units[a].name}..{units[b - 1].name}" for a, b in chunks
    ]


def _streaming(
    base: _Base,
    compiled: CompiledModel,
    segment: Segment,
    act: int,
    kv_base: int,
    inner: CpuRuntime | WgpuRuntime | None = None,
) -> StreamingRuntime:
    assert compiled.spill_dir is not None
    old = base.runner
    return StreamingRuntime(
        inner or base.runtime, old.definition, old.weights,
        {t.name: t for t in base.files.tensors()}, compiled.ledger, compiled.generations,
        compiled.spill_dir, stall_timeout_s=compiled.config.stall_timeout_s,
        trace_limits=old.trace_limits, compile_limits=old.compile_limits,
        recorder=compiled.recorder, activation_bytes=act, kv_base=kv_base, lane=segment.device,
    )  # fmt: skip


def _in_use(c: CompiledModel) -> int:
    """Bytes the compiled model's ledger holds now (device pools and host)."""
    snap = c.ledger.snapshot()
    return int(snap["device"]["used"] or 0) + int(snap["host"]["used"] or 0)
