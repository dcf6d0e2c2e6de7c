"""SentencePiece vocabularies from GGUF (``tokenizer.ggml.model == "llama"``).

llama.cpp does not run SentencePiece itself: it escapes spaces to U+2581, adds one leading
space to each fragment that starts the text or follows a special token, then merges adjacent
symbols greedily by the score of the token they form (``llm_tokenizer_spm_session``). Symbols
that never become a token fall back to byte tokens ``<0xXX>``. This module does the same, in
pure Python, because score ties are broken by position, which merge-rank BPE (``tokenizers``)
cannot express.

Invariants:
    - Output ids equal llama.cpp's for every input: the same heap order (highest score, then
      leftmost pair), the same stale-pair test, the same byte fallback.
    - Cost is O(n log n) in the fragment's length in code points.
    - The vocabulary is kept as Python objects (``SpmTable``) for the merge loop: about 100
      bytes per token, fine for SentencePiece vocabularies (32k tokens: 3 MiB).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from poot.errors import TokenizerError
from poot.tokenizer.gguf_vocab import GgufBackend, GgufVocab, MetaGetter

__all__ = ["SpmBackend", "SpmTable", "spm_tokenize"]

_SPACE = "\u2581"


def spm_tokenize(
    text: str,
    token_to_id: dict[str, int],
    scores: list[float],
    byte_ids: list[int | None],
    unk_id: int | None,
) -> list[int]:
    """Tokenizes one escaped fragment the way llama.cpp's SPM session does.

    Args:
        text: the fragment, spaces already escaped to U+2581.
        token_to_id: the vocabulary.
        scores: token scores by id.
        byte_ids: the id of byte token ``<0xXX>`` (or of the one-byte token) for each byte.
        unk_id: used for a byte with no token.
    """
    n = len(text)
    if n == 0:
        return []
    sym = list(text)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, int]] = []

    def add(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        merged = sym[left] + sym[right]
        tid = token_to_id.get(merged)
        if tid is not None:
            heapq.heappush(heap, (-scores[tid], left, right, len(merged)))

    for i in range(1, n):
        add(i - 1, i)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        a, b = sym[left], sym[right]
        if not a or not b or len(a) + len(b) != size:
            continue  # one side was merged away since this pair was queued
        sym[left] = a + b
        sym[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        add(prv[left], left)
        add(left, after)

    out: list[int] = []
    i = 0
    while i != -1:
        tid = token_to_id.get(sym[i])
        if tid is not None:
            out.append(tid)
        else:
            for byte in sym[i].encode():
                fallback = byte_ids[byte]
                if fallback is None:
                    fallback = unk_id
                if fallback is not None:
                    out.append(fallback)
        i = nxt[i]
    return out


@dataclass
class SpmTable:
    """A SentencePiece vocabulary as the merge loop reads it: plain Python lists and a dict.

    Attributes:
        tokens: token texts by id (an empty text becomes ``[EMPTY_<id>]``, as in llama.cpp).
        ids: the inverse of ``tokens``.
        scores: token scores by id (0.0 when the file has none).
    """

    tokens: list[str]
    ids: dict[str, int]
    scores: list[float]

    @classmethod
    def from_metadata(cls, get: MetaGetter) -> SpmTable:
        """Reads ``tokenizer.ggml.tokens`` and ``tokenizer.ggml.scores``.

        Raises:
            TokenizerError: there are no tokens, two ids share a text, or the scores are short.
        """
        raw = get("tokenizer.ggml.tokens")
        if not isinstance(raw, list) or not raw:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens list")
        tokens = [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(raw)]
        del raw
        ids: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if ids.setdefault(t, i) != i:
                raise TokenizerError(
                    f"duplicate token in vocabulary: {t!r} has ids {ids[t]} and {i}"
                )
        scores = get("tokenizer.ggml.scores")
        n = len(tokens)
        if scores is None:
            return cls(tokens, ids, [0.0] * n)
        if not isinstance(scores, list) or len(scores) < n:
            raise TokenizerError("tokenizer.ggml.scores is shorter than the vocabulary")
        return cls(tokens, ids, [float(x) for x in scores[:n]])

    def __len__(self) -> int:
        return len(self.tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token's text, or None."""
        return self.ids.get(token)


class SpmBackend(GgufBackend):
    """A GGUF SentencePiece vocabulary, tokenized as llama.cpp does."""

    kind = "gguf-spm"

    def __init__(self, vocab: GgufVocab, table: SpmTable) -> None:
        self._table = table
        super().__init__(vocab, clean_spaces=False)
        self._byte_ids: list[int | None] = []
        for b in range(256):
            tid = table.ids.get(f"<0x{b:02X}>")
            if tid is None:
                tid = table.ids.get(chr(b))
            self._byte_ids.append(tid)

    def id_to_token(self, token_id: int) -> str | None:
        tokens = self._table.tokens
        return tokens[token_id] if 0 <= token_id < len(tokens) else None

    def token_to_id(self, token: str) -> int | None:
        return self._table.ids.get(token)

    def encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        if self.vocab.add_space_prefix and after_special:
            text = " " + text
        out.extend(
            spm_tokenize(
                text.replace(" ", _SPACE),
                self._table.ids,
                self._table.scores,
                self._byte_ids,
                self.vocab.unk_id,
            )
        )

    def normal_piece(self, text: str) -> bytes:
        return text.replace(_SPACE, " ").encode()
