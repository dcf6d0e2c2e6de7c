"""``CompiledGraph``: a ``ModuleGraph`` placed over the devices and compiled node by node.

``build`` runs the graph in torch eager once on the example inputs (each node's example
arguments and its output structure), exports and lowers every node, reads each node's planner
unit from its traced graph (``placement.module_unit``), places the units
(``placement.place_modules``) and compiles each node as a ``CompiledModule`` on the runtime of
its device. A call runs the nodes through ``schedule.run_nodes``: one thread per device, each
node once the nodes it references are done, so branches on different devices run at the same
time (``concurrent=False`` runs them one after another in insertion order, with the same
results).

Invariants: a node's arguments are flattened the way ``torch.export`` flattened its example
arguments, and its outputs are rebuilt with the tree structure of its eager output, so tuples,
dicts and nesting survive the graph; a device tensor fed to a node on the runtime that made it
is bound as it lies (no readback, no upload); one crossing to another device goes through the
host (its ``cpu()``), recorded as a transfer span and counted in ``transfer_bytes``. The
compiled graph holds its weights' bytes per device in its ledger for its life,
and a call leases each node's output bytes on its device until it returns. Each call is
recorded (``Recorder``: module, op and transfer spans, ledger samples) for ``visualize``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from poot import _native
from poot.errors import ConfigError
from poot.planner.compiled import CompileConfig
from poot.planner.ledger import CapacityLedger
from poot.planner.op_spans import run_spans
from poot.planner.profiles import DeviceProfile, HostProfile
from poot.planner.record import Recorder
from poot.torch_frontend.lower import lower, weights_arrays
from poot.torch_frontend.module import CompiledModule
from poot.torch_frontend.node_runs import run_nodes
from poot.torch_frontend.placement import (
    ModulePlacement,
    discover_profiles,
    explain_modules,
    module_stats,
    module_unit,
    place_modules,
)
from poot.torch_frontend.program import replay
from poot.torch_frontend.tensor import PootTensor

if TYPE_CHECKING:
    from poot.torch_frontend.graph import ModuleGraph

__all__ = ["CompiledGraph", "build"]


def _resolve(a: Any, env: dict[str, Any]) -> Any:
    from poot.torch_frontend.graph import GraphRef

    if isinstance(a, GraphRef):
        v = env[a.source]
        for k in a.path:
            try:
                v = v[k]
            except (KeyError, IndexError, TypeError) as e:
                raise ConfigError(f"{a.describe()}: no item {k!r} in {type(v).__name__}") from e
        return v
    if isinstance(a, (tuple, list)):
        return type(a)(_resolve(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _resolve(v, env) for k, v in a.items()}
    return a


def _sources(a: Any) -> set[str]:
    """The inputs and nodes a node's arguments reference."""
    from poot.torch_frontend.graph import GraphRef

    if isinstance(a, GraphRef):
        return set() if a.is_input else {a.source}
    if isinstance(a, (tuple, list)):
        return set().union(*(_sources(x) for x in a))
    if isinstance(a, dict):
        return set().union(*(_sources(x) for x in a.values()))
    return set()


def _leaves(out: Any) -> list[Any]:
    """A ``CompiledModule``'s result (a tensor or nested tuples of them) in output order."""
    if isinstance(out, tuple):
        return [x for o in out for x in _leaves(o)]
    return [out]


def _runtime_for(key: str, timeout_s: float) -> Any:
    kind = key.split(":")[0]
    if kind == "cpu":
        return _native.CpuRuntime()
    if kind == "wgpu":
        return _native.WgpuRuntime(timeout_s=timeout_s)
    if kind == "cuda":
        return _native.CudaRuntime()
    raise ConfigError(f"no runtime for device {key!r}")


