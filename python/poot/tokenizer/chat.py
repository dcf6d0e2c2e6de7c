"""Chat templates rendered the way Hugging Face transformers renders them.

transformers compiles a template in an ``ImmutableSandboxedEnvironment`` with
``trim_blocks=True`` and ``lstrip_blocks=True``, the ``loopcontrols`` extension and a
``{% generation %}`` tag, replaces the ``tojson`` filter with a plain ``json.dumps`` (no HTML
escaping, ``ensure_ascii=False``), and adds the globals ``raise_exception`` and
``strftime_now``. The template sees ``messages``, ``tools``, ``documents``,
``add_generation_prompt``, the special-token strings (``bos_token``, ``eos_token``, ...) and any
extra keyword arguments. This module does the same, so a template renders here exactly as
``tokenizer.apply_chat_template(..., tokenize=False)`` renders it.

Invariants:
    - Templates never touch Python objects' internals or mutate their inputs (the sandbox is
      immutable); compiled templates are cached by source text.
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
    try:
        rendered = compiled.render(
            messages=list(messages),
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
        rendered = _cut_after_final_message(rendered, messages)
    return rendered


def _cut_after_final_message(rendered: str, messages: Sequence[Mapping[str, Any]]) -> str:
    if not messages:
        raise ChatTemplateError("continue_final_message is set but there are no messages")
    final = messages[-1].get("content")
    if isinstance(final, (list, tuple)):
        texts = [b["text"] for b in final if isinstance(b, Mapping) and "text" in b]
        if not texts:
            raise ChatTemplateError(
                "continue_final_message is set but the final message has no text to continue"
            )
        final = texts[-1]
    if not isinstance(final, str) or final.strip() not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the "
            "rendered chat; this template may not support continuing a message"
        )
    at = rendered.rindex(final.strip())
    if rendered[at : at + len(final.lstrip())] == final:
        return rendered[: at + len(final.lstrip())]
    return rendered[: at + len(final.strip())]
