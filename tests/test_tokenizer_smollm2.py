"""The default model's tokenizer (SmolLM2-135M-Instruct Q4_1 GGUF: byte-level BPE, pre "smollm").

The file comes from conftest's ``default_model_path`` (``POOT_TEST_SMOLLM2``, ../shared, or one
download into pytest's cache; see conftest).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from shared_data import SHARED_MODELS as SHARED
from shared_data import require_shared

from poot.tokenizer import Tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def smollm2_path(default_model_path: Path) -> Path:
    return default_model_path


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Tokenizer:
    return load_tokenizer(smollm2_path)


def test_smollm2_properties(smollm2: Tokenizer) -> None:
    assert smollm2.kind == "gguf-bpe:smollm"
    assert smollm2.vocab_size == 49152
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.add_bos) == (1, 2, False)
    assert {0, 2} <= smollm2.eos_ids  # <|endoftext|> and <|im_end|>
    assert smollm2.special_tokens["eos_token"] == "<|im_end|>"
    assert smollm2.special_tokens["bos_token"] == "<|im_start|>"


def test_smollm2_reference_prompt_and_text(smollm2: Tokenizer) -> None:
    ref_path = SHARED / "smollm2" / "reference.json"
    require_shared(ref_path, "llama.cpp reference")
    ref = json.loads(ref_path.read_text())
    for run in ref["runs"]:
        assert smollm2.encode(run["prompt"]) == run["prompt_ids"]
        ids = run["prompt_ids"] + run["gen_ids"]
        assert smollm2.decode(ids) == run["text"]
        stream = smollm2.stream(context=run["prompt_ids"])
        text = "".join(stream.push(i) for i in run["gen_ids"]) + stream.flush()
        assert run["prompt"] + text == run["text"]


def test_smollm2_digits_are_split_one_by_one(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("2024")
    assert [smollm2.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_smollm2_chat_template_renders_and_tokenizes(smollm2: Tokenizer) -> None:
    prompt = smollm2.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    )
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    prompt = smollm2.apply_chat_template([{"role": "user", "content": "Hi!"}])
    assert prompt.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    )
    ids = smollm2.encode(prompt)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>, <|im_end|>
    assert smollm2.decode(ids) == prompt
    assert "<|im_start|>" not in smollm2.decode(ids, skip_special_tokens=True)
    # Without parsing, the markers are plain text.
    assert 1 not in smollm2.encode(prompt, parse_special=False)


def test_smollm2_stream_holds_partial_characters(smollm2: Tokenizer) -> None:
    text = "Llamas 🦙 and 日本語!"
    ids = smollm2.encode(text)
    stream = smollm2.stream()
    parts = [stream.push(i) for i in ids]
    assert "".join(parts) + stream.flush() == text
    assert all("\ufffd" not in p for p in parts)


def test_smollm2_matches_hf_pre_tokenizer(smollm2_path: Path, smollm2: Tokenizer) -> None:
    """Against SmolLM2's own tokenizer.json pipeline: Digits(individual) + ByteLevel(regex)."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers

    from poot import _native

    meta = _native.GgufFile(str(smollm2_path)).metadata()
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    ref = HfTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    rng = random.Random(0)
    alphabet = [*"aAzZ09 '\t\n\r.,!?-_$+<=>^~|`\"()", "ß", "é", "Ω", "ж", "日", "😀", "\u00a0"]
    alphabet += ["\u3000", "٣", "²", "½", "'s", "'LL", " 's", "  "]
    for _ in range(1000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        assert smollm2.encode(text, parse_special=False) == ref.encode(text).ids, text
