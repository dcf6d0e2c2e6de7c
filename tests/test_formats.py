"""poot._native's checkpoint readers against the ``gguf`` and ``safetensors`` packages.

The references (``gguf.GGUFReader`` and ``safetensors.safe_open``) are test-only dependencies;
shipped code never imports them. Malformed files are made here from the real ones, and each
must surface as the right ``poot.errors`` class with ``kind``, ``file``, ``tensor`` and
``field`` set.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from poot import _native
from poot.errors import CheckpointFormatError, UnsupportedDTypeError

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402
from shared_data import SHARED_MODELS  # noqa: E402

SHARED = SHARED_MODELS
GGUF_FILES = sorted(
    p.relative_to(SHARED).as_posix()
    for sub in ("stories260K", "vocab", "quant-slices")
    for p in (SHARED / sub).glob("*.gguf")
)
ST_FILES = sorted(
    p.relative_to(SHARED).as_posix()
    for sub in ("stories260K/hf", "quant-slices")
    for p in (SHARED / sub).glob("*.safetensors")
)
HF_DIR = "stories260K/hf"
Q8 = "stories260K/stories260K-Q8_0.gguf"

_SCALAR_TYPES: dict[Any, type] = {}


def _py_type(vt: Any) -> type:
    """The Python type poot promises for a GGUF value type."""
    if not _SCALAR_TYPES:
        t = gguf.GGUFValueType
        for name in ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"):
            _SCALAR_TYPES[getattr(t, name)] = int
        _SCALAR_TYPES.update(
            {t.FLOAT32: float, t.FLOAT64: float, t.BOOL: bool, t.STRING: str, t.ARRAY: list}
        )
    return _SCALAR_TYPES[vt]


def test_shared_file_lists_are_not_empty(shared_models: Path) -> None:
    """The parametrized lists below come from globbing ../shared; an empty glob would make
    them vanish silently instead of failing."""
    assert len(GGUF_FILES) >= 7 and len(ST_FILES) >= 2, (GGUF_FILES, ST_FILES)


@pytest.mark.parametrize("rel", GGUF_FILES)
def test_gguf_matches_gguf_py(shared_models: Path, rel: str) -> None:
    path = shared_models / rel
    ours = _native.GgufFile(path)
    ref = gguf.GGUFReader(path)
    assert ours.path == str(path)
    assert ours.version == 3
    assert ours.alignment == ref.alignment
    assert ours.file_size == path.stat().st_size
    if ref.tensors:
        assert ours.data_offset == ref.data_offset

    meta = ours.metadata()
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(meta) == list(ref_fields), "same keys in file order"
    for key, field in ref_fields.items():
        want = field.contents()
        assert meta[key] == want, key
        assert type(meta[key]) is _py_type(field.types[0]), key
        if field.types[0] == gguf.GGUFValueType.ARRAY and meta[key]:
            assert type(meta[key][0]) is _py_type(field.types[-1]), key
        assert ours.get(key) == want
        assert ours.array_len(key) == (len(want) if isinstance(want, list) else None), key
    assert ours.get("no.such.key") is None
    assert ours.array_len("no.such.key") is None
    assert ours.keys() == list(ref_fields)
    short = ours.metadata(max_array_len=8)
    assert short == {k: v for k, v in meta.items() if not isinstance(v, list) or len(v) <= 8}

    tensors = ours.tensors()
    assert [t.name for t in tensors] == [t.name for t in ref.tensors]
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    for t, r in zip(tensors, ref.tensors, strict=True):
        assert t.shape == tuple(int(d) for d in reversed(r.shape)), t.name
        assert t.dtype == r.tensor_type.name, t.name
        assert (t.offset, t.nbytes) == (int(r.data_offset), int(r.n_bytes)), t.name
        assert t.n_elements == int(r.n_elements), t.name
        assert t.file == str(path)
        assert bytes(raw[t.offset : t.offset + t.nbytes]) == r.data.tobytes(), t.name


def test_vocab_metadata_converts_to_strs(shared_models: Path) -> None:
    # Its speed is measured in benches/bench_formats.py, not asserted here.
    f = _native.GgufFile(shared_models / "vocab" / "ggml-vocab-gpt-2.gguf")
    tokens = f.get("tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) > 50_000
    assert all(type(t) is str for t in tokens)


@pytest.mark.parametrize("rel", ST_FILES)
def test_safetensors_matches_safetensors_py(shared_models: Path, rel: str) -> None:
    path = shared_models / rel
    ours = _native.SafetensorsFile(path)
    assert ours.path == str(path)
    assert ours.file_size == path.stat().st_size
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert ours.data_offset == 8 + header_len
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    with safe_open(str(path), framework="np") as ref:
        assert ours.metadata() == (ref.metadata() or {})
        tensors = {t.name: t for t in ours.tensors()}
        assert set(tensors) == set(ref.keys())
        for name, t in tensors.items():
            s = ref.get_slice(name)
            assert t.shape == tuple(s.get_shape()), name
            assert t.dtype == s.get_dtype(), name
            arr = ref.get_tensor(name)
            assert t.nbytes == arr.nbytes and t.n_elements == arr.size, name
            assert bytes(raw[t.offset : t.offset + t.nbytes]) == arr.tobytes(), name
            assert t.file == str(path)


def test_model_opens_dir_and_single_file(shared_models: Path) -> None:
    hf = shared_models / HF_DIR
    for arg in (hf, hf / "model.safetensors", str(hf)):
        m = _native.SafetensorsModel(arg)
        assert m.files == [str(hf / "model.safetensors")]
        assert m.index_path is None
        assert len(m.tensors()) == len(_native.SafetensorsFile(hf / "model.safetensors").tensors())
        assert m.metadata() == {"format": "pt"}


def _split(src: Path, out: Path, n: int) -> dict[str, str]:
    """Splits ``src`` into ``n`` shards plus an index, HF style; returns the weight map."""
    with safe_open(str(src), framework="np") as f:
        names = sorted(f.keys())
        arrays = {k: f.get_tensor(k) for k in names}
    weight_map: dict[str, str] = {}
    for i in range(n):
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: arrays[k] for k in names[i::n]}
        safetensors_numpy.save_file(part, str(out / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in part})
    total = sum(a.nbytes for a in arrays.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return weight_map


def test_sharded_index(shared_models: Path, tmp_path: Path) -> None:
    src = shared_models / HF_DIR / "model.safetensors"
    weight_map = _split(src, tmp_path, 3)
    index = tmp_path / "model.safetensors.index.json"
    for arg in (tmp_path, index):
        m = _native.SafetensorsModel(arg)
        assert m.index_path == str(index)
        assert len(m.files) == 3
        got = {t.name: t for t in m.tensors()}
        assert set(got) == set(weight_map)
        assert m.metadata() == {"format": "pt"}
        with safe_open(str(src), framework="np") as ref:
            for name, t in got.items():
                assert t.file == str(tmp_path / weight_map[name])
                assert t.shape == tuple(ref.get_slice(name).get_shape())
                raw = np.memmap(t.file, dtype=np.uint8, mode="r")
                assert bytes(raw[t.offset : t.offset + t.nbytes]) == ref.get_tensor(name).tobytes()
    # Without the index, every *.safetensors in the directory.
    index.unlink()
    assert len(_native.SafetensorsModel(tmp_path).tensors()) == len(weight_map)


def _write_index(d: Path, weight_map: dict[str, str]) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_sharded_index_disagreements(shared_models: Path, tmp_path: Path) -> None:
    src = shared_models / HF_DIR / "model.safetensors"
    weight_map = _split(src, tmp_path, 2)
    name, shard = next(iter(weight_map.items()))
    other = next(s for s in weight_map.values() if s != shard)

    wrong = dict(weight_map, **{name: other})
    _write_index(tmp_path, wrong)
    with pytest.raises(CheckpointFormatError) as e:
        _native.SafetensorsModel(tmp_path)
    assert (e.value.kind, e.value.tensor, e.value.field) == ("shard_mismatch", name, "weight_map")
    assert e.value.file == str(tmp_path / shard)

    missing = dict(weight_map, **{"not.in.any.shard": shard})
    _write_index(tmp_path, missing)
    with pytest.raises(CheckpointFormatError) as e:
        _native.SafetensorsModel(tmp_path)
    assert (e.value.kind, e.value.tensor) == ("shard_mismatch", "not.in.any.shard")

    unlisted = {k: v for k, v in weight_map.items() if k != name}
    _write_index(tmp_path, unlisted)
    with pytest.raises(CheckpointFormatError) as e:
        _native.SafetensorsModel(tmp_path)
    assert (e.value.kind, e.value.tensor, e.value.file) == (
        "shard_mismatch",
        name,
        str(tmp_path / shard),
    )

    _write_index(tmp_path, dict(weight_map, **{name: "../elsewhere.safetensors"}))
    with pytest.raises(CheckpointFormatError) as e:
        _native.SafetensorsModel(tmp_path)
    assert (e.value.kind, e.value.tensor) == ("invalid_value", name)

    _write_index(tmp_path, dict(weight_map, **{name: "absent.safetensors"}))
    with pytest.raises(FileNotFoundError) as nf:
        _native.SafetensorsModel(tmp_path)
    assert nf.value.filename == str(tmp_path / "absent.safetensors")

    # The same tensor in two shards.
    with safe_open(str(src), framework="np") as f:
        dup = {name: f.get_tensor(name)}
    safetensors_numpy.save_file(dup, str(tmp_path / "extra.safetensors"))
    _write_index(tmp_path, dict(weight_map, **{"x": "extra.safetensors"}))
    with pytest.raises(CheckpointFormatError) as e:
        _native.SafetensorsModel(tmp_path)
    assert (e.value.kind, e.value.tensor) == ("duplicate_name", name)


# ---- malformed files ----------------------------------------------------------------------


def _expect(
    cls: type, path: Path, opener: Any, kind: str, tensor: str | None, field: str
) -> CheckpointFormatError:
    with pytest.raises(cls) as e:
        opener(path)
    err = e.value
    assert isinstance(err, CheckpointFormatError) and isinstance(err, ValueError)
    assert (err.kind, err.file, err.tensor, err.field) == (kind, str(path), tensor, field), err
    assert str(path) in str(err)
    return err


def _tensor_info_at(data: bytes, name: str) -> int:
    """Offset just past a GGUF tensor info's name (where n_dims starts)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key)
    assert data.find(key, at + 1) == -1
    return at + len(key)


