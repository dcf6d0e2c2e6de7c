"""Model spec resolution: real GGUF files and HF directories, GGUF metadata, bad specs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from checkpoints_data import (
    SMOLLM2_HPARAMS,
    STORIES_GGUFS,
    STORIES_HPARAMS,
    needs_gguf,
    needs_safetensors,
)

from poot.checkpoints import (
    RopeScaling,
    hparams_from_gguf,
    hparams_from_hf_config,
    resolve_model_files,
)
from poot.checkpoints.hparams import f32_shortest
from poot.checkpoints.hub import parse_hub_id
from poot.checkpoints.metadata import LAZY_ARRAY_LEN, GgufMetadata, metadata_array_len
from poot.config import Settings
from poot.errors import (
    CheckpointError,
    CheckpointFormatError,
    ConfigError,
    ModelNotFoundError,
)


def _gguf_metadata(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Metadata and tensor names read by the reference ``gguf`` package."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return meta, [t.name for t in reader.tensors]


# ---------------------------------------------------------------- hyperparameters (pure Python)


@pytest.mark.parametrize("name", STORIES_GGUFS)
def test_hparams_from_real_gguf_metadata(shared_models: Path, name: str) -> None:
    meta, names = _gguf_metadata(shared_models / "stories260K" / name)
    assert hparams_from_gguf(meta, names) == STORIES_HPARAMS


def test_hparams_from_real_hf_config(shared_models: Path) -> None:
    hf = shared_models / "stories260K" / "hf"
    config = json.loads((hf / "config.json").read_text())
    gen = json.loads((hf / "generation_config.json").read_text())
    h = hparams_from_hf_config(config, gen)
    assert h == STORIES_HPARAMS
    assert h.embedding_length == 64 and h.feed_forward_length == 172 and h.eos_token_id == 2


def test_hparams_defaults_and_aliases() -> None:
    config = {
        "model_type": "mistral",
        "vocab_size": 32,
        "max_position_embeddings": 64,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 40,
        "eos_token_id": [7, 8],
    }
    h = hparams_from_hf_config(config, {"eos_token_id": [8, 9], "bos_token_id": 3})
    assert h.architecture == "llama"
    assert (h.n_kv_heads, h.head_dim, h.rope_dim) == (4, 4, 4)
    assert h.rope_theta == 10000.0 and h.rms_norm_eps == 1e-6
    assert h.tie_word_embeddings is False
    assert h.bos_token_id == 3 and h.eos_token_ids == (7, 8, 9)


def test_hparams_rope_scaling_hf_and_gguf() -> None:
    config = {
        "model_type": "llama",
        "vocab_size": 32,
        "max_position_embeddings": 131072,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 40,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
    }
    h = hparams_from_hf_config(config)
    assert h.rope_scaling == RopeScaling(
        type="llama3", factor=8.0, original_context_length=8192, params={"low_freq_factor": 1.0}
    )
    assert json.loads(json.dumps(h.to_dict()))["rope_scaling"]["factor"] == 8.0
    meta = {
        "general.architecture": "qwen2",
        "qwen2.embedding_length": 16,
        "qwen2.attention.head_count": 4,
        "qwen2.block_count": 2,
        "qwen2.context_length": 32768,
        "qwen2.feed_forward_length": 40,
        "qwen2.rope.scaling.type": "yarn",
        "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": 8192,
        "tokenizer.ggml.tokens": ["a"] * 32,
    }
    g = hparams_from_gguf(meta, ["token_embd.weight", "output.weight"])
    assert g.vocab_size == 32 and g.n_kv_heads == 4 and g.tie_word_embeddings is False
    assert g.rope_scaling == RopeScaling(type="yarn", factor=4.0, original_context_length=8192)


def test_hparams_reject_bad_values() -> None:
    with pytest.raises(CheckpointFormatError, match="general.architecture"):
        hparams_from_gguf({}, [])
    with pytest.raises(CheckpointFormatError, match="llama.context_length") as e:
        hparams_from_gguf(
            {
                "general.architecture": "llama",
                "llama.embedding_length": 8,
                "llama.attention.head_count": 2,
                "llama.vocab_size": 4,
            },
            [],
        )
    assert e.value.field == "llama.context_length"
    config = {
        "model_type": "llama",
        "vocab_size": 32,
        "max_position_embeddings": 64,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 3,
        "intermediate_size": 40,
    }
    with pytest.raises(CheckpointFormatError, match="multiple"):
        hparams_from_hf_config(config)
    with pytest.raises(CheckpointFormatError, match="hidden_size"):
        hparams_from_hf_config({**config, "hidden_size": "sixteen"})


def test_f32_shortest() -> None:
    assert f32_shortest(9.999999747378752e-06) == 1e-5
    assert f32_shortest(10000.0) == 10000.0
    assert f32_shortest(0.1) == 0.1


def test_parse_hub_id() -> None:
    assert parse_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        None,
    )
    assert parse_hub_id("org/model@v1.0") == ("org/model", "v1.0")
    assert parse_hub_id("a/b") == ("a/b", None)
    for bad in (
        "model",
        "a/b/c",
        "org/..",
        "-org/model",
        "org/mo del",
        "org/a--b",
        "",
        "org/name-",
        "org/name.",
        "org/name.git",
        "org/" + "x" * 97,
    ):
        assert parse_hub_id(bad) is None, bad


def test_settings_from_env(tmp_path: Path) -> None:
    s = Settings.from_env(
        {"POOT_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "POOT_NETWORK_TIMEOUT": "2.5"}
    )
    assert s.cache_dir == tmp_path and s.models_dir == tmp_path / "models"
    assert s.hf_offline and s.network_timeout_s == 2.5
    xdg = Settings.from_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert not xdg.hf_offline and xdg.cache_dir.name == "poot"
    with pytest.raises(ConfigError, match="POOT_NETWORK_TIMEOUT"):
        Settings.from_env({"POOT_NETWORK_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="positive"):
        Settings.from_env({"POOT_PULL_TIMEOUT": "0"})


def test_settings_follow_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POOT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Settings.from_env().models_dir == tmp_path / "poot" / "models"


# ---------------------------------------------------------------- resolving real checkpoints


@needs_gguf
@pytest.mark.parametrize("name", STORIES_GGUFS)
def test_resolve_stories_gguf(shared_models: Path, name: str) -> None:
    path = shared_models / "stories260K" / name
    mf = resolve_model_files(str(path))
    assert mf.kind == "gguf" and mf.path == path and mf.spec == str(path)
    assert mf.gguf is not None and mf.safetensors is None
    assert mf.config == {} and mf.tokenizer_json is None
    assert mf.hparams == STORIES_HPARAMS
    assert mf.metadata["tokenizer.ggml.model"] == "llama"
    assert mf.chat_template is None
    ref_meta, ref_names = _gguf_metadata(path)
    tensors = mf.tensors()
    assert [t.name for t in tensors] == ref_names
    assert mf.total_bytes == sum(t.nbytes for t in tensors) > 0
    assert mf.total_bytes <= path.stat().st_size
    dtypes = {t.name: t.dtype for t in tensors}
    if name.endswith("Q4_0.gguf"):
        assert dtypes["token_embd.weight"] == "Q8_0"
        assert dtypes["blk.0.ffn_down.weight"] == "F16"
        assert dtypes["blk.0.attn_q.weight"] == "Q4_0"
    assert mf.tokenizer_summary() == {
        "source": "gguf",
        "model": "llama",
        "pre": "default",
        "n_tokens": 512,
    }


@needs_gguf
def test_resolve_accepts_pathlike_and_gguf_without_suffix(
    shared_models: Path, tmp_path: Path
) -> None:
    src = shared_models / "stories260K" / "stories260K-Q8_0.gguf"
    assert resolve_model_files(src).hparams == STORIES_HPARAMS
    renamed = tmp_path / "model.bin.q8"
    shutil.copyfile(src, renamed)
    assert resolve_model_files(renamed).kind == "gguf"


@needs_safetensors
def test_resolve_stories_hf_dir(shared_models: Path) -> None:
    from safetensors import safe_open

    hf = shared_models / "stories260K" / "hf"
    mf = resolve_model_files(str(hf))
    assert mf.kind == "hf" and mf.path == hf
    assert mf.safetensors is not None and mf.gguf is None
    assert mf.hparams == STORIES_HPARAMS
    assert mf.config["model_type"] == "llama"
    assert mf.tokenizer_json == hf / "tokenizer.json"
    assert mf.tokenizer_config["tokenizer_class"] == "LlamaTokenizer"
    assert mf.generation_config == {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
    with safe_open(hf / "model.safetensors", "np") as f:
        names = set(f.keys())
    tensors = mf.tensors()
    assert {t.name for t in tensors} == names
    assert all(t.dtype == "F32" for t in tensors)
    st_bytes = (hf / "model.safetensors").stat().st_size
    assert 0 < mf.total_bytes < st_bytes
    assert mf.weight_files == [hf / "model.safetensors"]
    assert mf.tokenizer_summary()["source"] == "tokenizer.json"
    # a config.json path resolves to its directory
    assert resolve_model_files(hf / "config.json").path == hf


@pytest.fixture
def sharded_hf_dir(shared_models: Path, tmp_path: Path) -> Path:
    """stories260K/hf re-saved as two safetensors shards with an index."""
    from safetensors.numpy import load_file, save_file

    src = shared_models / "stories260K" / "hf"
    out = tmp_path / "sharded"
    out.mkdir()
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        shutil.copyfile(src / name, out / name)
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, out / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.nbytes for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return out


@needs_safetensors
def test_resolve_sharded_hf_dir(sharded_hf_dir: Path, shared_models: Path) -> None:
    mf = resolve_model_files(sharded_hf_dir)
    single = resolve_model_files(shared_models / "stories260K" / "hf")
    assert mf.kind == "hf" and mf.hparams == STORIES_HPARAMS
    assert len(mf.weight_files) == 2
    assert {t.name for t in mf.tensors()} == {t.name for t in single.tensors()}
    assert {Path(t.file).name for t in mf.tensors()} == {p.name for p in mf.weight_files}
    assert mf.total_bytes == single.total_bytes


@needs_gguf
def test_resolve_default_model(default_model_path: Path) -> None:
    mf = resolve_model_files(None)
    assert mf.spec == "default" and mf.kind == "gguf"
    assert mf.path == default_model_path
    assert mf.hparams == SMOLLM2_HPARAMS
    assert resolve_model_files("default").path == default_model_path
    assert mf.chat_template is not None and "<|im_start|>" in mf.chat_template
    tok = mf.tokenizer_summary()
    assert (tok["model"], tok["pre"], tok["n_tokens"]) == ("gpt2", "smollm", 49152)
    by_dtype: dict[str, int] = {}
    for t in mf.tensors():
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + 1
    assert by_dtype == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


# ---------------------------------------------------------------- GGUF metadata, long arrays lazy


@needs_gguf
def test_gguf_metadata_converts_long_arrays_on_access(shared_models: Path) -> None:
    from poot._native import GgufFile

    f = GgufFile(shared_models / "vocab" / "ggml-vocab-gpt-2.gguf")
    m = GgufMetadata(f)
    full = f.metadata()
    assert list(m) == list(full) and len(m) == len(full)
    long = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}
    assert long <= m.lazy_keys
    assert all(isinstance(full[k], list) and len(full[k]) > LAZY_ARRAY_LEN for k in m.lazy_keys)
    assert dict(m) == full and m == full
    tokens = m["tokenizer.ggml.tokens"]
    assert tokens == full["tokenizer.ggml.tokens"]
    assert m["tokenizer.ggml.tokens"] is not tokens, "long arrays are not cached"
    assert m.array_len("tokenizer.ggml.tokens") == len(tokens) > 50_000
    assert m.array_len("tokenizer.ggml.model") is None and m.array_len("no.such") is None
    assert "tokenizer.ggml.merges" in m and "no.such" not in m and m.get("no.such") is None
    with pytest.raises(KeyError):
        m["no.such"]
    assert "tokenizer.ggml.tokens: <" in repr(m)
    assert metadata_array_len({"a": [1, 2], "b": "x"}, "a") == 2
    assert metadata_array_len({"a": [1, 2], "b": "x"}, "b") is None


@needs_gguf
@pytest.mark.parametrize("name", STORIES_GGUFS[:1])
def test_hparams_from_lazy_metadata(shared_models: Path, name: str) -> None:
    from poot._native import GgufFile

    f = GgufFile(shared_models / "stories260K" / name)
    m = GgufMetadata(f, lazy_array_len=100)  # the 512-token vocabulary becomes lazy
    assert "tokenizer.ggml.tokens" in m.lazy_keys
    names = {t.name for t in f.tensors()}
    assert hparams_from_gguf(m, names) == STORIES_HPARAMS
    no_vocab_size = {k: v for k, v in f.metadata().items() if k != "llama.vocab_size"}
    assert hparams_from_gguf(no_vocab_size, names).vocab_size == 512


def test_resolved_gguf_holds_no_python_vocabulary(default_model_path: Path) -> None:
    mf = resolve_model_files(default_model_path)
    assert isinstance(mf.metadata, GgufMetadata)
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"} <= mf.metadata.lazy_keys
    assert mf.tokenizer_summary()["n_tokens"] == 49152


# ---------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    "spec",
    [
        "./nope.gguf",
        "/no/such/dir",
        "missing.gguf",
        "a/b/c",
        "not a spec!",
        "plainword",
        "",
        "~/no-such-poot-model",
    ],
)
def test_bad_specs_list_the_forms(spec: str) -> None:
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model_files(spec)
    msg = str(e.value)
    assert ".gguf file" in msg and "hub id" in msg and "'default'" in msg
    assert "\n" not in msg
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, CheckpointError)


def test_dir_without_config_hints_at_gguf(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no config.json.*x.gguf"):
        resolve_model_files(tmp_path)


def test_non_gguf_file_is_not_a_model(shared_models: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not GGUF"):
        resolve_model_files(shared_models / "stories260K" / "hf" / "tokenizer.json")


def test_hf_dir_without_safetensors(shared_models: Path, tmp_path: Path) -> None:
    shutil.copyfile(shared_models / "stories260K" / "hf" / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointFormatError, match="no \\*.safetensors.*pytorch_model.bin") as e:
        resolve_model_files(tmp_path)
    assert e.value.kind == "missing_weights"


def test_hf_dir_with_broken_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointFormatError, match="not valid JSON"):
        resolve_model_files(tmp_path)


@needs_gguf
def test_corrupt_gguf_is_a_format_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    with pytest.raises(CheckpointFormatError):
        resolve_model_files(bad)
