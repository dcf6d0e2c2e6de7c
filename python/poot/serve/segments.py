"""One model's layer segments in Ray actors, one actor per node, run as one step runtime.

``SegmentWorker`` is the actor: on its node it opens the checkpoint (the same path on every
node), keeps a CPU runtime with a KV pool for its own layers only (``trace_units(kv_base=...)``
as the planner's local split does), and compiles its units per step shape on first use (an LRU
of ``max_plans``). ``NodesRuntime`` stands in for a step runner's runtime in the driver
(``configure_kv``, ``prepare(shape)``, ``run``, ``supports``, ``memory``, ``health``):

- a step calls every segment's ``run`` at once; each segment after the first gets the object
  ref of the previous one's hidden state (wrapped in a list, so the actor fetches it itself
  and times the fetch): hidden states go from node to node through Ray's object store (a small
  one through the driver's, which owns it), never through a copy the driver makes;
- the late token mask (guidance) is awaited in the driver and sent with the last segment's
  call, which runs the sampling head: the last segment's outputs are the step's;
- each call reports wall-clock times (fetch, compile, compute), recorded as spans per node
  (``transfer`` on ``<node> link``, ``compute`` on the node) for ``visualize(measured=True)``;
  a remote node's spans are placed by its own clock.

Invariants: the chained segments compute exactly the graph of one whole step, so greedy ids
and logprobs equal a one-process run's. Every wait is bounded by the step's deadline; a
deadline passed poisons the runtime (``DeviceTimeoutError``), a dead actor or node raises
``NodeLostError`` naming the segment's node and poisons it too; a poisoned runtime refuses
every later step (``RuntimePoisonedError``). An error raised inside a segment (a poot error)
is re-raised as itself. ``health()`` waits at most ``HEALTH_TIMEOUT_S`` (a server polls it;
each actor has a second thread, so health is answered while a step runs).
Ray is imported only inside the calls that need it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from poot.errors import DeviceTimeoutError, NodeLostError, RuntimePoisonedError
from poot.models.step import StepShape
from poot.planner.ledger import Generations
from poot.planner.record import Recorder

__all__ = [
    "HEALTH_TIMEOUT_S",
    "NodePart",
    "NodesPlan",
    "NodesRuntime",
    "SegmentSpec",
    "SegmentWorker",
]

HEALTH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SegmentSpec:
    """What one actor holds: units ``[start, end)`` of ``model`` (layers ``first`` ..
    ``first + count``), run with ``threads`` CPU threads in ``numerics``; ``definition`` is the
    driver's model definition itself (a plain dataclass), so both trace the same graph."""

    model: str
    numerics: str
    threads: int
    start: int
    end: int
    first: int
    count: int
    definition: Any
    trace_limits: dict[str, int]
    compile_limits: dict[str, int]
    max_plans: int
    last: bool


