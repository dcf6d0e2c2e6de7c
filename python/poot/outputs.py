"""Request outputs in the shape vLLM returns them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CompletionOutput", "FinishReason", "Logprob", "RequestOutput"]

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class Logprob:
    """A token's log probability under the model's raw distribution (before penalties,
    bias, guidance and temperature).

    Attributes:
        logprob: natural log of the probability.
        rank: 1 for the most likely token; None when the token is outside the top 20.
        decoded_token: the token's text.
    """

    logprob: float
    rank: int | None
    decoded_token: str | None


@dataclass
class CompletionOutput:
    """One generated completion.

    Attributes:
        index: the completion's index within its request (always 0 for now).
        text: the generated text (without the text of a stopping token).
        token_ids: the generated ids, including a stopping id.
        finish_reason: ``"stop"`` (an EOS or stop id, a stop string, a completed grammar),
            ``"length"`` (max_tokens or the context limit) or ``"error"`` (the model produced
            non-finite logits; no garbage token is emitted); None while unfinished.
        logprobs: with ``SamplingParams.logprobs`` set, one dict per generated token: the
            chosen id and the top alternatives, each a ``Logprob``; else None.
        cumulative_logprob: the sum of the chosen tokens' logprobs (with logprobs set).
        stop_reason: the stop id or stop string that ended the completion, if one did.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The result of one prompt.

    Attributes:
        request_id: the request's id (its index in the ``generate`` call, as a string).
        prompt: the prompt text; None when the prompt was given as token ids.
        prompt_token_ids: the prompt's token ids.
        outputs: the completions (one for now).
        finished: True when every completion has finished.
        prompt_logprobs: with ``SamplingParams.prompt_logprobs`` set, one entry per prompt
            token (None for the first): its ``Logprob`` and the top alternatives; else None.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
