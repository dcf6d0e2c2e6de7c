"""Streaming detokenizers: token ids in, complete UTF-8 text out.

Both streams hold back output until it is complete text, so a caller printing every ``push``
never shows half a character and never has to retract one.

Invariants:
    - ``"".join(push(i) for i in ids) + flush()`` equals the text ``decode`` gives for
      ``context + ids`` minus the text it gives for ``context`` (without space clean-up): a
      stream started with the prompt as context yields the continuation exactly as decoding
      the whole sequence would, leading space included. ``ByteStream`` guarantees this for any
      bytes; ``DecodeStream`` for valid UTF-8 (``tokenizers`` may mark a run of invalid bytes
      differently depending on where its window starts).
    - ``push`` never returns a string ending inside a character: ``ByteStream`` feeds bytes to
      an incremental UTF-8 decoder; ``DecodeStream`` holds text that ends in U+FFFD until more
      tokens complete it. Text that can never be completed comes out as U+FFFD at ``flush``.
    - ``ByteStream`` costs O(bytes of the token) per push; ``DecodeStream`` re-decodes a window
      of the last few tokens, O(window) per push.
"""

from __future__ import annotations

import codecs
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

__all__ = ["ByteStream", "DecodeStream", "TokenStream"]


class TokenStream(ABC):
    """Turns generated token ids into text, one id at a time."""

    @abstractmethod
    def push(self, token_id: int) -> str:
        """Adds one token; returns the text it completes (often empty)."""

    @abstractmethod
    def flush(self) -> str:
        """Returns whatever is held back; call once after the last token."""


class ByteStream(TokenStream):
    """A stream over per-token byte pieces (GGUF vocabularies).

    Args:
        piece: the bytes of one token.
        context: tokens already shown (the prompt); their text is not repeated.
        strip_first_space: drop one leading space from the very start of the text (SentencePiece's
            added prefix), only when the context produced no text.
    """

    def __init__(
        self,
        piece: Callable[[int], bytes],
        *,
        context: Sequence[int] = (),
        strip_first_space: bool = False,
    ) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        shown = "".join(self._decoder.decode(piece(int(i))) for i in context)
        # Bytes of a character the context left unfinished stay in the decoder.
        self._strip = strip_first_space and not shown and not self._decoder.getstate()[0]

    def _text(self, text: str) -> str:
        if self._strip and text:
            self._strip = False
            if text.startswith(" "):
                return text[1:]
        return text

    def push(self, token_id: int) -> str:
        return self._text(self._decoder.decode(self._piece(int(token_id))))

    def flush(self) -> str:
        return self._text(self._decoder.decode(b"", final=True))


class DecodeStream(TokenStream):
    """A stream over a whole-sequence decoder (``tokenizers`` objects).

    Decodes a sliding window of recent tokens twice, with and without the new ones, and emits
    the difference once it no longer ends in U+FFFD (the mark of an unfinished character).

    Args:
        decode: decodes a list of ids to text.
        context: tokens already shown (the prompt); their text is not repeated.
        window: how many context tokens to decode ahead of the new ones.
    """

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        *,
        context: Sequence[int] = (),
        window: int = 6,
    ) -> None:
        self._decode = decode
        self._ids = [int(i) for i in context]
        self._read = len(self._ids)
        self._prefix = max(0, self._read - window)

    def _emit(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True) if self._read < len(self._ids) else ""
