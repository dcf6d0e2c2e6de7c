"""The pre-tokenizers llama.cpp applies to byte-level BPE vocabularies, by GGUF name.

A GGUF file names its pre-tokenizer in ``tokenizer.ggml.pre``. llama.cpp maps that name to a
list of regular expressions (``llm_tokenizer_bpe`` in src/llama-vocab.cpp) and to a few flags
(``ignore_merges``, ``clean_spaces``, a default for ``add_bos``). The regexes are applied in
order; each one splits every piece produced so far into its matches and the unmatched gaps
between them ("isolated" splitting), which is exactly ``tokenizers.pre_tokenizers.Split(...,
behavior="isolated")`` applied in sequence.

Invariants:
    - Every regex here is llama.cpp's, character for character, with non-ASCII characters written
      as escapes so no editor or index can normalize them. (Copies of llama.cpp's DeepSeek-LLM
      class seen in search indexes are NFC-normalized, which reverses three ranges and turns
      U+212A KELVIN SIGN into ``K``; the escapes below keep the original code points, which are
      those of DeepSeek's own tokenizer.json.)
    - Only pre-tokenizers whose llama.cpp regexes mean the same in Oniguruma (the engine behind
      ``tokenizers``) as in llama.cpp are listed; names llama.cpp rewrites into approximations of
      ``\\p{Lu}``-style classes (tekken, gpt-4o, llama4, ...) are deliberately absent, so loading
      such a file fails loudly instead of tokenizing slightly differently.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PreTokenizer", "PRE_TOKENIZERS", "get_pre_tokenizer", "supported_pre_tokenizers"]

# The regexes, in llama.cpp's spelling. Python string escapes mirror the C++ literals: "\\p{N}"
# is the regex \p{N}; "[\r\n]" holds a real CR and LF, as the C++ literal does.
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS_CI = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS_CI
    + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+"
)
_QWEN2 = (
    _CONTRACTIONS_CI
    + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+"
)
_QWEN35 = (
    _CONTRACTIONS_CI
    + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_SEED_CODER = (
    _CONTRACTIONS_CI
    + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+"
)
_BAILINGMOE = (
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
)
# CJK Unified Ideographs U+4E00..U+9FA5, U+0800..U+4E00, Hangul U+AC00..U+D7FF.
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
# ASCII and full-width punctuation, curly quotes U+2018..U+201F, U+3000..U+3002.
_DEEPSEEK_LLM_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_DEEPSEEK_V3 = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)
# " ?[^(\s|.,!?...)]+" where "..." is U+2026, U+3002, U+FF0C, U+3001, U+0964, U+06D4, U+060C.
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp pre-tokenizes one family of byte-level BPE vocabularies.

    Attributes:
        name: llama.cpp's canonical name for the family (one of the GGUF names mapping to it).
        regexes: the split regexes, applied in order with isolated splitting.
        ignore_merges: a pre-token that is itself a vocabulary entry is emitted whole.
        clean_spaces: detokenization removes spaces before ``?!.,`` and some contractions.
        add_bos: the default for ``tokenizer.ggml.add_bos_token`` when the file omits it.
        default_bos: whether BOS defaults to id 11 (llama.cpp's BPE default) when the file has
            no ``tokenizer.ggml.bos_token_id``; false means no BOS.
    """

    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    clean_spaces: bool = True
    add_bos: bool = False
    default_bos: bool = True


def _family(
    names: tuple[str, ...], regexes: tuple[str, ...], **flags: bool
) -> dict[str, PreTokenizer]:
    return {n: PreTokenizer(names[0], regexes, **flags) for n in names}


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_family(
        ("default",),
        ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    ),
    **_family(
        ("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        (_LLAMA3,),
        ignore_merges=True,
        add_bos=True,
    ),
    **_family(("dbrx",), (_LLAMA3,)),
    **_family(("smaug-bpe",), (_LLAMA3,)),
    **_family(
        ("deepseek-llm",),
        ("[\r\n]", _DEEPSEEK_LLM_LETTERS, _DEEPSEEK_LLM_PUNCT, "\\s+$", _CJK, "\\p{N}+"),
        clean_spaces=False,
    ),
    **_family(
        ("deepseek-coder",),
        ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"),
        clean_spaces=False,
    ),
    **_family(
        ("deepseek-v3",),
        ("\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _DEEPSEEK_V3),
        clean_spaces=False,
    ),
    **_family(
        ("falcon",),
        ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    ),
    **_family(
        ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"),
        ("\\p{N}", _GPT2),
    ),
    **_family(("smollm", "command-r"), ("\\p{N}", _GPT2), clean_spaces=False),
    **_family(
        (
            "gpt-2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "exaone4",
        ),
        (_GPT2,),
    ),
    **_family(("trillion", "granite-docling"), (_GPT2,), clean_spaces=False),
    **_family(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), (_QWEN2,), clean_spaces=False),
    **_family(("stablelm2", "megrez"), (_QWEN2,)),
    **_family(("hunyuan", "solar-open"), (_QWEN2,), clean_spaces=False),
    **_family(("qwen35",), (_QWEN35,), clean_spaces=False),
    **_family(("poro-chat",), (_BLOOM,), clean_spaces=False),
    **_family(("bloom", "gpt3-finnish"), (_BLOOM,)),
    **_family(("viking",), (_BLOOM, "\\p{N}"), clean_spaces=False),
    **_family(("chatglm-bpe", "glm4"), (_LLAMA3,), default_bos=False),
    **_family(("seed-coder",), (_SEED_CODER,), clean_spaces=False),
    **_family(("bailingmoe", "bailingmoe2", "llada-moe"), (_BAILINGMOE,), clean_spaces=False),
    **_family(("grok-2",), (_QWEN2,), clean_spaces=False),
}


def supported_pre_tokenizers() -> list[str]:
    """Every ``tokenizer.ggml.pre`` value this module understands, sorted."""
    return sorted(PRE_TOKENIZERS)


def get_pre_tokenizer(name: str | None) -> PreTokenizer | None:
    """The pre-tokenizer for a GGUF ``tokenizer.ggml.pre`` value, or None if unknown.

    A missing or empty name means ``"default"``, as in llama.cpp.
    """
    return PRE_TOKENIZERS.get(name or "default")
