"""The package layout as a contract: no import cycle, and the runtime reads checkpoints but never judges them."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGES = ("lilicorr_ckpt", "lilicorr_runtime")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level?) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, id(node) in top))
    return out


def _graph() -> dict[str, dict[str, bool]]:
    graph: dict[str, dict[str, bool]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            edges = graph.setdefault(_module(path), {})
            for target, module_level in _imports(path):
                if target.startswith(PACKAGES):
                    edges[target] = edges.get(target, False) or module_level
    return graph


def test_the_runtime_imports_only_the_checkpoint_reader():
    bad = [(mod, target) for mod, edges in _graph().items() if mod.startswith("lilicorr_runtime")
           for target in edges if target.startswith("lilicorr_ckpt")
           and not (target == "lilicorr_ckpt.checkpoint" or target.startswith("lilicorr_ckpt.checkpoint."))
           # the validating convenience loader is the tooling's, re-exported lazily (PEP 562 __getattr__)
           and (mod, target) != ("lilicorr_runtime", "lilicorr_ckpt.smoke.load")]
    assert bad == []


def test_module_level_imports_have_no_cycle():
    graph = {m: {t for t, top in edges.items() if top} for m, edges in _graph().items()}

    def resolve(target: str) -> str | None:
        while target and target not in graph:
            target = target.rpartition(".")[0]
        return target or None

    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = 1
        for target in sorted(graph[mod]):
            dep = resolve(target)
            # a package's __init__ importing its own submodules is how a package is assembled, not a cycle
            if dep is None or dep == mod or mod.startswith(dep + "."):
                continue
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep):], dep] if dep in stack else [mod, dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert cycles == []
