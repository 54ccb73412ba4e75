"""The package layout as a contract: no import cycle, and the runtime reads checkpoints but never judges them."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PACKAGES = ("lilicorr_ckpt", "lilicorr_runtime", "lilicorr_train")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level?) for every import in the file, relative ones resolved. Module level is
    outside every function: what runs on import, `try:` and `if` blocks included, and what only a type checker
    reads (`if TYPE_CHECKING:`), whose cycles are cycles all the same."""
    tree = ast.parse(path.read_text())
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) not in in_function) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, id(node) not in in_function))
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


def _outside_the_reader(target: str) -> bool:
    return target.split(".")[0] == "lilicorr_ckpt" and not (
        target == "lilicorr_ckpt.checkpoint" or target.startswith("lilicorr_ckpt.checkpoint.")
    )


def _reaches_past_the_reader(source: str) -> list[str]:
    """What a runtime module's source names of lilicorr_ckpt outside the reader: imports (module level or inside a
    function) and strings that are module paths (importlib, a lazy export table)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if _outside_the_reader(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and _outside_the_reader(node.module or ""):
            out.append(node.module or "")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"lilicorr_ckpt(\.\w+)*", node.value)
            and _outside_the_reader(node.value)
        ):
            out.append(node.value)
    return out


def test_the_runtime_imports_only_the_checkpoint_reader():
    bad = {
        _module(p): found
        for p in sorted((REPO / "lilicorr_runtime").rglob("*.py"))
        if (found := _reaches_past_the_reader(p.read_text()))
    }
    assert bad == {}


def test_the_runtime_rule_sees_local_imports_and_lazy_tables():
    assert _reaches_past_the_reader(
        "from lilicorr_ckpt.checkpoint import Checkpoint\nimport lilicorr_ckpt.checkpoint.numerics\n"
        "def f():\n    from lilicorr_ckpt.smoke.load import load_drafter\n"
        "_EXPORTS = {'load_drafter': 'lilicorr_ckpt.checks.run', 'x': 'lilicorr_ckpt.checkpoint.load'}\n"
        "DOC = 'see lilicorr_ckpt.load_drafter(path) for the validating loader'\n"
    ) == ["lilicorr_ckpt.smoke.load", "lilicorr_ckpt.checks.run"]


def _type_checking_block(node: ast.stmt) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) at module level: imports only the type checker follows."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _type_only_imports(source: str, module: str, is_package: bool) -> set[str]:
    """The first-party modules a file imports under `if TYPE_CHECKING:`, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    out = set()
    for block in (n for n in ast.parse(source).body if _type_checking_block(n)):
        for node in ast.walk(block):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                out.add(base)
    return {t for t in out if t.startswith(PACKAGES)}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
                cycles.append([*stack[stack.index(dep) :], dep] if dep in stack else [mod, dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return cycles


def test_module_level_imports_have_no_cycle():
    graph = {m: {t for t, top in edges.items() if top} for m, edges in _graph().items()}
    assert _cycles(graph) == []


def test_type_only_imports_close_no_cycle_either():
    """What the type checker follows (module level plus `if TYPE_CHECKING:` blocks) has no cycle: a type-only
    import that closes one is a layering fault deferred, not removed (the data module is imported by both)."""
    graph = {m: {t for t, top in edges.items() if top} for m, edges in _graph().items()}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            graph[_module(path)] |= _type_only_imports(
                path.read_text(), _module(path), path.name == "__init__.py"
            )
    assert _cycles(graph) == []


def test_the_type_only_rule_sees_type_checking_blocks():
    source = (
        "from typing import TYPE_CHECKING\nimport typing\nif TYPE_CHECKING:\n"
        "    from lilicorr_ckpt.checks.run import Report\nif typing.TYPE_CHECKING:\n    from .findings import Finding\n"
        "def f():\n    from lilicorr_ckpt.smoke import run\n"
    )
    assert _type_only_imports(source, "lilicorr_ckpt.checks.waivers", False) == {
        "lilicorr_ckpt.checks.run",
        "lilicorr_ckpt.checks.findings",
    }
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_no_cycle_in_the_runtime_hides_behind_a_function_local_import():
    # a local import can break a cycle at import time (target -> fast_target inside load_target, fast_target ->
    # target at module level) while the two modules still need each other: the runtime and the training recipe
    # have none. (The tooling keeps two on purpose-built boundaries: smoke.options.runner -> smoke.run, the one
    # door to torch, and checks.run <-> checks.waivers.)
    runtime = ("lilicorr_runtime", "lilicorr_train")
    graph = {
        m: {t for t in edges if t.startswith(runtime)}
        for m, edges in _graph().items()
        if m.startswith(runtime)
    }
    assert _cycles(graph) == []


def test_the_cycle_rule_sees_a_cycle_through_a_local_import():
    edges = {"pkg.target": {"pkg.fast_target": False}, "pkg.fast_target": {"pkg.target": True}, "pkg": {}}
    assert _cycles({m: set(e) for m, e in edges.items()}) == [
        ["pkg.fast_target", "pkg.target", "pkg.fast_target"]
    ]
    assert _cycles({m: {t for t, top in e.items() if top} for m, e in edges.items()}) == []
    # a package importing its own submodules is not a cycle; a submodule importing its package's sibling is fine
    assert _cycles({"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}) == []


def test_the_training_recipe_is_beside_the_runtime_and_not_in_the_wheel():
    # the recipe builds on the runtime, never the reverse (the runtime's `train` is the old name's forwarder)
    graph = _graph()
    reaches = {
        m: sorted(t for t in edges if t.startswith("lilicorr_train"))
        for m, edges in graph.items()
        if m.startswith("lilicorr_runtime") and m.split(".")[:2] != ["lilicorr_runtime", "train"]
    }
    assert {m: t for m, t in reaches.items() if t} == {}
    assert {"lilicorr_train.__main__", "lilicorr_train.objective"} <= set(graph)
    # the wheel's packages, as setuptools finds them from pyproject's include patterns
    setuptools = pytest.importorskip("setuptools")
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
    shipped = set(setuptools.find_packages(where=str(REPO), include=include))
    assert not any(p.startswith("lilicorr_train") for p in shipped)
    assert {f"lilicorr_runtime.{sub}" for sub in ("model", "ops", "decode", "target", "train")} <= shipped


# ---------------------------------------------------------------- function-local imports
# A function-local import must serve a boundary; everything else is imported at module level.
OPTIONAL = {"torch", "transformers", "triton", "huggingface_hub", "gguf", "accelerate", "tomli", "tomllib"}
# (1) an optional dependency (above), or a first-party module that brings one the importer does not have
#     (validate, inspect and convert never import torch; the runtime imports triton only on a CUDA path);
# (2) a command body (click), which imports what the command runs when it runs, so that every other command and
#     `--help` start without it; a package's lazy API (`__getattr__`, `smoke()`) likewise;
# (3) the exceptions below, each with its reason.
LAZY = {
    "lilicorr_ckpt._entry:main",  # the console script imports the command line inside its Ctrl-C handler
    "lilicorr_ckpt.cli:validate",
    "lilicorr_ckpt.cli:inspect",
    "lilicorr_ckpt.cli:rules",
    "lilicorr_ckpt.cli:schema",
    "lilicorr_ckpt.cli:rules_markdown",
    "lilicorr_ckpt.cli:rules_page",
    "lilicorr_ckpt.cli:runtimes",
    "lilicorr_ckpt.cli:releases_markdown",
    "lilicorr_ckpt.convert.cli:register.convert_command",
    "lilicorr_ckpt.smoke.cli:smoke",
    "lilicorr_ckpt.report.card:register",
    "lilicorr_ckpt.report.card:register.card",
    "lilicorr_ckpt.report.ci:register",
    "lilicorr_ckpt.report.ci:register_workflow",
    "lilicorr_ckpt.precommit:validate_dir",
    "lilicorr_ckpt.precommit:_apply_waivers",
    "lilicorr_ckpt.precommit:hook",
    "lilicorr_ckpt.smoke:smoke",  # the package's API function: `import lilicorr_ckpt.smoke.cli` stays light
}
EXCEPTIONS = {
    # the command line imports the renderers at start-up (report/formats.py: the --format choices); the rule
    # catalogue SARIF lists brings every check and numpy: at module level, `import lilicorr_ckpt.cli` went from
    # 178 to 330 modules (~70 -> ~300 ms)
    ("lilicorr_ckpt.report.validate:render_sarif", "lilicorr_ckpt.checks"),
    # the guarded reader lives with the checkpoint reader (the runtime may import nothing else), which the command
    # line does not load at start-up: the modules it imports then read their files through it when they run
    ("lilicorr_ckpt.report.ci:load_report", "lilicorr_ckpt.checkpoint.readfile"),
    ("lilicorr_ckpt.report.locate:_lines", "lilicorr_ckpt.checkpoint.readfile"),
    # where pip installed lilicorr-ckpt from, read only to print the missing-extra hint: importlib.metadata took
    # ~110 ms to import on the 2-core box, which every torch-free `smoke --engine` start would pay otherwise
    ("lilicorr_ckpt.install:installed_from", "importlib.metadata"),
}


def _walk_functions(
    node: ast.AST, fn: str | None, found: list[tuple[str, ast.Import | ast.ImportFrom]]
) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk_functions(child, f"{fn}.{child.name}" if fn else child.name, found)
        elif isinstance(child, (ast.Import, ast.ImportFrom)) and fn:
            found.append((fn, child))
        else:
            _walk_functions(child, fn, found)


def _local_imports() -> list[tuple[str, str, str]]:
    """(module, enclosing function path, imported module) for every import inside a function."""
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = _module(path)
            base = module if path.name == "__init__.py" else module.rpartition(".")[0]
            found: list[tuple[str, ast.Import | ast.ImportFrom]] = []
            _walk_functions(ast.parse(path.read_text()), None, found)
            for fn, node in found:
                if isinstance(node, ast.Import):
                    out += [(module, fn, a.name) for a in node.names]
                    continue
                target = node.module or ""
                if node.level:
                    anchor = base.split(".")[: len(base.split(".")) - node.level + 1]
                    target = ".".join(anchor + ([target] if target else []))
                out.append((module, fn, target))
    return out


def _optional_deps() -> dict[str, set[str]]:
    """Per first-party module, the optional dependencies importing it at module level brings (transitively)."""
    direct: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            direct[_module(path)] = {t for t, top in _imports(path) if top}

    def resolve(target: str) -> str | None:
        while target and target not in direct:
            target = target.rpartition(".")[0]
        return target or None

    memo: dict[str, set[str]] = {}

    def deps(mod: str) -> set[str]:
        if mod not in memo:
            memo[mod] = set()
            found = set()
            for target in direct[mod]:
                if target.split(".")[0] in OPTIONAL:
                    found.add(target.split(".")[0])
                elif (dep := resolve(target)) is not None and dep != mod:
                    found |= deps(dep)
            parent = mod.rpartition(".")[0]  # importing a submodule imports its package first
            if parent in direct:
                found |= deps(parent)
            memo[mod] = found
        return memo[mod]

    return {mod: deps(mod) for mod in direct}


def _resolve(target: str, known: dict[str, set[str]]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def _unexplained(entries: list[tuple[str, str, str]]) -> list[str]:
    optional = _optional_deps()
    out = []
    for module, fn, target in entries:
        where = f"{module}:{fn}"
        if target.split(".")[0] in OPTIONAL or where in LAZY or (where, target) in EXCEPTIONS:
            continue
        if target.startswith(PACKAGES):
            dep = _resolve(target, optional)
            if dep is not None and optional[dep] - optional[module]:
                continue  # it brings torch / transformers / triton / huggingface_hub the importer lacks
        out.append(f"{where} imports {target}")
    return out


def test_function_local_imports_serve_a_boundary():
    assert _unexplained(_local_imports()) == [], (
        "import these at module level, or name the boundary they serve"
    )


def test_the_exceptions_are_still_local_imports():
    local = {(f"{module}:{fn}", target) for module, fn, target in _local_imports()}
    assert EXCEPTIONS - local == set()  # an exception whose import moved is deleted with it


def test_the_command_line_starts_without_the_checks():
    # the boundary render_sarif's exception serves: `lilicorr-ckpt --help` and every command start without the
    # catalogue (or the reader, or numpy), which a command loads when it runs
    probe = (
        "import sys, lilicorr_ckpt.cli; print(sorted(m for m in sys.modules if m == 'numpy' or "
        "m.startswith(('lilicorr_ckpt.checks', 'lilicorr_ckpt.checkpoint'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_local_import_rule_tells_a_boundary_from_none():
    optional = _optional_deps()
    assert (
        "torch" in optional["lilicorr_ckpt.smoke.run"]
        and "torch" not in optional["lilicorr_ckpt.convert.pipeline"]
    )
    assert (
        "triton" in optional["lilicorr_runtime.ops.draft_triton"] and not optional["lilicorr_ckpt.checkpoint"]
    )
    assert ("lilicorr_ckpt.convert.pipeline", "_verifier", "lilicorr_ckpt.convert.verify") in _local_imports()
    assert _unexplained(
        [
            ("lilicorr_ckpt.convert.plan", "build_plan", "torch"),  # an optional dependency
            ("lilicorr_ckpt.convert.pipeline", "_verifier", "lilicorr_ckpt.convert.verify"),  # brings torch
            ("lilicorr_runtime.ops", "topk_lse", "lilicorr_runtime.ops.draft_triton"),  # brings triton
            ("lilicorr_ckpt.convert.plan", "build_plan", "lilicorr_ckpt.errors"),  # no boundary
            ("lilicorr_runtime.decode.speculative", "draft_block", "lilicorr_runtime.ops"),  # no boundary
            ("lilicorr_ckpt.smoke.gates", "read_baseline", "json"),  # no boundary
        ]
    ) == [
        "lilicorr_ckpt.convert.plan:build_plan imports lilicorr_ckpt.errors",
        "lilicorr_runtime.decode.speculative:draft_block imports lilicorr_runtime.ops",
        "lilicorr_ckpt.smoke.gates:read_baseline imports json",
    ]


def test_one_list_shortening():
    from lilicorr_ckpt.checkpoint.text import shorten

    assert shorten(["a", "b", "c"], 2) == "`a`, `b` and 1 more" and shorten(iter("ab"), quote="") == "a, b"
    # no other "and N more" in the packages; report/ci.py's and smoke/gates.py's count the detail lines cut from a
    # report (a table's rows, a gate's divergence lines), not names joined into one line
    others = sorted(
        str(p.relative_to(REPO))
        for package in PACKAGES
        for p in (REPO / package).rglob("*.py")
        if re.search(r"and \{len\(", p.read_text())
    )
    assert others == [
        "lilicorr_ckpt/checkpoint/text.py",
        "lilicorr_ckpt/report/ci.py",
        "lilicorr_ckpt/smoke/gates.py",
    ]
