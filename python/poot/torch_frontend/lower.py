"""Lowering a ``torch.export`` graph to a ``Program`` of poot tracer calls.

Invariants: every node either folds (all of its tensor operands are constants: parameters,
buffers, lifted constants or results of earlier folds; torch evaluates it once, here) or lowers
to tracer calls through ``ops.LOWERINGS``; a node with neither is ``UnsupportedTorchOpError``
naming the aten op and the module path from its ``nn_module_stack``. Parameters become weights
in their stored dtype, handed over without a copy (``weights_arrays``); only folded results
(new tensors) and non-contiguous parameters are materialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from poot.errors import UnsupportedFeatureError, UnsupportedTorchOpError
from poot.torch_frontend.program import Program, Ref


@dataclass
class Weight:
    """A constant used as a weight: its stored name and tensor."""

    name: str
    tensor: Any


@dataclass
class Lowered:
    """What lowering produced: the program, the weights it reads, the input specs."""

    program: Program
    weights: dict[str, Any] = field(default_factory=dict)
    inputs: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    output_structure: Any = None
    # Weights a training step updates (the trainable parameters), when lowered for training.
    trainable: list[str] = field(default_factory=list)


def module_path(node: Any) -> str:
    """The innermost module path of ``node`` ("" for the root module)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return str(path).removeprefix("L['self'].").removeprefix("L__self__.")


def op_name(node: Any) -> str:
    return str(node.target) if node.op != "call_function" else _target_name(node.target)


def _target_name(target: Any) -> str:
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", "")
    if str(target).startswith("aten."):
        return str(target)
    return f"{module}.{name}" if name else str(target)


def shape_of(node: Any) -> tuple[int, ...]:
    val = node.meta.get("val")
    return tuple(int(d) for d in val.shape)


class Ctx:
    """What one op's lowering sees: the program and the environment of lowered values."""

    def __init__(self, program: Program, lowered: Lowered) -> None:
        self.program = program
        self.lowered = lowered
        self._weight_ids: dict[int, str] = {}
        self.node: Any = None

    def unsupported(self, detail: str) -> UnsupportedTorchOpError:
        op, path = op_name(self.node), module_path(self.node)
        where = f" in module {path!r}" if path else " in the root module"
        return UnsupportedTorchOpError(
            f"cannot lower {op}{where}: {detail}", op=op, module_path=path
        )

    def weight(self, w: Weight) -> Ref:
        """The weight value of a constant (registered once per tensor)."""
        return self.program.call("weight", w.name)

    def operand(self, a: Any) -> Ref:
        """A tensor operand as a value: a Ref as is, a constant as a weight."""
        if isinstance(a, Ref):
            return a
        if isinstance(a, Weight):
            return self.weight(a)
        raise self.unsupported(f"operand {type(a).__name__} is not a tensor")

    def activation(self, a: Any) -> Ref:
        """A tensor operand as an f32 activation: a constant is read through `x * 1` (exact),
        for the ops that take only computed values (concat, slices, reshapes)."""
        v = self.operand(a)
        if isinstance(a, Weight):
            one = self.program.call("literal", [1.0], [])
            v = self.program.call("binary", v, one, "mul")
        return v

    def register(self, tensor: Any, hint: str) -> Weight:
        """A constant tensor as a weight (deduplicated by identity)."""
        key = id(tensor)
        name = self._weight_ids.get(key)
        if name is None:
            name = hint
            i = 0
            while name in self.lowered.weights:
                i += 1
                name = f"{hint}.{i}"
            self._weight_ids[key] = name
            self.lowered.weights[name] = tensor
        return Weight(name, self.lowered.weights[name])


def weights_arrays(tensors: dict[str, Any]) -> tuple[dict[str, npt.NDArray[Any]], dict[str, str]]:
    """Numpy views of the weights in their stored dtype (BF16 as int16 words) and the
    dtypes numpy cannot name; a copy only for non-contiguous or non-float tensors."""
    import torch

    arrays: dict[str, npt.NDArray[Any]] = {}
    dtypes: dict[str, str] = {}
    for name, t in tensors.items():
        t = t.detach()
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            t = t.to(torch.float32)
        if not t.is_contiguous():
            t = t.contiguous()
        if t.dtype == torch.bfloat16:
            arrays[name] = t.view(torch.int16).numpy()
            dtypes[name] = "bf16"
        else:
            arrays[name] = t.numpy()
    return arrays, dtypes


def _input_dtype(dtype: Any) -> str:
    import torch

    if dtype == torch.float32:
        return "f32"
    if dtype in (torch.int64, torch.int32):
        return "i32"
    raise UnsupportedFeatureError(
        f"inputs of dtype {dtype} are not supported (float32, int32, int64 are)"
    )


