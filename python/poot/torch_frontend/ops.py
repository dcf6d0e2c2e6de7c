"""The aten ops poot lowers, one function each: ``LOWERINGS[str(op)](ctx, node, *args)``.

Each function gets the node's arguments with tensors already lowered (``Ref`` for values that
depend on the inputs, ``Weight`` for constants) and returns the node's value. Shapes come from
the node's fake-tensor metadata (``lower.shape_of``), so a view is a reshape to the shape torch
itself computed. What a function cannot express raises ``ctx.unsupported(...)``; the table in
docs/compiling-modules.md lists what lowers now.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from poot.torch_frontend.lower import Ctx, Multi, Weight, shape_of
from poot.torch_frontend.program import Ref

Lowering = Callable[..., Any]
LOWERINGS: dict[str, Lowering] = {}


def _reg(*names: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for n in names:
            LOWERINGS[n] = fn
        return fn

    return deco


def _rank(ctx: Ctx, node: Any) -> int:
    return len(shape_of(node))


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _in_shape(node: Any, i: int = 0) -> tuple[int, ...]:
    return shape_of(node.args[i])


@_reg("aten.linear.default")
def _linear(ctx: Ctx, node: Any, x: Any, w: Any, b: Any = None) -> Ref:
    if not isinstance(w, Weight) or w.tensor.dim() != 2:
        raise ctx.unsupported("the weight must be a 2-D parameter or constant")
    p = ctx.program
    shape = _in_shape(node)
    k = shape[-1]
    rows = math.prod(shape[:-1])
    xr = ctx.operand(x)
    if len(shape) != 2:
        xr = p.call("reshape", xr, [rows, k])
    y = p.call("matmul", xr, ctx.weight(w))
    if b is not None:
        # The IR's `add` (a row broadcast over rows): every runtime has it; same bits.
        y = p.call("add", y, ctx.operand(b))
    out = list(shape_of(node))
    if len(out) != 2:
        y = p.call("reshape", y, out)
    return y


_UNARY = {
    "aten.relu.default": "relu",
    "aten.tanh.default": "tanh",
    "aten.sigmoid.default": "sigmoid",
    "aten.neg.default": "neg",
    "aten.exp.default": "exp",
    "aten.sqrt.default": "sqrt",
    "aten.rsqrt.default": "rsqrt",
    "aten.abs.default": "abs",
}


def _unary(kind: str) -> Lowering:
    def fn(ctx: Ctx, node: Any, x: Any) -> Ref:
        return ctx.program.call("unary", ctx.operand(x), kind)

    return fn


for _name, _kind in _UNARY.items():
    LOWERINGS[_name] = _unary(_kind)


@_reg("aten.silu.default")
def _silu(ctx: Ctx, node: Any, x: Any) -> Ref:
    return ctx.program.call("silu", ctx.operand(x))


@_reg("aten.gelu.default")
def _gelu(ctx: Ctx, node: Any, x: Any, approximate: str = "none") -> Ref:
    if approximate == "tanh":
        return ctx.program.call("gelu", ctx.operand(x))
    return ctx.program.call("unary", ctx.operand(x), "gelu_erf")


@_reg("aten.layer_norm.default")
def _layer_norm(
    ctx: Ctx,
    node: Any,
    x: Any,
    normalized_shape: list[int],
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> Ref:
    if len(normalized_shape) != 1:
        raise ctx.unsupported(f"normalized_shape {list(normalized_shape)} (only the last dim)")
    w = ctx.operand(weight) if weight is not None else None
    b = ctx.operand(bias) if bias is not None else None
    return ctx.program.call("layer_norm", ctx.operand(x), w, b, float(eps))


_ARITH = {
    "aten.add.Tensor": "add",
    "aten.sub.Tensor": "sub",
    "aten.mul.Tensor": "mul",
    "aten.div.Tensor": "div",
    "aten.add.Scalar": "add",
    "aten.sub.Scalar": "sub",
    "aten.mul.Scalar": "mul",
    "aten.div.Scalar": "div",
}


def _arith(kind: str) -> Lowering:
    def fn(ctx: Ctx, node: Any, a: Any, b: Any, *, alpha: Any = 1) -> Ref:
        p = ctx.program
        if isinstance(b, (int, float)) and alpha != 1:
            b = b * alpha
        elif alpha != 1:
            b = p.call("scalar", ctx.operand(b), "mul", float(alpha))
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            return p.call("scalar", ctx.operand(a), kind, float(b))
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return p.call("scalar", ctx.operand(b), kind, float(a), reverse=True)
        if kind in ("add", "mul") and _row_broadcast(node, a):
            # The IR's own `add`/`mul` where their rule fits (every runtime has them).
            return p.call(kind, ctx.operand(a), ctx.operand(b))
        return p.call("binary", ctx.operand(a), ctx.operand(b), kind)

    return fn


def _row_broadcast(node: Any, a: Any) -> bool:
    """Whether `a op b` fits `add`/`mul`'s rule: `a` a computed value (a `Ref`: lowered values
    are activations; constants are `Weight`s), `b` of `a`'s shape or one row of it."""
    if not isinstance(a, Ref):
        return False
    sa, out = _in_shape(node, 0), shape_of(node)
    sb = _in_shape(node, 1)
    return sa == out and bool(sa) and (sb == sa or sb == sa[-1:])


