"""Function calling on ``/v1/chat/completions``: the request's ``tools``, ``tool_choice`` and
``parallel_tool_calls`` checked, rendered into the prompt, and turned into a constraint.

``plan_tools`` validates the fields (a 400 naming the field, e.g. ``tools[1].function.name``)
and picks the model's tool format from its chat template (``tool_parsers.format_for_template``).
``render_messages`` builds the template's messages: assistant ``tool_calls`` and ``tool``
messages are passed in the shape Hugging Face templates expect (arguments as objects); a
template that does not know tools (``tools`` is not one of its variables, as in SmolLM2's) gets
the functions and past calls written into the conversation in the Hermes form instead, so the
model sees them either way.

The constraint: ``required`` or a named function makes the reply calls whose arguments match
the function's schema (an llguidance grammar, so the arguments always parse and validate);
``auto`` leaves text free and constrains a call from its marker on. ``none`` (or no tools)
renders no tools and parses nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from poot.server.errors import APIError
from poot.server.protocol import ChatCompletionRequest, ChatMessage
from poot.server.tool_parsers import ToolFormat, format_for_template
from poot.tokenizer import Tokenizer

__all__ = ["ToolPlan", "plan_tools", "render_messages"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128

Choice = Literal["auto", "required"] | str


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses tools.

    Attributes:
        fmt: the model's tool-call format.
        tools: the request's tools as given (``{"type": "function", "function": {...}}``).
        functions: their function objects (``name``, ``description``, ``parameters``).
        choice: ``"auto"``, ``"required"`` or the forced function's name.
        parallel: more than one call is allowed.
        template_knows_tools: the chat template renders ``tools`` itself.
    """

    fmt: ToolFormat
    tools: list[dict[str, Any]]
    functions: list[dict[str, Any]]
    choice: Choice
    parallel: bool
    template_knows_tools: bool

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def grammar(self, tokenizer: Tokenizer) -> str:
        """The llguidance Lark grammar of the reply (see the module docs)."""
        functions = self.functions
        if self.choice not in ("auto", "required"):
            functions = [f for f in functions if f["name"] == self.choice]
        return self.fmt.grammar(
            functions,
            forced=self.forced,
            parallel=self.parallel,
            marker_token=_special_id(tokenizer, self.fmt.marker),
        )


def _special_id(tokenizer: Tokenizer, text: str) -> int | None:
    tid = tokenizer.token_to_id(text)
    return tid if tid is not None and tokenizer.is_special(tid) else None


def _check_function(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise _bad(where, f"{where} must be an object")
    extra = set(tool) - {"type", "function"}
    if extra:
        raise _bad(
            f"{where}.{sorted(extra)[0]}", f"{where} has an unknown field {sorted(extra)[0]!r}"
        )
    if tool.get("type") != "function":
        raise _bad(f"{where}.type", f"{where}.type must be 'function', got {tool.get('type')!r}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise _bad(f"{where}.function", f"{where}.function must be an object")
    extra = set(fn) - {"name", "description", "parameters", "strict"}
    if extra:
        field = f"{where}.function.{sorted(extra)[0]}"
        raise _bad(field, f"{field} is not a field of a function")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(
            f"{where}.function.name",
            f"{where}.function.name must be 1-64 characters of a-z A-Z 0-9 _ -, got {name!r}",
        )
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise _bad(f"{where}.function.description", "description must be a string")
    params = fn.get("parameters")
    if params is not None and (
        not isinstance(params, dict) or params.get("type", "object") != "object"
    ):
        raise _bad(
            f"{where}.function.parameters",
            f"{where}.function.parameters must be a JSON schema of an object",
        )
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"{where}.function.strict", "strict must be a boolean")
    out: dict[str, Any] = {
        "name": name,
        "parameters": params or {"type": "object", "properties": {}},
    }
    if desc is not None:
        out["description"] = desc
    return out


def _choice(raw: Any, names: list[str]) -> Choice:
    if raw is None or raw in ("auto", "required"):
        return raw or "auto"
    if isinstance(raw, str):
        raise _bad(
            "tool_choice", f"tool_choice must be none, auto, required or a function, got {raw!r}"
        )
    fn = raw.get("function") if raw.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if set(raw) != {"type", "function"} or not isinstance(name, str):
        raise _bad(
            "tool_choice",
            'tool_choice must be {"type": "function", "function": {"name": NAME}}',
        )
    if name not in names:
        raise _bad("tool_choice", f"tool_choice names {name!r}, which is not in tools")
    return name


def plan_tools(req: ChatCompletionRequest, template: str | None) -> ToolPlan | None:
    """The request's tool use, or None when it uses no tools.

    Raises:
        APIError: 400 naming the bad field.
    """
    if req.tool_choice == "none" or (req.tools is None and req.tool_choice is None):
        if req.tools is not None:
            for i, t in enumerate(req.tools):
                _check_function(i, t)
        return None
    if not req.tools:
        raise _bad("tool_choice", "tool_choice needs tools")
    if len(req.tools) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools, got {len(req.tools)}")
    functions = [_check_function(i, t) for i, t in enumerate(req.tools)]
    names = [f["name"] for f in functions]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise _bad(f"tools[{i}].function.name", f"two tools are named {n!r}")
    choice = _choice(req.tool_choice, names)
    if req.response_format is not None and req.response_format.type != "text":
        raise _bad("response_format", "response_format cannot be combined with tools")
    knows = bool(template) and "tools" in (template or "")
    return ToolPlan(
        format_for_template(template),
        list(req.tools),
        functions,
        choice,
        req.parallel_tool_calls is not False,
        knows,
    )


_HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools> {tools} </tools>\nFor each function call return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def _arguments(i: int, j: int, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        field = f"messages[{i}].tool_calls[{j}].function.arguments"
        raise _bad(field, f"{field} is not JSON") from None


def _mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates require it: 9 letters or digits (they raise
    otherwise); the same id always maps to the same one."""
    return re.sub(r"[^A-Za-z0-9]", "", call_id)[-9:].rjust(9, "0")


def render_messages(
    messages: list[ChatMessage], plan: ToolPlan | None, template: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The template's messages and extra variables (``tools``) for a request.

    Args:
        messages: the request's messages.
        plan: its tool use (None: no tools rendered).
        template: the chat template (its family decides how call ids are written).

    Raises:
        APIError: an assistant tool call's arguments are not JSON.
    """
    knows = plan is not None and plan.template_knows_tools
    fix_id = _mistral_id if format_for_template(template).family == "mistral" else str
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": m.text()}
        if m.tool_calls:
            calls: list[dict[str, Any]] = [
                {
                    "id": fix_id(c.id),
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments(i, j, c.function.arguments),
                    },
                }
                for j, c in enumerate(m.tool_calls)
            ]
            if knows:
                msg["tool_calls"] = calls
            else:
                blocks = [
                    "<tool_call>\n"
                    + json.dumps(
                        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    )
                    + "\n</tool_call>"
                    for c in calls
                ]
                msg["content"] = "\n".join(([msg["content"]] if msg["content"] else []) + blocks)
        if role == "tool":
            if m.tool_call_id is not None:
                msg["tool_call_id"] = fix_id(m.tool_call_id)
            if m.name is not None:
                msg["name"] = m.name
            if not knows:
                msg["content"] = f"<tool_response>\n{msg['content']}\n</tool_response>"
        out.append(msg)
    if plan is None:
        return out, {}
    if knows:
        return out, {"tools": plan.tools}
    listing = "\n".join(json.dumps({"type": "function", "function": f}) for f in plan.functions)
    system = _HERMES_SYSTEM.format(tools=listing)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out, {}
