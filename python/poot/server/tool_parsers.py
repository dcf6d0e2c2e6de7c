"""The model families' tool-call formats: how a call is written, parsed and constrained.

Three formats cover the chat templates poot serves:

- ``hermes`` (Hermes, Qwen2.5, and every ChatML model without its own format, SmolLM2
  included): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block
  per call, after optional text;
- ``llama3`` (Llama 3.1 / 3.2): the whole reply is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``; several calls are separated by ``;``;
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``.

``ToolFormat.grammar`` writes the llguidance Lark grammar that constrains a reply: with a
forced call (``tool_choice`` ``required`` or a named function) the reply is one call (or
several, with ``parallel_tool_calls``) whose arguments match the function's JSON schema; with
``auto`` it is free text, or text up to the format's marker and then constrained calls.
``ToolStream`` parses a reply as it streams: text is handed out as content until a call can
have started (a prefix of the marker is held back), and each call is handed out whole once it
is complete.

Invariants: ``parse(text)`` equals the concatenation of a ``ToolStream`` fed the same text in
any split; a reply that does not parse as calls is content, never an error (an unconstrained
``auto`` reply may be anything).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FORMATS", "ParsedCall", "ToolFormat", "ToolStream", "closed", "format_for_template"]

Family = Literal["hermes", "llama3", "mistral"]

_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ParsedCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict[str, Any]:
        """The call in the ``tool_calls`` shape of a chat completion message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _call_from(obj: Any, args_keys: tuple[str, ...]) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in args_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):  # some models write the arguments as JSON text
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return None
            if not isinstance(args, dict):
                return None
            return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))
    return ParsedCall(obj["name"], "{}")


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and does not say otherwise (xgrammar's strict mode, as vLLM serves tool
    arguments): a small model would otherwise invent properties until max_tokens."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k != "properties" else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    for key in ("$defs", "definitions", "patternProperties", "dependentSchemas"):
        if isinstance(schema.get(key), dict):
            out[key] = {k: closed(v) for k, v in schema[key].items()}
    return out


def _lark_str(s: str) -> str:
    return json.dumps(s)


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call format.

    Attributes:
        family: ``hermes``, ``llama3`` or ``mistral``.
        marker: the text that starts a call (llama3: ``<|python_tag|>``, also optional).
        args_key: the key holding the arguments in a written call.
    """

    family: Family
    marker: str
    args_key: str

    # ---- parsing ------------------------------------------------------------------------------

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """``(content, calls)`` of a whole reply; content is None when it is only calls."""
        s = ToolStream(self)
        parts = s.feed(text) + s.finish()
        content = "".join(p for p in parts if isinstance(p, str))
        calls = [p for p in parts if isinstance(p, ParsedCall)]
        if calls and not content.strip():
            return None, calls
        return content, calls

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        """The calls in the text after the marker (None when it does not parse)."""
        keys = (self.args_key, "arguments", "parameters")
        block = block.strip()
        if self.family == "hermes":
            end = block.find("</tool_call>")
            body = block if end < 0 else block[:end]
            try:
                call = _call_from(json.loads(body), keys)
            except json.JSONDecodeError:
                return None
            return None if call is None else [call]
        if self.family == "mistral":
            try:
                obj = json.loads(block)
            except json.JSONDecodeError:
                return None
            items = obj if isinstance(obj, list) else [obj]
            found = [_call_from(o, keys) for o in items]
            ok = [c for c in found if c is not None]
            return ok if ok and len(ok) == len(found) else None
        calls: list[ParsedCall] = []
        for piece in _split_top_level(block, ";"):
            try:
                call = _call_from(json.loads(piece), keys)
            except json.JSONDecodeError:
                return None
            if call is None:
                return None
            calls.append(call)
        return calls or None

    # ---- constraining -------------------------------------------------------------------------

    def call_schema(self, functions: list[dict[str, Any]]) -> dict[str, Any]:
        """The JSON schema of one written call to any of ``functions``."""
        options = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    self.args_key: closed(f.get("parameters") or {"type": "object"}),
                },
                "required": ["name", self.args_key],
                "additionalProperties": False,
            }
            for f in functions
        ]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        # One line with ", " and ": " (as ``poot.guidance`` does for json_schema): free
        # whitespace lets a small model write newlines until max_tokens runs out.
        return {**schema, "x-guidance": _COMPACT}

    def grammar(
        self,
        functions: list[dict[str, Any]],
        *,
        forced: bool,
        parallel: bool,
        marker_token: int | None = None,
    ) -> str:
        """The Lark grammar of a reply.

        Args:
            functions: the functions a call may name (``{"name", "parameters"}``).
            forced: the reply must be calls (``required`` or a named function); else ``auto``.
            parallel: more than one call is allowed.
            marker_token: the marker's token id where it is a special token (written
                ``<[id]>``, since text never matches a special token).
        """
        schema = json.dumps(self.call_schema(functions), separators=(",", ":"))

        def more(sep: str, item: str) -> str:
            return f" ({sep} {item})*" if parallel else ""

        marker = f"<[{marker_token}]>" if marker_token is not None else _lark_str(self.marker)
        if self.family == "hermes":
            lines = [
                'call: "\\n" body "\\n</tool_call>"',
                "calls: call" + more('"\\n"', f"{marker} call"),
            ]
            head = marker
        elif self.family == "mistral":
            item = {k: v for k, v in json.loads(schema).items() if k != "x-guidance"}
            array = {"type": "array", "items": item, "minItems": 1, "x-guidance": _COMPACT}
            if not parallel:
                array["maxItems"] = 1
            lines = [f'calls: " "? %json {json.dumps(array, separators=(",", ":"))}']
            head = marker
        else:
            lines = ["calls: body" + more('"; "', "body")]
            head = ""
        lines.append(f"body: %json {schema}")
        if forced:
            start = f"start: {head} calls" if head and self.family != "llama3" else "start: calls"
            return "\n".join([start, *lines])
        if self.family == "llama3":
            # A reply is a call when it starts with "{" (or the python tag): text may not.
            tag = marker
            start = f"start: TEXT? | calls | {tag} calls\nTEXT: /[^{{\\s](?s:.*)/"
        elif marker_token is not None:
            start = f"start: TEXT? | TEXT? {marker} calls\nTEXT: /(?s:.+)/"
        else:
            # The marker ends the text lexeme (the lexer cannot split one greedy match later).
            m = _regex_escape(self.marker)
            start = (
                f"start: TEXT? | PRE calls\n"
                f"TEXT: /(?s:.+)/ & ~/(?s:.*){m}(?s:.*)/\n"
                f"PRE: /(?s:.*){m}/ & ~/(?s:.*){m}(?s:.+)/"
            )
        return "\n".join([start, *lines])


def _regex_escape(s: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/" else c for c in s)


def _split_top_level(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside JSON strings and brackets."""
    out, depth, start, in_str, esc = [], 0, 0, False, False
    for i, c in enumerate(text):
        if in_str:
            esc = c == "\\" and not esc
            if c == '"' and not esc:
                in_str = False
            continue
        if c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif c == sep and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [p for p in out if p]