class CompiledGraph:
    """A placed, compiled ``ModuleGraph``; call it with the graph's inputs."""

    def __init__(
        self,
        graph: ModuleGraph,
        nodes: list[CompiledModule],
        specs: list[Any],
        placement: ModulePlacement,
        devices: list[str],
        ledger: CapacityLedger,
        wait_s: float = 30.0,
    ) -> None:
        self.graph = graph
        self.nodes = nodes
        self._specs = specs
        self.placement = placement
        self.devices = devices
        self.ledger = ledger
        self.recorder = Recorder()
        self._units: dict[int, Any] = {}
        self._wait_s = wait_s  # how long a call's output lease waits for room
        # Branches on different devices run at the same time (schedule.py).
        self.concurrent = True
        # Bytes copied between devices (through the host) by calls so far.
        self.transfer_bytes = 0
        # Called with a node's name as it starts, on its device's thread (tests).
        self.before_node: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        index = {n.name: i for i, n in enumerate(graph.nodes)}
        self._deps = [{index[s] for s in _sources(n.args)} for n in graph.nodes]
        for cm in nodes:  # each runtime with a timer times its equations for the ops lanes
            record = getattr(cm.runtime, "record_spans", None)
            if record is not None:
                record(True)

    @property
    def placed(self) -> dict[str, str]:
        """Each node's device key, in insertion order."""
        return {n.name: d for n, d in zip(self.graph.nodes, self.devices, strict=True)}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Takes the inputs by keyword, positionally in the order they were declared, or (a
        graph of several inputs) as one dict of them all."""
        names = self.graph.inputs
        if args and kwargs:
            raise ConfigError("give the graph's inputs by keyword or by position, not both")
        if kwargs:
            feed = dict(kwargs)
        elif len(names) > 1 and len(args) == 1 and isinstance(args[0], dict):
            feed = dict(args[0])
        elif len(args) == len(names):
            feed = dict(zip(names, args, strict=True))
        else:
            raise ConfigError(f"expected {len(names)} inputs ({names}), got {len(args)}")
        if set(feed) != set(names):
            raise ConfigError(f"the graph takes inputs {names}, got {sorted(feed)}")
        return self._run(feed)

    def _run(self, feed: dict[str, Any]) -> Any:
        from torch.utils._pytree import tree_flatten, tree_unflatten

        env: dict[str, Any] = dict(feed)
        rec = self.recorder
        rec.begin_step(held=self._in_use())
        leases: list[Any] = []

        def node(i: int) -> None:
            name, cm, dev = self.graph.nodes[i].name, self.nodes[i], self.devices[i]
            if self.before_node is not None:
                self.before_node(name)
            flat, _ = tree_flatten(_resolve(self.graph.nodes[i].args, env))
            leaves = [self._feed(x, cm, dev) for x in flat]
            t0 = time.perf_counter()
            out = cm(*leaves)
            rec.span(dev, name, t0, time.perf_counter())
            for s in run_spans(cm.runtime, cm.plan, t0, dev, self._units):
                if s.kind != "compute":  # the module's own span is its layer span
                    rec.span(s.lane, s.label, s.start, s.end, s.kind)
            flat_out = _leaves(out)
            # Each output holds its bytes on its device until the call returns.
            nbytes = sum(t.nbytes for t in flat_out)
            lease = self.ledger.lease(devices={dev: nbytes}, wait_s=self._wait_s)
            with self._lock:
                leases.append(lease)
            rec.sample(self._in_use())
            env[name] = tree_unflatten(flat_out, self._specs[i])

        try:
            run_nodes(self.devices, self._deps, node, concurrent=self.concurrent)
        finally:
            for lease in leases:
                lease.release()
            rec.sample(self._in_use())
        return _resolve(self.graph.outputs, env)

    def _feed(self, x: Any, cm: CompiledModule, dev: str) -> Any:
        """A node's argument: as it is, unless it is a device tensor of another runtime than
        the node's, which is copied to the host here (a recorded, counted transfer)."""
        if not isinstance(x, PootTensor) or x.device == "cpu" or x.runtime is cm.runtime:
            return x
        t0 = time.perf_counter()
        host = x.cpu()
        self.recorder.span(f"{dev} link", f"{x.device}->{dev}", t0, time.perf_counter(), "transfer")
        with self._lock:
            self.transfer_bytes += x.nbytes
        return host

    def _in_use(self) -> int:
        return int(self.ledger.snapshot()["device"]["used"] or 0)

    def explain(self) -> str:
        """Each module's device, the chosen plan and its cost, the runner-up, and why each
        device not used was dropped."""
        return explain_modules(self.placement)

    def visualize(self, path: str | os.PathLike[str], measured: bool = False) -> Path:
        """Writes the HTML timeline: the last calls as measured (up to 8, in sequence), or
        as many simulated calls (one before any ran), with the same lanes: per device its
        modules, its ops, its link, and the ledger's device bytes over time."""
        from poot.planner.visualize import render_timeline, simulated_view

        recorded = self.recorder.view()
        if measured:
            spans, ledger, marks = recorded
            if not spans:
                raise ValueError("no measured call yet: call it before visualize(measured=True)")
            kind = "measured"
        else:
            pl = self.placement
            held = int(self.ledger.snapshot()["device"]["used"] or 0)
            spans, ledger, marks = simulated_view(
                pl.stats, pl.simulation, pl.profiles, held, len(recorded[2])
            )
            kind = "simulated"
        p = Path(path)
        sub = self.placement.chosen.placement.describe(self.placement.stats)
        page = render_timeline(
            f"poot step timeline ({kind})", spans, sub, ledger=ledger, steps=marks
        )
        p.write_text(page)
        return p


