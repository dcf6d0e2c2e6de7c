"""The fuzz corpus and every crash reproducer, replayed through the fuzz targets on each run.

``tests/fuzz/corpus/<target>`` holds the seeds (``tests/fuzz/make_seeds.py``) and inputs a
fuzzing run found worth keeping; ``tests/fuzz/crashes/<target>`` every input that once crashed,
hung or was refused with an untyped error, kept after the fix. Each must now succeed or be
refused with the target's typed errors (``tests/fuzz/targets.py``). Needs no atheris.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz.targets import CORPUS, TARGETS, check, inputs

CASES = [
    pytest.param(name, path, id=f"{name}/{path.parent.name}/{path.name}")
    for name in TARGETS
    for path in inputs(name)
]


def test_every_target_has_seeds() -> None:
    assert {name for name, *_ in (c.values for c in CASES)} == set(TARGETS)


@pytest.mark.parametrize(("name", "path"), CASES)
def test_input_is_handled(name: str, path: Path) -> None:
    check(TARGETS[name], path.read_bytes())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_are_accepted_not_just_refused(name: str) -> None:
    """The seeds reach the code past validation: each one runs without any error."""
    seeds = [p for p in inputs(name) if p.parent == CORPUS / name]
    assert seeds
    for path in seeds:
        TARGETS[name].run(path.read_bytes())
