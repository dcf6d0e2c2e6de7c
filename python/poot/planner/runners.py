"""How a ``CompiledModel`` runs inside ``poot.LLM``: direct, streamed or split over devices.

``attach(llm, config)`` compiles the LLM's own model (its definition and weights), refuses a
plan this build cannot run (a CUDA device; weights streamed to a non-CPU device) before
touching anything, and rewires its step runner:

- direct path (one resident segment): the runner keeps its plans and the runtime of that
  segment's device (the LLM's own, or a new one that takes over with the KV pool); each run
  only leases the step's activation bytes from the ledger and records one span (a lock and an
  append: no segmenting, loader or buffer);
- streaming (one streamed CPU segment): the runner's plans become ``SegmentedPlan``s run by
  ``StreamingRuntime``;
- split (segments on several devices, e.g. CPU + wgpu): ``SplitPlan``s run by ``SplitRuntime``,
  each device with its own runtime and the KV of its own layers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from poot._native import CompileLimits, CpuRuntime, Graph, LateInput, Plan, Weights, WgpuRuntime
from poot.errors import BackendNotCompiledError, PlannerError
from poot.models.step import StepShape
from poot.planner.compiled import CompileConfig, CompiledModel, compile
from poot.planner.cost import Segment
from poot.planner.split import Part, SplitPlan, SplitRuntime
from poot.planner.streaming import SegmentedPlan, StreamingRuntime
from poot.runner import StepRunner

if TYPE_CHECKING:
    from poot.llm import LLM

__all__ = ["LeasedRuntime", "SplitStepRunner", "StreamingStepRunner", "attach"]


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

    def configure_kv(self, **kw: int) -> None:
        self.inner.configure_kv(**kw)

    def compile(self, graph: Graph, weights: Weights, limits: CompileLimits | None = None) -> Plan:
        return self.inner.compile(graph, weights, limits)

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
                c.recorder.begin_step()
                t0 = time.perf_counter()
                out = self.inner.run(plan, inputs, timeout_s, late)
                c.recorder.span(self.lane, "step", t0, time.perf_counter())
                return out
        finally:
            c.generations.end(gen)

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


def _runtime_for(llm: LLM, compiled: CompiledModel, key: str) -> CpuRuntime | WgpuRuntime:
    """The runtime a plan's device runs on: the LLM's own where it is that device's kind."""
    p = compiled.profiles[key]
    if p.kind == llm.backend:
        return llm.runtime
    if p.kind == "cpu":
        return CpuRuntime(None, llm.numerics)
    rt = WgpuRuntime(llm.runner.timeout_s, numerics=llm.numerics)
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
        if kind not in ("cpu", "wgpu"):
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


def attach(llm: LLM, config: CompileConfig) -> CompiledModel:
    """Compiles ``llm``'s model under ``config`` and rewires ``llm.runner`` to run the plan:
    the direct path (one resident segment, on whichever device), streaming (one CPU segment)
    or a split over devices (``split``)."""
    old = llm.runner
    # The KV pool every device holds (for its own layers) is the LLM's: its blocks, f16 entries
    # on a CPU in ggml numerics, f32 elsewhere.
    positions = (old.num_blocks + 1) * old.block_size
    entries = {"cpu": 2 if llm.numerics == "ggml" else 4, "wgpu": 4}
    compiled = compile(
        llm.files, config, definition=llm.definition, weights=llm.weights,
        kv_pool=(positions, entries),
    )  # fmt: skip
    _check_runnable(compiled)
    act = 4 * old.max_step_tokens * llm.files.hparams.hidden_size * 2
    segments = compiled.placement.segments
    runtimes = {s.device: _runtime_for(llm, compiled, s.device) for s in segments}
    n_layers, n_kv_heads, head_dim = llm.definition.kv_shape
    kv = dict(n_kv_heads=n_kv_heads, head_dim=head_dim, block_size=old.block_size)
    kv["num_blocks"] = old.num_blocks + 1
    common = dict(
        block_size=old.block_size, num_blocks=old.num_blocks,
        max_step_tokens=old.max_step_tokens, trace_limits=old.trace_limits,
        compile_limits=old.compile_limits, timeout_s=old.timeout_s,
    )  # fmt: skip
    if compiled.direct:
        rt = runtimes[segments[0].device]
        if rt is not llm.runtime:
            # The whole model on another device: its runtime takes over (with the KV pool).
            rt.configure_kv(n_layers=n_layers, **kv)
            llm.runtime = rt
            llm.backend = compiled.profiles[segments[0].device].kind  # type: ignore[assignment]
        old.runtime = LeasedRuntime(rt, compiled, act, segments[0].device)  # type: ignore[assignment]
        return compiled
    if len(segments) == 1:
        assert compiled.spill_dir is not None
        runtime = _streaming(llm, compiled, segments[0], act, 0)
        llm.runner = StreamingStepRunner(
            llm.definition, llm.weights, runtime, compiled=compiled,  # type: ignore[arg-type]
            **common,  # type: ignore[arg-type]
        )  # fmt: skip
        return compiled
    parts = []
    units = compiled.stats.units
    for s in segments:
        first, count = _layers(compiled, s.start, s.end)
        label = units[s.start].name + ("" if s.end - s.start == 1 else f"..{units[s.end - 1].name}")
        part = Part(s.device, s.start, s.end, runtimes[s.device], (first, count), label=label)
        if s.streamed:
            part.streaming = _streaming(llm, compiled, s, act, first, runtimes[s.device])
            part.chunks = s.chunks
            part.labels = tuple(_chunk_labels(compiled, s.chunks))
        parts.append(part)
    split = SplitRuntime(
        parts, llm.definition, llm.weights, compiled.ledger, compiled.generations,
        trace_limits=old.trace_limits, compile_limits=old.compile_limits,
        recorder=compiled.recorder, activation_bytes=act, stall_timeout_s=config.stall_timeout_s,
    )  # fmt: skip
    llm.runner = SplitStepRunner(
        llm.definition, llm.weights, split, **common,  # type: ignore[arg-type]
    )  # fmt: skip
    return compiled


def _chunk_labels(compiled: CompiledModel, chunks: tuple[tuple[int, int], ...]) -> list[str]:
    units = compiled.stats.units
    return [
        units[a].name if b - a == 1 else f"{units[a].name}..{units[b - 1].name}" for a, b in chunks
    ]


def _streaming(
    llm: LLM,
    compiled: CompiledModel,
    segment: Segment,
    act: int,
    kv_base: int,
    inner: CpuRuntime | WgpuRuntime | None = None,
) -> StreamingRuntime:
    assert compiled.spill_dir is not None
    old = llm.runner
    return StreamingRuntime(
        inner or llm.runtime, llm.definition, llm.weights,
        {t.name: t for t in llm.files.tensors()}, compiled.ledger, compiled.generations,
        compiled.spill_dir, stall_timeout_s=compiled.config.stall_timeout_s,
        trace_limits=old.trace_limits, compile_limits=old.compile_limits,
        recorder=compiled.recorder, activation_bytes=act, kv_base=kv_base, lane=segment.device,
    )  # fmt: skip