def _lowered(module: Any, args: tuple[Any, ...]) -> Any:
    import torch

    with torch.no_grad():
        return lower(torch.export.export(module, args))


def build(
    graph: ModuleGraph,
    example_inputs: dict[str, Any],
    config: CompileConfig | None,
    profiles: list[DeviceProfile] | None,
    host: HostProfile | None,
    runtimes: dict[str, Any] | None,
) -> CompiledGraph:
    """See the module docs."""
    import torch
    from torch.utils._pytree import tree_flatten

    config = config or CompileConfig()
    trace_limits, compile_limits = _native.TraceLimits(), _native.CompileLimits()
    env: dict[str, Any] = dict(example_inputs)
    parts = []  # per node: lowered, arrays, dtypes, graph, output spec
    units, sizes, activation = [], {}, 0
    for node in graph.nodes:
        args = _resolve(node.args, env)
        with torch.no_grad():
            out = node.module(*args)
        env[node.name] = out
        flat, spec = tree_flatten(out)
        for t in flat:
            if not isinstance(t, torch.Tensor):
                raise ConfigError(f"node {node.name!r} returns a {type(t).__name__}, not tensors")
            activation = max(activation, t.numel() * 4)
        lowered = _lowered(node.module, tuple(args))
        arrays, dtypes = weights_arrays(lowered.weights)
        traced = replay(
            lowered.program, _native.Weights.from_arrays(arrays, dtypes=dtypes), trace_limits
        )
        node_sizes = {k: int(np.asarray(a).nbytes) for k, a in arrays.items()}
        u = module_unit(node.name, traced, node_sizes)
        # Weight names are per module: keep two modules' "fc.weight" apart.
        u.weights = {f"{node.name}/{w}" for w in u.weights}
        sizes.update({f"{node.name}/{k}": v for k, v in node_sizes.items()})
        units.append(u)
        parts.append((lowered, arrays, dtypes, traced, spec))
    stats = module_stats(units, sizes, activation)
    if profiles is None:
        found, dropped = discover_profiles()
    else:
        found, dropped = {p.key: p for p in profiles}, {}
    host_memory = max((p.memory_bytes for p in found.values() if p.is_host), default=0)
    host = host or HostProfile(host_memory)
    rts: dict[str, Any] = dict(runtimes or {})
    supported: dict[str, set[int]] = {}
    for key, p in found.items():
        if not p.is_host and (not config.allow_gpu or p.source == "estimated"):
            continue  # place_modules drops it with the reason
        if key not in rts:
            try:
                rts[key] = _runtime_for(key, config.stall_timeout_s * 20)
            except Exception as e:  # noqa: BLE001 - any failure to open it drops the device
                dropped[key] = f"its runtime did not open: {e}"
                continue
        ops = [{eq[0] for eq in part[3].equations()} for part in parts]
        supported[key] = {i for i, o in enumerate(ops) if all(rts[key].supports(x) for x in o)}
    found = {k: v for k, v in found.items() if k not in dropped}
    placement = place_modules(stats, found, host, config, supported, dropped)
    devices = [placement.device_of(i) for i in range(len(units))]
    nodes = []
    for (lowered, arrays, dtypes, _, _), dev in zip(parts, devices, strict=True):
        nodes.append(
            CompiledModule(
                lowered.program,
                arrays,
                dtypes,
                lowered.inputs,
                lowered.output_structure,
                trace_limits,
                compile_limits,
                rts[dev],
            )
        )
    ledger = CapacityLedger(
        host=config.host_budget_bytes,
        device=config.device_budget_bytes,
        disk=0,
        devices=placement.chosen.placement.devices,
    )
    held: dict[str, int] = {}
    for s in placement.chosen.placement.segments:
        held[s.device] = held.get(s.device, 0) + stats.bytes_of(s.start, s.end)
    ledger.resident = ledger.lease(devices=held)
    specs = [part[4] for part in parts]
    return CompiledGraph(
        graph, nodes, specs, placement, devices, ledger, wait_s=config.stall_timeout_s
    )