def lower(exported: Any, *, training: bool = False) -> Lowered:
    """Lowers an ``ExportedProgram`` (see the module docs). With ``training``, a node reading
    a trainable parameter is lowered, never folded (its gradient must reach the parameter),
    and ``Lowered.trainable`` names those parameters."""
    import torch
    from torch.export.graph_signature import InputKind

    from poot.torch_frontend.ops import LOWERINGS

    program = Program()
    lowered = Lowered(program)
    ctx = Ctx(program, lowered)
    env: dict[Any, Any] = {}
    sig = exported.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    for node in exported.graph_module.graph.nodes:
        ctx.node = node
        if node.op == "placeholder":
            spec = kinds[node.name]
            if spec.kind == InputKind.USER_INPUT:
                val = node.meta["val"]
                shape = tuple(int(d) for d in val.shape)
                dtype = _input_dtype(val.dtype)
                lowered.inputs.append((node.name, dtype, shape))
                env[node] = program.call("input", node.name, dtype, list(shape))
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                t = exported.state_dict.get(spec.target)
                if t is None:
                    t = exported.constants[spec.target]
                env[node] = ctx.register(t, spec.target)
                if training and spec.kind == InputKind.PARAMETER and t.requires_grad:
                    name = env[node].name
                    if name not in lowered.trainable:
                        lowered.trainable.append(name)
            elif spec.kind == InputKind.CONSTANT_TENSOR:
                env[node] = ctx.register(exported.constants[spec.target], spec.target)
            else:
                raise ctx.unsupported(f"input kind {spec.kind}")
            continue
        if node.op == "output":
            flat, structure = _flatten(node.args[0], env)
            for i, ref in enumerate(flat):
                if not isinstance(ref, Ref):
                    raise ctx.unsupported("an output does not depend on the inputs")
                program.output(f"out{i}", ref)
                lowered.output_names.append(f"out{i}")
            # A module returning one tensor: export still wraps it in a tuple.
            spec = exported.call_spec.out_spec
            if spec is not None and spec.is_leaf() and isinstance(structure, list):
                structure = structure[0]
            lowered.output_structure = structure
            continue
        if node.op != "call_function":
            raise ctx.unsupported(f"node kind {node.op}")
        args = _map(node.args, env)
        kwargs = {k: _map(v, env) for k, v in node.kwargs.items()}
        if not _any_ref((args, kwargs)) and not _reads(args, kwargs, lowered.trainable):
            if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
                # Folding would freeze one draw into the artifact.
                raise ctx.unsupported("a random op (it would be frozen by constant folding)")
            # Constant folding: torch evaluates the node once (arange, buffer slices, masks).
            result = node.target(*_unwrap(args), **_unwrap(kwargs))
            env[node] = _wrap_const(ctx, result, node.name)
            continue
        fn = LOWERINGS.get(op_name(node))
        if fn is None:
            raise ctx.unsupported("no lowering for this op")
        env[node] = fn(ctx, node, *args, **kwargs)
    return lowered


def _reads(args: Any, kwargs: dict[str, Any], names: list[str]) -> bool:
    """Whether a node's arguments include one of the weights ``names``."""
    if not names:
        return False

    def walk(a: Any) -> bool:
        if isinstance(a, Weight):
            return a.name in names
        if isinstance(a, (list, tuple)):
            return any(walk(x) for x in a)
        return False

    return walk(args) or walk(list(kwargs.values()))


def _map(a: Any, env: dict[Any, Any]) -> Any:
    import torch.fx

    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_map(x, env) for x in a)
    return a


def _any_ref(a: Any) -> bool:
    if isinstance(a, Ref):
        return True
    if isinstance(a, (list, tuple)):
        return any(_any_ref(x) for x in a)
    if isinstance(a, dict):
        return any(_any_ref(x) for x in a.values())
    if isinstance(a, Multi):
        return any(_any_ref(x) for x in a.items)
    return False


@dataclass
class Multi:
    """An op with several outputs (``split``): picked apart by ``operator.getitem``."""

    items: list[Any]


def _unwrap(a: Any) -> Any:
    if isinstance(a, Weight):
        return a.tensor
    if isinstance(a, Multi):
        return [_unwrap(x) for x in a.items]
    if isinstance(a, (list, tuple)):
        return type(a)(_unwrap(x) for x in a)
    if isinstance(a, dict):
        return {k: _unwrap(v) for k, v in a.items()}
    return a


def _wrap_const(ctx: Ctx, result: Any, name: str) -> Any:
    import torch

    if isinstance(result, torch.Tensor):
        return ctx.register(result, f"_folded.{name}")
    if isinstance(result, (list, tuple)):
        return Multi([_wrap_const(ctx, r, f"{name}.{i}") for i, r in enumerate(result)])
    return result


def _flatten(out: Any, env: dict[Any, Any]) -> tuple[list[Any], Any]:
    """The output's values in order and its structure (a count, or a nested list of them)."""
    import torch.fx

    flat: list[Any] = []

    def walk(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            flat.append(env[a])
            return len(flat) - 1
        if isinstance(a, (list, tuple)):
            return [walk(x) for x in a]
        raise UnsupportedFeatureError(f"output of type {type(a).__name__} is not supported")

    return flat, walk(out)


def numpy_input(name: str, value: Any, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """A call's argument as the numpy array the graph input takes, or
    ``UnsupportedFeatureError`` saying what differs from the example input."""
    import torch

    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise UnsupportedFeatureError(
            f"input {name!r}: expected a torch tensor or numpy array, got {type(value).__name__}"
        )
    got_shape = tuple(int(d) for d in value.shape)
    if got_shape != shape:
        raise UnsupportedFeatureError(
            f"input {name!r} has shape {list(got_shape)}, the module was compiled for "
            f"{list(shape)}; compile another one for this shape"
        )
    want = {"f32": (torch.float32,), "i32": (torch.int64, torch.int32)}[dtype]
    if value.dtype not in want:
        raise UnsupportedFeatureError(
            f"input {name!r} has dtype {value.dtype}, the module was compiled for {want[0]}"
        )
    arr = value.detach().cpu().contiguous().numpy()
    if dtype == "i32" and arr.dtype != np.int32:
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise UnsupportedFeatureError(f"input {name!r} holds ids beyond int32")
        arr = arr.astype(np.int32)
    return arr
