"""The native byte-level BPE model (``poot._native.BpeModel``) against ``tokenizers``' BPE.

``tokenizers`` is the reference here: the same vocabulary and merges, the same pre-tokenized
words, the same ids. The GGUF path must also build the model without a Python copy of the
vocabulary, which is what keeps a loaded model close to its file size.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import models

from poot._native import BpeModel, GgufFile
from poot.checkpoints.metadata import GgufMetadata
from poot.errors import TokenizerError
from poot.tokenizer import load_tokenizer, tokenizer_from_gguf_metadata

GPT2 = "vocab/ggml-vocab-gpt-2.gguf"


@pytest.fixture(scope="module")
def gpt2(shared_models: Path) -> GgufFile:
    return GgufFile(shared_models / GPT2)


def _reference(tokens: list[str], merges: list[str]) -> models.BPE:
    ids = {t: i for i, t in enumerate(tokens)}
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for m in merges:
        a, b = m.split(" ", 1)
        if (a, b) not in seen and a in ids and b in ids and a + b in ids:
            seen.add((a, b))
            pairs.append((a, b))
    return models.BPE(vocab=ids, merges=pairs, fuse_unk=False)


def _words(tokens: list[str], n: int, seed: int) -> list[str]:
    """Words made of random vocabulary pieces, so merges of every rank get exercised."""
    rng = random.Random(seed)
    return ["".join(rng.choice(tokens) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def test_merges_as_tokenizers_bpe_does(gpt2: GgufFile) -> None:
    tokens, merges = gpt2.get("tokenizer.ggml.tokens"), gpt2.get("tokenizer.ggml.merges")
    ours = BpeModel.from_gguf(gpt2)
    ref = _reference(tokens, merges)
    assert len(ours) == len(tokens) and ours.n_merges == len(merges)
    for word in _words(tokens, 3000, seed=0):
        want = [t.id for t in ref.tokenize(word)]
        assert ours.encode([word]) == want, word
    words = _words(tokens, 200, seed=1)
    assert ours.encode(words) == [t.id for w in words for t in ref.tokenize(w)]


def test_from_gguf_equals_from_lists(gpt2: GgufFile) -> None:
    tokens, merges = gpt2.get("tokenizer.ggml.tokens"), gpt2.get("tokenizer.ggml.merges")
    a = BpeModel.from_gguf(gpt2, ignore_merges=True)
    b = BpeModel(tokens, merges, ignore_merges=True)
    assert (len(a), a.n_merges, a.nbytes) == (len(b), b.n_merges, b.nbytes)
    words = _words(tokens, 500, seed=2)
    assert a.encode(words) == b.encode(words)
    # A 50k vocabulary with 50k merges: about 2 MiB, a quarter of tokenizers' BPE.
    assert a.nbytes < 3 << 20
    for i in (0, 1000, len(tokens) - 1):
        assert a.id_to_token(i) == tokens[i] and a.token_to_id(tokens[i]) == i
    assert a.id_to_token(-1) is None and a.id_to_token(len(tokens)) is None
    assert a.token_to_id("no such token \x00") is None
    assert repr(a) == f"BpeModel(tokens={len(tokens)}, merges={len(merges)})"


def test_ignore_merges_takes_whole_tokens() -> None:
    tokens, merges = ["a", "b", "c", "ab", "abc"], ["a b"]
    assert BpeModel(tokens, merges).encode(["abc", "cab"]) == [3, 2, 2, 3]
    assert BpeModel(tokens, merges, ignore_merges=True).encode(["abc", "cab"]) == [4, 2, 3]


def test_bad_vocabularies_are_tokenizer_errors(shared_models: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="duplicate token.*ids 0 and 2") as e:
        BpeModel(["a", "b", "a"], [])
    assert isinstance(e.value, ValueError)
    assert BpeModel(["a", ""], []).id_to_token(1) == "[EMPTY_1]"
    no_vocab = GgufFile(shared_models / "quant-slices" / "real-quant-slices.gguf")
    with pytest.raises(TokenizerError, match="no tokenizer.ggml.tokens"):
        BpeModel.from_gguf(no_vocab)
    stories = GgufFile(shared_models / "stories260K" / "stories260K-f32.gguf")
    assert len(BpeModel.from_gguf(stories)) == 512  # SentencePiece pieces, no merges
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "int-tokens.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [1, 2, 3])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens is not an array of strings"):
        BpeModel.from_gguf(GgufFile(path))


class _CountingMetadata(GgufMetadata):
    """Records every key read, to show which arrays reach Python."""

    def __init__(self, gguf: GgufFile) -> None:
        super().__init__(gguf)
        self.read: list[str] = []

    def __getitem__(self, key: str) -> Any:
        self.read.append(key)
        return super().__getitem__(key)


def test_gguf_bpe_tokenizer_converts_no_vocabulary(gpt2: GgufFile) -> None:
    meta = _CountingMetadata(gpt2)
    tok = tokenizer_from_gguf_metadata(meta, source="gpt-2")
    assert "tokenizer.ggml.tokens" not in meta.read
    assert "tokenizer.ggml.merges" not in meta.read
    plain = tokenizer_from_gguf_metadata(gpt2.metadata(), source="gpt-2 dict")
    text = "Hello world! It's 2024, and the caf\u00e9 is   open.\n\tBye <|endoftext|>"
    assert tok.encode(text) == plain.encode(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.id_to_token(tok.vocab_size) is None and tok.id_to_token(-1) is None


def test_default_model_tokenizer_is_small(default_model_path: Path) -> None:
    tok = load_tokenizer(default_model_path)
    backend: Any = tok._backend
    assert backend._model.nbytes < 3 << 20
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
