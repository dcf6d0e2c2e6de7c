"""Running a model out of core on the CPU: layer chunks through a bounded double buffer.

What is real: when a plan streams, each step runs as a chain of segment graphs (``LlamaModel.
trace_units``: units ``[a, b)`` with the hidden state as input and output). Before a chunk runs,
its weights (still packed, byte for byte) are copied from the checkpoint into a buffer file in
the spill directory, opened as their own ``Weights``, and the chunk's graph is traced and compiled
against that buffer only, so the runtime cannot read any weight outside it. Two buffer slots: a
loader thread copies chunk ``i + 1`` while chunk ``i`` computes; chunk ``i + 2`` waits for chunk
``i``'s slot. Slots are leases from the model's ``CapacityLedger`` (device bytes for the buffer,
disk bytes for its file), so the device budget bounds what is held at once.

What it is not: the buffer is a file that the kernel may keep in the page cache, so on the CPU
"device memory" is the bytes poot holds mapped, not RAM the OS could not also cache; and each
chunk is traced and compiled again per step (the plan is bound to its weights), which costs time
a GPU backend with device-side buffers would not pay.

Invariants: the greedy ids equal the resident run's (the chained segments compute the same
graph); every lease is returned however the step ends; a wait with no progress (bytes copied,
chunks finished) for ``stall_timeout_s`` raises ``Stalled`` naming the chunk; a cancelled
generation stops at the next chunk boundary and only that generation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy.typing as npt

from poot._native import (
    CompileLimits,
    CpuRuntime,
    GgufFile,
    LateInput,
    TensorInfo,
    TraceLimits,
    Tracer,
    Weights,
    WgpuRuntime,
)
from poot.errors import Stalled
from poot.models.step import StepShape
from poot.planner.ledger import CapacityLedger, Generations, Lease
from poot.planner.record import Recorder
from poot.planner.weightfile import write_gguf_subset

__all__ = ["SegmentedPlan", "StreamingRuntime"]


@dataclass
class SegmentedPlan:
    """One step shape as chunks of units, each with the tensors its graph reads."""

    shape: StepShape
    chunks: list[tuple[int, int]]
    tensors: list[list[TensorInfo]]
    labels: list[str]

    @property
    def artifact_bytes(self) -> int:
        # The prepared cache bounds retained bytes; a segmented plan retains only names.
        return 1024 * len(self.chunks)

    @property
    def chunk_bytes(self) -> list[int]:
        return [sum(t.nbytes for t in ts) for ts in self.tensors]


class StreamingRuntime:
    """Runs ``SegmentedPlan``s on a CPU runtime through a two-slot weight buffer.

    It stands in for the runtime a ``StepRunner`` holds: ``configure_kv`` and ``run`` keep their
    signatures, and ``compile`` is replaced by ``prepare``.
    """

    def __init__(
        self,
        inner: CpuRuntime | WgpuRuntime,
        definition: Any,
        weights: Weights,
        tensors: Mapping[str, TensorInfo],
        ledger: CapacityLedger,
        generations: Generations,
        spill_dir: Path,
        *,
        stall_timeout_s: float,
        trace_limits: TraceLimits,
        compile_limits: CompileLimits,
        recorder: Recorder | None = None,
        activation_bytes: int = 0,
        kv_base: int = 0,
        lane: str = "cpu",  # the device key: its ledger pool and its spans' lane
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.kv_entry_bytes = inner.kv_entry_bytes
        self.definition = definition
        self.weights = weights
        self.tensors = dict(tensors)
        self.ledger = ledger
        self.generations = generations
        self.spill_dir = spill_dir
        self.stall_timeout_s = stall_timeout_s
        self.trace_limits = trace_limits
        self.compile_limits = compile_limits
        self.recorder = recorder
        self.activation_bytes = activation_bytes
        # The first layer whose KV this runtime's pool holds (a segment of a split plan).
        self.kv_base = kv_base
        self.lane = lane
        self.loader = ThreadPoolExecutor(1, thread_name_prefix="poot-stream")
        # Tests replace this to simulate a source that stops delivering.
        self.copy: Callable[[Sequence[TensorInfo], Path, Callable[[int], None]], int] = (
            lambda ts, dest, progress: write_gguf_subset(ts, dest, progress=progress)
        )
        self.current_generation = 0
        self._progress = 0
        self._lock = threading.Lock()

    # ---- the StepRunner's runtime surface ----------------------------------------------------

    def supports(self, op: str) -> bool:
        return bool(self.inner.supports(op))

    def configure_kv(self, **kw: int) -> None:
        self.inner.configure_kv(**kw)

    def memory(self) -> dict[str, int]:
        return self.inner.memory()

    def health(self) -> dict[str, str | None]:
        return self.inner.health()

    def prepare(
        self, shape: StepShape, chunks: list[tuple[int, int]], labels: list[str]
    ) -> SegmentedPlan:
        """Finds the tensors each chunk's graph reads (traced over the full weights)."""
        tensors = []
        for a, b in chunks:
            t = Tracer(self.weights, shape.tokens, self.trace_limits)
            self.definition.trace_units(t, shape, a, b, self.kv_base)
            names = sorted({w[0] for w in t.finish().weights()})
            tensors.append([self.tensors[n] for n in names])
        return SegmentedPlan(shape, chunks, tensors, labels)

    def run(
        self,
        plan: SegmentedPlan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
        *,
        generation: int | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Runs the chunks in order, loading each through the double buffer.

        ``generation``: run as one segment of a caller's step (``poot.planner.split``): the
        caller began that generation, the recorder's step and leased the activations; the
        input ``"hidden"``, if given, feeds the first chunk.
        """
        nested = generation is not None
        gen = generation if generation is not None else self.generations.begin()
        self.current_generation = gen
        rec = self.recorder
        if rec is not None and not nested:
            rec.begin_step()
        held: list[Lease] = []
        if not nested:
            held.append(self.ledger.lease(host=self.activation_bytes, wait_s=self.stall_timeout_s))
        pending: dict[int, Future[tuple[Lease, Path]]] = {}
        try:
            pending[0] = self.loader.submit(self._load, plan, 0, gen)
            hidden: npt.NDArray[Any] | None = None
            out: dict[str, npt.NDArray[Any]] = {}
            for i, (a, b) in enumerate(plan.chunks):
                self.generations.check(gen)
                lease, path = self._wait(pending[i], f"weights of chunk {i} ({plan.labels[i]})")
                del pending[i]
                held.append(lease)
                if i + 1 < len(plan.chunks):
                    pending[i + 1] = self.loader.submit(self._load, plan, i + 1, gen)
                t0 = time.perf_counter()
                weights = Weights(GgufFile(path))
                path.unlink()  # the mapping keeps the bytes; no buffer file outlives its chunk
                tracer = Tracer(weights, plan.shape.tokens, self.trace_limits)
                self.definition.trace_units(tracer, plan.shape, a, b, self.kv_base)
                graph = tracer.finish()
                compiled = self.inner.prepare(graph, weights, self.compile_limits)
                names = {x[0] for x in graph.inputs()}
                feed = {k: v for k, v in inputs.items() if k in names}
                if hidden is not None:
                    feed["hidden"] = hidden
                last = i == len(plan.chunks) - 1
                out = self.inner.run(compiled, feed, timeout_s, late if last else None)
                hidden = out.get("hidden")
                del compiled, graph, tracer, weights  # unmap the slot before it is reused
                if rec is not None:
                    rec.span(
                        self.lane, f"compute {plan.labels[i]}", t0, time.perf_counter(), "compute"
                    )
                lease.release()
                held.remove(lease)
                with self._lock:
                    self._progress += 1
            self.generations.check(gen)
            return out
        finally:
            for fut in pending.values():
                # A load still running (or stuck) gives its slot back whenever it ends.
                if not fut.cancel():
                    fut.add_done_callback(_discard)
            for lease in held:
                lease.release()
            if not nested:
                self.generations.end(gen)

    # ---- loading ------------------------------------------------------------------------------

    def _load(self, plan: SegmentedPlan, i: int, gen: int) -> tuple[Lease, Path]:
        nbytes = plan.chunk_bytes[i]
        # The slot: device bytes for the buffer, disk bytes for its file. With chunks at most
        # half the budget, chunk i + 2 waits here until chunk i is released.
        lease = self.ledger.lease(
            device=nbytes, disk=nbytes, on=self.lane, wait_s=self.stall_timeout_s
        )
        try:
            self.generations.check(gen)
            path = self.spill_dir / f"slot{i % 2}-{id(self):x}.gguf"
            t0 = time.perf_counter()
            self.copy(plan.tensors[i], path, self._note_progress)
            if self.recorder is not None:
                self.recorder.span(
                    f"{self.lane} load", f"load {plan.labels[i]}", t0, time.perf_counter(), "load"
                )
            return lease, path
        except BaseException:
            lease.release()
            raise

    def _note_progress(self, copied: int) -> None:
        with self._lock:
            self._progress += 1

    def _wait(self, fut: Future[tuple[Lease, Path]], what: str) -> tuple[Lease, Path]:
        """The future's result; ``Stalled`` when nothing progresses for ``stall_timeout_s``."""
        with self._lock:
            seen = self._progress
        since = time.monotonic()
        while True:
            try:
                return fut.result(timeout=min(0.05, self.stall_timeout_s))
            except TimeoutError:
                pass
            with self._lock:
                now_progress = self._progress
            if now_progress != seen:
                seen, since = now_progress, time.monotonic()
            elif time.monotonic() - since >= self.stall_timeout_s:
                raise Stalled(
                    f"no progress for {self.stall_timeout_s:g} s waiting for {what}",
                    waited_for=what, timeout_s=self.stall_timeout_s, progress=seen,
                )  # fmt: skip

    def close(self) -> None:
        self.loader.shutdown(wait=False, cancel_futures=True)


def _discard(fut: Future[tuple[Lease, Path]]) -> None:
    """Returns the slot of a load whose step already ended, and removes its buffer file."""
    if fut.cancelled() or fut.exception() is not None:
        return  # a failed load released its own lease
    lease, path = fut.result()
    lease.release()
    path.unlink(missing_ok=True)
