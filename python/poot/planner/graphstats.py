"""Per-layer bytes and FLOPs of a model's step graph, read from a real trace.

The planner does not guess a model's cost from its hyperparameters: it traces one step of the
workload's shape (``poot.models``' own definition, the same trace the runtime compiles) and sums,
per *unit*, the stored bytes of the weights it reads, the matmul FLOPs, the KV bytes attention
reads (and keeps: the KV pool of its layer, which stays on the unit's device) and the number of
kernel dispatches its equations cost. Units are ``pre`` (embedding), each layer (weights named
``blk.{i}.`` or ``layers.{i}.``) and ``post`` (final norm, output head, sampling step); the
placement search cuts the model only at unit boundaries.

Invariant: ``sum(u.weight_bytes for u in units)`` counts a weight once per unit that reads it, so
a tied embedding is counted in ``pre`` and ``post``; ``ModelStats.total_weight_bytes`` counts it
once.

Mixture-of-experts: a ``moe_matmul`` over a packed [E, N, K] expert stack is resident whole
(``weight_bytes``, ``bytes_of``: every expert, since any may be chosen next step), but a step
reads only the experts its tokens chose: ``bytes_by_dtype`` counts the stack times the expected
fraction of experts ``rows`` tokens touch, each choosing ``k`` of ``E`` (``experts_read``: ``k /
E`` for one decode row, near 1 for a long prefill), and ``matmul_flops`` counts ``k`` experts'
rows per token.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from poot._native import TraceLimits, Tracer, Weights
from poot.models.step import StepShape

if TYPE_CHECKING:
    from poot.models.llama import LlamaModel

__all__ = [
    "ModelStats",
    "UnitStats",
    "Workload",
    "experts_read",
    "model_stats",
    "with_expert_stacks",
]

# Kernels an equation launches where it is not one (as the wgpu and CPU plans lower them; a
# cast of a weight is fused into its reader).
_DISPATCHES = {
    "input": 0,
    "weight": 0,
    "literal": 0,
    "reshape": 0,
    "cast": 0,
    "paged_attention": 2,
}
_LAYER = re.compile(r"(?:^|\.)(?:blk|layers|h)\.(\d+)\.")
_EXPERT = re.compile(r"^(.*\.experts\.)\d+\.(.*)$")


def with_expert_stacks(sizes: dict[str, int]) -> dict[str, int]:
    """``sizes`` plus the stored bytes of each safetensors expert stack (the weight store's
    virtual ``{p}.experts.{rest}``, which the trace reads, over the files' ``{p}.experts.{j}.
    {rest}``): the sum of its experts' tensors. A GGUF's stacks are stored tensors already."""
    out = dict(sizes)
    stacks: dict[str, int] = {}
    for name, n in sizes.items():
        m = _EXPERT.match(name)
        if m:
            stack = m.group(1) + m.group(2)
            stacks[stack] = stacks.get(stack, 0) + n
    for stack, n in stacks.items():
        out.setdefault(stack, n)
    return out


def experts_read(n_experts: int, k: int, tokens: int) -> float:
    """Expected number of distinct experts ``tokens`` tokens touch when each chooses ``k`` of
    ``n_experts`` (routing taken as uniform and independent per token: an expert is missed by a
    token with probability ``1 - k / E``). One token touches exactly ``k``; never more than
    ``E`` or ``tokens * k``."""
    if n_experts <= 0 or k <= 0 or tokens <= 0:
        return 0.0
    k = min(k, n_experts)
    touched = n_experts * (1.0 - (1.0 - k / n_experts) ** tokens)
    return min(float(n_experts), float(tokens * k), touched)


@dataclass(frozen=True)
class Workload:
    """What one step does: ``rows`` tokens (one per sequence when decoding) over ``context``,
    and the KV pool the runtimes keep.

    Attributes:
        kv_positions: positions the KV pool holds (an ``LLM``'s blocks times block size); 0:
            ``rows * context``, the step's own.
        kv_entry_bytes: per device kind, bytes of one stored K or V value (the CPU in ggml
            numerics keeps f16: 2); a kind not listed: 4 (f32, the widest any runtime keeps).
    """

    rows: int = 1
    context: int = 256
    block_size: int = 16
    kv_positions: int = 0
    kv_entry_bytes: tuple[tuple[str, int], ...] = ()

    def shape(self) -> StepShape:
        blocks = max(1, math.ceil(self.context / self.block_size))
        return StepShape(self.rows, self.rows, blocks)


@dataclass
class UnitStats:
    """One unit of the model (``pre``, a layer, ``post``).

    Attributes:
        name: ``"pre"``, ``"layer 3"``, ``"post"``.
        weights: weight names the unit reads.
        weight_bytes: their stored bytes.
        bytes_by_dtype: stored bytes one step reads, per dtype (matmul weights only; an expert
            stack counts the experts the step's tokens are expected to choose, not all).
        matmul_flops: 2 * rows * in * out summed over matmuls, per weight dtype (an expert
            stack: 2 * rows * k * N * K, the chosen experts' rows).
        kv_bytes: KV cache bytes attention reads (f32 entries, ``context`` positions).
        kv_pool_bytes: KV cache bytes the unit's layer keeps on its device: K and V of the
            workload's ``kv_positions``, in f32 entries (``ModelStats.kv_of`` scales them to a
            device's entry size).
        attn_flops: attention FLOPs.
        equations: kernel dispatches the unit's equations cost (``_DISPATCHES``): inputs,
            weights, literals and reshapes launch nothing, attention launches two (KV write,
            then attention). Counting every equation overstated a lavapipe step by a third.
        matmuls: matmuls over stored weights (each pays a fixed cost too).
    """

    name: str
    weights: set[str] = field(default_factory=set)
    weight_bytes: int = 0
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    matmul_flops: dict[str, int] = field(default_factory=dict)
    kv_bytes: int = 0
    kv_pool_bytes: int = 0
    attn_flops: int = 0
    equations: int = 0
    matmuls: int = 0


@dataclass(frozen=True)
class ModelStats:
    """A model's units for one workload, and the bytes crossing each cut."""

    units: tuple[UnitStats, ...]
    activation_bytes: int
    total_weight_bytes: int
    workload: Workload
    sizes: dict[str, int]

    @property
    def n_layers(self) -> int:
        return len(self.units) - 2

    def kv_of(self, start: int, end: int, device: str = "") -> int:
        """KV pool bytes units [start, end) keep on ``device`` (a key such as ``"wgpu:0"``: its
        kind sets the entry size)."""
        entry = dict(self.workload.kv_entry_bytes).get(device.split(":")[0], 4)
        return sum(u.kv_pool_bytes for u in self.units[start:end]) * entry // 4

    def bytes_of(self, start: int, end: int) -> int:
        """Stored bytes of the distinct weights units [start, end) read."""
        names = set().union(*(u.weights for u in self.units[start:end]))
        return sum(self.sizes[n] for n in names)


def model_stats(
    definition: LlamaModel, weights: Weights, sizes: dict[str, int], workload: Workload
) -> ModelStats:
    """Traces one step of ``workload`` and sums bytes and FLOPs per unit.

    Args:
        definition: the model definition.
        weights: its checkpoint's weights (only names, dtypes and shapes are read).
        sizes: stored bytes of each tensor, by name.
        workload: rows and context of the step.
    """
    sizes = with_expert_stacks(sizes)
    shape = workload.shape()
    tracer = Tracer(weights, shape.tokens, TraceLimits(max_tokens=max(shape.tokens, 1)))
    definition.trace(tracer, shape)
    eqs = tracer.finish().equations()
    n_layers = definition.hparams.n_layers
    units = [UnitStats("pre")] + [UnitStats(f"layer {i}") for i in range(n_layers)]
    units.append(UnitStats("post"))
    current = 0  # equations before the first layer weight belong to "pre"
    weight_of: dict[int, tuple[str, str, tuple[int, ...]]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for vid, (op, ins, attrs, dtype, out_shape) in enumerate(eqs):
        shapes[vid] = tuple(out_shape)
        if op == "weight":
            name = str(attrs["name"])
            weight_of[vid] = (name, dtype, tuple(out_shape))
            m = _LAYER.search(name)
            if m:
                current = 1 + int(m.group(1))
            elif current > 0:
                current = n_layers + 1  # output norm / head: the post unit
        elif op == "cast" and ins[0] in weight_of:
            weight_of[vid] = weight_of[ins[0]]  # its reader reads the stored words
        u = units[current]
        u.equations += _DISPATCHES.get(op, 1)
        for i in ins:  # a weight belongs to every unit that reads it (a tied head: pre and post)
            if i in weight_of and weight_of[i][0] not in u.weights:
                u.weights.add(weight_of[i][0])
                u.weight_bytes += sizes.get(weight_of[i][0], 0)
        if op == "matmul" and len(ins) == 2 and ins[1] in weight_of:
            wname, wdt, wshape = weight_of[ins[1]]
            rows = math.prod(out_shape[:-1])
            flops = 2 * rows * math.prod(wshape)
            u.matmul_flops[wdt] = u.matmul_flops.get(wdt, 0) + flops
            u.matmuls += 1
            u.bytes_by_dtype[wdt] = u.bytes_by_dtype.get(wdt, 0) + sizes.get(wname, 0)
        elif op == "moe_matmul" and len(ins) == 3 and ins[1] in weight_of:
            wname, wdt, (n_exp, n, k_in) = weight_of[ins[1]]
            tokens, k = shapes[ins[2]]  # ids [T, k]
            read = experts_read(n_exp, k, tokens) / n_exp
            u.matmul_flops[wdt] = u.matmul_flops.get(wdt, 0) + 2 * tokens * k * n * k_in
            u.matmuls += 1
            step_bytes = round(sizes.get(wname, 0) * read)
            u.bytes_by_dtype[wdt] = u.bytes_by_dtype.get(wdt, 0) + step_bytes
        elif op == "paged_attention":
            hd, nkv, nh = int(attrs["head_dim"]), int(attrs["n_kv_heads"]), int(attrs["n_heads"])
            rows = int(out_shape[0])
            u.kv_bytes += 2 * rows * workload.context * nkv * hd * 4
            positions = workload.kv_positions or workload.rows * workload.context
            u.kv_pool_bytes += 2 * positions * nkv * hd * 4
            u.attn_flops += 4 * rows * workload.context * nh * hd
    act = workload.rows * definition.hparams.hidden_size * 4
    total = sum(sizes.get(n, 0) for n in set().union(*(u.weights for u in units)))
    return ModelStats(tuple(units), act, total, workload, dict(sizes))
