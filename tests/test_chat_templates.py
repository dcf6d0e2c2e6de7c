"""The published chat templates of ChatML, Llama 2/3/3.1/3.2, Mistral (v1, v3) and Qwen2/2.5
render as transformers' ``apply_chat_template`` renders them.

poot ships no templates of its own: it reads the model's (GGUF ``tokenizer.chat_template``,
``tokenizer_config.json``, ``chat_template.jinja``) and renders it with
``poot.tokenizer.chat.render_chat_template``, which ``Tokenizer.apply_chat_template``, ``LLM.chat``
and the server all go through. So every family is covered by rendering its real template on
both sides. ``tests/test_chat_families.py`` does Qwen3, Gemma 2 and Phi-3.5 the same way.

The templates are byte-exact copies of what the model repositories publish (the hub is out of
reach in tests, so they live in ``tests/data/chat_templates``); ``SOURCES`` says where each
came from. ChatML is SmolLM2's own template, read from the default model's GGUF metadata with
the ``gguf`` package (not poot) for the reference and through ``poot.tokenizer.load_tokenizer``
for poot.

The reference is ``transformers.PreTrainedTokenizerFast(...).apply_chat_template(...,
tokenize=False)`` over a one-word-per-special-token vocabulary: rendering needs only the
template and the special-token strings, and transformers needs no torch for it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from poot.errors import ChatTemplateError
from poot.tokenizer import load_tokenizer
from poot.tokenizer.chat import render_chat_template

transformers = pytest.importorskip("transformers", reason="transformers is the reference")

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"

# Where each copy comes from: the model repository's file, and the copy it was taken from.
# llama.cpp's models/templates files are written by its scripts/get_chat_template.py straight
# from the hub (these were taken from the llama.cpp tree vendored in llama-cpp-python 0.3.16).
SOURCES = {
    "meta-llama-Llama-2-7b-chat-hf": "meta-llama/Llama-2-7b-chat-hf tokenizer_config.json",
    "meta-llama-Meta-Llama-3-8B-Instruct": (
        "meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json, via llama-cpp-python's "
        "llama_chat_format.LLAMA3_INSTRUCT_CHAT_TEMPLATE"
    ),
    "meta-llama-Llama-3.1-8B-Instruct": (
        "meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json, "
        "via llama.cpp models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
    ),
    "meta-llama-Llama-3.2-3B-Instruct": (
        "meta-llama/Llama-3.2-3B-Instruct tokenizer_config.json, "
        "via llama.cpp models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"
    ),
    "mistralai-Mistral-7B-Instruct-v0.3": (
        "mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json (the 'v3' template it shares "
        "with Mistral-Large-Instruct-2407), via llama.cpp tests/test-chat-template.cpp"
    ),
    "mistralai-Mixtral-8x7B-Instruct-v0.1": (
        "mistralai/Mixtral-8x7B-Instruct-v0.1 tokenizer_config.json (Mistral's 'v1' template), "
        "via llama-cpp-python's llama_chat_format.MIXTRAL_INSTRUCT_CHAT_TEMPLATE"
    ),
    "Qwen-Qwen2-7B-Instruct": "Qwen/Qwen2-7B-Instruct tokenizer_config.json",
    "Qwen-Qwen2.5-7B-Instruct": (
        "Qwen/Qwen2.5-7B-Instruct tokenizer_config.json, "
        "via llama.cpp models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    ),
}
# The special tokens each repository's tokenizer_config.json declares (the ones templates read).
SPECIAL: dict[str, dict[str, str]] = {
    "meta-llama-Llama-2-7b-chat-hf": {"bos_token": "<s>", "eos_token": "</s>"},
    "meta-llama-Meta-Llama-3-8B-Instruct": {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    "meta-llama-Llama-3.1-8B-Instruct": {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    "meta-llama-Llama-3.2-3B-Instruct": {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    "mistralai-Mistral-7B-Instruct-v0.3": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistralai-Mixtral-8x7B-Instruct-v0.1": {"bos_token": "<s>", "eos_token": "</s>"},
    "Qwen-Qwen2-7B-Instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "Qwen-Qwen2.5-7B-Instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
}

SYSTEM = {"role": "system", "content": "You are terse."}
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a prime.\nJust one."},
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
            "required": ["city"],
        },
    },
}
# A call and its result in the shape Hugging Face templates expect (arguments as an object);
# the id is 9 letters or digits because Mistral's template refuses any other.
CALL_ID = "abcDEF123"
TOOL_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "18 C, sunny"},
]
TOOL_DONE: list[dict[str, Any]] = [
    *TOOL_TURNS,
    {"role": "assistant", "content": "18 C and sunny."},
    {"role": "user", "content": "Thanks!"},
]


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _reference(template: str, special: dict[str, str]) -> Any:
    from tokenizers import Tokenizer, models

    vocab = {t: i for i, t in enumerate(sorted(set(special.values())))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=next(iter(vocab))))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=template, **special
    )


def _both(
    template: str, special: dict[str, str], messages: list[dict[str, Any]], **kw: Any
) -> tuple[str, str]:
    """(transformers' rendering, poot's rendering); each gets its own copy of the inputs."""
    want = _reference(template, special).apply_chat_template(
        copy.deepcopy(messages), tokenize=False, **copy.deepcopy(kw)
    )
    got = render_chat_template(template, messages, special_tokens=special, **kw)
    return want, got


# (template, messages, extra keyword arguments). Every case also runs with and without the
# generation prompt. Llama 3.2's template reads today's date through strftime_now; the date is
# pinned so both sides cannot straddle midnight.
PINNED_DATE = {"date_string": "04 Dec 2026"}
NO_SYSTEM = {"mistralai-Mixtral-8x7B-Instruct-v0.1"}  # refuses a system turn (tested below)
CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = []
for _name in SOURCES:
    _kw = PINNED_DATE if "3.2" in _name else {}
    CASES += [(_name, TURNS[:1], _kw), (_name, TURNS, _kw)]
    if _name not in NO_SYSTEM:
        CASES += [(_name, [SYSTEM, *TURNS], _kw), (_name, [SYSTEM, *TURNS[:1]], _kw)]
for _name in (
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "mistralai-Mistral-7B-Instruct-v0.3",
    "Qwen-Qwen2.5-7B-Instruct",
):
    _kw = PINNED_DATE if "3.2" in _name else {}
    CASES += [
        (_name, TURNS, {**_kw, "tools": [WEATHER]}),
        (_name, [SYSTEM, *TOOL_TURNS], {**_kw, "tools": [WEATHER]}),
        (_name, TOOL_DONE, {**_kw, "tools": [WEATHER]}),
    ]
CASES += [
    # Llama 3.1's built-in tools ("Environment: ipython" / "Tools: brave_search") and tools in
    # the system message instead of the first user message.
    ("meta-llama-Llama-3.1-8B-Instruct", TOOL_TURNS, {"builtin_tools": ["brave_search"]}),
    (
        "meta-llama-Llama-3.1-8B-Instruct",
        [SYSTEM, *TOOL_TURNS],
        {"tools": [WEATHER], "tools_in_user_message": False},
    ),
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(
    ("name", "messages", "kwargs"),
    CASES,
    ids=[f"{n}-{len(m)}msgs-{'+'.join(sorted(k)) or 'plain'}" for n, m, k in CASES],
)
def test_renders_as_transformers(
    name: str, messages: list[dict[str, Any]], kwargs: dict[str, Any], add_generation_prompt: bool
) -> None:
    want, got = _both(
        _template(name),
        SPECIAL[name],
        messages,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    assert got == want


@pytest.mark.parametrize(
    ("name", "messages", "message"),
    [
        # Llama 2 and Mistral insist on user/assistant alternation.
        ("meta-llama-Llama-2-7b-chat-hf", [TURNS[1]], "roles must alternate"),
        ("mistralai-Mistral-7B-Instruct-v0.3", TURNS[:1] * 2, "roles must alternate"),
        ("mistralai-Mixtral-8x7B-Instruct-v0.1", [SYSTEM, *TURNS], "roles must alternate"),
        # Mistral's call ids are 9 letters or digits (the server rewrites others; see
        # poot.server.tools), and Llama 3.1 takes one call per message.
        (
            "mistralai-Mistral-7B-Instruct-v0.3",
            [
                TOOL_TURNS[0],
                {
                    **TOOL_TURNS[1],
                    "tool_calls": [{**TOOL_TURNS[1]["tool_calls"][0], "id": "call_1"}],
                },
            ],
            "Tool call IDs should be alphanumeric strings with length 9",
        ),
        (
            "meta-llama-Llama-3.1-8B-Instruct",
            [TOOL_TURNS[0], {**TOOL_TURNS[1], "tool_calls": TOOL_TURNS[1]["tool_calls"] * 2}],
            "only supports single tool-calls",
        ),
    ],
)
def test_refuses_as_transformers_does(
    name: str, messages: list[dict[str, Any]], message: str
) -> None:
    template, special = _template(name), SPECIAL[name]
    with pytest.raises(Exception, match=message):
        _reference(template, special).apply_chat_template(copy.deepcopy(messages), tokenize=False)
    with pytest.raises(ChatTemplateError, match=message):
        render_chat_template(template, messages, special_tokens=special)


def _gguf_chatml(path: Path) -> tuple[str, dict[str, str]]:
    """SmolLM2's template and special-token strings, read with the ``gguf`` package."""
    gguf = pytest.importorskip("gguf", reason="the gguf package reads the reference metadata")
    reader = gguf.GGUFReader(str(path))

    def value(key: str) -> Any:
        return reader.fields[key].contents()

    tokens = value("tokenizer.ggml.tokens")
    special = {
        "bos_token": tokens[value("tokenizer.ggml.bos_token_id")],
        "eos_token": tokens[value("tokenizer.ggml.eos_token_id")],
    }
    return value("tokenizer.chat_template"), special


