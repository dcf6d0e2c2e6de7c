"""Response bodies and stream chunks in OpenAI's shapes, for both routes.

``Builder`` accumulates a request's events into whole choices (non-streamed responses) or turns
each event into one SSE chunk (streamed ones). Logprobs use each route's own format: the legacy
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for completions and
``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`` for chat.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from poot.server.generation import Event
from poot.server.params import Job
from poot.tokenizer import Tokenizer

__all__ = ["Builder", "sse"]

Route = Literal["completions", "chat"]


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[tuple[int, dict[int, Any]]] = field(default_factory=list)
    offset: int = 0  # characters emitted so far (completions' text_offset)
    started: bool = False  # chat: the role chunk was sent


class Builder:
    """Builds one request's response (or its chunks)."""

    def __init__(
        self, route: Route, request_id: str, model: str, job: Job, tokenizer: Tokenizer
    ) -> None:
        self.route = route
        self.id = request_id
        self.model = model
        self.job = job
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.choices = [_Choice() for _ in job.choices]
        if job.echo:
            for i, (p, _) in enumerate(job.choices):
                self.choices[i].text.append(job.prompt_texts[p] or "")

    @property
    def completion_tokens(self) -> int:
        return sum(c.tokens for c in self.choices)

    def usage(self) -> dict[str, int]:
        prompt = self.job.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }

    # ---- logprobs ---------------------------------------------------------------------------

    def _token_text(self, tid: int, lp: Any) -> str:
        text = getattr(lp, "decoded_token", None)
        return text if text is not None else self.tokenizer.decode([tid])

    def _tops(self, d: dict[int, Any]) -> list[tuple[int, Any]]:
        n = self.job.logprobs or 0
        ranked = sorted(d.items(), key=lambda kv: kv[1].rank)
        return [(tid, lp) for tid, lp in ranked if lp.rank <= n][:n]

    def _logprobs(self, choice: _Choice, pairs: list[tuple[int, dict[int, Any]]]) -> Any:
        if self.job.logprobs is None:
            return None
        if self.route == "chat":
            content = []
            for tid, d in pairs:
                chosen = d.get(tid)
                tok = self._token_text(tid, chosen)
                content.append(
                    {
                        "token": tok,
                        "logprob": chosen.logprob if chosen is not None else None,
                        "bytes": list(tok.encode()),
                        "top_logprobs": [
                            {
                                "token": (t := self._token_text(a, lp)),
                                "logprob": lp.logprob,
                                "bytes": list(t.encode()),
                            }
                            for a, lp in self._tops(d)
                        ],
                    }
                )
            return {"content": content, "refusal": None}
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, d in pairs:
            chosen = d.get(tid)
            tok = self._token_text(tid, chosen)
            tokens.append(tok)
            token_lps.append(chosen.logprob if chosen is not None else None)
            tops.append({self._token_text(a, lp): lp.logprob for a, lp in self._tops(d)})
            offsets.append(choice.offset)
            choice.offset += len(tok)
        return {
            "tokens": tokens,
            "token_logprobs": token_lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _pairs(self, ev: Event) -> list[tuple[int, dict[int, Any]]]:
        if ev.logprobs is None:
            return []
        return list(zip(ev.token_ids, ev.logprobs, strict=False))

    # ---- whole responses ----------------------------------------------------------------------

    def add(self, ev: Event) -> None:
        c = self.choices[ev.index]
        c.text.append(ev.text)
        c.tokens += len(ev.token_ids)
        c.logprobs += self._pairs(ev)
        if ev.finish_reason is not None:
            c.finish_reason = ev.finish_reason

    def response(self) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            text = "".join(c.text)
            lps = self._logprobs(c, c.logprobs)
            if self.route == "chat":
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": lps,
                        "finish_reason": c.finish_reason,
                    }
                )
            else:
                choices.append(
                    {"index": i, "text": text, "logprobs": lps, "finish_reason": c.finish_reason}
                )
        obj = "chat.completion" if self.route == "chat" else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }

    # ---- stream chunks ------------------------------------------------------------------------

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.route == "chat" else "text_completion"
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.job.include_usage:
            chunk["usage"] = None
        return chunk

    def chunks(self, ev: Event) -> list[bytes]:
        """The SSE chunks for one event (chat sends the assistant role first)."""
        c = self.choices[ev.index]
        c.tokens += len(ev.token_ids)
        lps = self._logprobs(c, self._pairs(ev)) if ev.token_ids else None
        out = []
        if self.route == "chat":
            if not c.started:
                c.started = True
                first = {"role": "assistant", "content": ""}
                out.append(sse(self._chunk([self._chat_choice(ev.index, first, None, None)])))
            delta = {"content": ev.text} if ev.text or ev.finish_reason is None else {}
            out.append(
                sse(self._chunk([self._chat_choice(ev.index, delta, lps, ev.finish_reason)]))
            )
        else:
            text = ev.text
            if self.job.echo and not c.started:
                c.started = True
                text = "".join(c.text) + text
            out.append(
                sse(
                    self._chunk(
                        [
                            {
                                "index": ev.index,
                                "text": text,
                                "logprobs": lps,
                                "finish_reason": ev.finish_reason,
                            }
                        ]
                    )
                )
            )
        return out

    @staticmethod
    def _chat_choice(
        index: int, delta: dict[str, Any], lps: Any, finish: str | None
    ) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}

    def usage_chunk(self) -> bytes:
        chunk = self._chunk([])
        chunk["usage"] = self.usage()
        return sse(chunk)
