"""poot.load_tokenizer: GGUF SentencePiece against Hugging Face and llama2.c, decoding, streaming,
special tokens, and errors.

stories260K is the same tokenizer three times over: llama2.c's tok512.bin, the Hugging Face
tokenizer.json in hf/, and the GGUF metadata written by llama.cpp's converter. The GGUF
tokenizer must encode exactly as the other two.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from poot.errors import ModelNotFoundError, TokenizerError
from poot.tokenizer import Tokenizer, load_tokenizer, tokenizer_from_gguf_metadata

STORY_GGUFS = [
    "stories260K-f32.gguf",
    "stories260K-F16.gguf",
    "stories260K-Q8_0.gguf",
    "stories260K-Q4_0.gguf",
]

CORPUS = [
    "",
    " ",
    "  ",
    "\n",
    "Once upon a time",
    " Once upon a time",
    "Once upon a time, there was a little girl named Lily.",
    "Lily's mom said, \"Don't touch it!\" and they'd gone.",
    "  two  spaces  and a tab\tand\nnew\n\nlines ",
    "3.14159 + 2 = 5.14159; 1,000,000?",
    "ünïcödé café naïve Ærøskøbing",
    "日本語のテキスト and 中文 🦙🚀 emoji",
    "<s>hi</s> there <unk>",
    "trailing space ",
    "\t\t",
    "a" * 200,
]


# -- llama2.c's run.c tokenizer, as an independent reference -----------------------------------


class RunCTokenizer:
    """llama2.c's run.c ``encode``: BOS, a dummy space, code points, then best-score merges."""

    def __init__(self, path: Path, vocab_size: int) -> None:
        data = path.read_bytes()
        pos = 4  # max_token_length
        self.vocab: list[bytes] = []
        self.scores: list[float] = []
        for _ in range(vocab_size):
            score, length = struct.unpack_from("<fi", data, pos)
            pos += 8
            self.vocab.append(data[pos : pos + length])
            pos += length
            self.scores.append(score)
        self.lookup = {v: i for i, v in enumerate(self.vocab)}

    def encode(self, text: str) -> list[int]:
        tokens = [1]
        if text:
            tokens.append(self.lookup[b" "])
        for ch in text:
            b = ch.encode()
            tid = self.lookup.get(b)
            tokens.extend([tid] if tid is not None else [x + 3 for x in b])
        while True:
            best = (-1e10, -1, -1)
            for i in range(len(tokens) - 1):
                tid = self.lookup.get(self.vocab[tokens[i]] + self.vocab[tokens[i + 1]], -1)
                if tid != -1 and self.scores[tid] > best[0]:
                    best = (self.scores[tid], tid, i)
            if best[2] < 0:
                return tokens
            tokens[best[2] : best[2] + 2] = [best[1]]


@pytest.fixture(scope="module")
def stories_hf(shared_models: Path) -> Tokenizer:
    return load_tokenizer(shared_models / "stories260K" / "hf")


@pytest.fixture(scope="module")
def stories_gguf(shared_models: Path) -> Tokenizer:
    return load_tokenizer(shared_models / "stories260K" / "stories260K-f32.gguf")


@pytest.fixture(scope="module")
def story_lines(shared_models: Path) -> list[str]:
    text = (shared_models / "stories260K" / "runc-greedy-256.txt").read_text(encoding="utf-8")
    return [*CORPUS, text, *text.splitlines()]


@pytest.mark.parametrize("name", STORY_GGUFS)
def test_stories_gguf_encodes_like_hf_tokenizer_json(
    shared_models: Path, stories_hf: Tokenizer, story_lines: list[str], name: str
) -> None:
    tok = load_tokenizer(shared_models / "stories260K" / name)
    assert tok.kind == "gguf-spm"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (512, 1, 2, True)
    for text in story_lines:
        assert tok.encode(text) == stories_hf.encode(text), text
        assert tok.encode(text, add_special_tokens=False) == stories_hf.encode(
            text, add_special_tokens=False
        ), text


def test_stories_gguf_encodes_like_hf_on_random_text(
    stories_hf: Tokenizer, stories_gguf: Tokenizer
) -> None:
    rng = random.Random(0)
    alphabet = list("abcdeflmnorstuy LOS.,!?'\"\n\t-") + ["é", "日", "🦙", "<s>", "</s>", "  "]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        assert stories_gguf.encode(text) == stories_hf.encode(text), text


