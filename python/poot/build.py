"""How the native module was built, and a warning when that makes poot slow.

``poot._native.build_profile`` is ``"release"`` or ``"debug"`` (set by Rust from
``cfg!(debug_assertions)``). A debug build (``make develop``) runs 10-50x slower; importing poot
logs one warning that says so and how to fix it, and ``poot doctor`` shows the profile.
"""

from __future__ import annotations

import logging

DEBUG_BUILD_WARNING = (
    "poot's native module is a debug build (unoptimized, 10-50x slower): rebuild it in release "
    "mode with `make build` (or `pip install .`); `make develop` builds the debug profile"
)


def build_profile() -> str:
    """``"release"`` or ``"debug"``: how ``poot._native`` was compiled (``"unknown"`` for a
    module built before it said)."""
    from poot import _native

    # "unknown": a native module older than the attribute (it predates this check).
    return str(getattr(_native, "build_profile", "unknown"))


def warn_if_debug(profile: str | None = None) -> bool:
    """Logs ``DEBUG_BUILD_WARNING`` on the ``poot`` logger for a debug build; returns whether
    it did."""
    if (profile or build_profile()) != "debug":
        return False
    logging.getLogger("poot").warning(DEBUG_BUILD_WARNING)
    return True