def test_gguf_malformed(shared_models: Path, tmp_path: Path) -> None:
    data = (shared_models / Q8).read_bytes()
    ref = _native.GgufFile(shared_models / Q8)
    last = ref.tensors()[-1]
    p = tmp_path / "bad.gguf"
    G = _native.GgufFile

    def case(b: bytes) -> Path:
        p.write_bytes(b)
        return p

    _expect(CheckpointFormatError, case(b"GGUX" + data[4:]), G, "bad_magic", None, "magic")
    v1 = data[:4] + struct.pack("<I", 1) + data[8:]
    _expect(CheckpointFormatError, case(v1), G, "unsupported_version", None, "version")
    _expect(CheckpointFormatError, case(data[:20]), G, "truncated", None, "metadata_kv_count")
    cut = case(data[: last.offset + 3])
    _expect(CheckpointFormatError, cut, G, "truncated", last.name, "data")

    name = "output_norm.weight"  # 1-D
    at = _tensor_info_at(data, name)
    type_at = at + 4 + 8
    bad_type = data[:type_at] + struct.pack("<I", 99) + data[type_at + 4 :]
    err = _expect(UnsupportedDTypeError, case(bad_type), G, "unknown_dtype", name, "dtype")
    assert "99" in str(err)
    (rel,) = struct.unpack("<Q", data[type_at + 4 : type_at + 12])
    off = data[: type_at + 4] + struct.pack("<Q", rel + 4) + data[type_at + 12 :]
    _expect(CheckpointFormatError, case(off), G, "misaligned", name, "offset")
    n_tensors = data[:8] + struct.pack("<Q", 2**64 - 1) + data[16:]
    _expect(CheckpointFormatError, case(n_tensors), G, "absurd_count", None, "tensor_count")

    key = b"tokenizer.ggml.tokens"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4 + 4
    huge = data[:at] + struct.pack("<Q", 2**62) + data[at + 8 :]
    _expect(CheckpointFormatError, case(huge), G, "absurd_count", None, key.decode())
    # The first token's first byte made invalid UTF-8.
    bad_utf8 = bytearray(data)
    bad_utf8[at + 16] = 0xFF
    _expect(CheckpointFormatError, case(bytes(bad_utf8)), G, "bad_utf8", None, key.decode())


