"""Which arithmetic a checkpoint runs under, and the identity its cached KV is keyed by.

``numerics_for`` resolves ``"auto"``: llama.cpp's arithmetic (``"ggml"``) for quantized
checkpoints, exact for plain floats. ``model_key`` is the prefix cache's seed for one
checkpoint under one mode.

Invariants:
    - The key changes with the mode and with any change of the checkpoint's files (path,
      size, modification time), so KV written under one never matches blocks of another.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from poot.checkpoints import ModelFiles
from poot.errors import ConfigError

__all__ = ["FLOAT_DTYPES", "Numerics", "model_key", "numerics_for"]

Numerics = Literal["auto", "ggml", "exact"]

# Checkpoint dtypes that are plain floats; anything else is a quantized GGUF (see numerics_for).
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})


def numerics_for(numerics: Numerics, files: ModelFiles) -> Literal["ggml", "exact"]:
    """``"auto"`` resolved: llama.cpp's arithmetic for quantized checkpoints, exact otherwise.

    Raises:
        ConfigError: ``numerics`` is not one of the three names.
    """
    if numerics == "auto":
        quantized = any(t.dtype not in FLOAT_DTYPES for t in files.tensors())
        return "ggml" if quantized else "exact"
    if numerics == "ggml" or numerics == "exact":
        return numerics
    raise ConfigError(f'numerics must be "auto", "ggml" or "exact", got {numerics!r}')


def model_key(files: ModelFiles, numerics: Literal["ggml", "exact"]) -> int:
    """A stable 64-bit key for the prefix cache: the checkpoint's files (resolved path, size,
    mtime) and the numerics mode, hashed with BLAKE2b.

    Cached KV blocks only match blocks hashed under the same key, so two modes (or a checkpoint
    rewritten in place) never share them.
    """
    root = Path(files.path).resolve()
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.blake2b(digest_size=8)
    h.update(f"poot-kv-v1\0{numerics}\0".encode())
    for path in paths:
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return int.from_bytes(h.digest(), "little")
