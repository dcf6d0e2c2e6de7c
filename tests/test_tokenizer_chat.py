"""Chat templates render as transformers' ``apply_chat_template(..., tokenize=False)`` does.

transformers is not installed here, so expected strings are written by hand from transformers'
rendering rules (sandboxed Jinja, trim_blocks, lstrip_blocks, its own tojson, raise_exception,
strftime_now, the {% generation %} tag, loop controls).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from poot.errors import ChatTemplateError, TokenizerError
from poot.tokenizer import Tokenizer, load_tokenizer, tokenizer_from_gguf_metadata

# SmolLM2-135M-Instruct's template, exactly as stored in its GGUF (tokenizer.chat_template).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2_DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


def _tok(**templates: str) -> Tokenizer:
    tokens = ["<unk>", "<s>", "</s>", "a"]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [2, 3, 3, 1],
    }
    for name, source in templates.items():
        key = "tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"
        meta[key] = source
    return tokenizer_from_gguf_metadata(meta, source="toy")


def _render(template: str, messages: list[dict[str, Any]] | None = None, **kwargs: Any) -> str:
    return _tok(default=template).apply_chat_template(
        messages if messages is not None else [{"role": "user", "content": "hi"}], **kwargs
    )


def test_smollm2_template_single_user_turn() -> None:
    tok = _tok(default=SMOLLM2_TEMPLATE)
    got = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert got == (
        SMOLLM2_DEFAULT_SYSTEM + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_template_with_system_and_history() -> None:
    tok = _tok(default=SMOLLM2_TEMPLATE)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    )
    assert tok.apply_chat_template(messages).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_trim_blocks_and_lstrip_blocks() -> None:
    template = "{% for m in messages %}\n  {{ m['content'] }}\n  {% endfor %}\n"
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    # trim_blocks eats the newline after each block tag; lstrip_blocks the indent before one.
    assert _render(template, messages) == "  a\n  b\n"


def test_tojson_is_transformers_not_jinja() -> None:
    messages = [{"role": "user", "content": "<b>\"é\" & 'x'</b>"}]
    assert _render("{{ messages[0]['content'] | tojson }}", messages) == json.dumps(
        "<b>\"é\" & 'x'</b>", ensure_ascii=False
    )
    out = _render("{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=true) }}")
    assert out == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'
    assert _render("{{ 'é' | tojson(ensure_ascii=true) }}") == '"\\u00e9"'


def test_raise_exception_is_a_chat_template_error() -> None:
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('need a system') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="need a system"):
        _render(template)


def test_strftime_now_and_template_kwargs() -> None:
    year = datetime.now().strftime("%Y")
    assert _render("{{ strftime_now('%Y') }}") in {year, str(int(year) + 1)}
    assert _render(
        "{{ date_string }}|{{ enable_thinking }}", date_string="x", enable_thinking=0
    ) == ("x|0")


def test_generation_tag_and_loop_controls() -> None:
    template = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m['role'] == 'assistant' %}{% generation %}[{{ m['content'] }}]{% endgeneration %}"
        "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "never"},
    ]
    assert _render(template, messages) == "q[a]"


def test_special_token_variables_from_gguf(shared_models: Path) -> None:
    tok = load_tokenizer(shared_models / "stories260K" / "stories260K-f32.gguf")
    template = "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}|{{ unk_token }}"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=template) == (
        "<s>hi</s>|<unk>"
    )


def test_special_token_variables_from_hf_dir(shared_models: Path, tmp_path: Path) -> None:
    src = shared_models / "stories260K" / "hf"
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ bos_token }}[{{ messages[0]['content'] }}]{{ eos_token }}"
    config["eos_token"] = {"content": "</s>", "lstrip": False}  # AddedToken form
    (tmp_path / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tmp_path)
    assert tok.eos_id == 2
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>[x]</s>"
    # chat_template.jinja, as newer checkpoints ship it, wins over tokenizer_config.json.
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"


def test_named_templates_and_tool_use_selection() -> None:
    tok = _tok(default="D", tool_use="T{{ tools | length }}")
    messages = [{"role": "user", "content": "x"}]
    assert tok.apply_chat_template(messages) == "D"
    assert tok.apply_chat_template(messages, tools=[{"type": "function"}]) == "T1"
    assert tok.apply_chat_template(messages, chat_template="tool_use", tools=[]) == "T0"
    assert tok.apply_chat_template(messages, chat_template="inline {{ 1 + 1 }}") == "inline 2"


def test_hf_template_list_form(shared_models: Path, tmp_path: Path) -> None:
    src = shared_models / "stories260K" / "hf"
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "plain"},
        {"name": "tool_use", "template": "tools"},
    ]
    (tmp_path / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tmp_path)
    assert tok.chat_templates == {"default": "plain", "tool_use": "tools"}
    assert tok.apply_chat_template([], tools=[{"type": "function"}]) == "tools"


def test_continue_final_message() -> None:
    tok = _tok(default=SMOLLM2_TEMPLATE)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "The color is"},
    ]
    got = tok.apply_chat_template(messages, continue_final_message=True)
    assert got == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
        "<|im_start|>assistant\nThe color is"
    )
    with pytest.raises(ChatTemplateError, match="cannot both be set"):
        tok.apply_chat_template(messages, add_generation_prompt=True, continue_final_message=True)


def test_missing_template_is_an_error(shared_models: Path) -> None:
    tok = load_tokenizer(shared_models / "stories260K" / "stories260K-f32.gguf")
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match="has no chat template") as err:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert isinstance(err.value, TokenizerError)  # and a ValueError
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}{{ m }", "does not compile"),
        ("{{ messages[0]['content'] + 1 }}", "failed to render"),
        ("{{ messages.append(1) }}", "failed to render"),  # the sandbox is immutable
        ("{{ ''.__class__.__mro__ }}", "failed to render"),
    ],
)
def test_template_failures_are_chat_template_errors(template: str, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        _render(template)


def test_messages_are_not_modified() -> None:
    messages = [{"role": "user", "content": "hi"}]
    _render("{% set x = messages[0] %}{{ x['content'] }}", messages)
    assert messages == [{"role": "user", "content": "hi"}]
