"""llama.cpp's tokenizer test vectors: every case in ../shared/models/vocab/*.gguf.inp/.out.

The files are llama.cpp's own (tests/test-tokenizer-0): inputs separated by a line
``__ggml_vocab_test__``, expected ids one line per case, produced with ``add_special=false``
and ``parse_special=false``. Every vocabulary found there is tested, so vocabularies added
later (llama-bpe, qwen2, ...) are covered without changing this file.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from shared_data import SHARED_MODELS, require_shared

from poot.tokenizer import Tokenizer, load_tokenizer

VOCAB_DIR = SHARED_MODELS / "vocab"
_SEP = "\n__ggml_vocab_test__\n"


def _read_cases(gguf: Path) -> list[tuple[str, list[int]]]:
    """Parses the .inp/.out pair the way test-tokenizer-0.cpp does."""
    raw = gguf.with_name(gguf.name + ".inp").read_bytes().decode("utf-8")
    inputs: list[str] = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(_SEP, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(_SEP)
    lines = gguf.with_name(gguf.name + ".out").read_bytes().decode("utf-8").split("\n")
    assert len(lines) >= len(inputs), f"{gguf.name}: fewer outputs than inputs"
    return [(s, [int(t) for t in line.split()]) for s, line in zip(inputs, lines, strict=False)]


def _vocab_files() -> list[Path]:
    return sorted(VOCAB_DIR.glob("*.gguf")) if VOCAB_DIR.is_dir() else []


def _params() -> list[object]:
    params: list[object] = []
    for gguf in _vocab_files():
        name = gguf.name.removeprefix("ggml-vocab-").removesuffix(".gguf")
        for i, (text, ids) in enumerate(_read_cases(gguf)):
            params.append(pytest.param(gguf, text, ids, id=f"{name}-{i}"))
    if not params:
        # One case that skips (or fails under POOT_REQUIRE_SHARED=1) with the reason.
        params.append(pytest.param(None, "", [], id="vocab-files-missing"))
    return params


@functools.cache
def _tokenizer(path: Path) -> Tokenizer:
    return load_tokenizer(path)


@pytest.mark.parametrize(("gguf", "text", "expected"), _params())
def test_llama_cpp_vocab_case(gguf: Path | None, text: str, expected: list[int]) -> None:
    if gguf is None:
        require_shared(VOCAB_DIR / "ggml-vocab-gpt-2.gguf", "llama.cpp vocab files")
        return
    tok = _tokenizer(gguf)
    assert tok.encode(text, add_special_tokens=False, parse_special=False) == expected


@pytest.mark.parametrize(
    ("name", "kind", "count"),
    [
        ("ggml-vocab-llama-spm.gguf", "gguf-spm", 46),
        ("ggml-vocab-gpt-2.gguf", "gguf-bpe:gpt-2", 46),
    ],
)
def test_vocab_files_present_and_complete(name: str, kind: str, count: int) -> None:
    path = VOCAB_DIR / name
    require_shared(path, "llama.cpp vocab file")
    assert _tokenizer(path).kind == kind
    assert len(_read_cases(path)) == count


def test_vocab_round_trip_decodes_to_input() -> None:
    """Decoding what was encoded gives the text back (no clean-up, no special tokens)."""
    for gguf in _vocab_files():
        tok = _tokenizer(gguf)
        for text, _ in _read_cases(gguf):
            ids = tok.encode(text, add_special_tokens=False, parse_special=False)
            back = tok.decode(ids, clean_up_tokenization_spaces=False)
            # SentencePiece's added prefix space is dropped again, so this holds for both.
            assert back == text, (gguf.name, text)
