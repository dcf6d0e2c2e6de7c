#!/usr/bin/env python3
"""Fail when the modules of ``crates/poot-cpu/src/kernels`` import each other in a cycle.

The graph: one node per source file (``kernels/matmul/r8.rs`` is ``kernels::matmul::r8``, a
folder's ``mod.rs`` is the folder); an edge for every ``super::``/``self::``/``crate::kernels::``
path in non-test code (``use`` lines, grouped ``use a::{b, c::d}`` included, and inline paths
such as ``super::simd::prefetch_ahead()``), and for a bare ``use child::...`` of a folder's
``mod.rs``. Doc comments (``//!``, ``///``) count too, as a name-based reader sees them: a
path of two or more segments (``crate::kernels::matmul::stored``, ``matmul::stored::dot_rows``,
an intra-doc link's target) names the module it resolves to from the documented module or its
nearest ancestor that has a module of that first name, so a doc that names a module depending
on it closes a cycle as a ``use`` would. A name a module only re-exports (``pub use``) counts
as an edge to where it is defined, and ``pub use``/``mod`` lines themselves are no edges, so a
folder's ``mod.rs`` that just gathers its children is not a hub. Test code (``#[cfg(test)]``
and ``#[cfg(all(test, ..))]`` modules, their doc comments included, ``tests.rs`` and
``*_tests.rs``) is left out: tests may import anything.

An edge inside a strongly connected component lies on a cycle. Those edges are checked against
an allowlist (``--allow FILE``, one ``a -> b`` a line) that may only shrink: a cycle edge not on
it fails the check (a new cycle), and so does an entry that is no longer a cycle edge (remove it
from the list). Without ``--allow`` any cycle fails. ``--write-allow FILE`` records today's cycle
edges. Prints the components and one cycle through each. It also fails on two layering
breaks that need no cycle: a module importing the dispatch (``mod.rs``) of a folder it sits in,
and ``arch/`` importing a family's dispatch.

Usage: python scripts/check_kernel_cycles.py [--root crates/poot-cpu/src] [--allow FILE]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_PATH = re.compile(rf"\b(?:super|self|crate)(?:::{_IDENT})+")
_MOD_OPEN = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({_IDENT})\s*\{{")
_MOD_DECL = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({_IDENT})\s*;")
_USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s")
_DOC = re.compile(r"^\s*//[/!](?!/)")
# In a doc comment: a path `a::b(::c)*` of two segments or more.
_DOC_PATH = re.compile(rf"(?<![A-Za-z0-9_:])(?:{_IDENT}::)+{_IDENT}")


def _strip(line: str) -> str:
    """The line without string literals and its `//` comment."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def _expand_use(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> [`a::b`, `a::c::d`, `a::c::e`] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", re.sub(rf"\s+as\s+{_IDENT}", "", tree))
    out: list[str] = []

    def walk(prefix: str, s: str) -> None:
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:i])
                start = i + 1
        parts.append(s[start:])
        for part in filter(None, parts):
            if "{" in part:
                head, rest = part.split("{", 1)
                walk(prefix + head, rest[: rest.rindex("}")])
            else:
                out.append((prefix + part).removesuffix("::*").rstrip(":"))

    walk("", tree)
    return [p.removesuffix("::self") for p in out if p and p != "self"]


