"""``SamplingParams``: how one request picks its tokens, validated when it is made.

The fields mirror vLLM's of the same names. Sampling itself runs inside the decode graph (its
last node); the host only supplies each row's parameters and a seeded uniform draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from poot.errors import SamplingParamsError

__all__ = ["SamplingParams"]

_I32_MAX = 2**31 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's tokens.

    Attributes:
        max_tokens: most tokens to generate (at least 1).
        temperature: 0 for greedy (argmax); otherwise logits are divided by it.
        top_k: keep only the k most likely tokens; 0 (or -1, as vLLM spells it) keeps all.
        top_p: keep the smallest set of tokens whose probability reaches top_p, in (0, 1].
        seed: seeds the request's random draws, so a run is reproducible; None draws fresh
            entropy.
        stop_token_ids: more ids that end generation (the stopping id is kept in
            ``token_ids``, its text is not in ``text``).
        ignore_eos: keep generating past the model's end-of-sequence ids.

    Raises:
        SamplingParamsError: a field is out of range; ``.field`` names it.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    _stop_ids: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> SamplingParamsError:
            value = getattr(self, name)
            return SamplingParamsError(f"{name} {why}, got {value!r}", field=name)

        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise bad("temperature", "must be a finite number >= 0")
        if not _is_int(self.top_k) or self.top_k < -1 or self.top_k > _I32_MAX:
            raise bad("top_k", "must be an integer >= 0 (or -1 for no cut)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not (0.0 < p <= 1.0):
            raise bad("top_p", "must be a number in (0, 1]")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise bad("seed", "must be None or an integer >= 0")
        if not isinstance(self.ignore_eos, bool):
            raise bad("ignore_eos", "must be a bool")
        stop = self.stop_token_ids
        if stop is not None:
            if isinstance(stop, str | bytes) or not isinstance(stop, Sequence):
                raise bad("stop_token_ids", "must be a sequence of token ids")
            if not all(_is_int(i) and 0 <= i <= _I32_MAX for i in stop):
                raise bad("stop_token_ids", "must hold integers >= 0")
        object.__setattr__(self, "_stop_ids", frozenset(stop or ()))

    @property
    def greedy(self) -> bool:
        """True when every token is the argmax."""
        return self.temperature == 0

    @property
    def stop_ids(self) -> frozenset[int]:
        """``stop_token_ids`` as a set."""
        return self._stop_ids
