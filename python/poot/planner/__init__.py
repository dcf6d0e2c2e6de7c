"""The planner: discovery, validation, placement search, simulation, ledger, explain, timeline.

``poot.compile(model, config=CompileConfig(...))`` returns a ``CompiledModel``; ``poot.LLM(model,
config=...)`` compiles its model the same way and exposes it as ``llm.compiled``. See
docs/architecture.md ("The planner") for the shape of the whole.
"""

from __future__ import annotations

from poot.planner.compiled import CompileConfig, CompiledModel, compile
from poot.planner.cost import Placement, Segment
from poot.planner.discovery import DeviceInfo, Discovery, discover
from poot.planner.graphstats import Workload
from poot.planner.ledger import CapacityLedger, Generations
from poot.planner.null_runtime import NullRuntime
from poot.planner.profiles import DeviceProfile, HostProfile

__all__ = [
    "CapacityLedger",
    "CompileConfig",
    "CompiledModel",
    "DeviceInfo",
    "DeviceProfile",
    "Discovery",
    "Generations",
    "HostProfile",
    "NullRuntime",
    "Placement",
    "Segment",
    "Workload",
    "compile",
    "discover",
]
