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
from poot.server.tool_parsers import ParsedCall, ToolStream
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
    tools: ToolStream | None = None  # chat with tools: the reply's parser while streaming
    calls: int = 0  # tool calls streamed so far
    prompt_lps: list[dict[int, Any] | None] | None = None  # the prompt's, once they came
    prompt_sent: bool = False  # completions: the prompt's logprobs went out (echo)


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
        # A marker that is a special token is not in the decoded text: it is put back where
        # its token appears, so the parser sees it.
        self.marker_id: int | None = None
        if job.tools is not None:
            for c in self.choices:
                c.tools = ToolStream(job.tools.fmt)
            tid = tokenizer.token_to_id(job.tools.fmt.marker)
            if tid is not None and tokenizer.is_special(tid):
                self.marker_id = tid
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

    def _prompt_part(self, index: int, choice: _Choice) -> dict[str, list[Any]]:
        """The prompt's tokens in the legacy logprobs lists (the first has no logprob)."""
        prompt = self.job.prompts[self.job.choices[index][0]]
        entries = choice.prompt_lps or [None] * len(prompt)
        n = self.job.logprobs or 0
        part: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for tid, entry in zip(prompt, entries, strict=True):
            chosen = None if entry is None else entry.get(tid)
            tok = self._token_text(tid, chosen)
            part["tokens"].append(tok)
            part["token_logprobs"].append(None if chosen is None else chosen.logprob)
            tops = None
            if entry is not None:
                ranked = sorted(entry.items(), key=lambda kv: kv[1].rank or 1 << 30)
                tops = {
                    self._token_text(a, lp): lp.logprob
                    for a, lp in ranked
                    if lp.rank is not None and lp.rank <= n
                }
                if not tops and chosen is not None:
                    tops = {tok: chosen.logprob}
            part["top_logprobs"].append(tops)
            part["text_offset"].append(choice.offset)
            choice.offset += len(tok)
        return part

    def _vllm_prompt_logprobs(self, index: int, choice: _Choice) -> list[Any] | None:
        """vLLM's ``prompt_logprobs``: per prompt token ``{id: {logprob, rank,
        decoded_token}}`` (None for the first)."""
        if choice.prompt_lps is None:
            return None
        return [
            None
            if entry is None
            else {
                str(t): {
                    "logprob": lp.logprob,
                    "rank": lp.rank,
                    "decoded_token": self._token_text(t, lp),
                }
                for t, lp in entry.items()
            }
            for entry in choice.prompt_lps
        ]

    def _logprobs(self, choice: _Choice, pairs: list[tuple[int, dict[int, Any]]]) -> Any:
        if self.job.logprobs is None:
            return None
        index = next(i for i, c in enumerate(self.choices) if c is choice)
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
        with_prompt = self.job.echo and choice.prompt_lps is not None and not choice.prompt_sent
        if with_prompt:
            choice.prompt_sent = True
            part = self._prompt_part(index, choice)
            tokens, token_lps = part["tokens"], part["token_logprobs"]
            tops, offsets = part["top_logprobs"], part["text_offset"]
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

    def _text(self, ev: Event) -> str:
        if self.marker_id is not None and self.marker_id in ev.token_ids:
            assert self.job.tools is not None
            return self.job.tools.fmt.marker + ev.text
        return ev.text

    def add(self, ev: Event) -> None:
        c = self.choices[ev.index]
        if ev.prompt_logprobs is not None:
            c.prompt_lps = ev.prompt_logprobs
        if self.job.drop_output:  # max_tokens 0: the one sampled token is not returned
            if ev.finish_reason is not None:
                c.finish_reason = "length" if ev.finish_reason != "error" else "error"
            return
        c.text.append(self._text(ev))
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
                message: dict[str, Any] = {"role": "assistant", "content": text}
                finish = c.finish_reason
                if self.job.tools is not None:
                    content, calls = self.job.tools.fmt.parse(text)
                    if calls:
                        message = {
                            "role": "assistant",
                            "content": content,
                            "tool_calls": [call.openai() for call in calls],
                        }
                        finish = "tool_calls" if finish == "stop" else finish
                choices.append(
                    {"index": i, "message": message, "logprobs": lps, "finish_reason": finish}
                )
            else:
                choice = {
                    "index": i,
                    "text": text,
                    "logprobs": lps,
                    "finish_reason": c.finish_reason,
                }
                if self.job.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = self._vllm_prompt_logprobs(i, c)
                choices.append(choice)
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
        if ev.prompt_logprobs is not None:
            c.prompt_lps = ev.prompt_logprobs
        lps = self._logprobs(c, self._pairs(ev)) if ev.token_ids else None
        out = []
        if self.route == "chat":
            if not c.started:
                c.started = True
                first = {"role": "assistant", "content": ""}
                out.append(sse(self._chunk([self._chat_choice(ev.index, first, None, None)])))
            if c.tools is not None:
                return out + self._tool_chunks(ev, c, lps)
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

    def _tool_chunks(self, ev: Event, c: _Choice, lps: Any) -> list[bytes]:
        """Chunks of a reply parsed for tool calls: content deltas, then each call as a delta
        with its id and name and one with its arguments (OpenAI's streamed shape)."""
        assert c.tools is not None
        parts = c.tools.feed(self._text(ev))
        if ev.finish_reason is not None:
            parts += c.tools.finish()
        out = []
        for part in parts:
            if isinstance(part, ParsedCall):
                head = {
                    "index": c.calls,
                    "id": part.id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": ""},
                }
                args = {"index": c.calls, "function": {"arguments": part.arguments}}
                c.calls += 1
                for call in (head, args):
                    out.append(
                        sse(
                            self._chunk(
                                [self._chat_choice(ev.index, {"tool_calls": [call]}, None, None)]
                            )
                        )
                    )
            elif part:
                out.append(
                    sse(self._chunk([self._chat_choice(ev.index, {"content": part}, None, None)]))
                )
        if lps is not None:
            out.append(sse(self._chunk([self._chat_choice(ev.index, {}, lps, None)])))
        if ev.finish_reason is not None:
            finish = "tool_calls" if c.calls and ev.finish_reason == "stop" else ev.finish_reason
            out.append(sse(self._chunk([self._chat_choice(ev.index, {}, None, finish)])))
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