class SegmentWorker:
    """The actor holding one segment (module docs). Made a Ray actor class by ``NodesRuntime``."""

    def __init__(self, spec: SegmentSpec) -> None:
        from poot import _native
        from poot.checkpoints import resolve_model_files

        self.spec = spec
        files = resolve_model_files(spec.model)
        self.definition = spec.definition
        source = files.gguf if files.gguf is not None else files.safetensors
        assert source is not None
        self.weights = _native.Weights(source)
        self.runtime = _native.CpuRuntime(spec.threads, spec.numerics)  # type: ignore[arg-type]
        self.trace_limits = _native.TraceLimits(**spec.trace_limits)
        self.compile_limits = _native.CompileLimits(**spec.compile_limits)
        self.plans: OrderedDict[StepShape, tuple[Any, frozenset[str]]] = OrderedDict()

    def ready(self) -> dict[str, Any]:
        """Where the actor runs (its node id and process)."""
        import os

        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def configure_kv(self, **kw: int) -> None:
        """A KV pool for this segment's layers only (at least one: a pool must exist)."""
        self.runtime.configure_kv(n_layers=max(1, self.spec.count), **kw)

    def supports(self, op: str) -> bool:
        return bool(self.runtime.supports(op))

    def memory(self) -> dict[str, int]:
        return dict(self.runtime.memory())

    def health(self) -> dict[str, str | None]:
        return dict(self.runtime.health())

    def _plan(self, shape: StepShape) -> tuple[Any, frozenset[str]]:
        hit = self.plans.get(shape)
        if hit is not None:
            self.plans.move_to_end(shape)
            return hit
        from poot import _native

        t = _native.Tracer(self.weights, shape.tokens, self.trace_limits)
        s = self.spec
        self.definition.trace_units(t, shape, s.start, s.end, s.first)
        graph = t.finish()
        names = frozenset(x[0] for x in graph.inputs())
        plan = self.runtime.prepare(graph, self.weights, self.compile_limits)
        self.plans[shape] = (plan, names)
        while len(self.plans) > max(1, s.max_plans):
            self.plans.popitem(last=False)
        return plan, names

    def prepare(self, shape: StepShape) -> tuple[frozenset[str], int]:
        """Compiles the segment for ``shape``: its graph's input names and artifact bytes."""
        plan, names = self._plan(shape)
        return names, int(plan.artifact_bytes)

    def run(
        self,
        shape: StepShape,
        feed: dict[str, npt.NDArray[Any]],
        hidden: list[Any] | None,
        timeout_s: float,
    ) -> tuple[Any, dict[str, Any]]:
        """Runs the segment for one step: (the hidden state, or the step's outputs for the last
        segment; wall-clock times of the fetch, compile and compute, and the bytes fetched)."""
        import ray

        t0 = time.time()
        nbytes = 0
        if hidden is not None:
            h = ray.get(hidden[0], timeout=timeout_s)
            feed = {**feed, "hidden": h}
            nbytes = int(h.nbytes)
        t1 = time.time()
        plan, _ = self._plan(shape)
        t2 = time.time()
        out = self.runtime.run(plan, feed, timeout_s)
        t3 = time.time()
        times = {"fetch": (t0, t1), "compile": (t1, t2), "compute": (t2, t3), "bytes": nbytes}
        return (out if self.spec.last else out["hidden"]), times


@dataclass
class NodePart:
    """One segment in the driver: its node, units, label and actor handle."""

    device: str
    node_id: str
    start: int
    end: int
    label: str
    actor: Any = None


@dataclass
class NodesPlan:
    """One step shape: each segment's graph input names (its actor holds the compiled plan)."""

    shape: StepShape
    inputs: list[frozenset[str]]
    artifact_bytes: int = 0


def _cause(e: BaseException) -> BaseException | None:
    """The poot error raised inside a segment, where ``e`` carries one."""
    from ray.exceptions import RayTaskError

    from poot.errors import PootError

    if isinstance(e, RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, PootError):
            return cause
        if isinstance(cause, BaseException):
            return _cause(cause)
    return None