FORMATS: dict[Family, ToolFormat] = {
    "hermes": ToolFormat("hermes", "<tool_call>", "arguments"),
    "llama3": ToolFormat("llama3", "<|python_tag|>", "parameters"),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", "arguments"),
}


def format_for_template(template: str | None) -> ToolFormat:
    """The tool format a chat template implies (Hermes for ChatML and anything unknown)."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<|python_tag|>" in t or ("ipython" in t and "<|eot_id|>" in t):
        return FORMATS["llama3"]
    return FORMATS["hermes"]


class ToolStream:
    """Splits a streamed reply into content text and whole calls (see the module docs)."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self._held = ""  # text that may still start a call
        self._block: str | None = None  # text after the marker (in a call)
        self._started = False  # any non-whitespace text was seen (llama3: a reply, not a call)
        self._after_call = False  # only whitespace since the last call (dropped before the next)

    def feed(self, delta: str) -> list[str | ParsedCall]:
        """Content and completed calls that ``delta`` makes known."""
        if self._block is not None:
            self._block += delta
            return self._drain(final=False)
        text = self._held + delta
        fmt = self.fmt
        if fmt.family == "llama3" and not self._started:
            stripped = text.lstrip()
            if not stripped:
                self._held = text
                return []
            self._started = True
            if stripped.startswith("{") or stripped.startswith(fmt.marker[: len(stripped)]):
                if stripped.startswith(fmt.marker) or stripped.startswith("{"):
                    body = stripped.removeprefix(fmt.marker)
                    self._held, self._block = "", body
                    return self._drain(final=False)
                self._held, self._started = text, False  # a prefix of the tag: wait
                return []
            self._held = ""
            return [text]
        if fmt.family == "llama3":
            self._held = ""
            return [text] if text else []
        at = text.find(fmt.marker)
        if at >= 0:
            self._held, self._block = "", text[at + len(fmt.marker) :]
            before = text[:at]
            if self._after_call and not before.strip():
                before = ""
            out: list[str | ParsedCall] = [before] if before else []
            return out + self._drain(final=False)
        keep = _marker_prefix(text, fmt.marker)
        out_text = text[: len(text) - keep]
        if self._after_call and not out_text.strip():
            self._held = text  # whitespace, then perhaps the next call's marker
            return []
        self._after_call = False
        self._held = text[len(text) - keep :]
        return [out_text] if out_text else []

    def _drain(self, final: bool) -> list[str | ParsedCall]:
        assert self._block is not None
        fmt = self.fmt
        if fmt.family != "hermes":
            if not final:
                return []
            calls = fmt.parse_block(self._block)
            text, self._block = self._block, None
            if calls is None:
                return [fmt.marker + text if fmt.family == "mistral" else text]
            return list(calls)
        out: list[str | ParsedCall] = []
        while self._block is not None:
            end = self._block.find("</tool_call>")
            if end < 0 and not final:
                break
            body = self._block if end < 0 else self._block[:end]
            rest = "" if end < 0 else self._block[end + len("</tool_call>") :]
            calls = fmt.parse_block(body)
            if calls is None:
                out.append(fmt.marker + self._block)
                self._block = None
                break
            out += calls
            self._block = None
            self._after_call = True
            if rest:
                out += self.feed(rest)  # a next call, text, or whitespace to hold
        return out

    def finish(self) -> list[str | ParsedCall]:
        """What is still held when the reply ends."""
        out: list[str | ParsedCall] = []
        if self._block is not None:
            out = self._drain(final=True)
        elif self._held:
            held = self._held
            if self.fmt.family == "llama3" and held.lstrip().startswith("{"):
                self._block = held.lstrip()
                out = self._drain(final=True)
            elif held.strip():
                out = [held]
        self._held = ""
        return out


def _marker_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