def test_stories_gguf_encodes_like_llama2c(
    shared_models: Path, stories_gguf: Tokenizer, story_lines: list[str]
) -> None:
    runc = RunCTokenizer(shared_models / "stories260K" / "llama2c" / "tok512.bin", 512)
    for text in story_lines:
        if "<" in text:  # run.c knows no special tokens
            continue
        assert stories_gguf.encode(text) == runc.encode(text), text


def test_stories_reference_ids_and_text(
    shared_models: Path, stories_hf: Tokenizer, stories_gguf: Tokenizer
) -> None:
    ref = json.loads((shared_models / "stories260K" / "reference.json").read_text())
    for run in ref["runs"]:
        ids = run["prompt_ids"] + run["gen_ids"]
        for tok in (stories_hf, stories_gguf):
            assert tok.encode(run["prompt"]) == run["prompt_ids"]
        if run["impl"] == "hf":  # transformers' decode keeps <s>
            assert stories_hf.decode(ids) == run["text"]
            assert stories_gguf.decode(ids) == run["text"]
        else:  # llama.cpp prints no control tokens
            assert stories_gguf.decode(ids, skip_special_tokens=True) == run["text"]
            assert stories_hf.decode(ids, skip_special_tokens=True) == run["text"]


def test_stories_decode_agrees_with_hf_on_valid_text(
    stories_hf: Tokenizer, stories_gguf: Tokenizer
) -> None:
    rng = random.Random(1)
    checked = 0
    for _ in range(2000):
        ids = [rng.randrange(512) for _ in range(rng.randrange(1, 25))]
        for skip in (False, True):
            want = stories_hf.decode(ids, skip_special_tokens=skip)
            if "\ufffd" in want:
                continue  # invalid UTF-8: transformers and poot mark bad bytes differently
            checked += 1
            assert stories_gguf.decode(ids, skip_special_tokens=skip) == want, ids
    assert checked > 300


# -- streaming ------------------------------------------------------------------------------


def _stream_text(tok: Tokenizer, ids: list[int], **kwargs: Any) -> tuple[list[str], str]:
    stream = tok.stream(**kwargs)
    parts = [stream.push(i) for i in ids]
    return parts, "".join(parts) + stream.flush()


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_stream_never_splits_a_character(
    stories_hf: Tokenizer, stories_gguf: Tokenizer, which: str
) -> None:
    tok = stories_hf if which == "hf" else stories_gguf
    text = "a 日本 🦙 b"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # the CJK and emoji come as byte tokens
    parts, joined = _stream_text(tok, ids)
    assert joined == text
    assert all("\ufffd" not in p for p in parts)
    assert [p for p in parts if p] == ["a", " ", "日", "本", " ", "🦙", " b"]


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_stream_matches_decode(
    stories_hf: Tokenizer, stories_gguf: Tokenizer, story_lines: list[str], which: str
) -> None:
    tok = stories_hf if which == "hf" else stories_gguf
    for text in story_lines:
        ids = tok.encode(text)
        for skip in (False, True):
            _, joined = _stream_text(tok, ids, skip_special_tokens=skip)
            assert joined == tok.decode(ids, skip_special_tokens=skip), text


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_stream_with_context_continues_the_prompt(
    shared_models: Path, stories_hf: Tokenizer, stories_gguf: Tokenizer, which: str
) -> None:
    tok = stories_hf if which == "hf" else stories_gguf
    run = json.loads((shared_models / "stories260K" / "reference.json").read_text())["runs"][0]
    prompt, gen = run["prompt_ids"], run["gen_ids"]
    _, joined = _stream_text(tok, gen, context=prompt)
    whole = tok.decode(prompt + gen, skip_special_tokens=True)
    assert joined == whole[len(tok.decode(prompt, skip_special_tokens=True)) :]
    assert joined.startswith(", there was a little girl")
    # Without context the first token starts the text, and SentencePiece's prefix space goes.
    _, alone = _stream_text(tok, gen[4:])
    assert alone == tok.decode(gen[4:], skip_special_tokens=True)
    assert not alone.startswith(" ")


def test_stream_flush_emits_unfinished_bytes(stories_gguf: Tokenizer) -> None:
    ids = stories_gguf.encode("日", add_special_tokens=False)  # three byte tokens
    stream = stories_gguf.stream()
    assert [stream.push(i) for i in ids[:-1]] == ["", "", ""][: len(ids) - 1]
    assert stream.flush() == "\ufffd"


# -- special tokens and llama.cpp's partitioning, on a small synthetic vocabulary ----------------


