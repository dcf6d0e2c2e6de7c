"""FP8 E4M3 checkpoints written with numpy (tests only): the E4M3 code table from the format's
definition, round-to-nearest encoding, and the float64 dequantization of a layer from its stored
bytes and scales.

E4M3 ("E4M3FN", torch's ``float8_e4m3fn``, the OCP FP8 format): a sign bit, 4 exponent bits
(bias 7) and 3 mantissa bits; exponent 0 is subnormal (``m / 8 * 2^-6``); ``S.1111.111``
(0x7f, 0xff) is NaN; there are no infinities (the largest value is 448).

Layouts: compressed-tensors ``float-quantized`` stores ``weight`` (F8_E4M3 ``[n, k]``) and
``weight_scale`` (``[1]`` per tensor, ``[n, 1]`` per channel, ``[ceil(n / 128), ceil(k / 128)]``
per block); ``quant_method: fp8`` stores ``weight_scale_inv`` per ``weight_block_size`` block.
Either way ``W[j, i] = e4m3(q[j, i]) * s(j, i)``.
"""

from __future__ import annotations

import numpy as np


def e4m3_table() -> np.ndarray:
    """The float64 value of every code 0..255 (NaN at 0x7f and 0xff)."""
    out = np.empty(256)
    for q in range(256):
        s = -1.0 if q & 0x80 else 1.0
        e, m = (q >> 3) & 15, q & 7
        if e == 15 and m == 7:
            out[q] = np.nan
        elif e == 0:
            out[q] = s * 2.0**-6 * m / 8
        else:
            out[q] = s * 2.0 ** (e - 7) * (1 + m / 8)
    return out


TABLE = e4m3_table()
# The non-negative finite codes in increasing order (0x00..0x7e).
_POS = TABLE[:0x7F]


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest E4M3 codes (``uint8``) of ``x``, saturating at 448."""
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_POS, a), 1, 0x7E)
    lo = hi - 1
    code = np.where(a - _POS[lo] <= _POS[hi] - a, lo, hi).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def scale_index(n: int, k: int, layout: str, block: int) -> np.ndarray:
    """For each weight ``[n, k]``, the flat index of its scale."""
    j, i = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    if layout == "tensor":
        return np.zeros((n, k), np.int64)
    if layout == "channel":
        return j
    return (j // block) * -(-k // block) + i // block


def fp8_layer(
    w: np.ndarray, layout: str, block: int = 128, scale_dtype: str = "F32"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes [n, k] uint8, scales float32 in the stored shape, float64 dequantization)``.
    Scales are absmax / 448 per tensor, row or block, rounded to bf16 when ``scale_dtype`` is
    ``"BF16"`` (so they are exact there)."""
    n, k = w.shape
    idx = scale_index(n, k, layout, block)
    count = int(idx.max()) + 1
    amax = np.zeros(count)
    np.maximum.at(amax, idx.ravel(), np.abs(w).ravel())
    s = (np.where(amax == 0, 1.0, amax) / 448.0).astype(np.float32)
    if scale_dtype == "BF16":
        s = (s.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    codes = to_e4m3(w / s.astype(np.float64)[idx])
    ref = TABLE[codes] * s.astype(np.float64)[idx]
    shape = {"tensor": (1,), "channel": (n, 1)}.get(layout, (-(-n // block), -(-k // block)))
    return codes, s.reshape(shape), ref
