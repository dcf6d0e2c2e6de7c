"""Device profiles: the numbers the cost model reads, and where validated ones are stored.

A profile is *measured* (written by ``poot validate-hardware`` after the device passed the
conformance subset), *estimated* (the CPU from discovery alone: the planner can always run on
the host, and says the numbers are guesses) or *synthetic* (tests). Only measured profiles
count as validated.

Stored profiles live in ``<cache_dir>/profiles/<slug>.json``, keyed by device, driver and poot
version: a new driver or a new poot invalidates the old profile (it is simply not found).
Invariant: a profile file is written whole (temporary name, then ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from poot.config import Settings
from poot.planner.discovery import DeviceInfo

__all__ = [
    "DeviceProfile",
    "HostProfile",
    "estimated_cpu_profile",
    "load_profile",
    "profile_path",
    "store_profile",
]

Source = Literal["measured", "estimated", "synthetic"]


@dataclass(frozen=True)
class DeviceProfile:
    """What the cost model knows about one device.

    Attributes:
        key, kind, name, vendor, driver: as in ``DeviceInfo``.
        memory_bytes: memory for weights and KV (host RAM for the CPU).
        read_bw: device memory read bandwidth, bytes/s.
        gemv_bw: per weight dtype, weight bytes/s a one-row matmul streams (decode).
        gemm_flops: per weight dtype, flop/s of a many-row matmul (prefill).
        dispatch_s: fixed cost per graph equation (launch, sync, thread wake-up).
        matmul_s: fixed cost per matmul on top (splitting rows over threads and joining).
        segment_s: fixed cost to start one streamed chunk (on the CPU: open its buffer, trace
            and compile the chunk's graph).
        stage_s: fixed cost to stage one streamed chunk on top of its bytes (the CPU: create
            the buffer file, write its header, close it); 0 = not measured.
        stage_bw: bytes/s of staging a streamed chunk into its buffer (the CPU: writing the
            buffer file); 0 = not measured.
        fresh_map_bw: bytes/s of the extra first-touch cost (page faults) of computing over a
            freshly staged buffer; 0 = none.
        overlap_slowdown: (compute, staging): how much slower the device computes while a
            loader stages a chunk beside it, and how much slower staging runs meanwhile
            (measured together: on a CPU with few cores the loader steals a core from a thread
            pool whose every matmul waits for its slowest thread, far worse than
            ``cores / (cores - 1)``); None = not measured (that ratio is assumed both ways).
        cores: cores the device computes with (the CPU: a loader thread takes one of them).
        copy_bw: host memory copy bytes/s measured on this device (the CPU; 0 elsewhere).
        link_bw: host<->device bytes/s (0 for the CPU: it reads host memory directly).
        link_latency_s: fixed cost per host<->device transfer.
        peer_bw: per other device key, direct device<->device bytes/s (absent: via the host).
        software: runs on the CPU's own cores (lavapipe/llvmpipe): it contends with the CPU.
        source: measured, estimated or synthetic.
        poot_version: the poot that measured it.
    """

    key: str
    kind: str
    name: str
    vendor: str
    driver: str = ""
    memory_bytes: int = 0
    read_bw: float = 1e10
    gemv_bw: dict[str, float] = field(default_factory=dict)
    gemm_flops: dict[str, float] = field(default_factory=dict)
    dispatch_s: float = 2e-6
    matmul_s: float = 0.0
    segment_s: float = 0.0
    stage_s: float = 0.0
    stage_bw: float = 0.0
    fresh_map_bw: float = 0.0
    overlap_slowdown: tuple[float, float] | None = None
    cores: int = 0
    copy_bw: float = 0.0
    link_bw: float = 0.0
    link_latency_s: float = 0.0
    peer_bw: dict[str, float] = field(default_factory=dict)
    software: bool = False
    source: Source = "synthetic"
    poot_version: str = ""

    @property
    def validated(self) -> bool:
        """Measured by ``validate-hardware`` (conformance passed)."""
        return self.source == "measured"

    @property
    def is_host(self) -> bool:
        """The CPU: weights in host memory are already resident."""
        return self.kind == "cpu"

    def gemv(self, dtype: str) -> float:
        """Weight bytes/s of a one-row matmul over ``dtype`` weights."""
        return self.gemv_bw.get(dtype) or _fallback(self.gemv_bw, self.read_bw)

    def gemm(self, dtype: str) -> float:
        """flop/s of a many-row matmul over ``dtype`` weights."""
        return self.gemm_flops.get(dtype) or _fallback(self.gemm_flops, 1e10)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeviceProfile:
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if kw.get("overlap_slowdown") is not None:
            kw["overlap_slowdown"] = tuple(kw["overlap_slowdown"])
        return cls(**kw)


def _fallback(table: dict[str, float], default: float) -> float:
    # An unmeasured dtype gets the slowest measured one: the planner prefers to overestimate.
    return min(table.values()) if table else default


@dataclass(frozen=True)
class HostProfile:
    """The host side of streaming.

    Attributes:
        memory_bytes: host RAM poot may use.
        disk_read_bw: bytes/s read from the spill/checkpoint disk.
        copy_bw: bytes/s of a host memory copy (filling a host staging buffer).
    """

    memory_bytes: int
    disk_read_bw: float = 1e9
    copy_bw: float = 5e9


def estimated_cpu_profile(info: DeviceInfo) -> DeviceProfile:
    """A CPU profile guessed from discovery alone (marked ``estimated``).

    The guesses are deliberately plain: ~4 GB/s of weight streaming per core up to a memory
    bandwidth of 20 GB/s, and 8 GFLOP/s per core (16 with AVX2, 32 with AVX-512).
    """
    cores = max(1, info.cores)
    per_core = 32e9 if "avx512f" in info.features else 16e9 if "avx2" in info.features else 8e9
    bw = min(20e9, 4e9 * cores)
    dtypes = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
    return DeviceProfile(
        key=info.key,
        kind="cpu",
        name=info.name,
        vendor="cpu",
        driver="",
        memory_bytes=info.memory_bytes,
        read_bw=bw,
        gemv_bw={d: bw for d in dtypes},
        gemm_flops={d: per_core * cores for d in dtypes},
        dispatch_s=5e-6,
        source="estimated",
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60]


def profile_path(info: DeviceInfo, version: str, settings: Settings | None = None) -> Path:
    """Where the profile of ``info`` (its device and driver) under poot ``version`` is stored."""
    settings = settings or Settings.from_env()
    digest = hashlib.sha256(f"{info.identity}|{version}".encode()).hexdigest()[:12]
    return settings.cache_dir / "profiles" / f"{_slug(info.kind + '-' + info.name)}-{digest}.json"


def store_profile(
    info: DeviceInfo, profile: DeviceProfile, version: str, settings: Settings | None = None
) -> Path:
    """Writes ``profile`` for ``info`` atomically; returns its path."""
    path = profile_path(info, version, settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    body = {"identity": info.identity, "version": version, "profile": profile.to_json()}
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def load_profile(
    info: DeviceInfo, version: str, settings: Settings | None = None
) -> DeviceProfile | None:
    """The stored profile for ``info`` under ``version``, or None (absent or unreadable)."""
    path = profile_path(info, version, settings)
    try:
        body = json.loads(path.read_text())
        if body.get("identity") != info.identity or body.get("version") != version:
            return None
        return replace(DeviceProfile.from_json(body["profile"]), key=info.key)
    except (OSError, ValueError, KeyError, TypeError):
        return None
