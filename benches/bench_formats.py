"""Opening a GGUF: poot's strict mmap reader vs gguf-py (the reference Python reader).

Both parse the header, the full metadata (49k-token vocabulary included) and the tensor infos
of the default model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot._native as native


def _open_poot(path: Path) -> int:
    f = native.GgufFile(path)
    return len(f.metadata()) + len(f.tensors())


def test_open_gguf_poot(benchmark: Any, default_model_path: Path) -> None:
    benchmark.group = "open default GGUF + metadata"
    benchmark.extra_info["impl"] = "poot"
    assert benchmark(_open_poot, default_model_path) > 272


def test_open_gguf_peer(benchmark: Any, default_model_path: Path) -> None:
    gguf = pytest.importorskip("gguf")

    def run() -> int:
        r = gguf.GGUFReader(default_model_path)
        return len(r.fields) + len(r.tensors)

    benchmark.group = "open default GGUF + metadata"
    benchmark.extra_info["impl"] = "peer"
    assert benchmark(run) > 272
