"""Writes a subset of a checkpoint's tensors, bytes unchanged, as a small GGUF file.

This is how a streamed chunk reaches the CPU runtime without a new Rust seam: the runtime
compiles against ``poot._native.Weights`` over a mapped file, so a chunk's weights are copied
(still packed: the stored bytes, never dequantized) from the source checkpoint into a buffer
file in the spill directory, which is then opened as its own ``Weights``. The GGUF written has no
metadata keys, only tensor infos (GGUF dims are innermost first, the reverse of poot's shapes)
and the data section at 32-byte alignment.

Invariants: bytes are copied with ``os.pread`` from the source file at the tensor's offset, so
nothing is converted; the file is complete before anyone opens it (written, then renamed).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from poot._native import TensorInfo

__all__ = ["GGML_TYPES", "write_gguf_arrays", "write_gguf_subset"]

GGML_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "I8": 24,
    "I16": 25, "I32": 26, "I64": 27, "F64": 28, "BF16": 30,
}  # fmt: skip
_ALIGN = 32
_COPY = 4 << 20


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def write_gguf_subset(
    tensors: Sequence[TensorInfo],
    dest: Path,
    *,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Writes ``tensors`` (from their own files) to ``dest`` as GGUF v3; returns data bytes.

    Args:
        tensors: the tensors to copy (any mix of source files).
        dest: the file to write (replaced atomically).
        progress: called with the bytes copied so far, after each piece (stall detection).
    """
    header = bytearray(b"GGUF")
    header += struct.pack("<IQQ", 3, len(tensors), 0)
    offset = 0
    for t in tensors:
        if t.dtype not in GGML_TYPES:
            raise ValueError(f"{t.name}: dtype {t.dtype} has no GGUF type id")
        name = t.name.encode()
        header += struct.pack("<Q", len(name)) + name
        dims = tuple(reversed(t.shape))
        header += struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        header += struct.pack("<IQ", GGML_TYPES[t.dtype], offset)
        offset += t.nbytes + _pad(t.nbytes)
    header += b"\0" * _pad(len(header))
    tmp = dest.with_name(dest.name + ".part")
    copied = 0
    sources: dict[str, int] = {}
    try:
        with open(tmp, "wb") as out:
            out.write(header)
            for t in tensors:
                fd = sources.get(t.file)
                if fd is None:
                    fd = sources[t.file] = os.open(t.file, os.O_RDONLY)
                left, pos = t.nbytes, t.offset
                while left:
                    piece = os.pread(fd, min(left, _COPY), pos)
                    if not piece:
                        raise OSError(f"{t.file}: short read of {t.name} at {pos}")
                    out.write(piece)
                    left -= len(piece)
                    pos += len(piece)
                    copied += len(piece)
                    if progress is not None:
                        progress(copied)
                out.write(b"\0" * _pad(t.nbytes))
        os.replace(tmp, dest)
    finally:
        for fd in sources.values():
            os.close(fd)
        tmp.unlink(missing_ok=True)
    return copied


def write_gguf_arrays(
    entries: Sequence[tuple[str, str, tuple[int, ...], bytes]], dest: Path
) -> None:
    """Writes in-memory tensors ``(name, dtype, shape, stored bytes)`` as GGUF v3 (benchmarks)."""
    header = bytearray(b"GGUF")
    header += struct.pack("<IQQ", 3, len(entries), 0)
    offset = 0
    for name, dtype, shape, data in entries:
        raw = name.encode()
        dims = tuple(reversed(shape))
        header += struct.pack("<Q", len(raw)) + raw
        header += struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        header += struct.pack("<IQ", GGML_TYPES[dtype], offset)
        offset += len(data) + _pad(len(data))
    header += b"\0" * _pad(len(header))
    with open(dest, "wb") as out:
        out.write(header)
        for _, _, _, data in entries:
            out.write(data)
            out.write(b"\0" * _pad(len(data)))
