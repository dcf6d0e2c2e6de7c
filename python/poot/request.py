"""One request's host-side state: its tokens and text, its sampling state, how it ends.

The device samples. What the sampling step needs from one step to the next (the request's
seeded random stream, the counts behind its penalties, its logit bias) lives in the step
driver (``poot._native.StepDriver``) from admission on: ``rng`` is handed to it when the
request is added and not drawn from here. The host keeps the guidance matcher, turns tokens
into text deltas and applies stop strings.

Invariants:
    - Stop strings: no text that could still become part of a stop string is handed out
      (the longest suffix that is a prefix of a stop string is held back); once one appears the
      text ends just before it and the request finishes with ``"stop"``.
    - ``ended_by_host`` is set when the host, not the scheduler, ended the request (a stop
      string, a finished grammar, non-finite logits): the driver must then free its blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from poot.outputs import Logprob
from poot.sampling import SamplingParams
from poot.tokenizer import TokenStream

if TYPE_CHECKING:
    import llguidance

__all__ = ["Request"]


def _held_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


@dataclass
class Request:
    index: int
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    rng: np.random.Generator
    stream: TokenStream
    matcher: llguidance.LLMatcher | None = None
    out: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    # The stop string or token id that ended the request, when one did.
    stop_reason: str | int | None = None
    # Text deltas accepted but not yet yielded by the loop that owns the request.
    pending: deque[str] = field(default_factory=deque)
    logprobs: list[dict[int, Logprob]] | None = None
    # With ``params.prompt_logprobs``: one entry per prompt token (None for the first, and
    # for positions not computed yet), filled by the engine during the prefill.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    cumulative_logprob: float | None = None
    request_id: int = -1
    ended_by_host: bool = False
    # Accepted text not yet handed out (it may still turn into a stop string).
    _held: str = ""

    def __post_init__(self) -> None:
        if self.params.logprobs is not None:
            self.logprobs = []
            self.cumulative_logprob = 0.0
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_ids)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.out)

    # ---- accepting tokens -----------------------------------------------------------------

    def fail(self) -> None:
        """Ends the request because its logits were not finite."""
        self.finish_reason = "error"
        self.ended_by_host = True
        self.pending.append(self._release(self.stream.flush(), final=True))

    def accept(self, token: int, finish: str | None) -> str:
        """Appends a sampled token; returns the text it completes and sets finish_reason.

        ``finish`` is the scheduler's verdict (``"stop"`` on an eos or stop id, ``"length"``).
        """
        self.out.append(token)
        grammar_done = False
        if self.matcher is not None:
            # The mask only allowed tokens the matcher accepts; a refusal is an engine bug.
            if not self.matcher.consume_token(token) and finish is None:
                raise RuntimeError(f"guidance refused token {token}: {self.matcher.get_error()}")
            grammar_done = finish is None and self.matcher.is_stopped()
        if finish == "stop":
            # An eos or stop id: the id stays in ``out``, its text does not join the text.
            self.stop_reason = token
            delta = self.stream.flush()
        else:
            delta = self.stream.push(token)
            if grammar_done:  # the grammar is complete: its last token's text is part of it
                finish = "stop"
                self.ended_by_host = True
            if finish is not None:
                delta += self.stream.flush()
        if finish is not None:
            self.finish_reason = "stop" if finish == "stop" else "length"
        return self._release(delta, final=finish is not None)

    def _release(self, delta: str, final: bool) -> str:
        """The part of ``delta`` that can be handed out, after stop strings."""
        stops = self.params.stop_strings
        if not stops:
            if delta:
                self.text.append(delta)
            return delta
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stop_reason = next(s for s in stops if text.find(s) == cut)
            out, self._held = text[:cut], ""
            if self.finish_reason is None:
                self.finish_reason = "stop"
                self.ended_by_host = True
            elif self.finish_reason == "length":
                self.finish_reason = "stop"
        elif final:
            out, self._held = text, ""
        else:
            keep = _held_suffix(text, stops)
            out, self._held = text[: len(text) - keep], text[len(text) - keep :]
        if out:
            self.text.append(out)
        return out

    def add_logprobs(self, entry: dict[int, Logprob], chosen: float) -> None:
        """Records one sampled token's logprob entry."""
        if self.logprobs is not None:
            self.logprobs.append(entry)
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + chosen
