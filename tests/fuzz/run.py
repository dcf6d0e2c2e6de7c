"""Fuzz one target with atheris (libFuzzer): ``python tests/fuzz/run.py TARGET [libFuzzer args]``.

The seeds in ``tests/fuzz/corpus/TARGET`` are copied into a working corpus under
``target/fuzz/TARGET`` (new inputs the fuzzer finds go there, not into the repo); crash, hang
and out-of-memory reproducers are written to ``tests/fuzz/crashes/TARGET/`` so that, once fixed,
``tests/test_fuzz_regressions.py`` replays them forever. poot's Python modules are instrumented
for coverage; the Rust parsers are not (atheris sees only their Python callers), so on the
binary formats the fuzzer mutates blind and the execution count is what counts.

``make fuzz`` runs every target (``FUZZ_RUNS`` executions each, 1,000,000 by default).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    import atheris

    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: {sys.argv[0]} TARGET [libFuzzer args]")
    name = sys.argv.pop(1)
    with atheris.instrument_imports(include=["poot"]):
        import poot  # noqa: F401
        import poot.server.params  # noqa: F401
        import poot.tokenizer  # noqa: F401
        from fuzz.targets import CORPUS, CRASHES, TARGETS, check
    if name not in TARGETS:
        sys.exit(f"unknown target {name!r}: one of {', '.join(TARGETS)}")
    target = TARGETS[name]
    work = ROOT / "target" / "fuzz" / name
    work.mkdir(parents=True, exist_ok=True)
    for seed in (CORPUS / name).iterdir():
        shutil.copy(seed, work / seed.name)
    crashes = CRASHES / name
    crashes.mkdir(parents=True, exist_ok=True)
    target.allowed()  # import the error classes before fuzzing starts

    def one(data: bytes) -> None:
        check(target, data)

    args = [sys.argv[0], str(work), f"-artifact_prefix={crashes}/", "-timeout=10",
            "-rss_limit_mb=4096", "-print_final_stats=1", *sys.argv[1:]]  # fmt: skip
    atheris.Setup(args, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
