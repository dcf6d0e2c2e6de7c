"""A GGUF vocabulary as llama.cpp loads it, and the parts of tokenization all GGUF models share.

``read_gguf_vocab`` reads the ``tokenizer.ggml.*`` keys with llama.cpp's defaults and quirks
(``llama_vocab::impl::load`` in src/llama-vocab.cpp): per-model default special ids,
``add_bos``/``add_eos``/``add_space_prefix`` defaults, EOG tokens detected by their text and
promoted to control tokens, Phi-3's right-stripping special tokens. The token texts are not
part of it: each backend reads them into its own ``TokenTable`` first (the native BPE model,
or SentencePiece's Python lists), and ``GgufVocab`` keeps only 2 bytes of attributes per id.
``GgufBackend`` does what ``llama_vocab::impl::tokenize`` and ``detokenize`` do around the
model-specific core: special-token partitioning, BOS/EOS, token pieces and space clean-up.

Invariants:
    - Special-token partitioning is llama.cpp's: control, unknown and user-defined tokens are
      tried longest text first, each splitting every remaining raw-text fragment at every
      occurrence; control and unknown tokens take part only when ``parse_special`` is true,
      user-defined tokens always.
    - A token's piece is the exact bytes llama.cpp's ``token_to_piece`` yields, so decoding and
      streaming agree byte for byte; text is made from bytes with ``errors="replace"``.
    - Nothing here imports ``poot._native``; metadata arrives as a getter over plain values.
    - Token texts are held once, by the backend's table; what is shared keeps 2 bytes per id.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from poot.errors import TokenizerError
from poot.tokenizer.base import Backend
from poot.tokenizer.stream import ByteStream, TokenStream

__all__ = [
    "ATTR",
    "GgufBackend",
    "GgufVocab",
    "TokenTable",
    "clean_spaces",
    "read_gguf_vocab",
    "tokenizer_model",
]

MetaGetter = Callable[[str], Any]


class ATTR:
    """llama.cpp's token attribute bits (``llama_token_attr``)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# GGUF tokenizer.ggml.token_type values -> attributes.
_TYPE_TO_ATTR = {
    1: ATTR.NORMAL,
    2: ATTR.UNKNOWN,
    3: ATTR.CONTROL,
    4: ATTR.USER_DEFINED,
    5: ATTR.UNUSED,
    6: ATTR.BYTE,
}
_SPECIAL = ATTR.CONTROL | ATTR.USER_DEFINED | ATTR.UNKNOWN

# Token texts llama.cpp treats as end-of-generation (and therefore as control tokens).
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "[e~[",
    }
)
# FIM pad/repo/file-separator tokens: also end generation in llama.cpp.
_FIM_EOG_TEXTS = frozenset(
    {
        "<|fim_pad|>",
        "<fim-pad>",
        "<fim_pad>",
        "<PAD>",
        "[PAD]",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
    }
)
# Other FIM tokens llama.cpp promotes to control tokens by their text.
_FIM_TEXTS = frozenset(
    {
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
    }
)
_WHITESPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character table."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE = _bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}


def _opt_id(value: Any, n_tokens: int) -> int | None:
    if value is None:
        return None
    value = int(value)
    return value if 0 <= value < n_tokens else None


class TokenTable(Protocol):
    """Where a backend keeps its token texts: the id of a text, and the number of ids."""

    def __len__(self) -> int: ...

    def token_to_id(self, token: str) -> int | None: ...


@dataclass
class GgufVocab:
    """What every GGUF tokenizer keeps of the ``tokenizer.ggml.*`` metadata, with llama.cpp's
    defaults applied; the token texts themselves stay in the backend's ``TokenTable``.

    Attributes:
        model: ``tokenizer.ggml.model`` (``"llama"``, ``"gpt2"`` or ``"gemma4"``).
        pre: ``tokenizer.ggml.pre`` (``"default"`` when absent).
        n_tokens: the number of token ids.
        attrs: ``ATTR`` bits by id (2 bytes each).
        bos_id, eos_id, eot_id, eom_id, unk_id, pad_id, sep_id: special ids, or None.
        add_bos, add_eos, add_space_prefix: tokenizer flags.
        eog_ids: every token that ends generation, as llama.cpp computes it.
        chat_templates: ``tokenizer.chat_template`` under ``"default"``, and any named ones.
    """

    model: str
    pre: str
    n_tokens: int
    attrs: array[int]
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    eom_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    sep_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    eog_ids: frozenset[int] = frozenset()
    chat_templates: dict[str, str] = field(default_factory=dict)