for _name, _kind in _ARITH.items():
    LOWERINGS[_name] = _arith(_kind)


@_reg("aten.rsub.Scalar")
def _rsub(ctx: Ctx, node: Any, a: Any, b: float, alpha: float = 1) -> Ref:
    x = ctx.operand(a)
    if alpha != 1:
        x = ctx.program.call("scalar", x, "mul", float(alpha))
    return ctx.program.call("scalar", x, "sub", float(b), reverse=True)


@_reg(
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
    "aten.flatten.using_ints",
    "aten.unflatten.int",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.unsqueeze.default",
    "aten.expand.default",
)
def _reshape(ctx: Ctx, node: Any, x: Any, *rest: Any) -> Ref:
    out = list(shape_of(node))
    if math.prod(out) != math.prod(_in_shape(node)):
        raise ctx.unsupported(f"an expand from {list(_in_shape(node))} to {out}")
    return ctx.program.call("reshape", ctx.operand(x), out)


@_reg(
    "aten.contiguous.default",
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
)
def _identity(ctx: Ctx, node: Any, x: Any, *rest: Any, **kw: Any) -> Any:
    return ctx.operand(x)


@_reg("aten.dropout.default")
def _dropout(ctx: Ctx, node: Any, x: Any, p: float, train: bool) -> Any:
    if train and p > 0:
        raise ctx.unsupported(f"dropout p={p} in training mode (call module.eval() first)")
    return ctx.operand(x)


@_reg("aten.softmax.int", "aten._softmax.default")
def _softmax(ctx: Ctx, node: Any, x: Any, dim: int, *rest: Any) -> Ref:
    rank = _rank(ctx, node)
    d = _dim(dim, rank)
    v = ctx.operand(x)
    if d == rank - 1:
        return ctx.program.call("softmax", v)
    perm = list(range(rank))
    perm[d], perm[-1] = perm[-1], perm[d]
    v = ctx.program.call("permute", v, perm)
    v = ctx.program.call("softmax", v)
    return ctx.program.call("permute", v, perm)


