"""Byte-level BPE vocabularies from GGUF (``tokenizer.ggml.model == "gpt2"``).

llama.cpp splits each raw fragment with the regexes of the file's pre-tokenizer
(``tokenizer.ggml.pre``), maps every piece's bytes to GPT-2's printable alphabet, and merges
adjacent symbols by merge rank, lowest first and leftmost on ties (``llm_tokenizer_bpe_session``).
Here the split is a ``tokenizers`` pre-tokenizer (``Split(regex, "isolated")`` for each regex,
Oniguruma being the engine whose regex dialect matches llama.cpp's), and the byte mapping and
merging are ``poot._native.BpeModel`` (poot-tokenize): GPT-2's byte alphabet and the same merge
loop as a ``tokenizers`` BPE model. Special tokens are partitioned out beforehand by
``GgufBackend``.

Invariants:
    - The native model is the only copy of the vocabulary and merges: built from an opened
      file (``GgufMetadata``) it reads them in Rust, so no Python object is made per token or
      merge; about 2 MiB for 50k tokens and merges, against 8 MiB for a ``tokenizers`` model.
    - Merges are ranked by their position in ``tokenizer.ggml.merges``; a repeated merge keeps its
      first rank (llama.cpp's ``emplace``). Merges naming tokens that are not in the vocabulary
      are dropped: llama.cpp could apply them only to produce a symbol it then spells in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import Regex, pre_tokenizers

from poot._native import BpeModel
from poot.errors import TokenizerError
from poot.tokenizer.gguf_vocab import UNICODE_TO_BYTE, GgufBackend, GgufVocab
from poot.tokenizer.pretokenizers import PreTokenizer

__all__ = ["BpeBackend", "bpe_model"]

_TOKENS = "tokenizer.ggml.tokens"
_MERGES = "tokenizer.ggml.merges"


def bpe_model(metadata: Mapping[str, Any], *, ignore_merges: bool) -> BpeModel:
    """The native BPE model of a GGUF vocabulary.

    Args:
        metadata: a dict of plain values, or the ``GgufMetadata`` of an opened file (then the
            tokens and merges are read natively, never converted to Python).
        ignore_merges: a word that is itself a token is that token (Llama 3's pre-tokenizer).

    Raises:
        TokenizerError: there are no tokens or no merges, or two ids share a text.
    """
    from poot.checkpoints.metadata import GgufMetadata, metadata_array_len

    if not metadata_array_len(metadata, _TOKENS):
        raise TokenizerError(f"GGUF metadata has no {_TOKENS} list")
    if not metadata_array_len(metadata, _MERGES):
        raise TokenizerError(f"GGUF byte-level BPE vocabulary has no {_MERGES}")
    if isinstance(metadata, GgufMetadata):
        return BpeModel.from_gguf(metadata.file, ignore_merges=ignore_merges)
    tokens = [str(t) for t in metadata[_TOKENS]]
    merges = [str(m) for m in metadata[_MERGES]]
    return BpeModel(tokens, merges, ignore_merges=ignore_merges)


class BpeBackend(GgufBackend):
    """A GGUF byte-level BPE vocabulary with its llama.cpp pre-tokenizer."""

    def __init__(self, vocab: GgufVocab, model: BpeModel, pre: PreTokenizer) -> None:
        self._model = model
        self._n = len(model)
        try:
            self._split = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
            )
        except Exception as e:  # tokenizers raises plain Exception on bad regexes
            raise TokenizerError(f"cannot build the {vocab.pre!r} pre-tokenizer: {e}") from e
        super().__init__(vocab, clean_spaces=pre.clean_spaces)
        self.pre = pre
        self.kind = f"gguf-bpe:{vocab.pre}"

    def id_to_token(self, token_id: int) -> str | None:
        return self._model.id_to_token(token_id) if 0 <= token_id < self._n else None

    def token_to_id(self, token: str) -> int | None:
        return self._model.token_to_id(token)

    def encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        words = [w for w, _ in self._split.pre_tokenize_str(text)]
        out.extend(self._model.encode(words, byte_level=True))

    def normal_piece(self, text: str) -> bytes:
        # Characters outside GPT-2's alphabet stand for themselves (as in tokenizers' ByteLevel
        # decoder; llama.cpp would print an [UNK_BYTE] marker).
        get = UNICODE_TO_BYTE.get
        out = bytearray()
        for ch in text:
            b = get(ch)
            if b is None:
                out += ch.encode()
            else:
                out.append(b)
        return bytes(out)
