"""Load the released vLLM's own Python sources into this process, with only serving infrastructure stubbed.

The wheel's modules are imported under their real names (`vllm.model_executor.models.lilicorr`, ...) from the
unpacked wheel, so their absolute and relative imports resolve as in an installed vLLM. Each `vllm.*` module is
one of:

- REAL: executed from the wheel, unchanged;
- EXTRACTED: a module holding only some top-level definitions of the released file (classes, functions,
  constants), executed from the wheel's source text with the imports those definitions use. This is how a
  released function is reached when the rest of its file is serving infrastructure (kernels, MoE, workers).
  An Extract may also lift methods out of a class (put back on a stand-in class with `methods_of`), take a run
  of statements out of a long method as a function (Span: e.g. the method handling inside
  `SpeculativeConfig.__post_init__`), pull in the file's own definitions the kept ones use (`closure`), and
  name definitions only some releases have (`optional`);
- STUB: serving infrastructure written by this harness (vllm_stubs.py): tensor parallelism, platforms, CUDA
  kernels, attention backends, the config objects;
- a package on the way to one of these, created empty (its `__init__` is not run unless listed in REAL).

Any other `vllm.*` import fails loudly, so nothing is stubbed by accident. Nothing of the wheel is copied
into this repository: the sources are read from `.cache/engines` at test time.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class SandboxError(ImportError):
    """A released module or name the sandbox does not provide (`module`, and `name` when one name is missing)."""

    def __init__(self, message: str, module: str | None = None, name: str | None = None):
        super().__init__(message)
        self.module, self.missing = module, name


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
        optional: Iterable[str] = (),
        spans: dict[str, Span] | None = None,
        closure: bool = False,
    ):
        self.names = tuple(names)
        self.drop = drop or {}
        # kept class -> the only class-body definitions kept (its other methods reach serving infrastructure)
        self.only = only or {}
        # class -> methods lifted out as module-level functions (a staticmethod of a class not extracted)
        self.methods = methods or {}
        # names (definitions or methods) kept when the release has them: what only some releases define
        self.optional = frozenset(optional)
        # function name -> a run of statements of a released method, made a module-level function
        self.spans = spans or {}
        # also keep the module's top-level definitions the kept ones use (transitively), except the classes
        # whose methods are lifted
        self.closure = closure


class Span:
    """The statements of `cls.method` that follow the first statement `start` matches, up to (not including)
    the first one `stop` matches, in the same block: made a function `name(*, free...)`, whose keyword-only
    arguments are the method's variables the statements read without assigning them (`self`, `spec`, a local
    set earlier in the method), None unless given. How a few deciding statements of a long released method run
    without the rest of it. `start`/`stop` are the statement's source prefix (ast.unparse) or a predicate."""

    def __init__(
        self,
        cls: str,
        method: str,
        start: str | tuple[str, ...] | Callable[[ast.stmt], bool] | None,
        stop: str | tuple[str, ...] | Callable[[ast.stmt], bool],
    ):
        self.cls, self.method = cls, method
        # start None: from the method's first statement
        self.start = None if start is None else _matcher(start)
        self.stop = _matcher(stop)

    def find(self, tree: ast.Module) -> list[ast.stmt] | None:
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == self.cls:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == self.method:
                        return self._in_block(item.body)
        return None

    def _in_block(self, block: list[ast.stmt]) -> list[ast.stmt] | None:
        if self.start is None:
            return self._until_stop(block)
        for i, stmt in enumerate(block):
            if self.start(stmt):
                return self._until_stop(block[i + 1 :])
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    found = self._in_block(inner)
                    if found is not None:
                        return found
            for handler in getattr(stmt, "handlers", None) or []:
                found = self._in_block(handler.body)
                if found is not None:
                    return found
        return None

    def _until_stop(self, block: list[ast.stmt]) -> list[ast.stmt] | None:
        out = []
        for stmt in block:
            if self.stop(stmt):
                return out
            # a docstring is no statement of the span
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                out.append(stmt)
        return None  # no stop in the same block: the release's method changed shape


def _matcher(test: str | tuple[str, ...] | Callable[[ast.stmt], bool]) -> Callable[[ast.stmt], bool]:
    if callable(test):
        return test
    prefixes = (test,) if isinstance(test, str) else test
    return lambda stmt: ast.unparse(stmt).startswith(prefixes)


