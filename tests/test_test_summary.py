"""scripts/test_summary.py: CI's ran/skipped/ignored counts by reason, from real pytest JUnit
XML (made here by a nested pytest run) and cargo's output format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test_summary.py"

CARGO = """\
     Running unittests src/lib.rs (target/release/deps/poot_cpu-1)
test a::tests::one ... ok
test a::tests::slow ... ignored, needs 40 GB
test a::tests::bare ... ignored
test result: ok. 5 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.1s
     Running tests/x.rs (target/release/deps/x-2)
test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s
"""
SKIPS = "rust\tpoot-cpu\ta::tests::amx\tno amx on this CPU\n"


def _run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True
    )
    return out.stdout


def test_counts_pytest_junit_by_reason(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_skip(): pytest.skip('no widget here')\n"
        "@pytest.mark.xfail(strict=True)\n"
        "def test_xfail(): assert False\n"
        "def test_fail(): assert False\n"
    )
    xml = tmp_path / "out.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         f"--junitxml={xml}", str(tmp_path / "test_inner.py")],
        cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    out = _run("--junit", str(xml))
    assert (
        out.splitlines()[0] == "python: 3 ran (1 passed, 1 failed, 1 xfailed), 1 skipped, 0 ignored"
    )
    assert "skipped    1: no widget here" in out


def test_counts_cargo_and_moves_recorded_skips_out_of_passed(tmp_path: Path) -> None:
    (tmp_path / "cargo.log").write_text(CARGO)
    (tmp_path / "skips.log").write_text(SKIPS)
    out = _run(
        "--cargo-log", str(tmp_path / "cargo.log"), "--skip-log", str(tmp_path / "skips.log")
    )
    lines = out.splitlines()
    assert lines[0] == "rust: 8 ran (7 passed, 1 failed), 1 skipped, 2 ignored"
    assert "  skipped    1: poot-cpu: no amx on this CPU" in lines
    assert "  ignored    1: needs 40 GB" in lines
    assert "  ignored    1: (#[ignore] without a reason)" in lines


def test_missing_input_exits_1(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--junit", str(tmp_path / "none.xml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "none.xml" in proc.stderr
