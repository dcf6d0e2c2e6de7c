"""``ModuleGraph``: several ``torch.nn.Module``s wired into one plan, and
``compile_modules`` for a linear sequence of them.

A graph has named inputs (``input``), module nodes (``add``) whose arguments are nested
tuples, lists and dicts of references (a graph input, a node's output, or an item of either:
``ref[0]``, ``ref["key"]``), and one output structure of references (``output``). Nodes are
added after what they read, so insertion order is a topological order; that order is the
planner's unit order (``placement.py``).

Invariants: ``compile`` runs the graph once in torch eager on the example inputs, so every
node is exported (``torch.export``) for the exact values it will be fed, and its output's
structure (tuple, dict, nesting) is the one a compiled call rebuilds; each node is then
compiled (``CompiledModule``) for the device its unit was placed on. A reference to an input
or node that does not exist, a duplicate name, or an argument that is not a reference is
``ConfigError`` at the call that made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from poot.errors import ConfigError

if TYPE_CHECKING:
    from poot.planner.compiled import CompileConfig
    from poot.planner.profiles import DeviceProfile, HostProfile
    from poot.torch_frontend.compiled_graph import CompiledGraph

__all__ = ["GraphRef", "ModuleGraph", "compile_modules"]


@dataclass(frozen=True)
class GraphRef:
    """A value of the graph: input or node ``source``, then ``path`` of items into it."""

    graph_id: int
    source: str
    is_input: bool
    path: tuple[Any, ...] = ()

    def __getitem__(self, key: Any) -> GraphRef:
        if not isinstance(key, (int, str)):
            raise ConfigError(f"a graph value is indexed by an int or a str, got {key!r}")
        return GraphRef(self.graph_id, self.source, self.is_input, (*self.path, key))

    def describe(self) -> str:
        return self.source + "".join(f"[{k!r}]" for k in self.path)


@dataclass
class Node:
    name: str
    module: Any
    args: tuple[Any, ...]


@dataclass
class ModuleGraph:
    """Modules wired into one plan: branches, joins, structured inputs and outputs.

    ``g.input(name)`` declares an input; ``g.add(name, module, *args)`` a node whose
    arguments are references (nested in tuples, lists, dicts); ``g.output(structure)`` the
    result; ``g.compile(example_inputs, config=...)`` places and compiles it.
    """

    inputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: Any = None

    def input(self, name: str) -> GraphRef:
        self._new_name(name)
        self.inputs.append(name)
        return GraphRef(id(self), name, True)

    def add(self, name: str, module: Any, *args: Any) -> GraphRef:
        """A node running ``module(*args)``; its result as a reference."""
        self._new_name(name)
        if not callable(module):
            raise ConfigError(f"node {name!r}: {type(module).__name__} is not a module")
        self._check_refs(args, f"node {name!r}")
        self.nodes.append(Node(name, module, tuple(args)))
        return GraphRef(id(self), name, False)

    def output(self, structure: Any) -> None:
        """What a compiled call returns: a reference, or tuples, lists, dicts of them."""
        self._check_refs(structure, "the output")
        self.outputs = structure

    def compile(
        self,
        example_inputs: dict[str, Any],
        config: CompileConfig | None = None,
        *,
        profiles: list[DeviceProfile] | None = None,
        host: HostProfile | None = None,
        runtimes: dict[str, Any] | None = None,
    ) -> CompiledGraph:
        """Places the nodes over the devices and compiles each for its device.

        Args:
            example_inputs: a value per input name (tensors, or tuples/dicts of them).
            config: what the planner may use (``force_placement`` pins module ranges: unit
                ``i`` is the ``i``-th node added).
            profiles: device profiles to plan over instead of this machine's (tests).
            host: the host side of the plan (default from the profiles).
            runtimes: the runtime to use per device key (default: a new one per key).
        """
        from poot.torch_frontend.compiled_graph import build

        if self.outputs is None:
            raise ConfigError("the graph has no output: call ModuleGraph.output(...) first")
        missing = [n for n in self.inputs if n not in example_inputs]
        extra = [n for n in example_inputs if n not in self.inputs]
        if missing or extra:
            raise ConfigError(
                f"example inputs must name exactly the graph's inputs {self.inputs}: "
                f"missing {missing}, unknown {extra}"
            )
        return build(self, example_inputs, config, profiles, host, runtimes)

    def _new_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a graph name must be a non-empty str, got {name!r}")
        if name in self.inputs or any(n.name == name for n in self.nodes):
            raise ConfigError(f"the graph already has an input or node named {name!r}")

    def _check_refs(self, a: Any, where: str) -> None:
        if isinstance(a, GraphRef):
            if a.graph_id != id(self):
                raise ConfigError(f"{where}: {a.describe()} belongs to another graph")
            return
        if isinstance(a, (tuple, list)):
            for x in a:
                self._check_refs(x, where)
            return
        if isinstance(a, dict):
            for x in a.values():
                self._check_refs(x, where)
            return
        raise ConfigError(
            f"{where}: arguments are graph values (from input() or add()) nested in tuples, "
            f"lists or dicts; got {type(a).__name__}"
        )


def compile_modules(
    modules: Sequence[Any],
    example_inputs: Any,
    config: CompileConfig | None = None,
    *,
    profiles: list[DeviceProfile] | None = None,
    host: HostProfile | None = None,
    runtimes: dict[str, Any] | None = None,
) -> CompiledGraph:
    """A linear sequence ``modules[-1](...modules[0](*example_inputs))`` placed as one plan.

    Each module takes the previous one's output: a tuple is passed as positional arguments,
    anything else as the one argument. Node ``i`` is named ``"{i}.{ClassName}"``; calling the
    result takes the example inputs' positional form and returns the last module's output.
    """
    if not modules:
        raise ConfigError("compile_modules needs at least one module")
    inputs = (
        tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    )
    import torch

    g = ModuleGraph()
    refs: tuple[Any, ...] = tuple(g.input(f"input{i}") for i in range(len(inputs)))
    value: Any = inputs
    with torch.no_grad():
        for i, m in enumerate(modules):
            ref = g.add(f"{i}.{type(m).__name__}", m, *refs)
            value = m(*value)
            if isinstance(value, tuple):
                refs, value = tuple(ref[j] for j in range(len(value))), value
            else:
                refs, value = (ref,), (value,)
    g.output(ref)
    return g.compile(
        {f"input{i}": x for i, x in enumerate(inputs)}, config,
        profiles=profiles, host=host, runtimes=runtimes,
    )  # fmt: skip
