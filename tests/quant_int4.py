"""GPTQ and AWQ int4 tensors written with numpy, and their float64 dequantization (tests only).

The packers write the formats as their producers do (AutoGPTQ/GPTQModel ``pack``, AutoAWQ's
``WQLinear_GEMM.from_linear``); the dequantizers read the packed ``int32`` words back by the
formats' published definitions, independently of poot's re-lay:

- GPTQ: ``qweight[i // 8, j] >> 4 * (i % 8)`` is ``q(i, j)`` (input dim packed);
  ``qzeros[g, j // 8] >> 4 * (j % 8)`` the zero, plus 1 in the v1 format;
  ``W[j, i] = (q - z[g_idx[i], j]) * scales[g_idx[i], j]``.
- AWQ (GEMM): ``qweight[i, c] >> 4 * pos[e]`` is ``q(i, 8c + e)`` with
  ``pos = [0, 4, 1, 5, 2, 6, 3, 7]`` (AutoAWQ packs in the order ``[0, 2, 4, 6, 1, 3, 5, 7]``);
  ``qzeros`` the same along the output dim; ``W[j, i] = (q - z) * s`` for ``i``'s group.
"""

from __future__ import annotations

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_POS = [0, 4, 1, 5, 2, 6, 3, 7]


def rtn(
    w: np.ndarray, group: int, sym: bool, bits: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest ``bits``-bit quantization of ``w`` ([n, k] float): quants [k, n], zeros
    and f16 scales [groups, n] (GPTQ/AWQ calibration is not the point; the layout is)."""
    n, k = w.shape
    g = k if group == -1 else group
    top = (1 << bits) - 1
    wg = w.reshape(n, k // g, g).astype(np.float64)
    if sym:
        scale = np.abs(wg).max(axis=2) / (top // 2)
        zero = np.full(scale.shape, float(top // 2 + 1))
    else:
        lo, hi = np.minimum(wg.min(axis=2), 0), np.maximum(wg.max(axis=2), 0)
        scale = (hi - lo) / top
        zero = np.round(-lo / np.where(scale == 0, 1, scale))
    scale = np.where(scale == 0, 1e-3, scale).astype(np.float16)
    s64 = scale.astype(np.float64)
    q = np.clip(np.round(wg / s64[:, :, None]) + zero[:, :, None], 0, top)
    return (
        q.reshape(n, k).T.astype(np.uint32),
        zero.T.astype(np.uint32),
        np.ascontiguousarray(scale.T),
    )


def _words(a: np.ndarray) -> np.ndarray:
    return a.astype(np.uint32).view(np.int32)


def pack_gptq(q: np.ndarray, z: np.ndarray, v1: bool) -> tuple[np.ndarray, np.ndarray]:
    """``qweight`` [k/8, n] and ``qzeros`` [groups, n/8] as int32 (v1: zeros stored minus 1)."""
    k, n = q.shape
    qw = np.zeros((k // 8, n), np.uint32)
    for e in range(8):
        qw |= q[e::8, :] << np.uint32(4 * e)
    zs = ((z.astype(np.int64) - 1) & 0xF).astype(np.uint32) if v1 else z
    qz = np.zeros((z.shape[0], n // 8), np.uint32)
    for e in range(8):
        qz |= zs[:, e::8] << np.uint32(4 * e)
    return _words(qw), _words(qz)


def pack_gptq8(q: np.ndarray, z: np.ndarray, v1: bool) -> tuple[np.ndarray, np.ndarray]:
    """8-bit GPTQ: ``qweight`` [k/4, n] and ``qzeros`` [groups, n/4], a byte each."""
    k, n = q.shape
    qw = np.zeros((k // 4, n), np.uint32)
    for e in range(4):
        qw |= q[e::4, :] << np.uint32(8 * e)
    zs = ((z.astype(np.int64) - 1) & 0xFF).astype(np.uint32) if v1 else z
    qz = np.zeros((z.shape[0], n // 4), np.uint32)
    for e in range(4):
        qz |= zs[:, e::4] << np.uint32(8 * e)
    return _words(qw), _words(qz)


def dequant_gptq8(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group: int, v1: bool
) -> np.ndarray:
    """W [n, k] in float64: byte ``i % 4`` of ``qweight[i // 4, j]``; zeros likewise (+1 in v1)."""
    kw, n = qweight.shape
    k = kw * 4
    b = qweight.view(np.uint32)[..., None] >> (8 * np.arange(4, dtype=np.uint32))
    q = (b & 0xFF).astype(np.int64).transpose(0, 2, 1).reshape(k, n)
    zb = qzeros.view(np.uint32)[..., None] >> (8 * np.arange(4, dtype=np.uint32))
    z = (zb & 0xFF).astype(np.int64).reshape(qzeros.shape[0], n) + (1 if v1 else 0)
    gi = np.arange(k) // (k if group == -1 else group)
    return ((q - z[gi]) * scales.astype(np.float64)[gi]).T


def pack_awq(q: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``qweight`` [k, n/8] and ``qzeros`` [groups, n/8], AutoAWQ's interleaved order."""

    def pack(a: np.ndarray) -> np.ndarray:
        out = np.zeros((a.shape[0], a.shape[1] // 8), np.uint32)
        for i, e in enumerate(AWQ_ORDER):
            out |= a[:, e::8] << np.uint32(4 * i)
        return _words(out)

    return pack(q), pack(z)


def _nibbles(words: np.ndarray) -> np.ndarray:
    """[..., 8] nibbles of each word, nibble 0 first."""
    u = words.view(np.uint32)[..., None]
    return ((u >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).astype(np.int64)


def dequant_gptq(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray | None,
    group: int,
    v1: bool,
) -> np.ndarray:
    """W [n, k] in float64, from the stored tensors."""
    kw, n = qweight.shape
    k = kw * 8
    q = _nibbles(qweight).transpose(0, 2, 1).reshape(k, n)
    z = _nibbles(qzeros).reshape(qzeros.shape[0], n) + (1 if v1 else 0)
    gi = g_idx if g_idx is not None else np.arange(k) // (k if group == -1 else group)
    s = scales.astype(np.float64)
    return ((q - z[gi]) * s[gi]).T


def dequant_awq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group: int
) -> np.ndarray:
    k, c = qweight.shape
    n = c * 8
    q = _nibbles(qweight)[:, :, AWQ_POS].reshape(k, n)
    z = _nibbles(qzeros)[:, :, AWQ_POS].reshape(qzeros.shape[0], n)
    gi = np.arange(k) // (k if group == -1 else group)
    return ((q - z[gi]) * scales.astype(np.float64)[gi]).T


def quantize_layer(
    w: np.ndarray,
    packing: str,
    group: int,
    sym: bool = False,
    g_idx: bool = False,
    bits: int = 4,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The stored tensors of one linear layer (``qweight``, ``qzeros``, ``scales``, maybe
    ``g_idx``) and its float64 dequantization."""
    q, z, s = rtn(w, group, sym, bits)
    k = w.shape[1]
    if bits == 8:
        v1 = packing == "gptq"
        qw, qz = pack_gptq8(q, z, v1)
        return {"qweight": qw, "qzeros": qz, "scales": s}, dequant_gptq8(qw, qz, s, group, v1)
    if packing == "awq":
        qw, qz = pack_awq(q, z)
        return {"qweight": qw, "qzeros": qz, "scales": s}, dequant_awq(qw, qz, s, group)
    v1 = packing == "gptq"
    qw, qz = pack_gptq(q, z, v1)
    t = {"qweight": qw, "qzeros": qz, "scales": s}
    gi = None
    if g_idx:
        gi = (np.arange(k) // (k if group == -1 else group)).astype(np.int32)
        t["g_idx"] = gi
    return t, dequant_gptq(qw, qz, s, gi, group, v1)


def quant_config(packing: str, group: int, sym: bool = False, bits: int = 4) -> dict[str, object]:
    """``config.json``'s ``quantization_config`` as the producers write it."""
    if packing == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group,
            "zero_point": True,
            "version": "gemm",
        }
    return {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group,
        "sym": sym,
        "desc_act": False,
        "checkpoint_format": "gptq_v2" if packing == "gptq_v2" else "gptq",
    }
