"""The runtime seam on the Python side: what every runtime the engine drives offers.

``Runtime`` mirrors the Rust ``poot_runtime::Runtime`` trait that ``poot._native.CpuRuntime``
and ``WgpuRuntime`` wrap; the planner's runtimes (``LeasedRuntime``, ``StreamingRuntime``,
``SplitRuntime``, ``NullRuntime``) are written against it too, so a step runner and the engine
core take any of them. ``supports(op)`` answers by op kind, as the graph names its ops
(``"adjust_logits"``, ``"matmul"``, ...): the engine asks it where a step samples, instead of
checking a runtime's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy.typing as npt

from poot._native import CompileLimits, Graph, LateInput, Plan, Weights

__all__ = ["Runtime"]


@runtime_checkable
class Runtime(Protocol):
    """A device backend over whole graphs (see the module docs)."""

    @property
    def name(self) -> str:
        """The backend's name (``"cpu"``, ``"wgpu"``, ...)."""
        ...

    @property
    def kv_entry_bytes(self) -> int:
        """Bytes of one K or V element in the runtime's KV pool (what the pool is sized by)."""
        ...

    def supports(self, op: str) -> bool:
        """Whether graphs with ops of kind ``op`` compile here."""
        ...

    def configure_kv(
        self,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        windowed_layers: int = 0,
        windowed_blocks: int = 0,
    ) -> None:
        """Allocates (or replaces) the paged KV pool: per layer, ``num_blocks`` blocks, but
        ``windowed_blocks`` for the last ``windowed_layers`` (a windowed KV group)."""
        ...

    def prepare(self, graph: Graph, weights: Weights, limits: CompileLimits | None = None) -> Plan:
        """Prepares a plan: the traced graph compiled for this runtime against ``weights``, under
        ``limits`` (the runtime-level verb; ``poot.compile`` places a whole model)."""
        ...

    def run(
        self,
        plan: Plan,
        inputs: Mapping[str, npt.NDArray[Any]],
        timeout_s: float = 600.0,
        late: Mapping[str, LateInput] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Runs ``plan`` on named inputs within ``timeout_s``; returns the named outputs."""
        ...

    def memory(self) -> dict[str, int]:
        """Bytes the runtime holds (``kv_bytes``, ``scratch_bytes``, ``weight_bytes``)."""
        ...

    def health(self) -> dict[str, str | None]:
        """``{"status": "ok"}`` or ``{"status": "poisoned", "reason": ...}``."""
        ...