class Source:
    """One kernel source file: its module path and the paths its non-test code names."""

    def __init__(self, path: Path, module: tuple[str, ...]) -> None:
        self.path = path
        self.module = module
        # (scope module path, path text, is a `pub use`) for each path named.
        self.paths: list[tuple[tuple[str, ...], str, bool]] = []
        # name -> (scope module path, path text) of what a `pub use` re-exports
        self.reexports: dict[str, tuple[tuple[str, ...], str]] = {}
        self.children: set[str] = set()  # child modules declared here
        # (scope module path, path segments) for each path a doc comment names.
        self.docs: list[tuple[tuple[str, ...], list[str]]] = []
        self._scan()

    def _scan(self) -> None:
        stack: list[tuple[tuple[str, ...], int, bool]] = [(self.module, 0, False)]
        depth, cfg_test, pending_use = 0, False, ""
        pending_pub = False
        for raw in self.path.read_text().splitlines():
            scope, _, in_test = stack[-1]
            if _DOC.match(raw):
                if not in_test and not cfg_test:
                    self._scan_doc(scope, raw)
                continue
            line = _strip(raw)
            if re.match(r"^\s*#\[cfg\((?:all\()?test\b", line):
                cfg_test = True
                continue
            if re.match(r"^\s*#\[", line):
                continue
            m_open, m_decl = _MOD_OPEN.match(line), _MOD_DECL.match(line)
            if m_decl:
                if len(stack) == 1 and not cfg_test:
                    self.children.add(m_decl.group(1))
                cfg_test = False
                continue
            opened = line.count("{") - line.count("}")
            if m_open:
                stack.append((scope + (m_open.group(1),), depth + 1, in_test or cfg_test))
                cfg_test = False
                depth += opened
                continue
            cfg_test = False
            if not in_test:
                if pending_use or _USE.match(line):
                    if not pending_use:
                        pending_pub = bool(_USE.match(line).group(1))  # type: ignore[union-attr]
                    pending_use += line
                    if ";" in line:
                        body = re.sub(r"^\s*(pub(\([^)]*\))?\s+)?use\s", "", pending_use)
                        for p in _expand_use(body.split(";", 1)[0]):
                            self.paths.append((scope, p, pending_pub))
                        pending_use = ""
                else:
                    for p in _PATH.findall(line):
                        self.paths.append((scope, p, False))
            depth += opened
            while len(stack) > 1 and depth < stack[-1][1]:
                stack.pop()

    def _scan_doc(self, scope: tuple[str, ...], raw: str) -> None:
        """Records the module paths one doc-comment line names (resolved in `build_graph`)."""
        text = _DOC.sub("", raw, count=1)
        for m in _DOC_PATH.finditer(text):
            self.docs.append((scope, m.group(0).split("::")))


def _module_of(root: Path, file: Path) -> tuple[str, ...]:
    rel = file.relative_to(root).with_suffix("")
    parts = rel.parts
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return ("crate",) + parts


def build_graph(root: Path) -> dict[str, set[str]]:
    """Module -> modules it imports, over `root/kernels/**.rs` (see the module docs)."""
    kernels = root / "kernels"
    sources = [
        Source(f, _module_of(root, f))
        for f in sorted(kernels.rglob("*.rs"))
        if not (f.name == "tests.rs" or f.name.endswith("_tests.rs"))
    ]
    by_module = {s.module: s for s in sources}
    # `#[path]`/test-only children are not in `by_module`; inline modules belong to their file.
    test_children = {
        s.module + (c,) for s in sources for c in s.children if s.module + (c,) not in by_module
    }

    def resolve(scope: tuple[str, ...], text: str) -> tuple[tuple[str, ...], list[str]] | None:
        segs = text.split("::")
        base: tuple[str, ...]
        if segs[0] == "crate":
            base, rest = ("crate",), segs[1:]
        elif segs[0] in ("self", "super"):
            base, rest = scope, segs
            while rest and rest[0] in ("self", "super"):
                base = base if rest[0] == "self" else base[:-1]
                rest = rest[1:]
        else:  # a bare `use child::...` (only children of the file's module resolve)
            base, rest = scope, segs
        full = base + tuple(rest)
        # The longest prefix that is a file module.
        for n in range(len(full), 0, -1):
            if full[:n] in by_module:
                return full[:n], list(full[n:])
        return None

    def target(scope: tuple[str, ...], text: str, seen: int = 0) -> tuple[str, ...] | None:
        hit = resolve(scope, text)
        if hit is None:
            return None
        module, rest = hit
        src = by_module[module]
        if rest and rest[0] in src.reexports and seen < 8:
            scope2, text2 = src.reexports[rest[0]]
            return target(scope2, text2, seen + 1) or module
        return module

    def doc_target(scope: tuple[str, ...], segs: list[str]) -> tuple[str, ...] | None:
        """The module a doc comment's path names (see the module docs), or None."""
        if segs[0] in ("crate", "self", "super"):
            hit = resolve(scope, "::".join(segs))
            return None if hit is None else hit[0]
        for n in range(len(scope), 0, -1):
            base = scope[:n]
            if base + (segs[0],) not in by_module:
                continue
            full = base + tuple(segs)
            for m in range(len(full), n, -1):
                if full[:m] in by_module:
                    return full[:m]
        return None

    for s in sources:
        for scope, text, pub in s.paths:
            if pub:
                name = text.split("::")[-1]
                s.reexports[name] = (scope, text)

    graph: dict[str, set[str]] = {"::".join(s.module[1:]): set() for s in sources}
    for s in sources:
        me = "::".join(s.module[1:])
        found: list[tuple[str, ...] | None] = []
        for scope, text, pub in s.paths:
            first = text.split("::")[0]
            if not pub and (first in ("crate", "self", "super") or first in s.children):
                found.append(target(scope, text))
        found += [doc_target(scope, segs) for scope, segs in s.docs]
        for t in found:
            if t is None or t in test_children or t[:2] != ("crate", "kernels"):
                continue
            name = "::".join(t[1:])
            if name != me and name != "kernels":
                graph[me].add(name)
    return graph


