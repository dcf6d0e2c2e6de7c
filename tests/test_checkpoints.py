"""Model spec resolution: real GGUF files and HF directories, bad specs, the hub offline."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from poot.checkpoints import (
    ModelHParams,
    RopeScaling,
    hparams_from_gguf,
    hparams_from_hf_config,
    resolve_model_files,
)
from poot.checkpoints.hparams import f32_shortest
from poot.checkpoints.hub import parse_hub_id
from poot.config import Settings
from poot.errors import (
    CheckpointError,
    CheckpointFormatError,
    ConfigError,
    ModelNotFoundError,
    OfflineError,
)

STORIES_GGUFS = [
    "stories260K-f32.gguf",
    "stories260K-F16.gguf",
    "stories260K-Q8_0.gguf",
    "stories260K-Q4_0.gguf",
]

STORIES_HPARAMS = ModelHParams(
    architecture="llama",
    vocab_size=512,
    context_length=512,
    hidden_size=64,
    n_layers=5,
    n_heads=8,
    n_kv_heads=4,
    intermediate_size=172,
    head_dim=8,
    rope_theta=10000.0,
    rope_dim=8,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_scaling=None,
    bos_token_id=1,
    eos_token_ids=(2,),
)

SMOLLM2_HPARAMS = ModelHParams(
    architecture="llama",
    vocab_size=49152,
    context_length=8192,
    hidden_size=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    intermediate_size=1536,
    head_dim=64,
    rope_theta=100000.0,
    rope_dim=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_scaling=None,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def _native_has(name: str) -> bool:
    from poot import _native

    return hasattr(_native, name)


needs_gguf = pytest.mark.skipif(
    not _native_has("GgufFile"), reason="poot._native has no GgufFile yet (rebuild the extension)"
)
needs_safetensors = pytest.mark.skipif(
    not _native_has("SafetensorsModel"),
    reason="poot._native has no SafetensorsModel yet (rebuild the extension)",
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


# ---------------------------------------------------------------- the hub, offline


def test_hub_offline_env_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    start = time.monotonic()
    with pytest.raises(OfflineError) as e:
        resolve_model_files("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert time.monotonic() - start < 5
    msg = str(e.value)
    assert "HF_HUB_OFFLINE" in msg and "local path" in msg and "poot pull" in msg
    assert isinstance(e.value, ConnectionError)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP endpoint that accepts connections and never answers (a black-holed network)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.timeout(30)
def test_hub_unreachable_fails_fast(
    silent_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("POOT_NETWORK_TIMEOUT", "1")
    start = time.monotonic()
    with pytest.raises(OfflineError, match="local path.*poot pull"):
        resolve_model_files("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert time.monotonic() - start < 10


@pytest.mark.timeout(30)
def test_hub_connection_refused_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    start = time.monotonic()
    with pytest.raises(OfflineError, match="SmolLM2"):
        resolve_model_files("HuggingFaceTB/SmolLM2-135M-Instruct@main")
    assert time.monotonic() - start < 10


class _NotFoundHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(30)
def test_hub_unknown_repo_is_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFoundHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
        with pytest.raises(ModelNotFoundError, match="no model 'poot-test/no-such-model'"):
            resolve_model_files("poot-test/no-such-model")
    finally:
        server.shutdown()
        server.server_close()
        t.join()


# ---------------------------------------------------------------- the hub, reachable or cached


@needs_safetensors
def test_hub_download_pins_the_resolved_commit(
    shared_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    hf = shared_models / "stories260K" / "hf"
    commit = "a" * 40
    calls: list[dict[str, Any]] = []

    def model_info(self: object, repo_id: str, **kwargs: Any) -> SimpleNamespace:
        calls.append({"repo_id": repo_id, **kwargs})
        return SimpleNamespace(sha=commit)

    def snapshot_download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(hf)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("POOT_NETWORK_TIMEOUT", "3")
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    mf = resolve_model_files("poot-test/stories@v1")
    assert mf.kind == "hf" and mf.spec == "poot-test/stories@v1" and mf.path == hf
    assert mf.hparams == STORIES_HPARAMS
    info, snap = calls
    assert info == {"repo_id": "poot-test/stories", "revision": "v1", "timeout": 3.0}
    assert snap["revision"] == commit and snap["etag_timeout"] == 3.0
    assert {"config.json", "*.safetensors", "tokenizer.json"} <= set(snap["allow_patterns"])


def _hub_cache(shared_models: Path, cache: Path, repo_id: str) -> Path:
    """A Hugging Face hub cache holding stories260K/hf as ``repo_id`` at ``main``."""
    commit = "c" * 40
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(shared_models / "stories260K" / "hf", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@needs_safetensors
def test_hub_offline_uses_the_cache(
    shared_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = _hub_cache(shared_models, tmp_path / "hf", "poot-test/stories")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mf = resolve_model_files("poot-test/stories")
    assert mf.kind == "hf" and mf.path == snapshot and mf.hparams == STORIES_HPARAMS
    # unreachable hub, cached repo: the cache answers
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert resolve_model_files("poot-test/stories").path == snapshot
