"""A debug build of the native module says so: a warning at import naming the fix, and the
profile in ``poot doctor``."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from poot import _native
from poot.build import DEBUG_BUILD_WARNING, build_profile, warn_if_debug


def test_the_native_module_reports_its_profile() -> None:
    assert _native.build_profile in ("release", "debug")
    assert build_profile() == _native.build_profile


def test_a_debug_build_warns_with_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="poot"):
        assert warn_if_debug("debug")
        assert not warn_if_debug("release")
    assert [r.getMessage() for r in caplog.records] == [DEBUG_BUILD_WARNING]
    assert "make build" in DEBUG_BUILD_WARNING and "10-50x slower" in DEBUG_BUILD_WARNING


def test_import_warns_only_for_a_debug_build() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import logging; logging.basicConfig(); import poot"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    warned = DEBUG_BUILD_WARNING in out.stderr
    assert warned == (_native.build_profile == "debug"), out.stderr


def test_doctor_shows_the_build_profile() -> None:
    from poot.planner.commands import doctor_report

    assert doctor_report()["build_profile"] == _native.build_profile
    out = subprocess.run(
        [sys.executable, "-m", "poot.cli", "doctor"], capture_output=True, text=True, check=True
    )
    assert f"native build: {_native.build_profile}" in out.stdout
