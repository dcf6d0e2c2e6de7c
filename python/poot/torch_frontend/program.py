"""A lowered module as a replayable program of tracer calls, and its replay.

Invariants: a ``Program`` holds only plain data (method names, ints, floats, strings, value
references by index) and the weights' names, so it is host-agnostic and is what an artifact
stores (``artifact.py``); ``replay`` is the only place a ``Tracer`` is driven, so a compiled
module and a loaded artifact trace the same graph under the same ``TraceLimits``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from poot import _native


@dataclass(frozen=True)
class Ref:
    """A value of the program: the index of the call that made it."""

    index: int


@dataclass
class Program:
    """Tracer calls in order; ``calls[i]`` defines ``Ref(i)`` (``output`` calls define none)."""

    calls: list[tuple[str, list[Any], dict[str, Any]]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Ref:
        self.calls.append((method, list(args), dict(kwargs)))
        return Ref(len(self.calls) - 1)

    def output(self, name: str, ref: Ref) -> None:
        self.calls.append(("output", [name, ref], {}))
        self.outputs.append(name)

    def to_json(self) -> dict[str, Any]:
        def enc(a: Any) -> Any:
            if isinstance(a, Ref):
                return {"ref": a.index}
            if isinstance(a, (list, tuple)):
                return [enc(x) for x in a]
            return a

        return {
            "calls": [[m, enc(args), kw] for m, args, kw in self.calls],
            "outputs": list(self.outputs),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Program:
        def dec(a: Any) -> Any:
            if isinstance(a, dict) and set(a) == {"ref"} and isinstance(a["ref"], int):
                return Ref(a["ref"])
            if isinstance(a, list):
                return [dec(x) for x in a]
            return a

        calls = [(str(m), dec(args), dict(kw)) for m, args, kw in data["calls"]]
        return cls(calls=calls, outputs=[str(o) for o in data["outputs"]])


# The tracer methods a program may call: anything else in a loaded file is refused.
ALLOWED = frozenset(
    {
        "input",
        "weight",
        "literal",
        "embedding",
        "matmul",
        "add",
        "mul",
        "silu",
        "gelu",
        "softmax",
        "reshape",
        "slice",
        "concat",
        "unary",
        "binary",
        "scalar",
        "layer_norm",
        "permute",
        "batch_matmul",
        "causal_mask",
        "reduce",
        "rms_norm",
        "output",
    }
)


def replay(
    program: Program, weights: _native.Weights, limits: _native.TraceLimits
) -> _native.Graph:
    """Traces ``program`` against ``weights`` (TraceError on a bad call or budget)."""
    tracer = _native.Tracer(weights, 1, limits)
    values: list[Any] = []

    def res(a: Any) -> Any:
        if isinstance(a, Ref):
            if not 0 <= a.index < len(values) or values[a.index] is None:
                raise ValueError(f"program refers to value {a.index} before it exists")
            return values[a.index]
        if isinstance(a, list):
            return [res(x) for x in a]
        return a

    for method, args, kwargs in program.calls:
        if method not in ALLOWED:
            raise ValueError(f"program calls unknown tracer method {method!r}")
        out = getattr(tracer, method)(*res(args), **kwargs)
        values.append(out)
    return tracer.finish()
