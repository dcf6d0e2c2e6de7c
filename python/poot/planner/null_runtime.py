"""NullRuntime: the runtime surface the engine uses, computing nothing.

It compiles any graph (keeping it), "runs" it by returning zeros of each output's shape and
dtype, and advances a simulated clock by the cost model's time for the graph on its device
profile (the same per-matmul ``max(bytes / gemv_bw, flops / gemm_flops)``, attention KV reads
and per-equation dispatch as ``cost``). Planner and scheduler tests run on it anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from poot._native import CompileLimits, Graph, Weights
from poot.planner.profiles import DeviceProfile

__all__ = ["NullPlan", "NullRuntime"]

_DTYPES = {"F32": np.float32, "I32": np.int32, "F16": np.float16}


@dataclass
class NullPlan:
    """A graph 'compiled' for the null runtime, with its simulated run time."""

    graph: Graph
    seconds: float
    artifact_bytes: int = 256


class NullRuntime:
    """See the module docs. ``clock_s`` is the simulated time of every run so far."""

    name = "null"
    kv_entry_bytes = 4

    def __init__(
        self, profile: DeviceProfile, sizes: Mapping[str, int], context: int = 256
    ) -> None:
        self.profile = profile
        self.sizes = dict(sizes)
        self.context = context
        self.clock_s = 0.0
        self.runs = 0
        self.kv: dict[str, int] = {}

    def supports(self, op: str) -> bool:
        """Every op: the cost model times any graph."""
        return True

    def configure_kv(self, **kw: int) -> None:
        self.kv = dict(kw)

    def prepare(
        self, graph: Graph, weights: Weights | None = None, limits: CompileLimits | None = None
    ) -> NullPlan:
        return NullPlan(graph, self.graph_seconds(graph))

    def graph_seconds(self, graph: Graph) -> float:
        """The cost model's time for ``graph`` on this runtime's profile."""
        p, t = self.profile, 0.0
        weight: dict[int, tuple[str, str, tuple[int, ...]]] = {}
        for vid, (op, ins, attrs, dtype, shape) in enumerate(graph.equations()):
            if op == "cast" and ins[0] in weight:
                weight[vid] = weight[ins[0]]  # fused into its reader: no dispatch
                continue
            t += p.dispatch_s
            if op == "weight":
                weight[vid] = (str(attrs["name"]), dtype, tuple(shape))
            elif op == "matmul" and len(ins) == 2 and ins[1] in weight:
                name, wdt, wshape = weight[ins[1]]
                flops = 2 * math.prod(shape[:-1]) * math.prod(wshape)
                t += max(self.sizes.get(name, 0) / p.gemv(wdt), flops / p.gemm(wdt)) + p.matmul_s
            elif op == "paged_attention":
                hd, nkv = int(attrs["head_dim"]), int(attrs["n_kv_heads"])
                t += 2 * shape[0] * self.context * nkv * hd * 4 / p.read_bw
                t += 4 * shape[0] * self.context * int(attrs["n_heads"]) * hd / p.gemm("F32")
        return t

    def run(
        self,
        plan: NullPlan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, Any] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        self.clock_s += plan.seconds
        self.runs += 1
        return {
            name: np.zeros(shape, _DTYPES.get(dtype, np.float32))
            for name, dtype, shape in plan.graph.outputs()
        }

    def memory(self) -> dict[str, int]:
        return {}

    def health(self) -> dict[str, str | None]:
        return {"status": "ok", "reason": None}
