"""Chat templates rendered the way Hugging Face transformers renders them.

transformers compiles a template in an ``ImmutableSandboxedEnvironment`` with
``trim_blocks=True`` and ``lstrip_blocks=True``, the ``loopcontrols`` extension and a
``{% generation %}`` tag, replaces the ``tojson`` filter with a plain ``json.dumps`` (no HTML
escaping, ``ensure_ascii=False``), and adds the globals ``raise_exception`` and
``strftime_now``. The template sees ``messages``, ``tools``, ``documents``,
``add_generation_prompt``, the special-token strings (``bos_token``, ``eos_token``, ...) and any
extra keyword arguments. Before rendering, transformers drops the keys of a message whose
value is None and copies a message's reasoning (``reasoning_content``, ``thinking`` or
``reasoning``) to ``reasoning_content`` and ``thinking``; with ``continue_final_message`` it
appends a tag to the final message's text, renders, and cuts the text where the tag lands. This
module does the same, so a template renders here exactly as
``tokenizer.apply_chat_template(..., tokenize=False)`` renders it (as of transformers 5.25; older
releases cut at the final message's stripped text, which differs where a template trims the
message's whitespace).

Invariants:
    - Templates never touch Python objects' internals or mutate their inputs (the sandbox is
      immutable, and the template gets copies of the messages); compiled templates are cached
      by source text.
    - Every failure (no template, a syntax error, ``raise_exception``, a runtime error inside
      the template) surfaces as ``ChatTemplateError`` with the cause chained.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from poot.errors import ChatTemplateError

__all__ = ["render_chat_template", "select_template"]


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body unchanged.

    transformers uses the tag to find assistant tokens for training masks; rendering only needs
    the body.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def select_template(
    templates: Mapping[str, str], chat_template: str | None, tools: Any, source: str
) -> str:
    """Picks the template to render, as transformers does.

    Args:
        templates: the model's templates by name (``"default"``, ``"tool_use"``, ...).
        chat_template: a template name from ``templates``, or a template's source; None picks
            ``"tool_use"`` when tools are given and the model has one, else ``"default"``.
        tools: the tools argument (only its presence matters).
        source: where the templates came from, for error messages.

    Raises:
        ChatTemplateError: the model has no such template.
    """
    if chat_template is not None:
        return templates.get(chat_template, chat_template)
    if tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if not templates:
        raise ChatTemplateError(
            f"{source} has no chat template (no tokenizer.chat_template in GGUF metadata, no "
            "chat_template in tokenizer_config.json or chat_template.jinja); pass "
            "chat_template= to apply_chat_template"
        )
    raise ChatTemplateError(
        f"{source} has several chat templates and none is named 'default' "
        f"({', '.join(sorted(templates))}); pass chat_template= with one of those names"
    )


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    special_tokens: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> str:
    """Renders a chat template.

    Args:
        template: the template's Jinja source.
        messages: the conversation, a list of ``{"role": ..., "content": ...}`` dicts.
        add_generation_prompt: end with the header that starts an assistant reply.
        continue_final_message: cut the text right after the last message's content, so the
            model continues it (cannot be combined with ``add_generation_prompt``).
        tools: tool JSON schemas, passed to the template as ``tools``.
        documents: documents for retrieval templates, passed as ``documents``.
        special_tokens: ``bos_token``, ``eos_token`` and the like, as strings.
        **kwargs: further template variables.

    Returns:
        The rendered prompt.

    Raises:
        ChatTemplateError: the template does not compile or fails to render.
    """
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError(
            "continue_final_message and add_generation_prompt cannot both be set: one continues "
            "the last message, the other starts a new one"
        )
    try:
        compiled = _compile(template)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from e
    except (SyntaxError, RecursionError, ValueError) as e:  # jinja emits Python it cannot compile
        raise ChatTemplateError(
            f"chat template does not compile: {type(e).__name__}: {e}"
        ) from e  # (a `break` outside a loop reaches Python's compiler; found by fuzzing)
    variables = {**(special_tokens or {}), **kwargs}
    chat = _plain_messages(messages)
    if continue_final_message:
        final = _tag_final_message(chat, template)
    try:
        rendered = compiled.render(
            messages=chat,
            tools=None if tools is None else list(tools),
            documents=None if documents is None else list(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {e}") from e
    except Exception as e:  # a template can fail in Python code (a bad + or index, ...)
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e
    if continue_final_message:
        rendered = _cut_at_tag(rendered, final)
    return rendered


# transformers appends this to the final message, renders, and cuts the text where it lands.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The messages as transformers hands them to the template: keys whose value is None
    dropped (OpenAI clients send ``content: null``; templates handle a missing key better),
    and a message's reasoning under all of ``reasoning_content`` and ``thinking`` too."""
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"chat messages must be mappings, got {type(m).__name__}")
        msg = {k: v for k, v in m.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if k in msg), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def _tag_final_message(chat: list[Any], template: str) -> str:
    """Appends the continue tag to the final message's text (in the copy ``chat``); returns
    that text as it was."""
    if not chat:
        raise ChatTemplateError("continue_final_message is set but there are no messages")
    last = chat[-1] if isinstance(chat[-1], dict) else {}
    final = last.get("content")
    if final is None:
        raise ChatTemplateError(
            "continue_final_message is set but the final message has no content to continue"
        )
    if "content" not in template:
        raise ChatTemplateError(
            "continue_final_message is set but the chat template never reads a message's content"
        )
    if isinstance(final, (list, tuple)):
        blocks = [dict(b) if isinstance(b, Mapping) else b for b in final]
        for b in reversed(blocks):
            if isinstance(b, dict) and "text" in b:
                final, b["text"] = b["text"], f"{b['text']}{_CONTINUE_TAG}"
                break
        else:
            raise ChatTemplateError(
                "continue_final_message is set but the final message has no text to continue"
            )
        chat[-1] = {**last, "content": blocks}
    elif isinstance(final, str):
        chat[-1] = {**last, "content": final + _CONTINUE_TAG}
    else:
        raise ChatTemplateError(
            "continue_final_message is set but the final message's content is not text"
        )
    return str(final)


def _cut_at_tag(rendered: str, final: str) -> str:
    """The text up to where the final message ends: up to the tag where the template kept the
    message's spacing, else with the trailing whitespace the template trimmed removed."""
    if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the "
            "rendered chat; this template may not support continuing a message"
        )
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
