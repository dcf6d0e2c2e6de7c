"""CI's summary: how many tests ran, were skipped and were ignored, by reason.

Reads pytest's JUnit XML (``--junitxml``), the output of ``cargo test`` and the Rust skip log
(``POOT_SKIP_LOG``: one ``rust<TAB>crate<TAB>test<TAB>reason`` line per test that returned
without running its body, written by poot-cpu's ``testutil`` and poot-formats' ``tests/common``).
A Rust test that records a skip still counts as "passed" in cargo's own totals, so it is moved
from ran to skipped here. Prints the summary; exits 1 when an input is missing or unreadable, and
never judges the counts (failures already failed the run).

Usage: python scripts/test_summary.py [--junit X.xml] [--cargo-log LOG] [--skip-log LOG]
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_RESULT = re.compile(
    r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; "
    r"(\d+) filtered out"
)
_IGNORED = re.compile(r"^test (\S+) \.\.\. ignored(?:, (.*))?$")


@dataclass
class Tally:
    """Counts of one language's tests and the reasons for those that did not run."""

    ran: int = 0
    passed: int = 0
    failed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    xfailed: int = 0

    def lines(self, name: str) -> list[str]:
        skipped, ignored = sum(self.skipped.values()), sum(self.ignored.values())
        head = (
            f"{name}: {self.ran} ran ({self.passed} passed, {self.failed} failed"
            + (f", {self.xfailed} xfailed" if self.xfailed else "")
            + f"), {skipped} skipped, {ignored} ignored"
        )
        out = [head]
        out += [f"  skipped {n:>4}: {r}" for r, n in self.skipped.most_common()]
        out += [f"  ignored {n:>4}: {r}" for r, n in self.ignored.most_common()]
        return out


def _reason(message: str) -> str:
    """A skip message without pytest's location prefix (``file.py:12: ``)."""
    return re.sub(r"^[^:\s]+\.py:\d+: ", "", message.strip()) or "(no reason given)"


def from_junit(path: Path) -> Tally:
    """Counts from pytest's JUnit XML."""
    t = Tally()
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            t.failed += 1
            t.ran += 1
        elif "skipped" in kinds:
            el = kinds["skipped"]
            if el.get("type") == "pytest.xfail":
                t.xfailed += 1
                t.ran += 1
            else:
                t.skipped[_reason(el.get("message") or el.text or "")] += 1
        else:
            t.passed += 1
            t.ran += 1
    return t


def from_cargo(log: str, skip_log: str) -> Tally:
    """Counts from ``cargo test`` output and the Rust skip log."""
    t = Tally()
    for line in log.splitlines():
        if m := _RESULT.match(line.strip()):
            passed, failed = int(m[1]), int(m[2])
            t.passed += passed
            t.failed += failed
        elif m := _IGNORED.match(line.strip()):
            t.ignored[m[2] or "(#[ignore] without a reason)"] += 1
    for line in skip_log.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[0] == "rust":
            t.skipped[f"{parts[1]}: {parts[3]}"] += 1
    recorded = sum(t.skipped.values())
    t.passed -= recorded  # cargo counted these as passed
    t.ran = t.passed + t.failed
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", type=Path, help="pytest --junitxml output")
    ap.add_argument("--cargo-log", type=Path, help="captured `cargo test` output")
    ap.add_argument("--skip-log", type=Path, help="POOT_SKIP_LOG of the Rust run")
    args = ap.parse_args(argv)
    lines: list[str] = []
    try:
        if args.cargo_log is not None:
            skips = args.skip_log.read_text() if args.skip_log and args.skip_log.exists() else ""
            lines += from_cargo(args.cargo_log.read_text(errors="replace"), skips).lines("rust")
        if args.junit is not None:
            lines += from_junit(args.junit).lines("python")
    except (OSError, ET.ParseError) as e:
        print(f"test_summary: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
