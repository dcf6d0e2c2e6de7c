"""Discovery (doctor), validation (validate-hardware) and stored profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poot import _native
from poot.cli import main
from poot.config import Settings
from poot.planner.discovery import cpu_info, discover, parse_vulkaninfo_summary
from poot.planner.profiles import estimated_cpu_profile, load_profile, store_profile
from poot.planner.validate import quantize

VULKANINFO = """
Devices:
========
GPU0:
\tapiVersion         = 1.3.230
\tvendorID           = 0x10005
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
\tdriverName         = llvmpipe
\tdriverInfo         = Mesa 22.3.6 (LLVM 15.0.6)
GPU1:
\tvendorID           = 0x10de
\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName         = NVIDIA GeForce RTX 4090
\tdriverName         = NVIDIA
"""


def test_parse_vulkaninfo() -> None:
    lava, rtx = parse_vulkaninfo_summary(VULKANINFO)
    assert lava.software and lava.vendor == "mesa" and lava.key == "wgpu:0"
    assert "llvmpipe" in lava.driver
    assert not rtx.software and rtx.vendor == "nvidia" and rtx.key == "wgpu:1"


def test_discovery_lists_the_cpu_and_notes_what_it_cannot_see() -> None:
    d = discover()
    cpu = d.devices[0]
    assert cpu.key == "cpu" and cpu.cores >= 1 and cpu.memory_bytes > 0
    assert d.host_memory_bytes >= d.host_available_bytes > 0
    assert all(dev.kind != "cuda" for dev in d.devices) or "cuda" not in d.notes
    if not any(dev.kind == "cuda" for dev in d.devices):
        assert "no driver" in d.notes["cuda"] or "no devices" in d.notes["cuda"]


def test_profiles_are_keyed_by_device_driver_and_version(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    info = cpu_info()
    prof = estimated_cpu_profile(info)
    path = store_profile(info, prof, "1.0", settings)
    assert path.is_relative_to(tmp_path / "profiles")
    assert load_profile(info, "1.0", settings) == prof
    assert load_profile(info, "1.1", settings) is None  # a new poot measures again
    other = type(info)(**{**info.__dict__, "driver": "new driver"})
    assert load_profile(other, "1.0", settings) is None


def test_doctor_table_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["DEVICE", "KIND"]
    assert "cpu" in out and "visible" in out and "cuda:" in out
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["devices"][0]["key"] == "cpu"
    assert report["devices"][0]["status"] == "visible"


def test_validate_hardware_stores_a_profile_and_doctor_sees_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path))
    assert main(["validate-hardware", "--quick", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    cpu = reports[0]
    assert cpu["status"] == "validated" and set(cpu["checks"].values()) == {"ok"}
    prof = cpu["profile"]
    assert prof["gemv_gbps"]["Q8_0"] > 0 and prof["read_bw_gbps"] > 0
    assert prof["copy_bw_gbps"] > 0 and prof["stage_gbps"] > 0 and prof["segment_us"] > 0
    assert Path(cpu["stored"]).is_file()
    assert all(r["status"] in ("validated", "skipped") for r in reports)
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["status"] == "validated"
    prof = load_profile(cpu_info(), _native.__version__, Settings(cache_dir=tmp_path))
    assert prof is not None and prof.validated


def test_validate_hardware_exits_nonzero_on_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import poot.planner.validate as v
    import poot.planner.validate_wgpu  # noqa: F401

    # validate_wgpu binds validate's _BOUNDS when first imported; imported first inside the
    # patch it kept the patched dict for every later test (found by a shuffled order).
    monkeypatch.setenv("POOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(v, "_BOUNDS", {**v._BOUNDS, "Q4_0": 1e-4})  # no quantizer: it crashes
    assert main(["validate-hardware", "--quick"]) == 1
    assert "failed" in capsys.readouterr().out
    assert not (tmp_path / "profiles").exists()


def test_quantizers_roundtrip_close() -> None:
    import numpy as np

    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    for dt, nbytes, tol in (
        ("Q8_0", 8 * 2 * 34, 0.02),
        ("Q4_1", 8 * 2 * 20, 0.3),
        ("F16", 1024, 1e-3),
    ):
        raw, deq = quantize(w, dt)
        assert len(raw) == nbytes
        assert np.abs(deq - w).max() < tol


def test_cuda_devices_come_from_the_cuda_runtime_when_it_sees_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from poot import _native
    from poot.planner import discovery

    h200 = {
        "ordinal": 0,
        "name": "NVIDIA H200",
        "compute_capability": "9.0",
        "multiprocessors": 132,
        "total_memory": 150754820096,
        "driver_version": 13000,
        "nvrtc_version": "0.0",
    }
    monkeypatch.setattr(_native, "cuda_devices", lambda: [h200])
    found, note = discovery.cuda_devices()
    assert note == ""
    (d,) = found
    assert (d.key, d.kind, d.name, d.driver) == ("cuda:0", "cuda", "NVIDIA H200", "CUDA 13.0")
    assert d.features == ("sm_90",) and d.cores == 132 and d.memory_bytes == 150754820096
