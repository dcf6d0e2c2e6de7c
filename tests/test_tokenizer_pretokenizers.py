"""The llama.cpp pre-tokenizer table: names, regex transcription and behaviour.

Vocabularies for most pre-tokenizers are not in ../shared/models, so these tests check the
regexes themselves: that each compiles in the engine ``tokenizers`` uses, that llama.cpp's
rewrites of ``(?i:...)`` split exactly as the tokenizer.json originals they replace, and that
the full GPT-2 pipeline matches Hugging Face's own ByteLevel pre-tokenizer on the GPT-2 vocab.
"""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import pytest
from shared_data import require_shared
from tokenizers import Regex, pre_tokenizers

import poot.tokenizer.pretokenizers as pt
from poot.tokenizer import load_tokenizer, supported_pre_tokenizers

REQUIRED = [
    "default",
    "gpt-2",
    "smollm",
    "llama-bpe",
    "qwen2",
    "deepseek-llm",
    "deepseek-coder",
    "starcoder",
    "phi-2",
]

# The tokenizer.json regexes llama.cpp quotes as the originals of its case-spelled rewrites.
_HF_LLAMA3 = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_HF_QWEN2 = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)


def _corpus(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    # No U+017F or U+212A: case-insensitive matching folds them to s/k, llama.cpp's rewrite not.
    alphabet = [*"aAsStTdDmMlLvVrReE09 '\t\n\r.,!?-_$+<=>^~|`\"()", "ß", "é", "Ω", "ж"]
    alphabet += ["日", "本", "😀", "\u00a0", "\u3000", "٣", "²", "½", "\u0301", "'S", "'Ll", "'VE"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30))) for _ in range(n)]


def _splitter(regexes: tuple[str, ...] | list[str]) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    )


def test_required_pre_tokenizers_are_supported() -> None:
    names = supported_pre_tokenizers()
    for name in REQUIRED:
        assert name in names
    assert pt.get_pre_tokenizer(None) is pt.PRE_TOKENIZERS["default"]
    assert pt.get_pre_tokenizer("tekken") is None  # llama.cpp approximates it; not claimed


@pytest.mark.parametrize("name", supported_pre_tokenizers())
def test_every_regex_compiles_and_splits_losslessly(name: str) -> None:
    splitter = _splitter(pt.PRE_TOKENIZERS[name].regexes)
    for text in _corpus(1, 50):
        pieces = [p for p, _ in splitter.pre_tokenize_str(text)]
        assert "".join(pieces) == text


def test_flags_follow_llama_cpp() -> None:
    table = pt.PRE_TOKENIZERS
    assert table["llama-bpe"].ignore_merges and table["llama-bpe"].add_bos
    assert not table["smollm"].clean_spaces and table["starcoder"].clean_spaces
    assert not table["qwen2"].clean_spaces and table["gpt-2"].clean_spaces
    assert table["phi-2"].regexes == table["gpt-2"].regexes
    assert table["smollm"].regexes == table["starcoder"].regexes == ("\\p{N}", pt._GPT2)
    assert not table["deepseek-llm"].clean_spaces and not table["deepseek-coder"].clean_spaces


@pytest.mark.parametrize(
    ("name", "original"), [("llama-bpe", _HF_LLAMA3), ("qwen2", _HF_QWEN2), ("grok-2", _HF_QWEN2)]
)
def test_case_spelled_rewrites_split_like_the_originals(name: str, original: str) -> None:
    ours = _splitter(pt.PRE_TOKENIZERS[name].regexes)
    theirs = _splitter([original])
    for text in _corpus(2, 2000):
        assert ours.pre_tokenize_str(text) == theirs.pre_tokenize_str(text), text


def test_llama3_split_examples() -> None:
    split = _splitter(pt.PRE_TOKENIZERS["llama-bpe"].regexes)
    pieces = [p for p, _ in split.pre_tokenize_str("I'LL pay 12345 dollars!!\n\n  ok")]
    assert pieces == ["I", "'LL", " pay", " ", "123", "45", " dollars", "!!\n\n", " ", " ok"]


def test_deepseek_llm_letter_class_holds_only_cased_letters() -> None:
    """The class as DeepSeek's tokenizer.json has it: increasing ranges of Lu/Ll/Lt letters.

    An NFC-normalized copy would reverse three ranges (and fail to compile) and widen
    ``\u212a-\u212d`` to ``K-\u212d``, matching digits' neighbours and much more.
    """
    body = pt._DEEPSEEK_LLM_LETTERS
    body = body[body.index("[") + 1 : body.rindex("]")]
    i, count = 0, 0
    while i < len(body):
        lo = hi = body[i]
        if i + 2 < len(body) and body[i + 1] == "-":
            hi = body[i + 2]
            i += 3
        else:
            i += 1
        assert ord(lo) <= ord(hi), (hex(ord(lo)), hex(ord(hi)))
        for cp in range(ord(lo), ord(hi) + 1):
            assert unicodedata.category(chr(cp)) in {"Lu", "Ll", "Lt"}, hex(cp)
            count += 1
    assert count == 2729


def test_source_is_ascii_so_no_tool_can_normalize_it() -> None:
    Path(pt.__file__).read_bytes().decode("ascii")


def test_deepseek_pre_tokenizers_split_examples() -> None:
    llm = _splitter(pt.PRE_TOKENIZERS["deepseek-llm"].regexes)
    assert [p for p, _ in llm.pre_tokenize_str("Hello, 世界 123\nÉcole")] == [
        "Hello",
        ",",
        " ",
        "世界",
        " ",
        "123",
        "\n",
        "É",  # DeepSeek's punctuation class ":-~" also covers ASCII letters
        "cole",
    ]
    coder = _splitter(pt.PRE_TOKENIZERS["deepseek-coder"].regexes)
    # "=" is a math symbol, not punctuation: it stays in the gap before " f".
    assert [p for p, _ in coder.pre_tokenize_str("x = f(42);")] == [
        "x",
        " =",
        " f",
        "(",
        "4",
        "2",
        ");",
    ]


def test_gpt2_pipeline_matches_hf_byte_level(shared_models: Path) -> None:
    """The whole GGUF gpt-2 tokenizer against HF's ByteLevel(use_regex=True) on the same BPE."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models

    from poot import _native

    path = shared_models / "vocab" / "ggml-vocab-gpt-2.gguf"
    require_shared(path, "llama.cpp vocab file")
    meta = _native.GgufFile(str(path)).metadata()
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    ref = HfTokenizer(
        models.BPE({t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}, merges)
    )
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok = load_tokenizer(path)
    for text in _corpus(3, 2000):
        assert tok.encode(text, parse_special=False) == ref.encode(text).ids, text
