"""compressed-tensors ``pack-quantized`` and act-order GPTQ layers written with numpy, and their
float64 dequantization from the stored tensors (tests only).

compressed-tensors (``compressors/quantized_compressors/pack_quantized.py`` in
neuralmagic/compressed-tensors): quants are signed (``-2^(b-1) .. 2^(b-1) - 1``) and stored
shifted by ``2^(b-1)``; ``pack_to_int32`` packs ``32 / b`` of them a word, value ``e`` of a
word at bits ``b * e``: ``weight_packed`` along the input dim (``[n, k / f]``),
``weight_zero_point`` along the output dim (``[n / f, groups]``, asymmetric only).
``weight_scale`` is ``[n, groups]``, ``weight_shape`` ``[n, k]``, ``weight_g_idx`` ``[k]``
(``actorder: group``). ``W[j, i] = (q - zp) * scale[j, g(i)]``.

GPTQ act-order (``desc_act``): GPTQ quantizes the columns in the order ``perm`` and assigns
column ``perm[r]`` the group ``r // group_size``; ``g_idx`` records it, the stored columns keep
their original order.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np


def act_order_groups(rng: np.random.Generator, k: int, group: int) -> np.ndarray:
    """A ``g_idx`` as act-order writes it, for a random column order."""
    perm = rng.permutation(k)
    g = np.empty(k, np.int32)
    g[perm] = np.arange(k) // group
    return g


def rtn_signed(
    w: np.ndarray, gidx: np.ndarray, groups: int, bits: int, sym: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest signed quants ``[n, k]``, signed zero points and f16 scales
    ``[n, groups]`` for columns grouped by ``gidx``."""
    n, _ = w.shape
    lo_q, hi_q = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    scale = np.zeros((n, groups))
    zero = np.zeros((n, groups))
    for g in range(groups):
        wg = w[:, gidx == g].astype(np.float64)
        if sym:
            scale[:, g] = np.abs(wg).max(axis=1) / hi_q
        else:
            lo, hi = np.minimum(wg.min(axis=1), 0), np.maximum(wg.max(axis=1), 0)
            scale[:, g] = (hi - lo) / (hi_q - lo_q)
            zero[:, g] = np.round(lo_q - lo / np.where(scale[:, g] == 0, 1, scale[:, g]))
    s16 = np.where(scale == 0, 1e-3, scale).astype(np.float16)
    s = s16.astype(np.float64)[:, gidx]
    q = np.clip(np.round(w / s) + zero[:, gidx], lo_q, hi_q).astype(np.int64)
    return q, zero.astype(np.int64), s16


