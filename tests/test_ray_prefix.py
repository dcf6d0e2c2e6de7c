"""The Ray front end's parts that need no cluster: prefix keys, the prefix table, the typed
errors of ``poot.serve.ray`` and ``poot-serve --ray``'s argument checks.

The cluster tests are in ``tests/test_ray_serve.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from poot.errors import ConfigError
from poot.serve import ray as poot_ray
from poot.serve.prefix import (
    BLOCK_CHARS,
    MAX_BLOCKS,
    PrefixTable,
    hash_block,
    prefix_hashes,
    prompt_text,
)


def test_block_hash_is_the_kv_caches() -> None:
    # crates/poot-kv/src/hash.rs, hash_is_stable_across_runs: the same function, bit for bit.
    assert hash_block(None, [1, 2, 3, 4], 7) == 0x30A1_E4CE_3138_6485
    base = hash_block(None, [1, 2, 3, 4], 7)
    assert base != hash_block(0, [1, 2, 3, 4], 7)
    assert base != hash_block(None, [1, 2, 3], 7)
    assert base != hash_block(None, [1, 2, 3, 4], 8)
    # The one-multiply path for small ids equals the word-by-word FNV-1a of the Rust code.
    items = [0, 7, 255, 256, 49151, 70000]
    assert hash_block(5, items, 9) == _reference_hash(5, items, 9)


def _reference_hash(parent: int | None, items: list[int], key: int) -> int:
    mask, prime = (1 << 64) - 1, 0x100000001B3
    h = 0xCBF29CE484222325
    data = key.to_bytes(8, "little")
    data += (0x9E3779B97F4A7C15 if parent is None else parent).to_bytes(8, "little")
    data += len(items).to_bytes(8, "little")
    data += b"".join(t.to_bytes(4, "little") for t in items)
    for b in data:
        h = ((h ^ b) * prime) & mask
    for shift, mul in ((33, 0xFF51AFD7ED558CCD), (33, 0xC4CEB9FE1A85EC53)):
        h = ((h ^ (h >> shift)) * mul) & mask
    return h ^ (h >> 33)


def test_prefix_hashes_chain_full_blocks_only() -> None:
    shared = "s" * (3 * BLOCK_CHARS)
    a = prefix_hashes(shared + "a" * BLOCK_CHARS)
    b = prefix_hashes(shared + "b" * BLOCK_CHARS + "tail")
    assert len(a) == len(b) == 4
    assert a[:3] == b[:3] and a[3] != b[3]
    assert prefix_hashes("x" * (BLOCK_CHARS - 1)) == []
    assert len(prefix_hashes("y" * BLOCK_CHARS * (MAX_BLOCKS + 5))) == MAX_BLOCKS
    # Chained: the same block after a different one hashes differently.
    assert (
        prefix_hashes("p" * BLOCK_CHARS + "q" * BLOCK_CHARS)[1]
        != (prefix_hashes("r" * BLOCK_CHARS + "q" * BLOCK_CHARS)[1])
    )


def test_prompt_text_of_request_bodies() -> None:
    assert prompt_text(json.dumps({"prompt": "hello"}).encode()) == "hello"
    assert prompt_text(json.dumps({"prompt": ["one"]}).encode()) == "one"
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    text = prompt_text(json.dumps(chat).encode())
    assert text is not None and text.startswith("system\x00be brief\x00user\x00hi")
    # Same system prompt, another question: same leading text.
    other = {"messages": [chat["messages"][0], {"role": "user", "content": "bye"}]}
    assert str(prompt_text(json.dumps(other).encode())).startswith("system\x00be brief\x00")
    for body in (b"not json", b"[1]", b"{}", json.dumps({"prompt": [1, 2]}).encode()):
        assert prompt_text(body) is None
    assert prompt_text(json.dumps({"prompt": ["a", "b"]}).encode()) is None


def test_prefix_table_longest_match_recency_and_forget() -> None:
    table = PrefixTable(max_entries=100)
    shared = prefix_hashes("s" * (4 * BLOCK_CHARS))
    assert table.match(shared) == (0, [])
    table.record(shared[:2], "A")
    table.record(shared, "B")
    assert table.match(shared) == (4, ["B"])
    assert table.match(shared[:2] + [123]) == (2, ["A", "B"])
    table.record(shared[:2], "A")  # A most recent now
    assert table.match(shared[:2]) == (2, ["B", "A"])
    table.forget("B")
    assert table.match(shared) == (2, ["A"])
    table.forget("A")
    assert len(table) == 0


def test_prefix_table_is_bounded() -> None:
    table = PrefixTable(max_entries=3)
    table.record([1, 2, 3, 4, 5], "A")
    assert len(table) == 3 and table.match([1]) == (0, []) and table.match([5]) == (1, ["A"])
    with pytest.raises(ValueError, match="max_entries"):
        PrefixTable(0)


@pytest.mark.parametrize("field", ["replicas", "busy_requests", "ingress_replicas"])
def test_build_app_refuses_bad_counts(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        poot_ray.build_app("model.gguf", **{field: 0})


def test_without_ray_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: import raises
    with pytest.raises(poot_ray.RayNotInstalledError, match=r"pip install 'poot\[ray\]'") as e:
        poot_ray.build_app("model.gguf")
    assert isinstance(e.value, ImportError)
    with pytest.raises(poot_ray.RayNotInstalledError):
        poot_ray.connect()


def _serve(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(p for p in sys.path if p),
        # No cluster to find: an empty Ray temp dir, and no address given.
        "RAY_TMPDIR": str(tmp_path),
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-m", "poot.server.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_ray_flags_need_ray(tmp_path: Path) -> None:
    r = _serve(["--replicas", "2"], tmp_path)
    assert r.returncode == 2 and "need --ray" in r.stderr
    r = _serve(["--ray", "--autoscaling-config", "[1]"], tmp_path)
    assert r.returncode == 2 and "JSON object" in r.stderr
    r = _serve(["--ray", "--replicas", "0"], tmp_path)
    assert r.returncode == 2 and "replicas must be an integer >= 1" in r.stderr


def test_cli_without_a_cluster_is_a_typed_error(tmp_path: Path) -> None:
    if os.environ.get("POOT_REQUIRE_RAY") != "1":  # under it, a missing Ray fails below
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'poot[ray]')")
    r = _serve(["--ray", "--replicas", "2", "--model", "model.gguf"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert "no running Ray cluster" in r.stderr and "ray start --head" in r.stderr


def test_app_builder_takes_a_serve_configs_args(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("POOT_REQUIRE_RAY") != "1":
        pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    from ray.serve import Application

    monkeypatch.setenv("POOT_API_KEY", "from-the-environment")
    app = poot_ray.app_builder(
        {"model": "model.gguf", "max_model_len": 256, "replicas": 2, "routing": "round_robin"}
    )
    assert isinstance(app, Application)
    with pytest.raises(ConfigError, match=r"unknown poot.serve.ray argument\(s\) \['nope'\]"):
        poot_ray.app_builder({"model": "m.gguf", "nope": 1})
    with pytest.raises(ConfigError, match="max_queue"):
        poot_ray.app_builder({"max_queue": 0})
    with pytest.raises(ConfigError, match="routing"):
        poot_ray.app_builder({"routing": "random"})


def test_kuberay_manifest_is_a_valid_serve_config_of_this_app() -> None:
    if os.environ.get("POOT_REQUIRE_RAY") != "1":
        pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    import yaml
    from ray.serve import Application
    from ray.serve.schema import ServeDeploySchema

    root = Path(__file__).resolve().parents[1]
    manifest = yaml.safe_load((root / "deploy" / "kuberay" / "rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService"
    config = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    (app,) = config.applications
    assert app.import_path == "poot.serve.ray:app_builder"
    assert isinstance(poot_ray.app_builder(app.args), Application)
