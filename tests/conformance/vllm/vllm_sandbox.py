"""Load the released vLLM's own Python sources into this process, with only serving infrastructure stubbed.

The wheel's modules are imported under their real names (`vllm.model_executor.models.lilicorr`, ...) from the
unpacked wheel, so their absolute and relative imports resolve as in an installed vLLM. Each `vllm.*` module is
one of:

- REAL: executed from the wheel, unchanged;
- EXTRACTED: a module holding only some top-level definitions of the released file (classes, functions,
  constants), executed from the wheel's source text with the imports those definitions use. This is how a
  released function is reached when the rest of its file is serving infrastructure (kernels, MoE, workers);
- STUB: serving infrastructure written by this harness (vllm_stubs.py): tensor parallelism, platforms, CUDA
  kernels, attention backends, the config objects;
- a package on the way to one of these, created empty (its `__init__` is not run unless listed in REAL).

Any other `vllm.*` import fails loudly, so nothing is stubbed by accident. Nothing of the wheel is copied
into this repository: the sources are read from `.cache/engines` at test time.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path


class SandboxError(ImportError):
    pass


class Extract:
    """A module made of selected top-level definitions of the released file `module`.

    `names` are the definitions kept (a class, a function, an assignment target); `drop` maps a kept class to
    the names of class-body statements removed (a class attribute computed from a sibling class of the same
    file that is not extracted). Imports are executed only for the names the kept definitions use.
    """

    def __init__(
        self,
        names: Iterable[str],
        drop: dict[str, tuple[str, ...]] | None = None,
        methods: dict[str, tuple[str, ...]] | None = None,
        only: dict[str, tuple[str, ...]] | None = None,
    ):
        self.names = tuple(names)
        self.drop = drop or {}
        # kept class -> the only class-body definitions kept (its other methods reach serving infrastructure)
        self.only = only or {}
        # class -> methods lifted out as module-level functions (a staticmethod of a class not extracted)
        self.methods = methods or {}


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


class _Names(ast.NodeVisitor):
    """Names a definition uses at run time (annotations are strings under `from __future__ import annotations`)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        self.used.add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        return None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        for default in (*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]):
            self.visit(default)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)


def _used_names(nodes: Iterable[ast.AST]) -> set[str]:
    visitor = _Names()
    for node in nodes:
        visitor.visit(node)
    return visitor.used


def extracted_source(path: Path, spec: Extract) -> tuple[str, list[str]]:
    """(code, missing): the kept definitions plus the imports they use, as one module's source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    kept: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in spec.methods:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in spec.methods[node.name]:
                    item.decorator_list = [
                        d
                        for d in item.decorator_list
                        if not (isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod"))
                    ]
                    kept.append(item)
                    found.add(item.name)
        bound = _bound_names(node)
        if not bound & set(spec.names):
            continue
        if isinstance(node, ast.ClassDef) and node.name in spec.drop:
            node.body = [s for s in node.body if not (_bound_names(s) & set(spec.drop[node.name]))] or [
                ast.Pass()
            ]
        if isinstance(node, ast.ClassDef) and node.name in spec.only:
            keep = set(spec.only[node.name])
            node.body = [
                s
                for s in node.body
                if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) or s.name in keep
            ] or [ast.Pass()]
        kept.append(node)
        found |= bound
    missing = sorted(set(spec.names) - found)
    used = _used_names(kept)
    imports: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            aliases = [a for a in node.names if (a.asname or a.name) in used]
            if aliases:
                imports.append(ast.ImportFrom(module=node.module, names=aliases, level=node.level))
        elif isinstance(node, ast.Import):
            aliases = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
            if aliases:
                imports.append(ast.Import(names=aliases))
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
    module = ast.Module(
        body=[
            ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0),
            *imports,
            *kept,
        ],
        type_ignores=[],
    )
    ast.fix_missing_locations(module)
    return ast.unparse(module), missing


class Sandbox(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder serving `vllm.*` from the unpacked wheel at `root` (the directory holding `vllm/`)."""

    def __init__(
        self,
        root: Path,
        real: Iterable[str],
        extracted: dict[str, Extract],
        stubs: dict[str, Callable[[types.ModuleType], None]],
        packages_with_path: Iterable[str] = (),
    ):
        self.root = root
        self.real = set(real)
        self.extracted = extracted
        self.stubs = stubs
        # stub packages whose real submodules are still served from the wheel (vllm.config -> vllm.config.utils)
        self.packages_with_path = set(packages_with_path)
        self.installed: list[str] = []

    # -- importlib protocol

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        rel = fullname.replace(".", "/")
        directory = self.root / rel
        if fullname in self.real:
            if directory.is_dir():
                return importlib.util.spec_from_file_location(
                    fullname, directory / "__init__.py", submodule_search_locations=[str(directory)]
                )
            return importlib.util.spec_from_file_location(fullname, self.root / f"{rel}.py")
        if fullname in self.stubs or fullname in self.extracted:
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=directory.is_dir())
            if directory.is_dir():
                spec.submodule_search_locations = [str(directory)]
            return spec
        if directory.is_dir() and self._leads_somewhere(fullname):
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = [str(directory)]
            return spec
        raise SandboxError(
            f"the conformance harness neither loads nor stubs released module {fullname!r}: "
            "add it to the sandbox's real, extracted or stub modules"
        )

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        self.installed.append(name)
        if name in self.stubs:
            self.stubs[name](module)
            return
        if name in self.extracted:
            path = self.root / (name.replace(".", "/") + ".py")
            if not path.exists():
                path = self.root / name.replace(".", "/") / "__init__.py"
            code, missing = extracted_source(path, self.extracted[name])
            if missing:
                raise SandboxError(f"{path}: the release has no top-level {', '.join(missing)}")
            module.__file__ = str(path)
            exec(compile(code, f"{path} (extracted)", "exec"), module.__dict__)
            return
        # an empty package on the way to a real module

    def _leads_somewhere(self, package: str) -> bool:
        prefix = package + "."
        return any(n.startswith(prefix) for n in (*self.real, *self.extracted, *self.stubs))

    # -- lifecycle

    def install(self) -> None:
        clashing = [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]
        if clashing:
            raise SandboxError(
                f"a vllm package is already imported ({clashing[0]}); the harness needs its own"
            )
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]

    def module(self, name: str) -> types.ModuleType:
        return importlib.import_module(name)