class NodesRuntime:
    """Runs ``NodesPlan``s over the segments' actors (module docs)."""

    name = "cpu"

    def __init__(
        self,
        parts: list[NodePart],
        kv_entry_bytes: int,
        generations: Generations,
        recorder: Recorder,
        *,
        call_timeout_s: float = 300.0,
    ) -> None:
        self.parts = parts
        self.kv_entry_bytes = kv_entry_bytes
        self.generations = generations
        self.recorder = recorder
        self.call_timeout_s = call_timeout_s
        self.poisoned: str | None = None
        self._supports: dict[str, bool] = {}

    # ---- waits -------------------------------------------------------------------------------

    def _check(self) -> None:
        if self.poisoned is not None:
            raise RuntimePoisonedError(
                f"the model placed across nodes is unusable: {self.poisoned}",
                reason=self.poisoned,
            )

    def _lost(self, part: NodePart, e: BaseException, during: str) -> BaseException:
        """The typed error for ``e`` raised by ``part``'s actor; poisons where it must."""
        from ray.exceptions import GetTimeoutError

        cause = _cause(e)
        if cause is not None:
            if isinstance(cause, DeviceTimeoutError | RuntimePoisonedError):
                self.poisoned = f"{part.device}: {cause.message}"
            return cause
        if isinstance(e, GetTimeoutError):
            self.poisoned = f"{part.device} missed the deadline while {during}"
            return DeviceTimeoutError(
                f"the segment on node {part.device} ({part.label}) did not answer while {during}"
                f" within its deadline",
                during=during,
            )
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.poisoned = f"node {part.device} lost ({reason})"
        return NodeLostError(
            f"node {part.device} ({part.label}) was lost while {during}: {reason}",
            node=part.device,
            reason=reason,
        )

    def _get_all(self, refs: list[Any], parts: list[NodePart], deadline: float, during: str) -> Any:
        """Each ref's value, in order; the first part that failed is the one blamed."""
        import ray
        from ray.exceptions import RayError

        ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
        out = []
        for ref, part in zip(refs, parts, strict=True):
            try:
                out.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except RayError as e:
                raise self._lost(part, e, during) from None
        return out

    def _each(
        self, method: str, *args: Any, during: str, timeout_s: float | None = None, **kw: Any
    ) -> list[Any]:
        self._check()
        refs = [getattr(p.actor, method).remote(*args, **kw) for p in self.parts]
        deadline = time.monotonic() + (timeout_s or self.call_timeout_s)
        return self._get_all(refs, self.parts, deadline, during)

    # ---- the runtime seam --------------------------------------------------------------------

    def supports(self, op: str) -> bool:
        """Whether the last segment (which runs the sampling head) compiles ops of kind ``op``."""
        if op not in self._supports:
            last = self.parts[-1]
            self._check()
            deadline = time.monotonic() + self.call_timeout_s
            ref = last.actor.supports.remote(op)
            self._supports[op] = bool(self._get_all([ref], [last], deadline, "answering")[0])
        return self._supports[op]

    def configure_kv(self, *, n_layers: int, **kw: int) -> None:
        """Gives each segment's actor a pool for its own layers."""
        self._each("configure_kv", during="allocating its KV pool", **kw)

    def prepare(self, shape: StepShape) -> NodesPlan:
        """Compiles every segment for ``shape`` on its node, all at once."""
        got = self._each("prepare", shape, during=f"compiling {shape}")
        return NodesPlan(shape, [g[0] for g in got], sum(int(g[1]) for g in got))

    def memory(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for m in self._each("memory", during="reporting its memory"):
            for k, v in m.items():
                total[k] = total.get(k, 0) + int(v)
        return total

    def health(self) -> dict[str, str | None]:
        """``ok``, or the first segment that is not (a node that does not answer within
        ``HEALTH_TIMEOUT_S`` poisons the placement)."""
        try:
            timeout = min(self.call_timeout_s, HEALTH_TIMEOUT_S)
            found = self._each("health", during="reporting its health", timeout_s=timeout)
        except (NodeLostError, DeviceTimeoutError, RuntimePoisonedError) as e:
            return {"status": "poisoned", "reason": self.poisoned or str(e)}
        for p, h in zip(self.parts, found, strict=True):
            if h.get("status") != "ok":
                return {"status": h.get("status"), "reason": f"{p.device}: {h.get('reason')}"}
        return {"status": "ok", "reason": None}

    def run(
        self,
        plan: NodesPlan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, Any] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """One step over every segment (module docs)."""
        self._check()
        deadline = time.monotonic() + timeout_s
        gen = self.generations.begin()
        rec = self.recorder
        rec.begin_step()
        # The recorder keeps perf_counter times; the actors report wall-clock ones.
        offset = time.perf_counter() - time.time()
        try:
            self.generations.check(gen)
            last = len(self.parts) - 1
            hidden: Any = None
            outs: list[Any] = []
            times: list[Any] = []
            for i, p in enumerate(self.parts):
                feed = {k: v for k, v in inputs.items() if k in plan.inputs[i]}
                if i == last and late:
                    for name, slot in late.items():
                        feed[name] = slot.wait(max(0.0, deadline - time.monotonic()))
                left = max(0.001, deadline - time.monotonic())
                args = (plan.shape, feed, None if hidden is None else [hidden], left)
                out, t = p.actor.run.options(num_returns=2).remote(*args)
                outs.append(out)
                times.append(t)
                hidden = out
            got = self._get_all(times, self.parts, deadline, "running a step")
            result = self._get_all([outs[-1]], [self.parts[-1]], deadline, "running a step")[0]
            self.generations.check(gen)
            for p, t in zip(self.parts, got, strict=True):
                if t["bytes"]:
                    a, b = t["fetch"]
                    label = f"{self.parts[self.parts.index(p) - 1].device}->{p.device}"
                    rec.span(f"{p.device} link", label, a + offset, b + offset, "transfer")
                a, b = t["compute"]
                rec.span(p.device, p.label, a + offset, b + offset, "compute")
            return dict(result)
        finally:
            self.generations.end(gen)

    def close(self) -> None:
        """Ends the segments' actors (their KV pools and plans go with them)."""
        import ray

        for p in self.parts:
            if p.actor is not None:
                ray.kill(p.actor, no_restart=True)
                p.actor = None
        self.poisoned = self.poisoned or "closed"
