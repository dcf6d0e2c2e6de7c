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


VOCAB = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "vocab"


def test_vocab_metadata_to_strs(benchmark: Any) -> None:
    """The gpt-2 vocabulary (50k strings) out of GGUF metadata; the stated band: median under
    1 s (it was a wall-clock assert in tests/test_formats.py; measured ~10 ms)."""
    path = VOCAB / "ggml-vocab-gpt-2.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    f = native.GgufFile(path)
    benchmark.group = "gpt-2 vocab metadata to 50k str"
    benchmark.extra_info["impl"] = "poot"
    tokens = benchmark(f.get, "tokenizer.ggml.tokens")
    assert len(tokens) > 50_000
    assert benchmark.stats.stats.median < 1.0
