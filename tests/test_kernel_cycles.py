"""``scripts/check_kernel_cycles.py``: poot-cpu's kernel modules import each other one way only,
and the check itself finds a cycle and a layering break when one is planted."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_SRC = _ROOT / "crates" / "poot-cpu" / "src"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_kernel_cycles", _ROOT / "scripts" / "check_kernel_cycles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_kernel_tree_has_no_cycle(capsys: pytest.CaptureFixture[str]) -> None:
    check = _script()
    assert check.main(["--root", str(_SRC)]) == 0, capsys.readouterr().out
    graph = check.build_graph(_SRC)
    # The graph is real: the dispatch reaches its families and the x86 loops.
    assert "kernels::matmul::r8" in graph["kernels::matmul"]
    assert "kernels::arch::x86::qdot_r8" in graph["kernels::matmul::r8"]


def test_a_planted_cycle_and_layering_break_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = _script()
    src = tmp_path / "src"
    shutil.copytree(_SRC, src)
    with (src / "kernels" / "format.rs").open("a") as f:
        # dot_scalar lives in arch::generic::qdot_generic, which imports format: a two-module cycle.
        f.write("\nuse crate::kernels::arch::generic::qdot_generic::dot_scalar;\n")
    with (src / "kernels" / "matmul" / "r8.rs").open("a") as f:
        f.write("\nfn back() { crate::kernels::matmul::matmul(); }\n")
    assert check.main(["--root", str(src)]) == 1
    out = capsys.readouterr().out
    assert "kernels::format -> kernels::arch::generic::qdot_generic" in out
    assert "layering: kernels::matmul::r8 -> kernels::matmul" in out


def test_a_doc_comment_naming_a_dependent_module_is_a_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name-based reader follows module paths in docs: `blocks` naming the 8-row generic loop
    (which imports `blocks`) is a cycle; the same words in a test module's docs are not."""
    check = _script()
    src = tmp_path / "src"
    shutil.copytree(_SRC, src)
    blocks = src / "kernels" / "blocks.rs"
    text = blocks.read_text()
    doc = "/// As `arch::generic::qdot_r8_generic::group`."
    blocks.write_text(text + f"\n#[cfg(test)]\nmod doc_only {{\n    {doc}\n    fn f() {{}}\n}}\n")
    assert check.main(["--root", str(src)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    # Relative to an ancestor (`arch::...` from `kernels::blocks`), and absolute.
    for doc in (
        "/// As `arch::generic::qdot_r8_generic::group` reads it.",
        "/// See [`group`](crate::kernels::arch::generic::qdot_r8_generic::group).",
    ):
        blocks.write_text(text + f"\n{doc}\nconst _X: () = ();\n")
        assert check.main(["--root", str(src)]) == 1
        out = capsys.readouterr().out
        assert "kernels::blocks -> kernels::arch::generic::qdot_r8_generic" in out, out
