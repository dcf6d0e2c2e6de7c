"""How a ``CompiledModel`` runs inside ``poot.LLM``: the direct path or the streaming runner.

``attach(llm, config)`` compiles the LLM's own model (its definition and weights) and rewires its
step runner:

- direct path (one resident segment): the runner keeps its plans and its CPU runtime; each run
  only leases the step's activation bytes from the ledger and records one span (a lock and an
  append: no segmenting, loader or buffer);
- streaming: the runner's plans become ``SegmentedPlan``s run by ``StreamingRuntime``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from poot._native import CompileLimits, CpuRuntime, Graph, LateInput, Plan, Weights, WgpuRuntime
from poot.errors import BackendNotCompiledError
from poot.models.step import StepShape
from poot.planner.compiled import CompileConfig, CompiledModel, compile
from poot.planner.streaming import SegmentedPlan, StreamingRuntime
from poot.runner import StepRunner

if TYPE_CHECKING:
    from poot.llm import LLM

__all__ = ["LeasedRuntime", "StreamingStepRunner", "attach"]


class LeasedRuntime:
    """A runtime whose every run leases its activation bytes and records its span."""

    def __init__(
        self, inner: CpuRuntime | WgpuRuntime, compiled: CompiledModel, activation_bytes: int
    ) -> None:
        self.inner = inner
        self.compiled = compiled
        self.activation_bytes = activation_bytes
        self.name = inner.name

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
                c.recorder.span("cpu", "step", t0, time.perf_counter())
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
        units = compiled.stats.units
        self.labels = [
            units[a].name if b - a == 1 else f"{units[a].name}..{units[b - 1].name}"
            for a, b in self.chunks
        ]

    def _prepare(self, shape: StepShape) -> Plan:
        plan: SegmentedPlan = self.runtime.prepare(shape, self.chunks, self.labels)
        return plan  # type: ignore[return-value]


def attach(llm: LLM, config: CompileConfig) -> CompiledModel:
    """Compiles ``llm``'s model under ``config`` and rewires ``llm.runner`` to run the plan."""
    compiled = compile(llm.files, config, definition=llm.definition, weights=llm.weights)
    old = llm.runner
    act = 4 * old.max_step_tokens * llm.files.hparams.hidden_size * 2
    others = [d for d in compiled.placement.devices if d != "cpu"]
    if others:
        # Only the CPU runtime is wired to the runner in this build; never run a plan elsewhere
        # than where it says.
        raise BackendNotCompiledError(
            f"the plan places work on {', '.join(others)}, which this build cannot run yet "
            f"({compiled.placement.describe(compiled.stats)}); use CompileConfig(allow_gpu=False)",
            backend=compiled.profiles[others[0]].kind,
        )
    if compiled.streams:
        assert compiled.spill_dir is not None
        runtime = StreamingRuntime(
            llm.runtime, llm.definition, llm.weights, {t.name: t for t in llm.files.tensors()},
            compiled.ledger, compiled.generations, compiled.spill_dir,
            stall_timeout_s=config.stall_timeout_s, trace_limits=old.trace_limits,
            compile_limits=old.compile_limits, recorder=compiled.recorder, activation_bytes=act,
        )  # fmt: skip
        llm.runner = StreamingStepRunner(
            llm.definition, llm.weights, runtime,  # type: ignore[arg-type]
            block_size=old.block_size, num_blocks=old.num_blocks,
            max_step_tokens=old.max_step_tokens, trace_limits=old.trace_limits,
            compile_limits=old.compile_limits, timeout_s=old.timeout_s, compiled=compiled,
        )  # fmt: skip
    else:
        old.runtime = LeasedRuntime(llm.runtime, compiled, act)  # type: ignore[assignment]
    return compiled
