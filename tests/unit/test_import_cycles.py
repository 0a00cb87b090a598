"""No import cycle among the product's modules (STYLE.md habit 15).

Walks every module under ``distronet/`` with ``ast`` and counts every first-party import — at the
top, inside functions and under ``TYPE_CHECKING`` alike, since each ties two files together for a
reader — then looks for strongly connected groups (Tarjan). A package's ``__init__`` importing its
own submodule, and a module importing its parent package, are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent / "distronet"


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("distronet", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up) + ("." + base if base else "")
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for name in names:
                target = _resolve(name, mods)
                if (
                    target
                    and target != mod
                    and not mod.startswith(target + ".")
                    and target != mod.rpartition(".")[0]
                ):
                    edges[mod].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursive Tarjan: the module graph is a few hundred deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_walker_finds_a_cycle() -> None:
    """The check itself can fail: a two-module loop is a cycle, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_product() -> None:
    mods = _modules()
    assert len(mods) > 100, f"found only {len(mods)} modules under {ROOT}"
    assert _cycles(_edges(mods)) == []