def _spm_meta(**extra: Any) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)]]
    types = [2, 3, 3, *[6] * 256]
    scores = [0.0] * len(tokens)
    for text, kind, score in [
        ("\u2581", 1, -1.0),
        ("a", 1, -2.0),
        ("b", 1, -2.0),
        ("\u2581a", 1, -0.5),
        ("ab", 1, -0.4),
        ("\u2581ab", 1, -0.1),
        ("<ctl>", 3, 0.0),
        ("<ctl>b", 3, 0.0),
        ("<usr>", 4, 0.0),
        ("<|end|>", 1, 0.0),  # an EOG text: llama.cpp makes it a control token
    ]:
        tokens.append(text)
        types.append(kind)
        scores.append(score)
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(extra)
    return meta


@pytest.fixture(scope="module")
def toy() -> Tokenizer:
    return tokenizer_from_gguf_metadata(_spm_meta(), source="toy")


def _id(tok: Tokenizer, text: str) -> int:
    tid = tok.token_to_id(text)
    assert tid is not None, text
    return tid


def test_toy_merges_by_score(toy: Tokenizer) -> None:
    assert toy.encode("ab", add_special_tokens=False) == [_id(toy, "\u2581ab")]
    assert toy.encode("ab") == [1, _id(toy, "\u2581ab")]
    assert toy.encode("ba", add_special_tokens=False) == [
        _id(toy, "\u2581"),
        _id(toy, "b"),
        _id(toy, "a"),
    ]
    # "c" is no token: it falls back to its byte.
    assert toy.encode("c", add_special_tokens=False)[-1] == 3 + ord("c")


def test_control_tokens_match_only_when_parsing_special(toy: Tokenizer) -> None:
    ctl, usr = _id(toy, "<ctl>"), _id(toy, "<usr>")
    assert toy.encode("<ctl>", add_special_tokens=False) == [ctl]
    plain = toy.encode("<ctl>", add_special_tokens=False, parse_special=False)
    assert ctl not in plain
    assert toy.decode(plain) == "<ctl>"
    # User-defined tokens always match, as in llama.cpp and transformers.
    assert toy.encode("<usr>", add_special_tokens=False, parse_special=False) == [usr]


def test_longest_special_token_wins_and_prefix_space_follows_specials(toy: Tokenizer) -> None:
    ids = toy.encode("<ctl>b<ctl>ab", add_special_tokens=False)
    assert ids == [_id(toy, "<ctl>b"), _id(toy, "<ctl>"), _id(toy, "\u2581ab")]


def test_eog_texts_become_control_tokens(toy: Tokenizer) -> None:
    end = _id(toy, "<|end|>")
    assert toy.is_special(end)
    assert toy.eos_ids == {2, end}
    assert toy.decode([_id(toy, "\u2581ab"), end]) == "ab<|end|>"
    assert toy.decode([_id(toy, "\u2581ab"), end], skip_special_tokens=True) == "ab"


def test_phi3_special_tokens_strip_following_spaces() -> None:
    tok = tokenizer_from_gguf_metadata(_spm_meta(**{"general.name": "Phi-3 mini"}))
    end = _id(tok, "<|end|>")
    assert tok.encode("<|end|>  ab", add_special_tokens=False) == [end, _id(tok, "\u2581ab")]


def test_gguf_file_round_trip_through_native_reader(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    meta = _spm_meta()
    path = tmp_path / "toy.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_scores(meta["tokenizer.ggml.scores"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tok = load_tokenizer(path)
    assert tok.add_bos is False
    assert tok.encode("ab") == [_id(tok, "\u2581ab")]
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "<s>ab"


def _bpe_meta(pre: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": ["a", "b", "c", "ab", "abc", "<|eot_id|>"],
        "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 5,
        "tokenizer.ggml.eos_token_id": 5,
    }
    meta.update(extra)
    return meta


def test_llama3_ignores_merges_and_adds_bos() -> None:
    llama3 = tokenizer_from_gguf_metadata(_bpe_meta("llama-bpe"))
    gpt2 = tokenizer_from_gguf_metadata(_bpe_meta("gpt-2"))
    assert llama3.kind == "gguf-bpe:llama-bpe"
    # "abc" is a vocabulary entry: Llama 3 takes it whole; GPT-2 can only merge "a b".
    assert llama3.encode("abc") == [5, 4]
    assert gpt2.encode("abc") == [3, 2]
    off = tokenizer_from_gguf_metadata(
        _bpe_meta("llama-bpe", **{"tokenizer.ggml.add_bos_token": False})
    )
    assert off.encode("abc") == [4]


def test_clean_spaces_is_llama_cpp_s() -> None:
    from poot.tokenizer.gguf_vocab import clean_spaces

    text = "a , b . c ' d 's 're 've 'll 't ?!"
    assert clean_spaces(text) == "a, b. c'd's're've 'll 't?!"


def test_gpt2_decode_cleans_spaces_unless_asked_not_to(shared_models: Path) -> None:
    tok = load_tokenizer(shared_models / "vocab" / "ggml-vocab-gpt-2.gguf")
    ids = tok.encode("Hello , world ! It 's")
    assert tok.decode(ids) == "Hello, world! It's"
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == "Hello , world ! It 's"
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "Hello , world ! It 's"


# -- Hugging Face directories ---------------------------------------------------------------


def _copy_hf(shared_models: Path, dest: Path) -> Path:
    src = shared_models / "stories260K" / "hf"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, dest / name)
    return dest