def span_function(tree: ast.Module, name: str, span: Span) -> ast.FunctionDef | None:
    """The span as a function definition (None when the release's method has no such span)."""
    body = span.find(tree)
    if body is None:
        return None
    free = sorted(
        n for n in _used_names(body) - _assigned(body) - _module_names(tree) if not hasattr(builtins, n)
    )
    args = ast.arguments(
        posonlyargs=[],
        args=[],
        kwonlyargs=[ast.arg(n) for n in free],
        kw_defaults=[ast.Constant(None) for _ in free],
        defaults=[],
    )
    function = ast.FunctionDef(name=name, args=args, body=body, decorator_list=[], returns=None)
    if "type_params" in ast.FunctionDef._fields:
        function.type_params = []
    return function


def _module_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level: definitions and imports (not those under TYPE_CHECKING)."""
    return {n for node in tree.body for n in _bound_names(node)} | {
        (a.asname or a.name).split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for a in node.names
    }


def _assigned(nodes: Iterable[ast.AST]) -> set[str]:
    out: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                out.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                out |= {(a.asname or a.name).split(".")[0] for a in sub.names}
            elif (
                isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler))
                and sub.name  # an `except E:` binds nothing
            ):
                out.add(sub.name)
    return out


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
    lifted: list[ast.stmt] = []  # spans and methods, made module-level functions
    kinds: dict[str, str] = {}  # a lifted method -> "method", "staticmethod", "classmethod" or "property"
    selected: set[int] = set()  # top-level statements kept whole (their index)
    found: set[str] = set()
    for name, span in spec.spans.items():
        function = span_function(tree, name, span)
        if function is not None:
            lifted.append(function)
            found.add(name)
    for index, node in enumerate(tree.body):
        if isinstance(node, ast.ClassDef) and node.name in spec.methods:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in spec.methods[node.name]:
                    kind = next(
                        (
                            d.id
                            for d in item.decorator_list
                            if isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "property")
                        ),
                        "method",
                    )
                    item.decorator_list = [
                        d
                        for d in item.decorator_list
                        if not (
                            isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "property")
                        )
                    ]
                    lifted.append(item)
                    kinds[item.name] = kind
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
        selected.add(index)
        found |= bound
    while spec.closure:  # the module's own definitions the kept ones use, transitively
        used = _used_names([*lifted, *(tree.body[i] for i in selected)])
        more = {
            i
            for i, node in enumerate(tree.body)
            if i not in selected
            and _bound_names(node) & used
            and not (isinstance(node, ast.ClassDef) and node.name in spec.methods)
        }
        if not more:
            break
        selected |= more
    kept = [tree.body[i] for i in sorted(selected)] + lifted
    wanted = set(spec.names) | {m for ms in spec.methods.values() for m in ms} | set(spec.spans)
    missing = sorted(wanted - found - spec.optional)
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
            # how each lifted method was defined (the class it came from gets it back: methods_of)
            ast.parse(f"__lifted__ = {kinds!r}").body[0],
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
            "add it to the sandbox's real, extracted or stub modules",
            module=fullname,
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
                raise SandboxError(
                    f"{path}: the release has no top-level {', '.join(missing)}", module=name, name=missing[0]
                )
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

    def function_from_span(self, module_name: str, name: str, span: Span) -> Callable[..., Any] | None:
        """A span (Span) of a loaded module's source as a function over that module's globals, or None when the
        release has no such span."""
        module = self.module(module_name)
        tree = ast.parse(Path(module.__file__).read_text(), filename=module.__file__)
        function = span_function(tree, name, span)
        if function is None:
            return None
        code = ast.Module(body=[function], type_ignores=[])
        ast.fix_missing_locations(code)
        local: dict[str, Any] = {}
        exec(compile(code, f"{module.__file__} (span {name})", "exec"), module.__dict__, local)
        return local[name]


def methods_of(module: types.ModuleType) -> dict[str, Any]:
    """The methods an Extract lifted out of a class, ready to put back on a stand-in class (a staticmethod as a
    staticmethod, a property as a property)."""
    wrap = {"staticmethod": staticmethod, "classmethod": classmethod, "property": property}
    return {
        name: wrap[kind](getattr(module, name)) if kind in wrap else getattr(module, name)
        for name, kind in getattr(module, "__lifted__", {}).items()
    }
