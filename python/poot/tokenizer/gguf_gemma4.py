"""Gemma 4 vocabularies from GGUF (``tokenizer.ggml.model == "gemma4"``).

llama.cpp's recipe (``llama-vocab.cpp``, ``LLAMA_VOCAB_PRE_TYPE_GEMMA4``): SentencePiece-style
BPE over raw UTF-8. Spaces become ``▁`` (U+2581), the text is split only into runs of newlines
and runs of anything else (``[^\\n]+|[\\n]+``), and each run's characters are merged by rank
(lowest first, leftmost on ties) with no byte-level alphabet. A run of newlines that is itself
a token is that token. A character with no token is spelled by its UTF-8 bytes as ``<0xXX>``
tokens. BOS is always added (llama.cpp overrides a false ``add_bos_token`` for Gemma 4).

Here the merging is ``poot._native.BpeModel`` over words in the vocabulary's alphabet
(``byte_level=False``); a character with no token ends the word it is in, since no merge can
involve a symbol that is not a token, so splitting there gives llama.cpp's ids.
"""

from __future__ import annotations

import re

from poot._native import BpeModel
from poot.tokenizer.gguf_vocab import GgufBackend, GgufVocab

__all__ = ["Gemma4Backend"]

_SPLIT = re.compile(r"[^\n]+|\n+")
_SPACE = "\u2581"
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Gemma4Backend(GgufBackend):
    """A GGUF ``gemma4`` vocabulary (see the module docs)."""

    def __init__(self, vocab: GgufVocab, model: BpeModel) -> None:
        self._model = model
        self._n = len(model)
        self._byte_ids = [model.token_to_id(f"<0x{b:02X}>") for b in range(256)]
        super().__init__(vocab, clean_spaces=True)
        self.kind = "gguf-bpe:gemma4"

    def id_to_token(self, token_id: int) -> str | None:
        return self._model.id_to_token(token_id) if 0 <= token_id < self._n else None

    def token_to_id(self, token: str) -> int | None:
        return self._model.token_to_id(token)

    def encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        for word in _SPLIT.findall(text.replace(" ", _SPACE)):
            if word[0] == "\n":
                tid = self._model.token_to_id(word)
                if tid is not None:
                    out.append(tid)
                    continue
            self._encode_word(word, out)

    def _encode_word(self, word: str, out: list[int]) -> None:
        start = 0
        for i, ch in enumerate(word):
            if self._model.token_to_id(ch) is None:
                if start < i:
                    out.extend(self._model.encode([word[start:i]], byte_level=False))
                out.extend(tid for b in ch.encode() if (tid := self._byte_ids[b]) is not None)
                start = i + 1
        if start < len(word):
            out.extend(self._model.encode([word[start:]], byte_level=False))

    def normal_piece(self, text: str) -> bytes:
        m = _BYTE.fullmatch(text)
        if m:
            return bytes([int(m.group(1), 16)])
        return text.replace(_SPACE, " ").encode()