def pack_to_int32(value: np.ndarray, bits: int, packed_dim: int = 1) -> np.ndarray:
    """compressed-tensors' ``pack_to_int32``: shift signed to unsigned, pack along a dim."""
    u = (value + (1 << (bits - 1))).astype(np.uint32)
    f = 32 // bits
    if packed_dim == 0:
        u = u.T
    pad = -u.shape[1] % f
    u = np.pad(u, [(0, 0), (0, pad)])
    out = np.zeros((u.shape[0], u.shape[1] // f), np.uint32)
    for i in range(f):
        out |= u[:, i::f] << np.uint32(bits * i)
    out = out.T if packed_dim == 0 else out
    return np.ascontiguousarray(out).view(np.int32)


def unpack_from_int32(value: np.ndarray, bits: int, rows: int, packed_dim: int = 1) -> np.ndarray:
    """The inverse (``unpack_from_int32``): signed ``int64``, padding removed."""
    u = value.view(np.uint32)
    u = u.T if packed_dim == 0 else u
    f = 32 // bits
    parts = [(u >> np.uint32(bits * i)) & np.uint32((1 << bits) - 1) for i in range(f)]
    out = np.stack(parts, axis=2).reshape(u.shape[0], -1)[:, :rows].astype(np.int64)
    out -= 1 << (bits - 1)
    return out.T if packed_dim == 0 else out


def ct_layer(
    w: np.ndarray,
    bits: int,
    group: int,
    sym: bool,
    actorder: bool,
    rng: np.random.Generator,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One ``pack-quantized`` layer's tensors (``group`` -1: channel strategy) and its float64
    dequantization computed back from them."""
    n, k = w.shape
    groups = 1 if group == -1 else k // group
    gidx = act_order_groups(rng, k, k // groups) if actorder else np.arange(k) // (k // groups)
    q, zp, s = rtn_signed(w, gidx, groups, bits, sym)
    t = {
        "weight_packed": pack_to_int32(q, bits),
        "weight_scale": s,
        "weight_shape": np.array([n, k], np.int32),
    }
    if not sym:
        t["weight_zero_point"] = pack_to_int32(zp, bits, packed_dim=0)
    if actorder:
        t["weight_g_idx"] = gidx.astype(np.int32)
    return t, dequant_ct(t, bits)


def dequant_ct(t: dict[str, np.ndarray], bits: int) -> np.ndarray:
    """``W`` [n, k] in float64 from a layer's stored tensors."""
    n, k = (int(v) for v in t["weight_shape"])
    q = unpack_from_int32(t["weight_packed"], bits, k)
    scale = t["weight_scale"].astype(np.float64)
    groups = scale.shape[1]
    if "weight_zero_point" in t:
        zp = unpack_from_int32(t["weight_zero_point"], bits, n, packed_dim=0)
    else:
        zp = np.zeros((n, groups), np.int64)
    gidx = t.get("weight_g_idx", np.arange(k) // (k // groups))
    return (q - zp[:, gidx]) * scale[:, gidx]


def ct_config(bits: int, group: int, sym: bool, actorder: bool, ignore: list[str]) -> dict:
    """``quantization_config`` as llm-compressor writes it."""
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": sym,
        "strategy": "channel" if group == -1 else "group",
        "group_size": None if group == -1 else group,
        "actorder": "group" if actorder else None,
        "dynamic": False,
        "observer": "minmax",
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def save_raw(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file from raw bytes, for dtypes numpy has no type for (BF16, F8_E4M3)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, data in tensors.values():
            f.write(data)


def bf16_bytes(a: np.ndarray) -> bytes:
    """``a`` (values exact in bf16) as little-endian bf16 words."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    assert not np.any(u & 0xFFFF), "not exact in bf16"
    return (u >> 16).astype("<u2").tobytes()


def gptq_act_order_layer(
    w: np.ndarray, group: int, bits: int, v1: bool, sym: bool, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A GPTQ ``desc_act`` layer (``qweight``, ``qzeros``, ``scales``, a scattered ``g_idx``)
    and its float64 dequantization from the stored words (``g_idx`` read per column)."""
    from quant_int4 import pack_gptq, pack_gptq8

    n, k = w.shape
    groups = k // group
    gidx = act_order_groups(rng, k, group)
    q, zp, s = rtn_signed(w, gidx, groups, bits, sym)
    shift = 1 << (bits - 1)
    # GPTQ stores unsigned quants [k, n], zeros and scales [groups, n].
    qu = (q + shift).T.astype(np.uint32)
    zu = (zp + shift).T.astype(np.uint32)
    pack = pack_gptq if bits == 4 else pack_gptq8
    qw, qz = pack(qu, zu, v1)
    scales = np.ascontiguousarray(s.T)
    t = {"qweight": qw, "qzeros": qz, "scales": scales, "g_idx": gidx}
    # The reference reads the words back: quant i of column j, zero of (g, j).
    f = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    uq = np.stack([(qw.view(np.uint32) >> np.uint32(bits * e)) & mask for e in range(f)], 1)
    qk = uq.reshape(k, n).astype(np.int64)
    uz = np.stack([(qz.view(np.uint32) >> np.uint32(bits * e)) & mask for e in range(f)], 2)
    zk = uz.reshape(groups, n).astype(np.int64) + (1 if v1 else 0)
    ref = ((qk - zk[gidx]) * scales.astype(np.float64)[gidx]).T
    return t, ref
