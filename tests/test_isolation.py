"""The suite's own guarantees (conftest): private caches per session, network only where
marked, a default model that never comes from the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import _ISOLATED_VARS, session_cache_dir

from poot.config import Settings

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_session_caches_are_private_and_fresh() -> None:
    root = session_cache_dir().parent
    assert root.name.startswith("poot-test-session-")
    for var in _ISOLATED_VARS:
        assert Path(os.environ[var]).parent == root, var
    assert Settings.from_env().cache_dir == session_cache_dir()
    assert not (session_cache_dir() / "profiles").exists()  # nothing stored hardware profiles


def test_default_model_is_the_session_copy(default_model_path: Path) -> None:
    assert default_model_path.is_relative_to(session_cache_dir())
    assert default_model_path.stat().st_nlink == 1  # a copy: a test may corrupt it safely


def _inner(pytester: pytest.Pytester, mp: pytest.MonkeyPatch, body: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    network: needs the network\n")
    pytester.makepyfile(test_inner=body)
    tests_dir = str(CONFTEST.parent)
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    mp.setenv("PYTHONPATH", path)
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")


def test_network_only_where_marked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _inner(
        pytester,
        monkeypatch,
        """
import socket
import pytest

def test_swallowed_lookup():
    try:
        socket.getaddrinfo("example.com", 80)
    except OSError:
        pass  # code that turns the refusal into "offline" still fails the test

def test_loopback_is_fine():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    c = socket.create_connection(s.getsockname())
    c.close()
    s.close()

@pytest.mark.network
def test_marked_may_try():
    try:
        socket.getaddrinfo("example.invalid", 80)
    except OSError:
        pass
""",
    )
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*without @pytest.mark.network*lookup example.com*"])