@_reg("aten.transpose.int")
def _transpose(ctx: Ctx, node: Any, x: Any, d0: int, d1: int) -> Ref:
    rank = _rank(ctx, node)
    perm = list(range(rank))
    a, b = _dim(d0, rank), _dim(d1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.program.call("permute", ctx.operand(x), perm)


@_reg("aten.permute.default")
def _permute(ctx: Ctx, node: Any, x: Any, dims: list[int]) -> Ref:
    rank = _rank(ctx, node)
    return ctx.program.call("permute", ctx.operand(x), [_dim(d, rank) for d in dims])


@_reg("aten.t.default")
def _t(ctx: Ctx, node: Any, x: Any) -> Any:
    if _rank(ctx, node) < 2:
        return ctx.operand(x)
    return ctx.program.call("permute", ctx.operand(x), [1, 0])


@_reg("aten.matmul.default", "aten.bmm.default", "aten.mm.default")
def _matmul(ctx: Ctx, node: Any, a: Any, b: Any) -> Ref:
    if len(_in_shape(node, 0)) < 2 or len(_in_shape(node, 1)) < 2:
        raise ctx.unsupported("matmul of a vector (rank 1)")
    return ctx.program.call("batch_matmul", ctx.operand(a), ctx.operand(b))


@_reg("aten.embedding.default")
def _embedding(ctx: Ctx, node: Any, weight: Any, ids: Any, *rest: Any) -> Ref:
    if not isinstance(weight, Weight):
        raise ctx.unsupported("the embedding table must be a parameter or constant")
    p = ctx.program
    ishape = _in_shape(node, 1)
    if isinstance(ids, Weight):
        # Constant ids into a trained table (only lowered, not folded, for training): rows
        # picked by a constant one-hot matrix, so the table's gradient flows through a matmul.
        import torch

        n = weight.tensor.shape[0]
        onehot = torch.nn.functional.one_hot(ids.tensor.reshape(-1).long(), n).float()
        sel = ctx.register(onehot, f"_onehot.{node.name}")
        y = p.call("batch_matmul", ctx.weight(sel), ctx.weight(weight))
        return p.call("reshape", y, list(shape_of(node)))
    flat = p.call("reshape", ctx.operand(ids), [math.prod(ishape)])
    y = p.call("embedding", ctx.weight(weight), flat)
    return p.call("reshape", y, list(shape_of(node)))


@_reg("aten.split.Tensor", "aten.split_with_sizes.default")
def _split(ctx: Ctx, node: Any, x: Any, size: Any, dim: int = 0) -> Multi:
    shape = _in_shape(node)
    d = _dim(dim, len(shape))
    sizes = list(size) if isinstance(size, (list, tuple)) else None
    if sizes is None:
        sizes = [min(size, shape[d] - s) for s in range(0, shape[d], size)]
    items, start = [], 0
    for n in sizes:
        items.append(ctx.program.call("slice", ctx.operand(x), d, start, start + n))
        start += n
    return Multi(items)


@_reg("_operator.getitem")
def _getitem(ctx: Ctx, node: Any, seq: Any, i: int) -> Any:
    if not isinstance(seq, Multi):
        raise ctx.unsupported("getitem of a single value")
    return seq.items[i]


LOWERINGS[f"{operator.getitem.__module__}.getitem"] = _getitem


@_reg("aten.slice.Tensor")
def _slice(
    ctx: Ctx, node: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Any:
    shape = _in_shape(node)
    d = _dim(dim, len(shape))
    n = shape[d]
    s, e, _ = slice(start, end, 1).indices(n)
    if step != 1:
        raise ctx.unsupported(f"slice step {step}")
    if s == 0 and e == n:
        return ctx.operand(x)
    return ctx.program.call("slice", ctx.operand(x), d, s, e)


@_reg("aten.cat.default")
def _cat(ctx: Ctx, node: Any, xs: list[Any], dim: int = 0) -> Ref:
    d = _dim(dim, _rank(ctx, node))
    return ctx.program.call("concat", [ctx.activation(x) for x in xs], d)


@_reg("aten.scaled_dot_product_attention.default")
def _sdpa(
    ctx: Ctx,
    node: Any,
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Ref:
    p = ctx.program
    qs, ks = _in_shape(node, 0), _in_shape(node, 1)
    if dropout_p:
        raise ctx.unsupported(f"attention dropout {dropout_p}")
    if enable_gqa or qs[:-2] != ks[:-2]:
        raise ctx.unsupported("grouped-query attention (q and k head counts differ)")
    if is_causal and qs[-2] != ks[-2]:
        raise ctx.unsupported("a causal mask with different query and key lengths")
    rank = len(ks)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    kt = p.call("permute", ctx.operand(k), perm)
    s = p.call("batch_matmul", ctx.operand(q), kt)
    s = p.call("scalar", s, "mul", scale if scale is not None else 1.0 / math.sqrt(qs[-1]))
    if is_causal:
        s = p.call("causal_mask", s)
    if attn_mask is not None:
        s = _add_mask(ctx, s, attn_mask)
    s = p.call("softmax", s)
    return p.call("batch_matmul", s, ctx.operand(v))


def _add_mask(ctx: Ctx, s: Ref, mask: Any) -> Ref:
    import torch

    if isinstance(mask, Weight) and mask.tensor.dtype == torch.bool:
        # A constant boolean mask becomes an additive one (0 kept, -inf masked).
        add = torch.zeros(mask.tensor.shape).masked_fill(~mask.tensor, float("-inf"))
        mask = ctx.register(add, f"{mask.name}.additive")
    elif isinstance(mask, Ref) and ctx.node is not None:
        pass
    return ctx.program.call("binary", s, ctx.operand(mask), "add")


@_reg("aten.masked_fill.Scalar")
def _masked_fill(ctx: Ctx, node: Any, x: Any, mask: Any, value: float) -> Ref:
    import torch

    if not (isinstance(mask, Weight) and value == float("-inf")):
        raise ctx.unsupported("masked_fill other than a constant mask filled with -inf")
    add = torch.zeros(mask.tensor.shape).masked_fill(mask.tensor.bool(), float("-inf"))
    w = ctx.register(add, f"{mask.name}.additive")
    return ctx.program.call("binary", ctx.operand(x), ctx.weight(w), "add")


@_reg("aten.reciprocal.default")
def _reciprocal(ctx: Ctx, node: Any, x: Any) -> Ref:
    return ctx.program.call("scalar", ctx.operand(x), "div", 1.0, reverse=True)


@_reg("aten.pow.Tensor_Scalar")
def _pow(ctx: Ctx, node: Any, x: Any, exponent: float) -> Ref:
    v = ctx.operand(x)
    if exponent == 2:
        return ctx.program.call("binary", v, v, "mul")
    if exponent == 1:
        return v
    if exponent == 0.5:
        return ctx.program.call("unary", v, "sqrt")
    if exponent == -0.5:
        return ctx.program.call("unary", v, "rsqrt")
    if exponent == -1:
        return ctx.program.call("scalar", v, "div", 1.0, reverse=True)
    raise ctx.unsupported(f"pow with exponent {exponent} (2, 1, 0.5, -0.5, -1 lower)")


def _reduce(kind: str) -> Lowering:
    def fn(ctx: Ctx, node: Any, x: Any, dim: Any = None, keepdim: bool = False, **kw: Any) -> Ref:
        shape = _in_shape(node)
        rank = len(shape)
        if kw.get("dtype") is not None:
            raise ctx.unsupported(f"a reduction to dtype {kw['dtype']}")
        dims = list(range(rank)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        dims = sorted(_dim(d, rank) for d in dims)
        if not dims or rank == 0:
            raise ctx.unsupported("a reduction over no dims")
        p = ctx.program
        v = ctx.operand(x)
        # The reduced dims moved last and flattened into one, then one reduction over it.
        keep = [d for d in range(rank) if d not in dims]
        if keep + dims != list(range(rank)):
            v = p.call("permute", v, keep + dims)
        kept = [shape[d] for d in keep]
        v = p.call("reshape", v, [*kept, math.prod(shape[d] for d in dims)])
        v = p.call("reduce", v, kind)
        return p.call("reshape", v, list(shape_of(node)))

    return fn


LOWERINGS["aten.mean.dim"] = _reduce("mean")
LOWERINGS["aten.mean.default"] = _reduce("mean")
LOWERINGS["aten.sum.dim_IntList"] = _reduce("sum")
LOWERINGS["aten.sum.default"] = _reduce("sum")
LOWERINGS["aten.amax.default"] = _reduce("max")


@_reg("aten.rms_norm.default")
def _rms_norm(
    ctx: Ctx,
    node: Any,
    x: Any,
    normalized_shape: list[int],
    weight: Any = None,
    eps: float | None = None,
) -> Ref:
    import torch

    if len(normalized_shape) != 1:
        raise ctx.unsupported(f"normalized_shape {list(normalized_shape)} (only the last dim)")
    if weight is None:
        weight = ctx.register(torch.ones(normalized_shape[0]), f"_ones.{node.name}")
    if not isinstance(weight, Weight):
        raise ctx.unsupported("the weight must be a parameter or constant")
    e = torch.finfo(torch.float32).eps if eps is None else float(eps)
    return ctx.program.call("rms_norm", ctx.operand(x), ctx.weight(weight), e)


@_reg("aten.select.int")
def _select(ctx: Ctx, node: Any, x: Any, dim: int, index: int) -> Ref:
    shape = _in_shape(node)
    d = _dim(dim, len(shape))
    i = index + shape[d] if index < 0 else index
    v = ctx.program.call("slice", ctx.operand(x), d, i, i + 1)
    return ctx.program.call("reshape", v, list(shape_of(node)))


@_reg("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout")
def _to(ctx: Ctx, node: Any, x: Any, *rest: Any, **kw: Any) -> Any:
    src, dst = node.args[0].meta["val"].dtype, node.meta["val"].dtype
    if src != dst:
        raise ctx.unsupported(f"a cast from {src} to {dst} (activations are float32)")
    return ctx.operand(x)


@_reg("aten._assert_tensor_metadata.default")
def _assert_metadata(ctx: Ctx, node: Any, *args: Any, **kw: Any) -> None:
    # export's own check of a cast's input; shapes and dtypes are fixed here already.
    return None


@_reg("aten.unbind.int")
def _unbind(ctx: Ctx, node: Any, x: Any, dim: int = 0) -> Multi:
    shape = _in_shape(node)
    d = _dim(dim, len(shape))
    rest = [n for i, n in enumerate(shape) if i != d]
    v = ctx.activation(x)
    items = []
    for i in range(shape[d]):
        s = ctx.program.call("slice", v, d, i, i + 1)
        items.append(ctx.program.call("reshape", s, rest))
    return Multi(items)