@pytest.fixture(scope="module")
def smollm2(default_model_path: Path) -> tuple[str, dict[str, str], Any]:
    template, special = _gguf_chatml(default_model_path)
    return template, special, load_tokenizer(default_model_path)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(
    "messages",
    [TURNS[:1], TURNS, [SYSTEM, *TURNS], [SYSTEM, *TURNS[:1]]],
    ids=["one-turn", "multi-turn", "system-multi-turn", "system-one-turn"],
)
def test_default_model_chatml_renders_as_transformers(
    smollm2: tuple[str, dict[str, str], Any],
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> None:
    template, special, tok = smollm2
    assert "<|im_start|>" in template  # ChatML
    assert tok.chat_template == template
    want = _reference(template, special).apply_chat_template(
        copy.deepcopy(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want


# The server's path: an OpenAI-shaped request (arguments as a JSON string, no content on a
# calling turn) becomes the template's messages in ``poot.server.tools.render_messages``; the
# prompt must equal what transformers renders for the same conversation written the Hugging Face
# way (TOOL_DONE).
OPENAI_TOOL_DONE: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "18 C, sunny"},
    {"role": "assistant", "content": "18 C and sunny."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.mark.parametrize(
    "name",
    [
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
        "mistralai-Mistral-7B-Instruct-v0.3",
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen-Qwen3-0.6B",
    ],
)
def test_server_request_renders_as_transformers(name: str) -> None:
    from poot.server.protocol import ChatCompletionRequest
    from poot.server.tools import plan_tools, render_messages

    template = _template(name)
    special = SPECIAL.get(name, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    kw = PINNED_DATE if "3.2" in name else {}
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": OPENAI_TOOL_DONE, "tools": [WEATHER]}
    )
    plan = plan_tools(req, template)
    assert plan is not None and plan.template_knows_tools
    messages, variables = render_messages(req.messages, plan, template)
    # The Hugging Face way: arguments as an object, and the calling turn's content null
    # (transformers drops the key). Qwen3's template fails on a turn without content
    # (UndefinedError in transformers too); the server writes null content as "", which
    # renders, so its reference is the conversation with "".
    hf = copy.deepcopy(TOOL_DONE)
    if name != "Qwen-Qwen3-0.6B":
        hf[1]["content"] = None
    want = _reference(template, special).apply_chat_template(
        hf, tools=[WEATHER], tokenize=False, add_generation_prompt=True, **kw
    )
    got = render_chat_template(
        template, messages, special_tokens=special, add_generation_prompt=True, **variables, **kw
    )
    assert got == want


def _reference_cuts_at_a_tag() -> bool:
    """Whether this transformers cuts a continued message at a tag (as poot does) rather than
    at the message's stripped text (older releases; they differ only where a template trims
    the message's whitespace)."""
    import inspect

    try:
        from transformers.utils import chat_template_utils
    except ImportError:
        return False
    return "CONTINUE_FINAL_MESSAGE_TAG" in inspect.getsource(chat_template_utils)


@pytest.mark.parametrize("name", list(SOURCES))
@pytest.mark.parametrize("prefix", ["The prime is", "The prime is ", "  Seven\n"])
def test_continue_final_message_as_transformers(name: str, prefix: str) -> None:
    if prefix != prefix.strip() and not _reference_cuts_at_a_tag():
        pytest.skip("this transformers cuts a continued message the old way (before the tag)")
    # A prefilled reply: the text ends right after the assistant's words (trailing whitespace
    # kept only where the template kept it), as transformers cuts it.
    kw = PINNED_DATE if "3.2" in name else {}
    messages = [*TURNS, {"role": "assistant", "content": prefix}]
    want, got = _both(
        _template(name),
        SPECIAL[name],
        messages,
        add_generation_prompt=False,
        continue_final_message=True,
        **kw,
    )
    assert got == want


def test_continue_final_message_with_content_blocks() -> None:
    # The last text block is the one continued.
    name = "Qwen-Qwen2.5-7B-Instruct"
    template = (
        "{% for m in messages %}<{{ m.role }}>{% for b in m.content %}"
        "{{ b.text if b.type == 'text' else '[image]' }}{% endfor %}{% endfor %}"
    )
    final = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "See "},
            {"type": "image"},
            {"type": "text", "text": "it is"},
        ],
    }
    want, got = _both(
        template,
        SPECIAL[name],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, final],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert got == want
    assert final["content"][2] == {"type": "text", "text": "it is"}  # the input is untouched