def test_hf_eos_ids_include_generation_config(shared_models: Path, tmp_path: Path) -> None:
    d = _copy_hf(shared_models, tmp_path)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    tok = load_tokenizer(d)
    assert (tok.kind, tok.bos_id, tok.eos_id) == ("hf-tokenizer.json", 1, 2)
    assert tok.eos_ids == {2, 5}


def test_hf_parse_special_false_tokenizes_special_text(stories_hf: Tokenizer) -> None:
    assert stories_hf.encode("</s>", add_special_tokens=False) == [2]
    plain = stories_hf.encode("</s>", add_special_tokens=False, parse_special=False)
    assert 2 not in plain
    assert stories_hf.decode(plain) == "</s>"


def test_load_tokenizer_is_exported_from_poot() -> None:
    import poot

    assert poot.load_tokenizer is load_tokenizer
    assert poot.Tokenizer is Tokenizer


def test_tokenizer_from_model_files(shared_models: Path) -> None:
    from poot.checkpoints import resolve_model_files

    for spec in ("stories260K-Q8_0.gguf", "hf"):
        files = resolve_model_files(shared_models / "stories260K" / spec)
        tok = load_tokenizer(files)
        assert tok.encode("Once upon a time") == [1, 403, 407, 261, 378]


# -- errors ---------------------------------------------------------------------------------


def test_unknown_tokenizer_model_is_an_error() -> None:
    with pytest.raises(TokenizerError, match="unknown tokenizer.ggml.model 'bert'"):
        tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.model": "bert"}))


def test_unknown_pre_tokenizer_names_the_supported_ones() -> None:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "no-such-pre",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
    }
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer.*'no-such-pre'") as err:
        tokenizer_from_gguf_metadata(meta)
    for name in ("gpt-2", "smollm", "llama-bpe", "qwen2", "deepseek-llm", "starcoder"):
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokenizer.ggml.tokens": None}, "no tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.model": None}, "no tokenizer.ggml.model"),
        ({"tokenizer.ggml.scores": [0.0]}, "scores is shorter"),
        ({"tokenizer.ggml.token_type": [1]}, "token_type is shorter"),
        (
            {
                "tokenizer.ggml.tokens": ["a", "a"],
                "tokenizer.ggml.scores": None,
                "tokenizer.ggml.token_type": None,
            },
            "duplicate token",
        ),
    ],
)
def test_malformed_vocabulary_is_an_error(change: dict[str, Any], message: str) -> None:
    meta = _spm_meta()
    for key, value in change.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    with pytest.raises(TokenizerError, match=message):
        tokenizer_from_gguf_metadata(meta)


def test_gguf_without_a_vocabulary_is_an_error(shared_models: Path) -> None:
    path = shared_models / "quant-slices" / "real-quant-slices.gguf"
    with pytest.raises(TokenizerError, match="real-quant-slices.gguf: .*no tokenizer.ggml.model"):
        load_tokenizer(path)


def test_bpe_without_merges_is_an_error() -> None:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b"],
    }
    with pytest.raises(TokenizerError, match="no tokenizer.ggml.merges"):
        tokenizer_from_gguf_metadata(meta)


def test_add_bos_without_bos_token_is_an_error() -> None:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.add_bos_token": True,
    }
    with pytest.raises(TokenizerError, match="add_bos_token is true"):
        tokenizer_from_gguf_metadata(meta)


def test_decode_out_of_range_id_is_an_error(toy: Tokenizer, stories_hf: Tokenizer) -> None:
    for tok in (toy, stories_hf):
        with pytest.raises(TokenizerError, match="out of range"):
            tok.decode([tok.vocab_size])


def test_hf_dir_without_tokenizer_json_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_missing_model_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        load_tokenizer(tmp_path / "missing.gguf")