def tokenizer_model(get: MetaGetter) -> str:
    """``tokenizer.ggml.model``, checked to be one poot tokenizes.

    Raises:
        TokenizerError: it is missing or unknown.
    """
    model = get("tokenizer.ggml.model")
    if not isinstance(model, str):
        raise TokenizerError("GGUF metadata has no tokenizer.ggml.model")
    if model not in ("llama", "gpt2", "gemma4"):
        raise TokenizerError(
            f"unknown tokenizer.ggml.model {model!r}: poot supports 'llama' (SentencePiece), "
            "'gpt2' (byte-level BPE) and 'gemma4' (raw UTF-8 BPE)"
        )
    return model


def read_gguf_vocab(
    get: MetaGetter,
    table: TokenTable,
    *,
    default_add_bos: bool | None = None,
    default_bos: bool = True,
    keys: Sequence[str] = (),
) -> GgufVocab:
    """Reads what every GGUF tokenizer keeps, from a metadata getter and the token table the
    backend built.

    Args:
        get: returns the value of a metadata key, or None when absent (``Mapping.get``).
        table: the backend's token texts (``len`` is the vocabulary size).
        default_add_bos: the ``add_bos`` default when the file has no
            ``tokenizer.ggml.add_bos_token`` (set by the BPE pre-tokenizer); None keeps the
            model's default.
        default_bos: false when the pre-tokenizer has no default BOS id (GLM-4).
        keys: every metadata key, used to find named chat templates.

    Raises:
        TokenizerError: the model is unknown, or the token types or flags are malformed.
    """
    model = tokenizer_model(get)
    n = len(table)
    types = get("tokenizer.ggml.token_type")
    if types is None:
        attrs = array("H", [ATTR.NORMAL]) * n
    else:
        if not isinstance(types, list) or len(types) < n:
            raise TokenizerError("tokenizer.ggml.token_type is shorter than the vocabulary")
        attrs = array("H", [_TYPE_TO_ATTR.get(int(t), ATTR.UNDEFINED) for t in types[:n]])
        del types

    bos: int | None
    eos: int | None
    unk: int | None
    if model == "llama":
        bos, eos, unk = 1, 2, 0
        add_bos, add_eos, add_space_prefix = True, False, True
    elif model == "gemma4":
        # llama.cpp: no default special ids; the file names them.
        bos, eos, unk = None, None, None
        add_bos, add_eos, add_space_prefix = True, False, False
    else:
        bos, eos, unk = 11, 11, None
        add_bos, add_eos, add_space_prefix = False, False, False
    if default_add_bos is not None:
        add_bos = default_add_bos
    if not default_bos:
        bos = None
    add_bos = _flag(get("tokenizer.ggml.add_bos_token"), add_bos)
    add_eos = _flag(get("tokenizer.ggml.add_eos_token"), add_eos)
    add_space_prefix = _flag(get("tokenizer.ggml.add_space_prefix"), add_space_prefix)
    if model == "gemma4":
        add_bos = True  # llama.cpp overrides a false add_bos_token for Gemma 4

    def special(key: str, default: int | None) -> int | None:
        # An id outside the vocabulary is ignored (llama.cpp warns and keeps the default).
        value = _opt_id(get(f"tokenizer.ggml.{key}"), n)
        return value if value is not None else _opt_id(default, n)

    vocab = GgufVocab(
        model=model,
        pre=get("tokenizer.ggml.pre") or "default",
        n_tokens=n,
        attrs=attrs,
        bos_id=special("bos_token_id", bos),
        eos_id=special("eos_token_id", eos),
        eot_id=special("eot_token_id", None),
        eom_id=special("eom_token_id", None),
        unk_id=special("unknown_token_id", unk),
        pad_id=special("padding_token_id", None),
        sep_id=special("seperator_token_id", None),
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
    )
    if vocab.add_bos and vocab.bos_id is None:
        raise TokenizerError("tokenizer.ggml.add_bos_token is true, but there is no BOS token")
    if vocab.add_eos and vocab.eos_id is None:
        raise TokenizerError("tokenizer.ggml.add_eos_token is true, but there is no EOS token")
    _detect_specials(vocab, table, str(get("general.name") or ""))
    vocab.chat_templates = _chat_templates(get, keys)
    return vocab


