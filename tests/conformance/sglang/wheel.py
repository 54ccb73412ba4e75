"""Import chosen modules of the released SGLang wheel, stubbing only what serves a model, not what loads one.

SGLang's module graph pulls in thousands of modules (CUDA kernels, the scheduler, the HTTP server); importing
it whole takes half a minute and needs a GPU stack. This importer loads only the wheel files that decide
whether a drafter checkpoint loads, each under its real module name so their own imports resolve to each other:

- `WHOLE` modules are executed unchanged from the wheel;
- `PARTIAL` modules run their import statements, then only the named top-level definitions (functions,
  classes, constants, or `Class.method` picked out of a large class) copied from the wheel file by `ast`;
- every other `sglang.*` module is a stub: names listed for it in the stub table are serving infrastructure
  written here (tensor-parallel collectives, attention backends, CUDA kernels, distributed state); any other
  name it is asked for is a `Poison` that fails loudly, naming itself, the moment it is called or tested. A
  stub can therefore never stand in silently for logic that decides a verdict.

Nothing is copied into this repository: the code is read from the unpacked wheel at test time.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import textwrap
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class StubUsed(RuntimeError):
    """The wheel reached a piece of serving infrastructure the harness does not model."""


class Poison:
    """A name a stub module was asked for but does not provide: importable, unusable."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)

    def _fail(self, *_: Any, **__: Any):
        raise StubUsed(f"{self._qualname} is not modelled by the SGLang conformance harness")

    __call__ = _fail
    __bool__ = _fail
    __iter__ = _fail
    __len__ = _fail
    __getitem__ = _fail
    __int__ = _fail
    __index__ = _fail
    __float__ = _fail
    __enter__ = _fail
    __eq__ = _fail
    __lt__ = _fail
    __hash__ = object.__hash__

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Poison(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases):
        # `class X(Poison)`: a class whose construction fails, so defining it at import time is harmless
        qualname = self._qualname

        def refuse(cls, *_: Any, **__: Any):
            raise StubUsed(f"{qualname} (a base class) is not modelled by the SGLang conformance harness")

        return (type(qualname.rsplit(".", 1)[-1], (), {"__new__": refuse}),)

    def __repr__(self) -> str:
        return f"<poison {self._qualname}>"


