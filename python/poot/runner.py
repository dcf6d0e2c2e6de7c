"""Runs step graphs: a plan cache by step shape and the step inputs of each step.

Scheduling and KV block allocation live in Rust (``poot._native.Scheduler``, poot-engine):
``run_plan`` runs one of its ``StepPlan``s. The contract with a model definition is
``poot.models.step``.

Invariants:
    - Every step is a legal chunk: at most ``max_step_tokens`` tokens, and no more than the
      trace limits allow, so no trace is ever refused for its length.
    - Plans are cached by ``StepShape``: tokens, sequences and block-table width are rounded up
      to powers of two (padding tokens write no KV: slot -1), so a long generation compiles a
      handful of plans, not one per length. The cache (``poot.prepared.PreparedCache``) is
      bounded by plan count and by the plans' ``artifact_bytes``, evicting LRU or refusing.
    - A ``sample`` step reads back only token ids; full logits cross to the host only from a
      ``logits`` step, which only ``LLM.logits`` runs.
    - The runtime's KV pool holds ``num_blocks + 1`` blocks: block 0 is the scheduler's reserved
      null block (padding table entries point at it; padding tokens write no KV).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from poot._native import (
    CompileLimits,
    CpuRuntime,
    Plan,
    StepPlan,
    TraceLimits,
    Tracer,
    Weights,
    WgpuRuntime,
)
from poot.models.llama import LlamaModel
from poot.models.step import StepKind, StepShape
from poot.prepared import PreparedCache, PreparedPolicy

__all__ = ["SamplingRows", "StepRunner", "next_pow2"]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass
class SamplingRows:
    """The sampling inputs of a step, one value per row (``run_plan``)."""

    temperature: Sequence[float]
    top_k: Sequence[int]
    top_p: Sequence[float]
    uniform: Sequence[float]


class StepRunner:
    """Traces, compiles (cached by shape) and runs step graphs for one model on one runtime.

    Args:
        definition: the model definition.
        weights: the checkpoint's weights.
        runtime: the runtime; its KV pool is configured here.
        block_size: tokens per KV block.
        num_blocks: usable blocks in the KV pool (the runtime gets one more, the null block 0).
        max_step_tokens: most tokens in one step.
        trace_limits, compile_limits: budgets for tracing and compiling each plan.
        max_plans: plans kept in the cache (prepared entries).
        max_plan_bytes: bytes kept in the cache, summed over plans' ``artifact_bytes``.
        plan_policy: ``"evict"`` (LRU) or ``"refuse"`` (``PreparedEntryLimitError``) when full.
        timeout_s: the deadline of each run.
    """

    def __init__(
        self,
        definition: LlamaModel,
        weights: Weights,
        runtime: CpuRuntime | WgpuRuntime,
        *,
        block_size: int,
        num_blocks: int,
        max_step_tokens: int,
        trace_limits: TraceLimits,
        compile_limits: CompileLimits,
        max_plans: int = 64,
        max_plan_bytes: int = 1 << 30,
        plan_policy: PreparedPolicy = "evict",
        timeout_s: float = 600.0,
    ) -> None:
        self.definition = definition
        self.weights = weights
        self.runtime = runtime
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_step_tokens = max_step_tokens
        self.trace_limits = trace_limits
        self.compile_limits = compile_limits
        self.timeout_s = timeout_s
        self.plans: PreparedCache[StepShape, Plan] = PreparedCache(
            max_plans, max_plan_bytes, plan_policy
        )
        n_layers, n_kv_heads, head_dim = definition.kv_shape
        runtime.configure_kv(
            n_layers=n_layers,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            num_blocks=num_blocks + 1,
        )

    @property
    def cached_plans(self) -> list[StepShape]:
        """Shapes with a compiled plan, least recently used first."""
        return self.plans.keys()

    def plan(self, shape: StepShape) -> Plan:
        """The compiled plan for ``shape``, traced and compiled on first use."""
        return self.plans.get_or_prepare(shape, self._prepare)

    def _prepare(self, shape: StepShape) -> Plan:
        tracer = Tracer(self.weights, shape.tokens, self.trace_limits)
        self.definition.trace(tracer, shape)
        graph = tracer.finish()
        return self.runtime.compile(graph, self.weights, self.compile_limits)

    def run_plan(
        self, plan: StepPlan, kind: StepKind = "sample", sampling: SamplingRows | None = None
    ) -> npt.NDArray[np.generic]:
        """Runs one scheduler step (rows in plan order).

        Args:
            plan: the scheduler's plan (not empty).
            kind: ``"sample"`` or ``"logits"``.
            sampling: per-row sampling inputs; None samples greedily.

        Returns:
            ``sample``: each row's sampled token id (int32 [rows]); ``logits``: each row's
            last-token logits (float32 [rows, vocab]).
        """
        rows = plan.num_seqs
        if rows == 0:
            raise ValueError("a step needs at least one sequence")
        n = plan.num_tokens
        shape = StepShape(
            min(next_pow2(n), max(self.max_step_tokens, n)),
            next_pow2(rows),
            next_pow2(plan.max_blocks),
            kind,
        )
        inputs: dict[str, npt.NDArray[np.generic]] = dict(
            plan.flatten(shape.tokens, shape.seqs, shape.max_blocks)
        )
        if sampling is None:
            sampling = SamplingRows([0.0] * rows, [0] * rows, [1.0] * rows, [0.0] * rows)
        return self._execute(shape, inputs, kind, sampling)

    def _execute(
        self,
        shape: StepShape,
        inputs: dict[str, npt.NDArray[np.generic]],
        kind: StepKind,
        sampling: SamplingRows,
    ) -> npt.NDArray[np.generic]:
        s = shape.seqs
        rows = len(sampling.uniform)
        if kind == "sample":
            temperature = np.zeros(s, np.float32)
            top_k = np.zeros(s, np.int32)
            top_p = np.ones(s, np.float32)
            uniform = np.zeros(s, np.float32)
            temperature[:rows] = sampling.temperature
            top_k[:rows] = sampling.top_k
            top_p[:rows] = sampling.top_p
            uniform[:rows] = sampling.uniform
            inputs.update(temperature=temperature, top_k=top_k, top_p=top_p, uniform=uniform)
        out = self.runtime.run(self.plan(shape), inputs, self.timeout_s)
        if kind == "sample":
            return out["token_ids"][:rows]
        return out["logits"][:rows]