def _detect_specials(vocab: GgufVocab, table: TokenTable, model_name: str) -> None:
    # llama.cpp finds EOT/EOM/FIM/EOG tokens by their text and makes them control tokens.
    attrs = vocab.attrs
    eog: set[int] = set()
    for texts, ends in ((_EOG_TEXTS, True), (_FIM_EOG_TEXTS, True), (_FIM_TEXTS, False)):
        for text in texts:
            tid = table.token_to_id(text)
            if tid is not None:
                attrs[tid] |= ATTR.CONTROL
                if ends:
                    eog.add(tid)
    for end in (vocab.eos_id, vocab.eot_id, vocab.eom_id):
        if end is not None:
            eog.add(end)
    vocab.eog_ids = frozenset(eog)
    name = model_name.lower()
    if "phi-3" in name or "phi3" in name:
        for i, attr in enumerate(attrs):
            if attr & _SPECIAL:
                attrs[i] |= ATTR.RSTRIP
        for text, on in (
            ("</s>", True),
            ("<unk>", False),
            ("<s>", False),
            ("<|endoftext|>", False),
        ):
            found = table.token_to_id(text)
            if found is not None:
                attr = attrs[found]
                attrs[found] = attr | ATTR.RSTRIP if on else attr & ~ATTR.RSTRIP


def _flag(value: Any, default: bool) -> bool:
    return default if value is None else bool(value)


def _chat_templates(get: MetaGetter, keys: Sequence[str]) -> dict[str, str]:
    templates: dict[str, str] = {}
    default = get("tokenizer.chat_template")
    if isinstance(default, str):
        templates["default"] = default
    prefix = "tokenizer.chat_template."
    for key in keys:
        if key.startswith(prefix) and isinstance(value := get(key), str):
            templates[key[len(prefix) :]] = value
    return templates


def clean_spaces(text: str) -> str:
    """llama.cpp's ``clean_spaces`` pass: drop spaces before ``?!.,`` and in contractions."""
    text = re.sub(r" ([?!.,])", r"\1", text)
    text = text.replace(" ' ", "'")
    return re.sub(r" '(?=[sm]|re|ve)", "'", text)


