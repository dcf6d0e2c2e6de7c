"""Byte-level BPE vocabularies from GGUF (``tokenizer.ggml.model == "gpt2"``).

llama.cpp splits each raw fragment with the regexes of the file's pre-tokenizer
(``tokenizer.ggml.pre``), maps every piece's bytes to GPT-2's printable alphabet, and merges
adjacent symbols by merge rank, lowest first and leftmost on ties (``llm_tokenizer_bpe_session``).
That is exactly a ``tokenizers`` BPE model behind ``Split(regex, "isolated")`` pre-tokenizers and
a ``ByteLevel`` pre-tokenizer without its own regex, which is what this module builds; special
tokens are partitioned out beforehand by ``GgufBackend``.

Invariants:
    - The ``tokenizers`` object has no added tokens, normalizer or post-processor: it only ever
      sees raw fragments, so special-token handling stays llama.cpp's.
    - Merges are ranked by their position in ``tokenizer.ggml.merges``; a repeated merge keeps its
      first rank (llama.cpp's ``emplace``). Merges naming tokens that are not in the vocabulary
      are dropped: llama.cpp could apply them only to produce a symbol it then spells in bytes.
"""

from __future__ import annotations

from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HfTokenizer

from poot.errors import TokenizerError
from poot.tokenizer.gguf_vocab import UNICODE_TO_BYTE, GgufBackend, GgufVocab
from poot.tokenizer.pretokenizers import PreTokenizer

__all__ = ["BpeBackend"]


class BpeBackend(GgufBackend):
    """A GGUF byte-level BPE vocabulary with its llama.cpp pre-tokenizer."""

    def __init__(self, vocab: GgufVocab, pre: PreTokenizer) -> None:
        super().__init__(vocab, clean_spaces=pre.clean_spaces)
        self.pre = pre
        self.kind = f"gguf-bpe:{vocab.pre}"
        self._tk = _build(vocab, pre)

    def encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        out.extend(self._tk.encode(text, add_special_tokens=False).ids)

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


def _build(vocab: GgufVocab, pre: PreTokenizer) -> HfTokenizer:
    if not vocab.merges:
        raise TokenizerError("GGUF byte-level BPE vocabulary has no tokenizer.ggml.merges")
    ids = vocab.token_to_id
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for line in vocab.merges:
        cut = line.find(" ", 1)
        if cut < 0:
            continue
        pair = (line[:cut], line[cut + 1 :])
        if pair in seen or pair[0] not in ids or pair[1] not in ids or "".join(pair) not in ids:
            continue
        seen.add(pair)
        merges.append(pair)
    try:
        model = models.BPE(
            vocab=dict(ids), merges=merges, ignore_merges=pre.ignore_merges, fuse_unk=False
        )
        tk = HfTokenizer(model)
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    except Exception as e:  # tokenizers raises plain Exception on bad vocabularies or regexes
        raise TokenizerError(f"cannot build the byte-level BPE tokenizer: {e}") from e
    return tk
