"""``Tokenizer``: one interface over every tokenizer poot loads.

A ``Tokenizer`` wraps a ``Backend`` (a GGUF SentencePiece or byte-level BPE vocabulary rebuilt
from metadata, or a Hugging Face ``tokenizer.json``) and adds what does not depend on it: the
chat template, the special-token strings templates see, and the set of end-of-generation ids.
Jinja (``poot.tokenizer.chat``) is imported by the first ``apply_chat_template``.

Invariants:
    - ``encode`` then ``decode`` is the identity on text without special tokens, except where
      the tokenizer itself normalizes (SentencePiece's added prefix space is stripped again;
      clean-up of spaces happens only when the tokenizer asks for it).
    - ``eos_ids`` always contains ``eos_id`` when there is one.
    - A ``Tokenizer`` is immutable after construction and safe to share between threads for
      ``encode``/``decode``; each ``stream()`` belongs to one generation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from poot.tokenizer.stream import TokenStream

__all__ = ["Backend", "Tokenizer"]


class Backend(ABC):
    """The model-specific half of a tokenizer."""

    kind: str = ""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (including added tokens)."""

    @property
    @abstractmethod
    def bos_id(self) -> int | None:
        """The beginning-of-sequence id, or None."""

    @property
    @abstractmethod
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None."""

    @property
    @abstractmethod
    def add_bos(self) -> bool:
        """Whether ``encode(..., add_special_tokens=True)`` starts with BOS."""

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool, parse_special: bool) -> list[int]:
        """Token ids for ``text``."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool, clean_up: bool | None) -> str:
        """Text for ``ids``; ``clean_up`` None means the tokenizer's own default."""

    @abstractmethod
    def stream(self, skip_special_tokens: bool, context: Sequence[int]) -> TokenStream:
        """A streaming detokenizer."""

    def token_piece(self, token_id: int) -> bytes | None:
        """The bytes one token stands for (special tokens: their text); None when the backend
        describes its vocabulary by ``tokenizer_json`` instead."""
        return None

    def tokenizer_json(self) -> str | None:
        """The Hugging Face ``tokenizer.json`` text, for backends built from one."""
        return None

    def encode_continuation(self, text: str) -> list[int]:
        """The ids of ``text`` continuing earlier text: no BOS, no added space prefix."""
        return self.encode(text, add_special_tokens=False, parse_special=False)

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None:
        """The stored text of a token, or None when out of range."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a token's stored text, or None."""

    @abstractmethod
    def is_special(self, token_id: int) -> bool:
        """Whether ``decode(..., skip_special_tokens=True)`` drops this token."""


class Tokenizer:
    """A model's tokenizer: encode, decode, stream, and chat templates.

    Build one with ``poot.load_tokenizer``.

    Attributes:
        kind: ``"hf-tokenizer.json"``, ``"gguf-spm"`` or ``"gguf-bpe:<pre-tokenizer>"``.
        source: where the tokenizer was loaded from, for messages.
        chat_templates: the model's chat templates by name (``"default"``, ``"tool_use"``...).
        special_tokens: the strings templates see as ``bos_token``, ``eos_token``, ...
    """

    def __init__(
        self,
        backend: Backend,
        *,
        source: str,
        chat_templates: Mapping[str, str] | None = None,
        special_tokens: Mapping[str, Any] | None = None,
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        self._backend = backend
        self.kind = backend.kind
        self.source = source
        self.chat_templates = dict(chat_templates or {})
        self.special_tokens = dict(special_tokens or {})
        eos = set(extra_eos_ids)
        if backend.eos_id is not None:
            eos.add(backend.eos_id)
        self._eos_ids = frozenset(i for i in eos if 0 <= i < backend.vocab_size)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, source={self.source!r})"
        )

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return self._backend.vocab_size

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence id, or None."""
        return self._backend.bos_id

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None."""
        return self._backend.eos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends generation (EOS, end-of-turn, generation_config's eos ids)."""
        return self._eos_ids

    @property
    def add_bos(self) -> bool:
        """Whether ``encode`` adds BOS by default."""
        return self._backend.add_bos

    @property
    def chat_template(self) -> str | None:
        """The default chat template's source, or None."""
        return self.chat_templates.get("default")

    def encode(
        self, text: str, add_special_tokens: bool = True, *, parse_special: bool = True
    ) -> list[int]:
        """Token ids for ``text``.

        Args:
            text: the text.
            add_special_tokens: add BOS/EOS as the model is configured to.
            parse_special: recognize special tokens (``<|im_start|>``...) written in the text;
                when false they are tokenized as plain text (user-defined tokens still match).
        """
        return self._backend.encode(text, add_special_tokens, parse_special)

    def decode(
        self,
        ids: Iterable[int],
        skip_special_tokens: bool = False,
        *,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """Text for ``ids``.

        Args:
            ids: token ids.
            skip_special_tokens: drop control tokens (BOS, EOS, ``<|im_end|>``...).
            clean_up_tokenization_spaces: remove spaces before punctuation; None uses the
                tokenizer's own setting.
        """
        return self._backend.decode(list(ids), skip_special_tokens, clean_up_tokenization_spaces)

    def stream(
        self, *, skip_special_tokens: bool = True, context: Sequence[int] = ()
    ) -> TokenStream:
        """A streaming detokenizer: ``push(id) -> str`` and ``flush() -> str``.

        Args:
            skip_special_tokens: drop control tokens from the text.
            context: ids already shown (usually the prompt), so the first pushed token is
                rendered as a continuation of them.
        """
        return self._backend.stream(skip_special_tokens, context)

    def id_to_token(self, token_id: int) -> str | None:
        """The stored text of a token, or None when out of range."""
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token's stored text, or None."""
        return self._backend.token_to_id(token)

    def is_special(self, token_id: int) -> bool:
        """Whether ``decode(..., skip_special_tokens=True)`` drops this token."""
        return self._backend.is_special(token_id)

    def token_piece(self, token_id: int) -> bytes | None:
        """The bytes one token stands for; None for ``tokenizer.json`` tokenizers."""
        return self._backend.token_piece(token_id)

    def tokenizer_json(self) -> str | None:
        """The ``tokenizer.json`` text this tokenizer was built from, if any."""
        return self._backend.tokenizer_json()

    def encode_continuation(self, text: str) -> list[int]:
        """The ids of ``text`` as a continuation of earlier text (no BOS, and no space prefix
        even where the vocabulary adds one at the start of a text, as SentencePiece does)."""
        return self._backend.encode_continuation(text)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool | None = None,
        *,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Renders a conversation with the model's chat template, as transformers does.

        Args:
            messages: ``[{"role": "user", "content": "Hi"}, ...]``.
            add_generation_prompt: end with the assistant header; None means true unless
                ``continue_final_message`` is set.
            continue_final_message: end right after the last message, for the model to
                continue it.
            tools: tool JSON schemas for templates that support tools.
            documents: documents for retrieval templates.
            chat_template: a template name (``"tool_use"``) or a template's source, instead of
                the model's default.
            **kwargs: further template variables.

        Returns:
            The prompt text; encode it with ``add_special_tokens=False`` when the template
            writes BOS itself.

        Raises:
            ChatTemplateError: there is no template, or it fails to render.
        """
        # Imported here: Jinja (about 30 ms of imports) is needed only where a template renders.
        from poot.tokenizer.chat import render_chat_template, select_template

        template = select_template(self.chat_templates, chat_template, tools, self.source)
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final_message
        return render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            special_tokens=self.special_tokens,
            **kwargs,
        )
