"""Runs step graphs: a plan cache by step shape and the step inputs of each step.

Scheduling and KV block allocation live in Rust (``poot._native.Scheduler``, poot-engine):
``run_plan`` runs one ``SchedulerOutput`` (the scheduler's step, already laid out as the step
graph's inputs at its padded dims). The contract with a model definition is
``poot.models.step``. Most steps do not pass through here: the step driver
(``poot._native.StepDriver``) runs them in one call, full logits, prompt logprobs and split
sampling included, asking this runner only for a plan on a miss (``plan``, ``head_plan``);
this runner runs the steps the driver leaves unrun (``fast=False``, or a split step with no
host runtime), with sampling inputs the driver laid out.

Invariants:
    - Every step is a legal chunk: at most ``max_step_tokens`` tokens, and no more than the
      trace limits allow, so no trace is ever refused for its length.
    - Plans are cached by ``StepShape``, whose dims are the scheduler's padded ones
      (``poot_engine::StepDims::padded``: powers of two, padding tokens write no KV: slot -1),
      so a long generation compiles a handful of plans, not one per length. The cache
      (``poot.prepared.PreparedCache``) is bounded by plan count and by the plans'
      ``artifact_bytes``, evicting LRU or refusing.
    - A ``sample`` step reads back only token ids (and, when a row asks, the logprobs of the
      chosen token and the top 20); full logits cross to the host only from a ``logits``
      step, which only ``LLM.logits`` runs, and from an ``all_logits`` step, which the
      engine runs only for steps holding a prefill chunk of a request that asked for
      prompt logprobs.
    - Sampling features shape the plan: the adjust width (rounded up to a power of two, at
      least 16), whether a token mask is taken, whether logprobs are output. A step without
      them runs the plain plan.
    - The token mask is a late input: ``run_plan`` starts the run on a worker thread and
      computes the mask (``mask_rows``) meanwhile; if computing it fails, the slot is failed,
      the run ends with an error and the mask's own exception is raised.
    - A runtime without the logit ops (``runtime.supports("adjust_logits")`` is False, as on
      CUDA and on wgpu without ``shader-f64``) runs such a step split: the
      forward pass as a ``logits`` plan on the device (the mask computed meanwhile), then the
      sampling step as a small plan on a host CPU runtime with the same semantics. Plain steps
      (no adjust, mask or logprobs) still sample on the device.
    - The runtime's KV pool holds ``pool_blocks`` blocks, as the scheduler counts them
      (``Scheduler.pool_blocks``: the usable ones and the reserved null block 0, which padding
      table entries point at; padding tokens write no KV). With a window group
      (``LlamaModel.with_window_group``) its last ``kv_windowed_layers`` layers hold
      ``window_pool_blocks`` (``Scheduler.window_pool_blocks``) instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from poot._native import (
    CompileLimits,
    CpuRuntime,
    LateInput,
    Plan,
    TraceLimits,
    Tracer,
    Weights,
)
from poot.models.llama import LlamaModel
from poot.models.step import MASK_INPUT, StepKind, StepShape, trace_head
from poot.prepared import PreparedCache, PreparedPolicy
from poot.progress import polled_bar
from poot.runtimes import Runtime
from poot.sampling import MAX_LOGPROBS

__all__ = [
    "LOGPROB_WIDTH",
    "SamplingRows",
    "SchedulerOutput",
    "StepResult",
    "StepRunner",
    "next_pow2",
]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class SchedulerOutput:
    """One step as the scheduler planned it (``Scheduler.schedule``), rows in plan order:
    decode rows first, then prefill chunks.

    Attributes:
        request_ids: each row's request.
        row_tokens: tokens each row computes.
        sample: whether each row's last token is sampled.
        preempted: requests preempted while planning (their KV freed; they recompute).
        num_tokens: tokens across all rows.
        num_cached_tokens: tokens taken from the prefix cache instead of computed.
        dims: ``(tokens, seqs, max_blocks)`` the step's graph is compiled for (padded).
        inputs: the step graph's int32 inputs at ``dims`` (``poot.models.step``).
    """

    request_ids: list[int]
    row_tokens: list[int]
    sample: list[bool]
    preempted: list[int]
    num_tokens: int
    num_cached_tokens: int
    dims: tuple[int, int, int]
    inputs: dict[str, npt.NDArray[np.int32]]

    @property
    def num_seqs(self) -> int:
        """Rows."""
        return len(self.request_ids)


@dataclass
class SamplingRows:
    """The sampling inputs of a step (``run_plan``), laid out by the step driver
    (``poot._native.StepDriver``, which keeps each request's sampling state).

    Attributes:
        inputs: the sampling step's inputs at the step's padded rows: ``temperature``,
            ``top_k``, ``top_p``, ``min_p``, ``uniform``; with ``adjust``, also ``adj_ids``,
            ``adj_counts``, ``adj_bias``, ``repetition``, ``presence``, ``frequency``.
        adjust: the plan's adjust width (0: no adjust inputs).
        mask_rows: ``(row, matcher)`` for rows whose mask guidance fills; with ``fill_mask``.
        fill_mask: computes the step's token mask [seqs, ceil(vocab/32)] for ``mask_rows``.
        logprobs: whether any row wants logprobs.
    """

    inputs: dict[str, npt.NDArray[np.generic]]
    adjust: int = 0
    mask_rows: Sequence[tuple[int, Any]] = ()
    fill_mask: Callable[[Sequence[tuple[int, Any]], int], npt.NDArray[np.int32]] | None = None
    logprobs: bool = False

    @classmethod
    def greedy(cls, seqs: int) -> SamplingRows:
        """Every one of ``seqs`` rows greedy."""
        zeros = np.zeros(seqs, np.float32)
        return cls(
            {
                "temperature": zeros,
                "top_k": np.zeros(seqs, np.int32),
                "top_p": np.ones(seqs, np.float32),
                "min_p": zeros,
                "uniform": zeros,
            }
        )


@dataclass
class StepResult:
    """What a ``sample`` step brings back, rows in plan order.

    Attributes:
        token_ids: int32 [rows]; -1 where a row's logits were not finite.
        logprob_ids: int32 [rows, 1 + LOGPROB_WIDTH] (chosen, then the most likely), or None.
        logprobs: float32, the same shape, or None.
    """

    token_ids: npt.NDArray[np.int32]
    logprob_ids: npt.NDArray[np.int32] | None = None
    logprobs: npt.NDArray[np.float32] | None = None


class StepRunner:
    """Traces, compiles (cached by shape) and runs step graphs for one model on one runtime.

    Args:
        definition: the model definition.
        weights: the checkpoint's weights.
        runtime: the runtime; its KV pool is configured here.
        block_size: tokens per KV block.
        pool_blocks: blocks in the runtime's KV pool (``Scheduler.pool_blocks``: the usable
            ones and the null block 0).
        window_pool_blocks: blocks of each windowed layer's pool when the definition has a
            window group (``Scheduler.window_pool_blocks``); 0 otherwise.
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
        runtime: Runtime,
        *,
        block_size: int,
        pool_blocks: int,
        max_step_tokens: int,
        window_pool_blocks: int = 0,
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
        self.pool_blocks = pool_blocks
        self.max_step_tokens = max_step_tokens
        self.trace_limits = trace_limits
        self.compile_limits = compile_limits
        self.timeout_s = timeout_s
        self.plans: PreparedCache[StepShape, Plan] = PreparedCache(
            max_plans, max_plan_bytes, plan_policy
        )
        # Runs steps whose token mask is computed meanwhile (started on first use).
        self._pool: ThreadPoolExecutor | None = None
        # Split steps (see the module docs): the host runtime and its sampling-step plans.
        self._host: CpuRuntime | None = None
        self._heads: dict[tuple[int, int, int, bool, int], Plan] = {}
        self.samples_on_device = all(runtime.supports(op) for op in LOGIT_OPS)
        n_layers, n_kv_heads, head_dim = definition.kv_shape
        self.window_pool_blocks = window_pool_blocks
        windowed = definition.kv_windowed_layers
        if windowed > 0 and window_pool_blocks < 2:
            raise ValueError(
                "a window group needs window_pool_blocks >= 2 (the null block and one)"
            )
        # Only a window group passes the group's shape (Python runtimes need not know it).
        group = {"windowed_layers": windowed, "windowed_blocks": window_pool_blocks}
        runtime.configure_kv(
            n_layers=n_layers,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            num_blocks=pool_blocks,
            **(group if windowed > 0 else {}),
        )

    @property
    def cached_plans(self) -> list[StepShape]:
        """Shapes with a compiled plan, least recently used first."""
        return self.plans.keys()

    def plan(self, shape: StepShape) -> Plan:
        """The compiled plan for ``shape``, traced and compiled on first use."""
        return self.plans.get_or_prepare(shape, self._prepare)

    def prepare_weights(self, *, progress: bool = True, file: TextIO | None = None) -> None:
        """Compiles the one-token step once, outside the plan cache, and drops the plan.

        A runtime's first compile prepares every weight it reads (the CPU runtime's copies to
        huge pages and 8-row re-lays, kept per weight store and shared by later plans), which a
        model's first request would otherwise pay: seconds for a 2.4 GB F16 model. llama.cpp
        warms up at load likewise. The plan cache's counts and bytes are untouched.

        Args:
            progress: draw a bar of the bytes prepared (``poot.progress.polled_bar``) where
                the runtime reports them (the CPU runtime's ``weight_progress``), on a
                terminal, once the work has taken half a second.
            file: where the bar goes (default stderr); a file given here gets it whatever
                the time taken (tests read it).
        """
        # The planner's direct path wraps the runtime (``LeasedRuntime.inner``).
        rt = getattr(self.runtime, "inner", self.runtime)
        poll = getattr(rt, "weight_progress", None)
        if not progress or poll is None:
            self._prepare(StepShape(1, 1, 1))
            return
        desc = "prepare weights"
        if file is None:
            bar = polled_bar(poll, desc=desc)
        else:
            bar = polled_bar(poll, desc=desc, file=file, disable=False, delay=0.0)
        with bar:
            self._prepare(StepShape(1, 1, 1))

    def _prepare(self, shape: StepShape) -> Plan:
        tracer = Tracer(self.weights, shape.tokens, self.trace_limits)
        self.definition.trace(tracer, shape)
        graph = tracer.finish()
        return self.runtime.prepare(graph, self.weights, self.compile_limits)

    def run_plan(
        self, plan: SchedulerOutput, kind: StepKind = "sample", sampling: SamplingRows | None = None
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
        if kind == "logits":
            return self._run(plan, "logits", None).logits_out
        return self.run_sample(plan, sampling).token_ids

    def run_sample(self, plan: SchedulerOutput, sampling: SamplingRows | None) -> StepResult:
        """Runs one ``sample`` step; see ``StepResult``."""
        return self._run(plan, "sample", sampling).result

    def run_all_logits(
        self, plan: SchedulerOutput, sampling: SamplingRows | None
    ) -> tuple[StepResult, npt.NDArray[np.float32]]:
        """Runs one ``all_logits`` step: the ``sample`` step's result, and every token's
        logits (float32 [plan.num_tokens, vocab], tokens in plan order)."""
        out = self._run(plan, "all_logits", sampling)
        return out.result, out.out["all_logits"][: plan.num_tokens]

    def _run(
        self, plan: SchedulerOutput, kind: StepKind, sampling: SamplingRows | None
    ) -> _Outputs:
        rows = plan.num_seqs
        if rows == 0:
            raise ValueError("a step needs at least one sequence")
        tokens, seqs, max_blocks = plan.dims
        if sampling is None:
            sampling = SamplingRows.greedy(seqs)
        sample = kind != "logits"
        shape = StepShape(
            tokens,
            seqs,
            max_blocks,
            kind,
            adjust=sampling.adjust if sample else 0,
            masked=sample and bool(sampling.mask_rows),
            logprobs=LOGPROB_WIDTH if sample and sampling.logprobs else 0,
        )
        inputs: dict[str, npt.NDArray[np.generic]] = dict(plan.inputs)
        if sample:
            inputs.update(sampling.inputs)
        if sample and _has_logit_ops(shape) and not self.samples_on_device:
            return self._run_split(plan, shape, inputs, sampling)
        prepared = self.plan(shape)
        if not shape.masked:
            out = self.runtime.run(prepared, inputs, self.timeout_s)
        else:
            out = self._run_with_mask(prepared, inputs, shape, sampling)
        return _Outputs(out, rows)

    def _run_split(
        self,
        plan: SchedulerOutput,
        shape: StepShape,
        inputs: dict[str, npt.NDArray[np.generic]],
        sampling: SamplingRows,
    ) -> _Outputs:
        """The forward pass on the device, the sampling step on a host CPU runtime."""
        head_names = {"temperature", "top_k", "top_p", "min_p", "uniform", "adj_ids"}
        head_names |= {"adj_counts", "adj_bias", "repetition", "presence", "frequency"}
        head_inputs = {k: inputs.pop(k) for k in list(inputs) if k in head_names}
        # An all_logits step keeps its kind (and its plain sampling, unused): the forward
        # brings back every token's logits and the head samples the last rows on the host.
        every = shape.kind == "all_logits"
        if every:
            plain = ("temperature", "top_k", "top_p", "min_p", "uniform")
            inputs.update({k: head_inputs[k] for k in plain})
        forward = self.plan(
            replace(
                shape, kind="all_logits" if every else "logits", adjust=0, masked=False, logprobs=0
            )
        )
        if shape.masked:
            assert sampling.fill_mask is not None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="poot-step")
            future = self._pool.submit(self.runtime.run, forward, inputs, self.timeout_s)
            try:
                head_inputs[MASK_INPUT] = sampling.fill_mask(sampling.mask_rows, shape.seqs)
            except BaseException:
                future.exception()  # let the forward finish before the step is abandoned
                raise
            outs = future.result()
        else:
            outs = self.runtime.run(forward, inputs, self.timeout_s)
        if every:
            logits = outs["all_logits"][np.asarray(inputs["last_rows"], np.intp)]
        else:
            logits = outs["logits"]
        head_inputs["logits"] = np.ascontiguousarray(logits, np.float32)
        host, head = self._head(shape, int(logits.shape[1]))
        result = dict(host.run(head, head_inputs, self.timeout_s))
        if every:
            result["all_logits"] = outs["all_logits"]
        return _Outputs(result, plan.num_seqs)

    def _head(self, shape: StepShape, vocab: int) -> tuple[CpuRuntime, Plan]:
        """The host runtime and the sampling-step plan (logits as an input) for ``shape``."""
        plan = self.head_plan(shape.seqs, vocab, shape.adjust, shape.masked, shape.logprobs)
        return self.host, plan

    @property
    def host(self) -> CpuRuntime:
        """The host CPU runtime split steps sample on (made on first use)."""
        if self._host is None:
            self._host = CpuRuntime(1, "exact")
        return self._host

    @property
    def head_keys(self) -> list[tuple[int, int, int, bool, int]]:
        """``(seqs, vocab, adjust, masked, logprobs)`` of each sampling-step plan held."""
        return list(self._heads)

    def head_plan(self, seqs: int, vocab: int, adjust: int, masked: bool, logprobs: int) -> Plan:
        """The sampling step of a split step (``trace_head`` over a ``logits`` input [seqs,
        vocab]), compiled on the host runtime once per shape."""
        key = (seqs, vocab, adjust, masked, logprobs)
        head = self._heads.get(key)
        if head is None:
            t = Tracer(self.weights, 1, self.trace_limits)
            shape = StepShape(1, seqs, 1, "sample", adjust, masked, logprobs)
            trace_head(t, t.input("logits", "f32", [seqs, vocab]), shape)
            head = self.host.prepare(t.finish(), self.weights, self.compile_limits)
            self._heads[key] = head
        return head

    def _run_with_mask(
        self,
        prepared: Plan,
        inputs: dict[str, npt.NDArray[np.generic]],
        shape: StepShape,
        sampling: SamplingRows,
    ) -> dict[str, npt.NDArray[Any]]:
        """Runs the step while the host computes its token mask (a late input)."""
        assert sampling.fill_mask is not None
        slot = LateInput()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="poot-step")
        future = self._pool.submit(
            self.runtime.run, prepared, inputs, self.timeout_s, {MASK_INPUT: slot}
        )
        try:
            mask = sampling.fill_mask(sampling.mask_rows, shape.seqs)
        except BaseException as e:
            slot.fail(f"{type(e).__name__}: {e}")
            try:
                future.result()
            except Exception:
                pass  # the run's error only says the mask failed; raise the mask's own
            raise
        slot.fill(mask)
        return future.result()


LOGPROB_WIDTH = MAX_LOGPROBS

# The ops a step's sampling head needs beyond ``sample``: a runtime without them samples such
# steps on the host (see the module docs).
LOGIT_OPS = ("adjust_logits", "mask_logits", "top_k", "logprobs")


def _has_logit_ops(shape: StepShape) -> bool:
    return bool(shape.adjust or shape.masked or shape.logprobs)


class _Outputs:
    """A run's outputs trimmed to the plan's rows."""

    def __init__(self, out: dict[str, npt.NDArray[Any]], rows: int) -> None:
        self.out, self.rows = out, rows

    @property
    def logits_out(self) -> npt.NDArray[np.generic]:
        return self.out["logits"][: self.rows]

    @property
    def result(self) -> StepResult:
        o, r = self.out, self.rows
        ids, lps = o.get("logprob_ids"), o.get("logprobs")
        return StepResult(
            o["token_ids"][:r],
            None if ids is None else ids[:r],
            None if lps is None else lps[:r],
        )