class StubModule(types.ModuleType):
    def __init__(self, name: str, attrs: dict[str, Any]):
        super().__init__(name)
        self.__path__: list[str] = []
        self.__dict__.update(attrs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = Poison(f"{self.__name__}.{name}")
        self.__dict__[name] = value
        return value


class Partial:
    """Which top-level definitions of a wheel file to run: `names` (functions, classes, assignments) and
    `methods` ({class: [method, ...]}: a class rebuilt from these methods only)."""

    def __init__(self, names: Iterable[str] = (), methods: dict[str, list[str]] | None = None):
        self.names = tuple(names)
        self.methods = dict(methods or {})


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _partial_source(path: Path, spec: Partial) -> tuple[list[ast.stmt], str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    wanted = set(spec.names)
    found: set[str] = set()
    chunks: list[str] = []
    source = path.read_text()
    for node in tree.body:
        names = _defined_names(node)
        if wanted.intersection(names):
            found.update(wanted.intersection(names))
            chunks.append(ast.get_source_segment(source, node, padded=False) or "")
            decorators = getattr(node, "decorator_list", [])
            if decorators:  # ast.get_source_segment leaves decorators out
                chunks[-1] = "\n".join("@" + ast.unparse(d) for d in decorators) + "\n" + chunks[-1]
        if isinstance(node, ast.ClassDef) and node.name in spec.methods:
            bodies = []
            for item in node.body:
                if (
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and item.name in spec.methods[node.name]
                ):
                    segment = ast.get_source_segment(source, item) or ""
                    decorators = "".join(f"@{ast.unparse(d)}\n" for d in item.decorator_list)
                    bodies.append(textwrap.indent(decorators + textwrap.dedent(segment), "    "))
                    found.add(f"{node.name}.{item.name}")
            chunks.append(f"class {node.name}:\n" + "\n".join(bodies))
    missing = wanted - found
    missing |= {f"{c}.{m}" for c, ms in spec.methods.items() for m in ms} - found
    if missing:
        raise RuntimeError(f"{path}: the pinned wheel no longer defines {sorted(missing)}")
    # the wheel's files postpone annotations; the extracted definitions must too (they name stubbed types)
    return imports, "from __future__ import annotations\n\n" + "\n\n".join(chunks)


class WheelImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(
        self, root: Path, whole: set[str], partial: dict[str, Partial], stubs: dict[str, dict[str, Any]]
    ):
        self.root = root
        self.whole = whole
        self.partial = partial
        self.stubs = stubs

    def file_of(self, name: str) -> Path:
        base = self.root.joinpath(*name.split("."))
        if (base / "__init__.py").exists():
            return base / "__init__.py"
        return base.with_suffix(".py")

    def find_spec(self, name, path, target=None):
        if name != "sglang" and not name.startswith("sglang."):
            return None
        if name in self.whole:
            file = self.file_of(name)
            is_package = file.name == "__init__.py"
            return importlib.util.spec_from_file_location(
                name, file, submodule_search_locations=[str(file.parent)] if is_package else None
            )
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return StubModule(spec.name, dict(self.stubs.get(spec.name, {})))

    def exec_module(self, module):
        name = module.__name__
        if name not in self.partial:
            return
        path = self.file_of(name)
        imports, body = _partial_source(path, self.partial[name])
        namespace = module.__dict__
        namespace["__file__"] = str(path)
        for node in imports:
            try:
                exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
            except ImportError:
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    namespace.setdefault(bound, Poison(f"{getattr(node, 'module', '')}.{alias.name}"))
        exec(compile(body, str(path), "exec"), namespace)


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


def installed() -> WheelImporter | None:
    """The importer on sys.meta_path, if any."""
    return next((f for f in sys.meta_path if isinstance(f, WheelImporter)), None)


def install(
    root: Path, whole: set[str], partial: dict[str, Partial], stubs: dict[str, dict[str, Any]]
) -> WheelImporter:
    """Put the importer first on sys.meta_path (once; `sglang` must not be importable otherwise). One wheel at
    a time: another must be uninstalled first (they share the module names)."""
    finder = installed()
    if finder is not None:
        if finder.root != root:
            raise RuntimeError(f"SGLang sources already installed from {finder.root}; uninstall them first")
        return finder
    stray = [m for m in sys.modules if _is_sglang(m)]
    if stray:
        raise RuntimeError(
            f"an installed sglang package is already imported ({stray[0]}); the harness reads the "
            f"pinned wheel only"
        )
    finder = WheelImporter(root, whole, partial, stubs)
    sys.meta_path.insert(0, finder)
    return finder


def uninstall(finder: WheelImporter) -> dict[str, types.ModuleType]:
    """Take the importer off sys.meta_path and its modules out of sys.modules; returns them, for `reinstall`.
    Objects already built from them (classes, functions) keep working: they hold their own module namespaces."""
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    return {name: sys.modules.pop(name) for name in [m for m in sys.modules if _is_sglang(m)]}


def reinstall(finder: WheelImporter, modules: dict[str, types.ModuleType]) -> None:
    """Put back a wheel `uninstall` took out (its modules as they were: nothing is executed again)."""
    if installed() is not None or any(_is_sglang(m) for m in sys.modules):
        raise RuntimeError("another SGLang wheel is installed; uninstall it first")
    sys.modules.update(modules)
    sys.meta_path.insert(0, finder)


def constant(path: Path, name: str) -> Any:
    """A literal top-level constant of a wheel file (e.g. a kernel module's width limit)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{path}: no top-level constant {name}")


def extract(path: Path, names: Iterable[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Run the named top-level definitions of a wheel file in `namespace` (a helper a stub module re-exports)."""
    _, body = _partial_source(path, Partial(names))
    exec(compile(body, str(path), "exec"), namespace)
    return namespace


Factory = Callable[[], Any]
