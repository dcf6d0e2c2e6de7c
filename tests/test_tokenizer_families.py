"""llama.cpp's tokenizer test vectors for the families' vocabularies.

``ggml-vocab-{qwen2,phi-3,qwen35,gemma-4}.gguf`` with their ``.inp``/``.out`` cases
(Qwen2/Qwen3's byte-level BPE, Phi-3's SentencePiece, Gemma 4's raw UTF-8 BPE) from llama.cpp's
``models/`` directory, which is not in ``../shared/models``: set ``POOT_LLAMA_CPP_MODELS`` to
that directory (the llama-cpp-python 0.3.36 sdist built by ``../shared/peers/llama-cpp.sh``
holds it under ``vendor/llama.cpp``). Gemma 4's cases (its backend is new) also decode back
to their text.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from test_tokenizer_vocab import _read_cases

from poot.tokenizer import Tokenizer, load_tokenizer

VOCABS = ("qwen2", "phi-3", "qwen35", "gemma-4")
_DIR = os.environ.get("POOT_LLAMA_CPP_MODELS")
MODELS = Path(_DIR) if _DIR else None


def _params(names: tuple[str, ...] = VOCABS) -> list[object]:
    out: list[object] = []
    for name in names:
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


@pytest.mark.parametrize(("gguf", "text", "expected"), _params(("gemma-4",)))
def test_gemma4_case_decodes_to_its_text(gguf: Path, text: str, expected: list[int]) -> None:
    assert _tokenizer(gguf).decode(expected, clean_up_tokenization_spaces=False) == text


def test_gemma4_always_adds_bos() -> None:
    path = MODELS / "ggml-vocab-gemma-4.gguf" if MODELS else None
    if path is None or not path.is_file():
        pytest.skip("ggml-vocab-gemma-4.gguf not found (set POOT_LLAMA_CPP_MODELS)")
    tok = _tokenizer(path)
    ids = tok.encode("Hello world")
    assert ids[0] == tok.bos_id == 2
