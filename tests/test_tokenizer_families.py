"""llama.cpp's tokenizer test vectors for the families' vocabularies.

``ggml-vocab-{qwen2,phi-3,qwen35}.gguf`` with their ``.inp``/``.out`` cases (Qwen2/Qwen3's
byte-level BPE, Phi-3's SentencePiece) from llama.cpp's ``models/`` directory, which is not in
``../shared/models``: set ``POOT_LLAMA_CPP_MODELS`` to that directory (the llama-cpp-python
0.3.36 sdist built by ``../shared/peers/llama-cpp.sh`` holds it under ``vendor/llama.cpp``).
Gemma 4's vocabulary (``tokenizer.ggml.model = gemma4``) is not supported yet: a typed error.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from test_tokenizer_vocab import _read_cases

from poot.errors import TokenizerError
from poot.tokenizer import Tokenizer, load_tokenizer

VOCABS = ("qwen2", "phi-3", "qwen35")
_DIR = os.environ.get("POOT_LLAMA_CPP_MODELS")
MODELS = Path(_DIR) if _DIR else None


def _params() -> list[object]:
    out: list[object] = []
    for name in VOCABS:
        path = MODELS / f"ggml-vocab-{name}.gguf" if MODELS else None
        if path is None or not path.is_file():
            why = f"ggml-vocab-{name}.gguf not found (set POOT_LLAMA_CPP_MODELS)"
            out.append(pytest.param(None, "", [], id=name, marks=pytest.mark.skip(reason=why)))
            continue
        for i, (text, ids) in enumerate(_read_cases(path)):
            out.append(pytest.param(path, text, ids, id=f"{name}-{i}"))
    return out


@functools.cache
def _tokenizer(path: Path) -> Tokenizer:
    return load_tokenizer(path)


@pytest.mark.parametrize(("gguf", "text", "expected"), _params())
def test_llama_cpp_vocab_case(gguf: Path, text: str, expected: list[int]) -> None:
    tok = _tokenizer(gguf)
    assert tok.encode(text, add_special_tokens=False, parse_special=False) == expected


def test_gemma4_vocabulary_is_a_typed_error() -> None:
    path = MODELS / "ggml-vocab-gemma-4.gguf" if MODELS else None
    if path is None or not path.is_file():
        pytest.skip("ggml-vocab-gemma-4.gguf not found (set POOT_LLAMA_CPP_MODELS)")
    with pytest.raises(TokenizerError, match="gemma4"):
        load_tokenizer(path)
