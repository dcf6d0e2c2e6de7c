"""An independent numpy interpreter of poot graphs, for tests only.

It runs a ``poot._native.Graph`` equation by equation (``Graph.equations()``) with weights
dequantized by the ``gguf`` package (or read by ``safetensors``), in float64, with its own paged
KV cache. It checks what a graph *means*: the model definitions' traces against published
references, and the CPU runtime against it. It has the ``CpuRuntime`` methods the engine uses
(``compile``, ``configure_kv``, ``run``), so ``poot.LLM`` can run on it in tests.

The sampling step follows the documented semantics of its nodes (poot-runtime's
``sample`` module): a row with a NaN or +inf, or with nothing allowed,
samples -1; temperature 0 is argmax (the lowest id among ties); otherwise, over logits /
temperature without the -inf tokens, sorted by descending value (ties by lower id): top_k (0 =
all), softmax, the shortest prefix whose mass reaches top_p, then tokens with at least min_p
times the top probability, renormalized, and the token where the cumulative sum first exceeds
``uniform``. ``late`` inputs are waited for before the run starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

Array = np.ndarray


def load_weights(path: Path) -> dict[str, Array]:
    """Every tensor of a .gguf file or a HF directory, dequantized to float64."""
    path = Path(path)
    if path.is_dir():
        from safetensors.numpy import load_file

        out: dict[str, Array] = {}
        for f in sorted(path.glob("*.safetensors")):
            out.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
        return out
    import gguf

    reader = gguf.GGUFReader(path)
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        for t in reader.tensors
    }


def _rope_freqs(attrs: dict[str, Any]) -> Array:
    rot, theta = attrs["rot_dim"], attrs["theta"]
    inv = theta ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    s = attrs["scaling"]
    if s["type"] == "linear":
        inv = inv / s["factor"]
    elif s["type"] == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        orig = s["original_max_position"]
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = orig / lo, orig / hi
        smooth = (orig / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > low_wl, inv / factor, inv)
        mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif s["type"] == "factors":
        inv = inv / np.asarray(s["factors"], np.float64)
    return inv


def rope(x: Array, positions: Array, attrs: dict[str, Any]) -> Array:
    """Rotates x [T, H*Dh] in place of a copy."""
    t = x.shape[0]
    h, dh, rot = attrs["n_heads"], attrs["head_dim"], attrs["rot_dim"]
    y = x.reshape(t, h, dh).copy()
    angles = positions.astype(np.float64)[:, None] * _rope_freqs(attrs)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    if attrs["scaling"]["type"] == "factors":
        m = attrs["scaling"]["attn_factor"]
        cos, sin = cos * m, sin * m
    if attrs["style"] == "interleaved":
        a, b = y[:, :, 0:rot:2].copy(), y[:, :, 1:rot:2].copy()
        y[:, :, 0:rot:2] = a * cos - b * sin
        y[:, :, 1:rot:2] = a * sin + b * cos
    else:
        half = rot // 2
        a, b = y[:, :, :half].copy(), y[:, :, half:rot].copy()
        y[:, :, :half] = a * cos - b * sin
        y[:, :, half:rot] = a * sin + b * cos
    return y.reshape(t, h * dh)


def sample(
    logits: Array, temperature: float, top_k: int, top_p: float, min_p: float, uniform: float
) -> int:
    """One row of the ``sample`` node (see the module docs)."""
    if np.isnan(logits).any() or (logits == np.inf).any() or (logits == -np.inf).all():
        return -1
    if temperature == 0:
        return int(np.argmax(logits))
    z = logits / temperature
    ids = np.flatnonzero(z > -np.inf)
    order = ids[np.lexsort((ids, -z[ids]))]
    if top_k > 0:
        order = order[:top_k]
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    keep = len(order)
    if top_p < 1:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
    keep = min(keep, int((p >= min_p * p[0]).sum()))
    order, p = order[:keep], p[:keep] / p[:keep].sum()
    idx = int(np.searchsorted(np.cumsum(p), uniform, side="right"))
    return int(order[min(idx, len(order) - 1)])


def adjust(
    row: Array, ids: Array, counts: Array, bias: Array, rep: float, pres: float, freq: float
) -> Array:
    """One row of ``adjust_logits``: repetition, then presence/frequency, then bias."""
    out = row.copy()
    if not np.isfinite(out).all():
        return np.full_like(out, np.nan)
    for i, c, b in zip(ids, counts, bias, strict=True):
        if i < 0:
            continue
        x = out[i]
        if c >= 0:
            x = x / rep if x > 0 else x * rep
        if c > 0:
            x -= pres + freq * c
        out[i] = x + b
    return out


def mask(row: Array, words: Array) -> Array:
    """One row of ``mask_logits``: tokens whose bit is clear become -inf."""
    if not np.isfinite(row).all():
        return np.full_like(row, np.nan)
    bits = (words.astype(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    allowed = bits.reshape(-1)[: row.shape[0]].astype(bool)
    return np.where(allowed, row, -np.inf)


def top_k_ids(row: Array, k: int) -> Array:
    ids = np.flatnonzero(~np.isnan(row))
    order = ids[np.lexsort((ids, -row[ids]))][:k]
    return np.concatenate([order, np.full(k - len(order), -1)]).astype(np.int64)


def logprobs(row: Array, ids: Array) -> Array:
    if not np.isfinite(row).all():
        return np.full(len(ids), np.nan)
    lse = row.max() + np.log(np.exp(row - row.max()).sum())
    return np.array([row[i] - lse if i >= 0 else np.nan for i in ids])


def f16(x: Array) -> Array:
    return x.astype(np.float16).astype(np.float64)


def quantize_q8(x: Array, with_sum: bool) -> Array:
    """Rows of x through ggml's Q8_0 / Q8_1 activation quantization (blocks of 32)."""
    t, k = x.shape
    b = x.astype(np.float32).reshape(t, k // 32, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / 127
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0)
    q = np.round(b * inv)
    d16 = d.astype(np.float16).astype(np.float64)
    return (q * d16).reshape(t, k)


