"""The families' chat templates render exactly as transformers' ``apply_chat_template`` does.

Templates: Qwen3-0.6B, gemma-2-2b-it and Phi-3.5-mini-instruct as their model repositories
ship them (copies from llama.cpp's ``models/templates``, in ``tests/data/chat_templates``), and
Gemma 3's as the ``axolotl`` 0.19.0 wheel ships it (``axolotl-gemma3.jinja``, Apache-2.0: the
model repository's template but for a system turn given as a list of parts, whose texts it
joins where the original takes the first; no copy of the original is on the test machines).
The reference is ``transformers.PreTrainedTokenizerFast(...).apply_chat_template(...,
tokenize=False)`` (transformers needs no torch for this); poot renders through
``poot.tokenizer.chat.render_chat_template`` with the same special tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from poot.errors import ChatTemplateError
from poot.tokenizer.chat import render_chat_template

transformers = pytest.importorskip("transformers", reason="transformers is the reference")

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
SPECIAL = {
    "Qwen-Qwen3-0.6B": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "google-gemma-2-2b-it": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "microsoft-Phi-3.5-mini-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "axolotl-gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
}
SYSTEM = {"role": "system", "content": "You are terse."}
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a prime.\nJust one."},
]


def _reference(name: str) -> Any:
    from tokenizers import Tokenizer, models

    vocab = {t: i for i, t in enumerate(sorted(set(SPECIAL[name].values())))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=next(iter(vocab))))
    template = (TEMPLATES / f"{name}.jinja").read_text()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=template, **SPECIAL[name]
    )


# Gemma 3's content parts: an image and text (trimmed), and a system turn of parts.
PARTS: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "  What is shown?\n"}],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    {"role": "user", "content": " And its colour? "},
]

CASES = [
    ("Qwen-Qwen3-0.6B", [SYSTEM, *TURNS], {}),
    ("Qwen-Qwen3-0.6B", TURNS, {"enable_thinking": False}),
    ("Qwen-Qwen3-0.6B", TURNS[:1], {}),
    ("google-gemma-2-2b-it", TURNS, {}),
    ("google-gemma-2-2b-it", TURNS[:1], {}),
    ("microsoft-Phi-3.5-mini-instruct", [SYSTEM, *TURNS], {}),
    ("microsoft-Phi-3.5-mini-instruct", TURNS[:2], {}),
    ("axolotl-gemma3", [SYSTEM, *TURNS], {}),
    ("axolotl-gemma3", TURNS, {}),
    ("axolotl-gemma3", TURNS[:1], {}),
    ("axolotl-gemma3", PARTS, {}),
    ("axolotl-gemma3", PARTS[1:], {}),
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(("name", "messages", "kwargs"), CASES)
def test_renders_as_transformers(
    name: str, messages: list[dict[str, Any]], kwargs: dict[str, Any], add_generation_prompt: bool
) -> None:
    want = _reference(name).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    got = render_chat_template(
        (TEMPLATES / f"{name}.jinja").read_text(),
        messages,
        add_generation_prompt=add_generation_prompt,
        special_tokens=SPECIAL[name],
        **kwargs,
    )
    assert got == want


def test_gemma_refuses_a_system_turn_as_transformers_does() -> None:
    name = "google-gemma-2-2b-it"
    with pytest.raises(Exception, match="System role not supported"):
        _reference(name).apply_chat_template([SYSTEM, *TURNS], tokenize=False)
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        render_chat_template(
            (TEMPLATES / f"{name}.jinja").read_text(),
            [SYSTEM, *TURNS],
            special_tokens=SPECIAL[name],
        )


def test_gemma3_refuses_turns_that_do_not_alternate_as_transformers_does() -> None:
    name, messages = "axolotl-gemma3", [TURNS[0], TURNS[0]]
    with pytest.raises(Exception, match="must alternate"):
        _reference(name).apply_chat_template(messages, tokenize=False)
    with pytest.raises(ChatTemplateError, match="must alternate"):
        render_chat_template(
            (TEMPLATES / f"{name}.jinja").read_text(), messages, special_tokens=SPECIAL[name]
        )
