"""Tokenizer throughput on the default model (byte-level BPE rebuilt from GGUF metadata),
side by side with llama.cpp's own tokenizer (``llama_cpp`` with ``vocab_only``) when importable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import poot

_TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1969, 12345 people watched the launch; "
    "naïve café owners said: 'we've never seen anything like it!' — 東京 and Zürich agree.\n"
) * 64


def test_encode_poot(benchmark: Any, default_model_path: Path) -> None:
    tok = poot.load_tokenizer(default_model_path)
    benchmark.group = "encode 10 KiB text (SmolLM2 BPE)"
    benchmark.extra_info["impl"] = "poot"
    ids = benchmark(tok.encode, _TEXT, False)
    assert len(ids) > 1000


def test_encode_peer(benchmark: Any, default_model_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(default_model_path), vocab_only=True, verbose=False)
    data = _TEXT.encode()
    benchmark.group = "encode 10 KiB text (SmolLM2 BPE)"
    benchmark.extra_info["impl"] = "peer"
    ids = benchmark(llm.tokenize, data, False, False)
    assert ids == poot.load_tokenizer(default_model_path).encode(_TEXT, False)