def test_none_valued_keys_and_reasoning_as_transformers() -> None:
    # OpenAI clients send content: null and tool_calls: null; transformers drops such keys
    # before rendering, and shows reasoning given under any of its names to Qwen3's template
    # (which reads reasoning_content).
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "2+2?", "name": None},
        {"role": "assistant", "content": "4", "reasoning": "Add them.", "tool_calls": None},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6", "thinking": "Add again."},
    ]
    want, got = _both(template, special, messages, add_generation_prompt=False)
    assert got == want
    defined = "{% for m in messages %}{{ m.role }}:{{ 'content' in m }},{% endfor %}"
    want, got = _both(defined, special, [{"role": "assistant", "content": None}])
    assert got == want == "assistant:False,"


def test_non_mapping_message_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="must be mappings"):
        render_chat_template(_template("Qwen-Qwen2-7B-Instruct"), ["hi"])  # type: ignore[list-item]


# Reading: the templates a Hugging Face directory stores (tokenizer_config.json as a string or a
# list of named templates, chat_template.json, chat_template.jinja, additional_chat_templates/)
# reach the prompt as transformers' AutoTokenizer picks and renders them, special tokens
# included (stories260K's real tokenizer.json and tokenizer_config.json: <s>, </s>, <unk>).
def _hf_dir(root: Path, stories: Path, layout: str) -> Path:
    import json
    import shutil

    d = root / layout
    d.mkdir()
    shutil.copy(stories / "hf" / "tokenizer.json", d)
    config = json.loads((stories / "hf" / "tokenizer_config.json").read_text(encoding="utf-8"))
    llama2, llama31 = (
        _template("meta-llama-Llama-2-7b-chat-hf"),
        _template("meta-llama-Llama-3.1-8B-Instruct"),
    )
    qwen = _template("Qwen-Qwen2.5-7B-Instruct")
    if layout == "config-string":
        config["chat_template"] = llama2
    elif layout == "config-list":
        config["chat_template"] = [
            {"name": "default", "template": llama2},
            {"name": "tool_use", "template": qwen},
        ]
    elif layout == "jinja-over-config":
        config["chat_template"] = llama2
        (d / "chat_template.jinja").write_text(llama31, encoding="utf-8")
    elif layout == "json-file":
        (d / "chat_template.json").write_text(json.dumps({"chat_template": llama31}))
    elif layout == "additional":
        (d / "chat_template.jinja").write_text(llama2, encoding="utf-8")
        (d / "additional_chat_templates").mkdir()
        (d / "additional_chat_templates" / "tool_use.jinja").write_text(qwen, encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    "layout", ["config-string", "config-list", "jinja-over-config", "json-file", "additional"]
)
def test_templates_read_from_a_directory_render_as_transformers(
    tmp_path: Path, stories: Path, layout: str
) -> None:
    d = _hf_dir(tmp_path, stories, layout)
    ref = transformers.AutoTokenizer.from_pretrained(str(d))
    tok = load_tokenizer(d)
    # poot's add_generation_prompt defaults to true (documented; transformers' to false), so
    # every call passes it.
    calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        ([SYSTEM, *TURNS], {"add_generation_prompt": True}),
        (TURNS, {"add_generation_prompt": False}),
    ]
    if layout in ("config-list", "additional"):
        calls += [
            ([SYSTEM, *TOOL_DONE], {"tools": [WEATHER], "add_generation_prompt": True}),
            (TURNS, {"chat_template": "tool_use", "add_generation_prompt": True}),
        ]
    extra: dict[str, Any] = {}
    if layout == "json-file":
        # chat_template.json is a processor's file: transformers' AutoProcessor reads it and
        # AutoTokenizer does not, while poot, loading a model directory, reads it as the
        # model's template. The reference renders that template by passing it in.
        assert ref.chat_template is None
        extra = {"chat_template": _template("meta-llama-Llama-3.1-8B-Instruct")}
    for messages, kw in calls:
        want = ref.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kw, **extra)
        assert tok.apply_chat_template(messages, **kw) == want, (messages, kw)