def folders(root: Path) -> set[str]:
    """Modules that are folders (`kernels/matmul/mod.rs` is `kernels::matmul`)."""
    return {
        "::".join(_module_of(root, f)[1:])
        for f in (root / "kernels").rglob("mod.rs")
        if f.parent != root / "kernels"
    }


def layer_errors(graph: dict[str, set[str]], dirs: set[str]) -> list[str]:
    """Edges that break the tree's layering even without a cycle: a module importing the
    dispatch (`mod.rs`) of a folder it sits in, and `arch/` importing a family's dispatch."""
    out = []
    for v in sorted(graph):
        for w in sorted(graph[v]):
            if w in dirs and v.startswith(w + "::"):
                out.append(f"{v} -> {w}: a family's module imports its own dispatch")
            elif v.startswith("kernels::arch::") and w in dirs and "::arch" not in w:
                out.append(f"{v} -> {w}: arch/ imports a family's dispatch")
    return out


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One cycle inside the component, as a path that returns to its start."""
    members = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [start]
                    while v != start:
                        path.append(v)
                        v = prev[v]
                    return [start, *reversed(path[1:]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("crates/poot-cpu/src"))
    ap.add_argument("--allow", type=Path, help="known cycle edges, which may only shrink")
    ap.add_argument("--write-allow", type=Path, help="record today's cycle edges there")
    ap.add_argument("--graph", action="store_true", help="print every edge")
    args = ap.parse_args(argv)
    graph = build_graph(args.root)
    if args.graph:
        for v in sorted(graph):
            for w in sorted(graph[v]):
                print(f"{v} -> {w}")
    comps = sccs(graph)
    in_comp = {v: i for i, c in enumerate(comps) for v in c}
    cyc = {
        f"{v} -> {w}"
        for v in graph
        for w in graph[v]
        if v in in_comp and in_comp.get(w) == in_comp[v]
    }
    n_mod = sum(len(c) for c in comps)
    print(
        f"kernel modules: {len(graph)}; in import cycles: {n_mod} "
        f"({len(comps)} component(s), {len(cyc)} cycle edge(s))"
    )
    for c in comps:
        print(f"  component of {len(c)}: {', '.join(c)}")
        print(f"    e.g. {' -> '.join(a_cycle(graph, c))}")
    if args.write_allow:
        args.write_allow.write_text("".join(f"{e}\n" for e in sorted(cyc)))
        print(f"wrote {len(cyc)} edge(s) to {args.write_allow}")
        return 0
    allowed: set[str] = set()
    if args.allow:
        allowed = {
            ln.strip()
            for ln in args.allow.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")
        }
    layering = layer_errors(graph, folders(args.root))
    for e in layering:
        print(f"layering: {e}")
    new, stale = sorted(cyc - allowed), sorted(allowed - cyc)
    for e in new:
        print(f"new cycle edge (not in the allowlist): {e}")
    for e in stale:
        print(f"allowlist entry no longer on a cycle, remove it: {e}")
    if args.allow:
        print(f"allowlist: {len(allowed)} edge(s), must only shrink")
    return 1 if new or stale or layering else 0


if __name__ == "__main__":
    sys.exit(main())
