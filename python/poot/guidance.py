"""Guided decoding: JSON schemas, regexes and grammars as per-step token masks, by llguidance.

llguidance (the grammar engine llama.cpp and vLLM use) turns a request's constraint into a
matcher over the model's tokenizer. Each step the matcher gives a bitmask of the tokens that
keep the output valid; the sampling step sets the others to -inf (``mask_logits``). The mask
for a step depends only on tokens already sampled, so the engine computes it while the forward
pass of that step runs (the mask is a late graph input, see ``poot._native.LateInput``).

Invariants:
    - A constraint that does not compile raises ``SamplingParamsError`` naming its field when
      ``SamplingParams`` is made (``validate``) or, at the latest, when the request is added
      (``Guide.matcher``), never mid-generation.
    - The llguidance tokenizer is built once per ``Guide`` (about a second for a 50k
      vocabulary), lazily, on the first guided request.
    - Mask row layout is llguidance's: bit ``j`` of word ``w`` allows token ``32 w + j``;
      tokens past the tokenizer's vocabulary (padding rows of the embedding) are never allowed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from poot.errors import SamplingParamsError

if TYPE_CHECKING:
    # Imported where a guided request first needs it: unguided work (and a server's
    # start-up) never pays for llguidance and the package metadata it reads.
    import llguidance

    from poot.sampling import SamplingParams
    from poot.tokenizer import Tokenizer

__all__ = ["Guide", "grammar_of", "validate"]

_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_of(params: SamplingParams) -> tuple[str, str] | None:
    """``(field, llguidance grammar)`` for a guided request; None when unguided.

    Raises:
        SamplingParamsError: the constraint does not compile.
    """
    if not any(_given(params, f) for f in ("json_schema", "json_object", "regex", "grammar")):
        return None
    import llguidance

    try:
        if params.json_schema is not None or params.json_object:
            field = "json_schema" if params.json_schema is not None else "json_object"
            schema = params.json_schema if params.json_schema is not None else {"type": "object"}
            if isinstance(schema, str):
                schema = json.loads(schema)
            if isinstance(schema, Mapping) and "x-guidance" not in schema:
                # Single-line JSON with ", " and ": " unless the schema says otherwise: free
                # whitespace lets small models emit newlines until max_tokens runs out.
                schema = {**schema, "x-guidance": _COMPACT}
            return field, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        if params.regex is not None:
            return "regex", llguidance.LLMatcher.grammar_from_regex(params.regex)
        if params.grammar is not None:
            return "grammar", llguidance.grammar_from("grammar", params.grammar)
    except (ValueError, RuntimeError, TypeError) as e:
        field = next(
            f for f in ("json_schema", "json_object", "regex", "grammar") if _given(params, f)
        )
        raise SamplingParamsError(f"{field} does not compile: {e}", field=field) from None
    return None


def _given(params: SamplingParams, field: str) -> bool:
    v = getattr(params, field)
    return bool(v) if isinstance(v, bool) else v is not None


def validate(params: SamplingParams) -> None:
    """Compiles the request's constraint without a tokenizer.

    Raises:
        SamplingParamsError: the schema, regex or grammar does not compile.
    """
    found = grammar_of(params)
    if found is None:
        return
    field, grammar = found
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise SamplingParamsError(f"{field} does not compile: {'; '.join(messages)}", field=field)


class _PieceTokenizer:
    """The duck-typed tokenizer ``llguidance.TokenizerWrapper`` reads (GGUF vocabularies)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_id: int) -> None:
        self.eos_token_id = eos_id
        self.bos_token_id = tokenizer.bos_id
        tokens: list[bytes] = []
        specials: list[int] = []
        for i in range(vocab_size):
            piece = tokenizer.token_piece(i) if i < tokenizer.vocab_size else None
            if piece is None:
                tokens.append(b"")
            elif tokenizer.is_special(i):
                # llguidance marks special tokens with a leading 0xff byte, as llama.cpp does.
                tokens.append(b"\xff" + piece)
                specials.append(i)
            else:
                tokens.append(piece)
        self.tokens = tokens
        self.special_token_ids = specials
        self._tok = tokenizer

    def __call__(self, text: bytes) -> list[int]:
        # Grammar text continues the output so far: no space prefix (SentencePiece adds one
        # at the start of a text, which would make "{" tokenize as "▁" + "{").
        return self._tok.encode_continuation(text.decode("utf-8", errors="replace"))


class Guide:
    """Builds matchers for one model's tokenizer and fills their masks.

    Args:
        tokenizer: the model's tokenizer.
        vocab_size: the model's vocabulary (logits width; may exceed the tokenizer's).
        eos_ids: the ids that end generation (allowed once a constraint is satisfied).
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self.words = (vocab_size + 31) // 32
        self._lltok: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None

    def lltokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance tokenizer, built on first use."""
        import llguidance

        with self._lock:
            if self._lltok is None:
                eos: int | list[int] = self.eos_ids or 0
                source = self.tokenizer.tokenizer_json()
                if source is not None:
                    self._lltok = llguidance.LLTokenizer(
                        source, n_vocab=self.vocab_size, eos_token=eos
                    )
                else:
                    first = self.eos_ids[0] if self.eos_ids else 0
                    wrapper = llguidance.TokenizerWrapper(
                        _PieceTokenizer(self.tokenizer, self.vocab_size, first)
                    )
                    self._lltok = llguidance.LLTokenizer(wrapper, eos_token=eos)
                self._executor = llguidance.LLExecutor()
            return self._lltok

    def matcher(self, params: SamplingParams) -> llguidance.LLMatcher | None:
        """A fresh matcher for a guided request; None when unguided.

        Raises:
            SamplingParamsError: the constraint does not compile for this tokenizer.
        """
        found = grammar_of(params)
        if found is None:
            return None
        field, grammar = found
        import llguidance

        m = llguidance.LLMatcher(self.lltokenizer(), grammar, log_level=0)
        if m.is_error():
            raise SamplingParamsError(f"{field} does not compile: {m.get_error()}", field=field)
        return m

    def fill_masks(
        self, rows: Sequence[tuple[int, llguidance.LLMatcher]], seqs: int
    ) -> npt.NDArray[np.int32]:
        """The token mask of a step: ``rows`` are ``(row, matcher)``; other rows allow all.

        Raises:
            RuntimeError: a matcher is in an error state.
        """
        mask = np.full((seqs, self.words), -1, np.int32)
        if rows:
            import llguidance.numpy as llg_np

            self.lltokenizer()
            assert self._executor is not None
            llg_np.fill_next_token_bitmask_par(self._executor, [(m, r) for r, m in rows], mask)
            for r, m in rows:
                if m.is_error():
                    raise RuntimeError(f"guidance failed on row {r}: {m.get_error()}")
        return mask