def _st(tensors: dict[str, Any] | str, data: bytes) -> bytes:
    header = tensors if isinstance(tensors, str) else json.dumps(tensors)
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_safetensors_malformed(tmp_path: Path) -> None:
    p = tmp_path / "bad.safetensors"
    S = _native.SafetensorsFile

    def case(b: bytes) -> Path:
        p.write_bytes(b)
        return p

    def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
        return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}

    ok = {"w": entry("F32", [2], 0, 8)}
    S(case(_st(ok, bytes(8))))  # sanity

    _expect(CheckpointFormatError, case(b"\x01\x02"), S, "truncated", None, "header_len")
    huge = struct.pack("<Q", 2**63) + b"{}"
    _expect(CheckpointFormatError, case(huge), S, "absurd_count", None, "header_len")
    _expect(CheckpointFormatError, case(_st("{", b"")), S, "bad_json", None, "header")
    _expect(CheckpointFormatError, case(_st(ok, bytes(7))), S, "truncated", "w", "data")
    bad = {"w": entry("F4", [2], 0, 1)}
    _expect(UnsupportedDTypeError, case(_st(bad, bytes(1))), S, "unknown_dtype", "w", "dtype")
    bad = {"w": entry("F32", [3], 0, 8)}
    _expect(
        CheckpointFormatError, case(_st(bad, bytes(8))), S, "size_mismatch", "w", "data_offsets"
    )
    bad = {"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}
    _expect(CheckpointFormatError, case(_st(bad, bytes(8))), S, "overlap", "b", "data_offsets")
    bad = {"w": entry("U8", [4], 100, 104)}
    _expect(
        CheckpointFormatError, case(_st(bad, bytes(8))), S, "out_of_bounds", "w", "data_offsets"
    )
    bad = {"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}
    _expect(CheckpointFormatError, case(_st(bad, bytes(8))), S, "bad_json", "w", "shape")
    dup = (
        '{"w":'
        + json.dumps(entry("U8", [1], 0, 1))
        + ',"w":'
        + json.dumps(entry("U8", [1], 1, 2))
        + "}"
    )
    _expect(CheckpointFormatError, case(_st(dup, bytes(2))), S, "duplicate_name", "w", "name")
    meta = {"__metadata__": {"a": 1}}
    _expect(
        CheckpointFormatError, case(_st(meta, b"")), S, "bad_json", "__metadata__", "__metadata__"
    )
    raw = b'{"\xff":1}'
    bad_utf8 = struct.pack("<Q", len(raw)) + raw
    _expect(CheckpointFormatError, case(bad_utf8), S, "bad_utf8", None, "header")


def test_io_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    for cls in (_native.GgufFile, _native.SafetensorsFile, _native.SafetensorsModel):
        with pytest.raises(FileNotFoundError) as e:
            cls(missing)
        assert e.value.filename == str(missing)
    with pytest.raises(IsADirectoryError) as d:
        _native.GgufFile(tmp_path)
    assert d.value.filename == str(tmp_path)
    with pytest.raises(FileNotFoundError):
        _native.SafetensorsModel(tmp_path)  # a directory with nothing to load
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _expect(CheckpointFormatError, empty, _native.GgufFile, "truncated", None, "magic")
