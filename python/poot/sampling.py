"""``SamplingParams``: how one request picks its tokens, validated when it is made.

The fields mirror vLLM's of the same names. Sampling runs inside the decode graph (its last
nodes, see ``poot.models.step``); the host supplies each row's settings, its seeded uniform
draw, its penalty and bias list and, for guided requests, the token mask.

Invariants: every field is checked here, so a bad value fails with ``SamplingParamsError``
(a ``ValueError`` naming the field) before any work is queued. Checks that need the model
(a logit-bias id outside the vocabulary, a grammar that does not compile against the
tokenizer) run when the request is added, before it is scheduled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from poot.errors import SamplingParamsError

__all__ = ["MAX_LOGPROBS", "SamplingParams"]

_I32_MAX = 2**31 - 1
MAX_LOGPROBS = 20


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's tokens.

    The logits go through, in order: penalties and logit bias, the guidance mask, then
    temperature, top_k, top_p and min_p, and the request's seeded draw.

    Attributes:
        max_tokens: most tokens to generate (at least 1).
        temperature: 0 for greedy (argmax); otherwise logits are divided by it.
        top_k: keep only the k most likely tokens; 0 (or -1, as vLLM spells it) keeps all.
        top_p: keep the smallest set of tokens whose probability reaches top_p, in (0, 1].
        min_p: keep tokens whose probability is at least min_p times the most likely one's,
            in [0, 1).
        repetition_penalty: > 0; 1 is none. Tokens seen in the prompt or output have positive
            logits divided by it and negative ones multiplied.
        presence_penalty, frequency_penalty: in [-2, 2]; subtracted from a generated token's
            logit once, and once per occurrence.
        logit_bias: ``{token_id: bias}`` added to those logits, bias in [-100, 100].
        seed: seeds the request's random draws; the same seed gives the same tokens whatever
            else is in the batch. None draws fresh entropy.
        stop_token_ids: more ids that end generation (the stopping id is kept in
            ``token_ids``, its text is not in ``text``).
        stop: strings that end generation; the text ends before the first one.
        ignore_eos: keep generating past the model's end-of-sequence ids.
        logprobs: None for none; n in 0..20 returns the chosen token's log probability and
            the n most likely alternatives, from the model's raw distribution.
        prompt_logprobs: None for none; n in 0..20 returns, for every prompt token after the
            first, its log probability given the tokens before it and the n most likely
            alternatives (computed in the request's prefill, from full logits).
        json_schema: guide the output to JSON valid under this schema (a dict or JSON text).
        json_object: guide the output to any JSON object (OpenAI's ``json_object``).
        regex: guide the output to match this regular expression.
        grammar: guide the output by a Lark or GBNF grammar.

    Raises:
        SamplingParamsError: a field is out of range; ``.field`` names it.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    seed: int | None = None
    stop_token_ids: Sequence[int] | None = None
    stop: Sequence[str] | str | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    json_schema: Mapping[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    _stop_ids: frozenset[int] = field(init=False, repr=False, compare=False)
    _stop_strings: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _bias: tuple[tuple[int, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> SamplingParamsError:
            value = getattr(self, name)
            shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
            return SamplingParamsError(f"{name} {why}, got {shown}", field=name)

        def number(name: str, ok: bool, why: str) -> None:
            v = getattr(self, name)
            if not _is_num(v) or not math.isfinite(v) or not ok:
                raise bad(name, why)

        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        number("temperature", _is_num(self.temperature) and self.temperature >= 0, "must be >= 0")
        if not _is_int(self.top_k) or self.top_k < -1 or self.top_k > _I32_MAX:
            raise bad("top_k", "must be an integer >= 0 (or -1 for no cut)")
        p = self.top_p
        if not _is_num(p) or not (0.0 < p <= 1.0):
            raise bad("top_p", "must be a number in (0, 1]")
        m = self.min_p
        if not _is_num(m) or not (0.0 <= m < 1.0):
            raise bad("min_p", "must be a number in [0, 1)")
        number(
            "repetition_penalty",
            _is_num(self.repetition_penalty) and self.repetition_penalty > 0,
            "must be > 0 (1 = none)",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            number(name, _is_num(v) and -2.0 <= v <= 2.0, "must be in [-2, 2]")
        object.__setattr__(self, "_bias", self._check_bias(bad))
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**64):
            raise bad("seed", "must be None or an integer in [0, 2**64)")
        if not isinstance(self.ignore_eos, bool):
            raise bad("ignore_eos", "must be a bool")
        stop_ids = self.stop_token_ids
        if stop_ids is not None:
            if isinstance(stop_ids, str | bytes) or not isinstance(stop_ids, Sequence):
                raise bad("stop_token_ids", "must be a sequence of token ids")
            if not all(_is_int(i) and 0 <= i <= _I32_MAX for i in stop_ids):
                raise bad("stop_token_ids", "must hold integers >= 0")
        object.__setattr__(self, "_stop_ids", frozenset(stop_ids or ()))
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop is not None:
            if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
                raise bad("stop", "must be a string or a sequence of non-empty strings")
        object.__setattr__(self, "_stop_strings", tuple(stop or ()))
        n = self.logprobs
        if n is not None and (not _is_int(n) or not 0 <= n <= MAX_LOGPROBS):
            raise bad("logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}]")
        n = self.prompt_logprobs
        if n is not None and (not _is_int(n) or not 0 <= n <= MAX_LOGPROBS):
            raise bad("prompt_logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}]")
        self._check_guidance(bad)

    def _check_bias(self, bad: Any) -> tuple[tuple[int, float], ...]:
        bias = self.logit_bias
        if bias is None:
            return ()
        if not isinstance(bias, Mapping):
            raise bad("logit_bias", "must be a mapping of token id to bias")
        out = []
        for k, v in bias.items():
            key = int(k) if isinstance(k, str) and k.strip().lstrip("-").isdigit() else k
            if not _is_int(key) or not 0 <= key <= _I32_MAX:
                raise SamplingParamsError(
                    f"logit_bias key {k!r} is not a token id (an integer >= 0)", field="logit_bias"
                )
            if not _is_num(v) or not -100.0 <= v <= 100.0:
                raise SamplingParamsError(
                    f"logit_bias for token {key} must be a number in [-100, 100], got {v!r}",
                    field="logit_bias",
                )
            out.append((key, float(v)))
        return tuple(sorted(out))

    def _check_guidance(self, bad: Any) -> None:
        if not isinstance(self.json_object, bool):
            raise bad("json_object", "must be a bool")
        given = [n for n in ("json_schema", "regex", "grammar") if getattr(self, n) is not None] + (
            ["json_object"] if self.json_object else []
        )
        if len(given) > 1:
            raise SamplingParamsError(
                f"give at most one of json_schema, json_object, regex and grammar; got "
                f"{', '.join(given)}",
                field=given[1],
            )
        schema = self.json_schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise bad("json_schema", f"is not valid JSON ({e})") from None
        if schema is not None and not isinstance(schema, Mapping | bool):
            raise bad("json_schema", "must be a JSON schema (an object)")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise bad(name, "must be a non-empty string")
        # Whether the constraint compiles is checked where a request is admitted
        # (``LLM.make_request``), against the model's tokenizer.

    @property
    def greedy(self) -> bool:
        """True when every token is the argmax."""
        return self.temperature == 0

    @property
    def stop_ids(self) -> frozenset[int]:
        """``stop_token_ids`` as a set."""
        return self._stop_ids

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple (empty when none)."""
        return self._stop_strings

    @property
    def bias_items(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as sorted ``(token_id, bias)`` pairs."""
        return self._bias

    @property
    def penalized(self) -> bool:
        """True when any penalty is set."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def guided(self) -> bool:
        """True when the output is constrained by a schema, regex or grammar."""
        return (
            self.json_object
            or self.json_schema is not None
            or self.regex is not None
            or self.grammar is not None
        )