class GgufBackend(Backend):
    """What every GGUF tokenizer shares: special tokens, BOS/EOS, pieces and decoding.

    A subclass answers ``id_to_token`` and ``token_to_id`` from its own structures, and sets
    them up before calling ``GgufBackend.__init__``.
    """

    def __init__(self, vocab: GgufVocab, *, clean_spaces: bool) -> None:
        self.vocab = vocab
        self.clean_spaces = clean_spaces
        # Pieces of the tokens seen so far; grows with use, not with the vocabulary.
        self._pieces: dict[int, bytes] = {}
        specials: list[tuple[int, str, int]] = []
        for i, attr in enumerate(vocab.attrs):
            if attr & _SPECIAL:
                text = self.id_to_token(i)
                assert text is not None
                specials.append((i, text, attr))
        # Longest first, as llama.cpp's cache_special_tokens; ties keep id order.
        specials.sort(key=lambda s: -len(s[1]))
        self._special_order = specials
        self._always_split = [s for s in specials if not s[2] & (ATTR.CONTROL | ATTR.UNKNOWN)]

    @property
    def vocab_size(self) -> int:
        return self.vocab.n_tokens

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    def is_special(self, token_id: int) -> bool:
        return bool(self.vocab.attrs[token_id] & (ATTR.CONTROL | ATTR.UNKNOWN))

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Splits ``text`` into raw fragments and special token ids, as llama.cpp does."""
        frags: list[str | int] = [text] if text else []
        for tid, needle, attr in self._special_order if parse_special else self._always_split:
            if not any(isinstance(f, str) and needle in f for f in frags):
                continue
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or needle not in frag:
                    out.append(frag)
                    continue
                pos = 0
                while (hit := frag.find(needle, pos)) >= 0:
                    left = frag[pos:hit]
                    if attr & ATTR.LSTRIP:
                        left = left.rstrip(_WHITESPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = hit + len(needle)
                    if attr & ATTR.RSTRIP:
                        while pos < len(frag) and frag[pos] in _WHITESPACE:
                            pos += 1
                if pos < len(frag):
                    out.append(frag[pos:])
            frags = out
        return frags

    @abstractmethod
    def encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        """Appends the ids of one raw-text fragment to ``out``.

        Args:
            text: the fragment (never empty).
            after_special: the fragment starts the text or follows a special token.
            out: the ids so far.
        """

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool) -> list[int]:
        vocab = self.vocab
        out: list[int] = []
        if add_special_tokens and vocab.add_bos and vocab.bos_id is not None:
            out.append(vocab.bos_id)
        after_special = True
        for frag in self.partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                self.encode_fragment(frag, after_special, out)
                after_special = False
        if add_special_tokens and vocab.add_eos and vocab.eos_id is not None:
            out.append(vocab.eos_id)
        return out

    @abstractmethod
    def normal_piece(self, text: str) -> bytes:
        """The bytes a normal token's stored text stands for."""

    def piece(self, token_id: int, skip_special: bool) -> bytes:
        """The bytes of one token, as llama.cpp's ``token_to_piece``.

        Raises:
            TokenizerError: the id is out of range.
        """
        n = self.vocab.n_tokens
        if not 0 <= token_id < n:
            raise TokenizerError(f"token id {token_id} is out of range [0, {n})")
        attr = self.vocab.attrs[token_id]
        if skip_special and attr & (ATTR.CONTROL | ATTR.UNKNOWN):
            return b""
        cached = self._pieces.get(token_id)
        if cached is not None:
            return cached
        text = self.id_to_token(token_id)
        assert text is not None
        if attr & _SPECIAL:
            piece = text.encode()
        elif attr & ATTR.NORMAL:
            piece = self.normal_piece(text)
        elif attr & ATTR.BYTE and (m := _BYTE_TOKEN.fullmatch(text)):
            piece = bytes([int(m.group(1), 16)])
        else:
            piece = b""  # unused and undefined tokens render as nothing, as in llama.cpp
        self._pieces[token_id] = piece
        return piece

    def token_piece(self, token_id: int) -> bytes | None:
        return self.piece(token_id, skip_special=False)

    def encode_continuation(self, text: str) -> list[int]:
        out: list[int] = []
        for frag in self.partition(text, parse_special=False):
            if isinstance(frag, int):
                out.append(frag)
            else:
                self.encode_fragment(frag, False, out)
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool, clean_up: bool | None) -> str:
        data = b"".join(self.piece(int(i), skip_special_tokens) for i in ids)
        text = data.decode("utf-8", errors="replace")
        if self.vocab.add_space_prefix and text.startswith(" "):
            text = text[1:]
        if self.clean_spaces if clean_up is None else clean_up:
            text = clean_spaces(text)
        return text

    def stream(self, skip_special_tokens: bool, context: Sequence[int]) -> TokenStream:
        return ByteStream(
            lambda i: self.piece(i, skip_special_tokens),
            context=context,
            strip_first_space=self.vocab.add_space_prefix,
        )
