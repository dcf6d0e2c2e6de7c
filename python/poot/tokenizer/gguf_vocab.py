"""A GGUF vocabulary as llama.cpp loads it, and the parts of tokenization all GGUF models share.

``GgufVocab.from_metadata`` reads the ``tokenizer.ggml.*`` keys with llama.cpp's defaults and
quirks (``llama_vocab::impl::load`` in src/llama-vocab.cpp): per-model default special ids,
``add_bos``/``add_eos``/``add_space_prefix`` defaults, EOG tokens detected by their text and
promoted to control tokens, Phi-3's right-stripping special tokens. ``GgufBackend`` then does
what ``llama_vocab::impl::tokenize`` and ``detokenize`` do around the model-specific core:
special-token partitioning, BOS/EOS, token pieces and space clean-up.

Invariants:
    - Special-token partitioning is llama.cpp's: control, unknown and user-defined tokens are
      tried longest text first, each splitting every remaining raw-text fragment at every
      occurrence; control and unknown tokens take part only when ``parse_special`` is true,
      user-defined tokens always.
    - A token's piece is the exact bytes llama.cpp's ``token_to_piece`` yields, so decoding and
      streaming agree byte for byte; text is made from bytes with ``errors="replace"``.
    - Nothing here imports ``poot._native``; metadata arrives as a getter over plain values.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from poot.errors import TokenizerError
from poot.tokenizer.base import Backend
from poot.tokenizer.stream import ByteStream, TokenStream

__all__ = ["ATTR", "GgufBackend", "GgufVocab", "clean_spaces"]

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


@dataclass
class GgufVocab:
    """The ``tokenizer.ggml.*`` metadata of one GGUF file, with llama.cpp's defaults applied.

    Attributes:
        model: ``tokenizer.ggml.model`` (``"llama"`` or ``"gpt2"``).
        pre: ``tokenizer.ggml.pre`` (``"default"`` when absent).
        tokens: token texts by id.
        scores: token scores by id (0.0 when the file has none).
        attrs: ``ATTR`` bits by id.
        token_to_id: the inverse of ``tokens``.
        bos_id, eos_id, eot_id, eom_id, unk_id, pad_id, sep_id: special ids, or None.
        add_bos, add_eos, add_space_prefix: tokenizer flags.
        eog_ids: every token that ends generation, as llama.cpp computes it.
        merges: ``tokenizer.ggml.merges`` (BPE only).
        chat_templates: ``tokenizer.chat_template`` under ``"default"``, and any named ones.
    """

    model: str
    pre: str
    tokens: list[str]
    scores: list[float]
    attrs: list[int]
    token_to_id: dict[str, int]
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
    merges: list[str] = field(default_factory=list)
    chat_templates: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_metadata(
        cls,
        get: MetaGetter,
        *,
        default_add_bos: bool | None = None,
        default_bos: bool = True,
        keys: Sequence[str] = (),
    ) -> GgufVocab:
        """Reads the vocabulary from a metadata getter (``dict.get`` or ``GgufFile.get``).

        Args:
            get: returns the value of a metadata key, or None when absent.
            default_add_bos: the ``add_bos`` default when the file has no
                ``tokenizer.ggml.add_bos_token`` (set by the BPE pre-tokenizer); None keeps
                the model's default.
            default_bos: false when the pre-tokenizer has no default BOS id (GLM-4).
            keys: every metadata key, used to find named chat templates.

        Raises:
            TokenizerError: the vocabulary is missing or malformed.
        """
        model = get("tokenizer.ggml.model")
        if not isinstance(model, str):
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.model")
        raw_tokens = get("tokenizer.ggml.tokens")
        if not isinstance(raw_tokens, list) or not raw_tokens:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens list")
        n = len(raw_tokens)
        tokens = [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(raw_tokens)]
        token_to_id: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if token_to_id.setdefault(t, i) != i:
                raise TokenizerError(
                    f"duplicate token in vocabulary: {t!r} has ids {token_to_id[t]} and {i}"
                )
        scores = _float_list(get("tokenizer.ggml.scores"), n, "tokenizer.ggml.scores")
        types = get("tokenizer.ggml.token_type")
        if types is None:
            attrs = [ATTR.NORMAL] * n
        else:
            if not isinstance(types, list) or len(types) < n:
                raise TokenizerError("tokenizer.ggml.token_type is shorter than the vocabulary")
            attrs = [_TYPE_TO_ATTR.get(int(t), ATTR.UNDEFINED) for t in types[:n]]

        pre = get("tokenizer.ggml.pre") or "default"
        bos: int | None
        eos: int | None
        unk: int | None
        if model == "llama":
            bos, eos, unk = 1, 2, 0
            add_bos, add_eos, add_space_prefix = True, False, True
        elif model == "gpt2":
            bos, eos, unk = 11, 11, None
            add_bos, add_eos, add_space_prefix = False, False, False
        else:
            raise TokenizerError(
                f"unknown tokenizer.ggml.model {model!r}: poot supports 'llama' (SentencePiece) "
                "and 'gpt2' (byte-level BPE)"
            )
        if default_add_bos is not None:
            add_bos = default_add_bos
        if not default_bos:
            bos = None
        add_bos = _flag(get("tokenizer.ggml.add_bos_token"), add_bos)
        add_eos = _flag(get("tokenizer.ggml.add_eos_token"), add_eos)
        add_space_prefix = _flag(get("tokenizer.ggml.add_space_prefix"), add_space_prefix)

        def special(key: str, default: int | None) -> int | None:
            # An id outside the vocabulary is ignored (llama.cpp warns and keeps the default).
            value = _opt_id(get(f"tokenizer.ggml.{key}"), n)
            return value if value is not None else _opt_id(default, n)

        vocab = cls(
            model=model,
            pre=pre,
            tokens=tokens,
            scores=scores,
            attrs=attrs,
            token_to_id=token_to_id,
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
            merges=[str(m) for m in (get("tokenizer.ggml.merges") or [])],
        )
        if vocab.add_bos and vocab.bos_id is None:
            raise TokenizerError("tokenizer.ggml.add_bos_token is true, but there is no BOS token")
        if vocab.add_eos and vocab.eos_id is None:
            raise TokenizerError("tokenizer.ggml.add_eos_token is true, but there is no EOS token")
        vocab._detect_specials(str(get("general.name") or ""))
        vocab.chat_templates = _chat_templates(get, keys)
        return vocab

    def _detect_specials(self, model_name: str) -> None:
        # llama.cpp finds EOT/EOM/FIM/EOG tokens by their text and makes them control tokens.
        eog: set[int] = set()
        for text, tid in self.token_to_id.items():
            if text in _EOG_TEXTS or text in _FIM_EOG_TEXTS:
                eog.add(tid)
            if text in _EOG_TEXTS or text in _FIM_EOG_TEXTS or text in _FIM_TEXTS:
                self.attrs[tid] |= ATTR.CONTROL
        for end in (self.eos_id, self.eot_id, self.eom_id):
            if end is not None:
                eog.add(end)
        self.eog_ids = frozenset(eog)
        name = model_name.lower()
        if "phi-3" in name or "phi3" in name:
            for i, attr in enumerate(self.attrs):
                if attr & _SPECIAL:
                    self.attrs[i] |= ATTR.RSTRIP
            for text, on in (
                ("</s>", True),
                ("<unk>", False),
                ("<s>", False),
                ("<|endoftext|>", False),
            ):
                found = self.token_to_id.get(text)
                if found is not None:
                    attr = self.attrs[found]
                    self.attrs[found] = attr | ATTR.RSTRIP if on else attr & ~ATTR.RSTRIP

    def token_text(self, token_id: int) -> str | None:
        """The stored text of a token, or None when the id is out of range."""
        return self.tokens[token_id] if 0 <= token_id < len(self.tokens) else None


def _flag(value: Any, default: bool) -> bool:
    return default if value is None else bool(value)


def _float_list(value: Any, n: int, key: str) -> list[float]:
    if value is None:
        return [0.0] * n
    if not isinstance(value, list) or len(value) < n:
        raise TokenizerError(f"{key} is shorter than the vocabulary")
    return [float(x) for x in value[:n]]


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
    """What every GGUF tokenizer shares: special tokens, BOS/EOS, pieces and decoding."""

    def __init__(self, vocab: GgufVocab, *, clean_spaces: bool) -> None:
        self.vocab = vocab
        self.clean_spaces = clean_spaces
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)
        order = [i for i, a in enumerate(vocab.attrs) if a & _SPECIAL]
        # Longest first, as llama.cpp's cache_special_tokens; ties keep id order.
        order.sort(key=lambda i: -len(vocab.tokens[i]))
        self._special_order = order
        self._always_split = [
            i for i in order if not vocab.attrs[i] & (ATTR.CONTROL | ATTR.UNKNOWN)
        ]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    def id_to_token(self, token_id: int) -> str | None:
        return self.vocab.token_text(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.token_to_id.get(token)

    def is_special(self, token_id: int) -> bool:
        return bool(self.vocab.attrs[token_id] & (ATTR.CONTROL | ATTR.UNKNOWN))

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Splits ``text`` into raw fragments and special token ids, as llama.cpp does."""
        frags: list[str | int] = [text] if text else []
        vocab = self.vocab
        for tid in self._special_order if parse_special else self._always_split:
            needle = vocab.tokens[tid]
            attr = vocab.attrs[tid]
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
        vocab = self.vocab
        if not 0 <= token_id < len(vocab.tokens):
            raise TokenizerError(f"token id {token_id} is out of range [0, {len(vocab.tokens)})")
        attr = vocab.attrs[token_id]
        if skip_special and attr & (ATTR.CONTROL | ATTR.UNKNOWN):
            return b""
        cached = self._pieces[token_id]
        if cached is not None:
            return cached
        text = vocab.tokens[token_id]
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