def ggml_activations(a: Array, wtype: str) -> Array:
    """What ggml's CPU matmul feeds the dot product for a weight of ``wtype``."""
    if wtype in ("Q4_0", "Q5_0", "Q8_0"):
        return quantize_q8(a, with_sum=False)
    if wtype in ("Q4_1", "Q5_1"):
        return quantize_q8(a, with_sum=True)
    if wtype in ("F16",):
        return f16(a)
    return a


class NumpyPlan:
    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.equations = graph.equations()
        self.outputs = [(name, None) for name, _, _ in graph.outputs()]
        self.artifact_bytes = 0


class NumpyRuntime:
    """The ``CpuRuntime`` methods the engine calls, in numpy."""

    name = "numpy"

    def __init__(self, weights: dict[str, Array], *, ggml_numerics: bool = False) -> None:
        """``ggml_numerics`` mimics llama.cpp's CPU path: activations quantized to Q8_0/Q8_1
        (F16 for F16 weights) before quantized matmuls, K/V stored as F16, q and attention
        probabilities multiplied as F16."""
        self.weights = weights
        self.ggml = ggml_numerics
        self.k: list[Array] = []
        self.v: list[Array] = []
        self.block_size = 0
        # K/V kept as F16 values under ggml numerics (the LLM sizes its pool by this).
        self.kv_entry_bytes = 2 if ggml_numerics else 4

    def supports(self, op: str) -> bool:
        """Every op of the IR has a numpy interpretation here."""
        return True

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
        # The last ``windowed_layers`` layers are a windowed KV group with its own pool.
        def shape(layer: int) -> tuple[int, int, int]:
            blocks = windowed_blocks if layer >= n_layers - windowed_layers else num_blocks
            return (blocks * block_size, n_kv_heads, head_dim)

        self.k = [np.zeros(shape(i)) for i in range(n_layers)]
        self.v = [np.zeros(shape(i)) for i in range(n_layers)]
        self.block_size = block_size

    def prepare(self, graph: Any, weights: Any = None, limits: Any = None) -> NumpyPlan:
        return NumpyPlan(graph)

    def attention(self, q: Array, k: Array, v: Array, meta: list[Array], a: dict) -> Array:
        slots, token_seq, positions, tables = meta
        layer, h, hkv, dh = a["layer"], a["n_heads"], a["n_kv_heads"], a["head_dim"]
        kc, vc = self.k[layer], self.v[layer]
        t = q.shape[0]
        if self.ggml:  # llama.cpp keeps K/V in F16 and multiplies q and probs as F16
            k, v, q = f16(k), f16(v), f16(q)
        for i in range(t):
            if slots[i] >= 0:
                kc[slots[i]] = k[i].reshape(hkv, dh)
                vc[slots[i]] = v[i].reshape(hkv, dh)
        out = np.zeros((t, h * dh))
        bs = self.block_size
        window, cap = a.get("window", 0), a.get("softcap", 0.0)
        for i in range(t):
            # A windowed layer reads only the last `window` positions.
            first = max(0, positions[i] + 1 - window) if window else 0
            pos = np.arange(first, positions[i] + 1)
            table = tables[token_seq[i]]
            idx = table[pos // bs] * bs + pos % bs
            keys, vals = kc[idx], vc[idx]  # [P, hkv, dh]
            qi = q[i].reshape(h, dh)
            group = h // hkv
            for head in range(h):
                kv = head // group
                s = keys[:, kv, :] @ qi[head] * a["scale"]
                if cap:
                    s = np.tanh(s / cap) * cap
                p = np.exp(s - s.max())
                p /= p.sum()
                if self.ggml:
                    p = f16(p)
                out[i, head * dh : (head + 1) * dh] = p @ vals[:, kv, :]
        return out

    def run(
        self,
        plan: NumpyPlan,
        inputs: dict[str, Array],
        timeout_s: float = 600.0,
        late: dict[str, Any] | None = None,
    ) -> dict:
        if late:
            inputs = {**inputs, **{k: v.wait(timeout_s) for k, v in late.items()}}
        vals: list[Any] = []
        dtypes = [e[3] for e in plan.equations]
        for i, (op, args, attrs, _, shape) in enumerate(plan.equations):
            x = [vals[i] for i in args]
            if op == "cast":  # a stored weight read as f32: its reader sees the stored dtype
                dtypes[i] = dtypes[args[0]]
            if op == "input":
                r = np.asarray(inputs[attrs["name"]])
                assert r.shape == tuple(shape), (attrs["name"], r.shape, shape)
            elif op == "weight":
                r = self.weights[attrs["name"]].reshape(shape)
            elif op == "cast":
                r = x[0]
            elif op == "literal":
                r = np.asarray(attrs["data"], np.float64).reshape(shape)
            elif op == "embedding":
                r = x[0][x[1]]
            elif op == "rms_norm":
                r = x[0] / np.sqrt((x[0] ** 2).mean(-1, keepdims=True) + attrs["eps"]) * x[1]
            elif op == "matmul":
                a = x[0]
                if self.ggml:
                    a = ggml_activations(a, dtypes[args[1]])
                r = a @ x[1].T
            elif op == "add":
                r = x[0] + x[1].reshape(-1) if x[1].shape != x[0].shape else x[0] + x[1]
            elif op == "mul":
                r = x[0] * x[1].reshape(-1) if x[1].shape != x[0].shape else x[0] * x[1]
            elif op == "silu":
                r = x[0] / (1 + np.exp(-x[0]))
            elif op == "gelu":
                c = math.sqrt(2 / math.pi)
                r = 0.5 * x[0] * (1 + np.tanh(c * (x[0] + 0.044715 * x[0] ** 3)))
            elif op == "gather_cols":
                r = np.take_along_axis(x[0], x[1].astype(np.int64), axis=1)
            elif op == "moe_matmul":
                a, w, ids = x[0], x[1], x[2].astype(np.int64)
                if self.ggml:
                    a = ggml_activations(a, dtypes[args[1]])
                slots = ids.shape[1]
                shared = a.shape[0] == ids.shape[0]
                r = np.stack(
                    [w[e] @ a[s // slots if shared else s] for s, e in enumerate(ids.reshape(-1))]
                )
            elif op == "moe_combine":
                t, k = x[1].shape
                r = (x[0].reshape(t, k, -1) * x[1][:, :, None]).sum(axis=1)
            elif op == "softcap":
                r = np.tanh(x[0] / attrs["cap"]) * attrs["cap"]
            elif op == "softmax":
                e = np.exp(x[0] - x[0].max(-1, keepdims=True))
                r = e / e.sum(-1, keepdims=True)
            elif op == "rope":
                r = rope(x[0], x[1], attrs)
            elif op == "paged_attention":
                r = self.attention(x[0], x[1], x[2], x[3:7], attrs)
            elif op == "reshape":
                r = x[0].reshape(attrs["shape"])
            elif op == "slice":
                r = np.take(x[0], range(attrs["start"], attrs["end"]), axis=attrs["axis"])
            elif op == "concat":
                r = np.concatenate(x, axis=attrs["axis"])
            elif op == "gather_rows":
                r = x[0][x[1]]
            elif op == "scatter_add_rows":
                r = np.zeros((attrs["rows"], x[0].shape[1]), x[0].dtype)
                np.add.at(r, x[1], x[0])
            elif op == "sample":
                rows = range(x[0].shape[0])
                r = np.array([sample(x[0][i], *(v[i] for v in x[1:])) for i in rows], np.int32)
            elif op == "adjust_logits":
                rows = range(x[0].shape[0])
                r = np.stack([adjust(x[0][i], *(v[i] for v in x[1:])) for i in rows])
            elif op == "mask_logits":
                r = np.stack([mask(x[0][i], x[1][i]) for i in range(x[0].shape[0])])
            elif op == "top_k":
                r = np.stack([top_k_ids(row, attrs["k"]) for row in x[0]])
            elif op == "logprobs":
                r = np.stack([logprobs(x[0][i], x[1][i]) for i in range(x[0].shape[0])])
            else:
                raise NotImplementedError(op)
            vals.append(r)
        ids = plan.graph.output_ids()
        return {
            name: vals[ids[name]].astype(np.float32 if dtype == "F32" else np.int32)
            for name, dtype, _ in plan.graph.outputs()
        }
