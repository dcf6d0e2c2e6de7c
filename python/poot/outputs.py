"""Request outputs in the shape vLLM returns them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CompletionOutput", "FinishReason", "RequestOutput"]

FinishReason = Literal["stop", "length"]


@dataclass
class CompletionOutput:
    """One generated completion.

    Attributes:
        index: the completion's index within its request (always 0 for now).
        text: the generated text (without the text of a stopping token).
        token_ids: the generated ids, including a stopping id.
        finish_reason: ``"stop"`` (an EOS or stop id) or ``"length"`` (max_tokens or the
            context limit); None while unfinished.
        logprobs: per-token log probabilities; None (not computed yet).
        cumulative_logprob: None (not computed yet).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[dict[int, Any]] | None = None
    cumulative_logprob: float | None = None

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
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
