"""The runtime's LILICORR_* settings (lilicorr_runtime/settings.py): read in that module only, listed in one table in
docs/runtime.md that equals the module's registry both ways, each value typed and a bad one refused by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lilicorr_runtime import settings

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "runtime.md"
SETTINGS_MODULE = REPO / "lilicorr_runtime" / "settings.py"


def _doc_table() -> list[str]:
    """The table lines of docs/runtime.md's "Settings" section."""
    lines = DOC.read_text().splitlines()
    start = lines.index("## Settings")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return [line for line in lines[start:end] if line.startswith("|")]


def _names(lines: list[str]) -> set[str]:
    return {line.split("`")[1] for line in lines if line.startswith("| `LILICORR_")}


def test_the_docs_table_lists_exactly_the_registry():
    documented, registered = _names(_doc_table()), {s.name for s in settings.SETTINGS}
    assert not documented - registered, (
        f"in docs/runtime.md but read nowhere: {sorted(documented - registered)}"
    )
    assert not registered - documented, f"read but not in docs/runtime.md: {sorted(registered - documented)}"
    assert len(registered) == len(settings.SETTINGS)  # no name registered twice
    assert _doc_table() == settings.table(), "docs/runtime.md's Settings table differs from settings.table()"


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _lilicorr_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in the code (not a docstring) that names a LILICORR_ variable."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "LILICORR_" in node.value
        and id(node) not in skip
    ]


def test_no_runtime_module_but_settings_names_a_lilicorr_variable():
    found = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in sorted((REPO / "lilicorr_runtime").rglob("*.py"))
        if path != SETTINGS_MODULE
        for line, text in _lilicorr_strings(path)
    ]
    assert not found, "LILICORR_ variables are read in lilicorr_runtime/settings.py only:\n" + "\n".join(
        found
    )


def _environment_reads(path: Path) -> list[tuple[int, str]]:
    """(line, variable) of every read of the environment by a literal name: os.environ.get / [] / `in`,
    os.getenv."""

    def environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id == "environ"
        )

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            reads = isinstance(func, ast.Attribute) and (
                (func.attr == "get" and environ(func.value)) or func.attr == "getenv"
            )
            if reads or (isinstance(func, ast.Name) and func.id == "getenv"):
                name = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and environ(node.value):
            name = node.slice
        elif isinstance(node, ast.Compare) and any(environ(c) for c in node.comparators):
            name = node.left
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            out.append((node.lineno, name.value))
    return out


def test_no_module_of_the_tree_reads_a_runtime_setting_but_settings():
    registered = {s.name for s in settings.SETTINGS}
    found = []
    for top in ("lilicorr_runtime", "lilicorr_ckpt", "lilicorr_train", "bench", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path == SETTINGS_MODULE:
                continue
            for line, name in _environment_reads(path):
                if name in registered or (top == "lilicorr_runtime" and name.startswith("LILICORR_")):
                    found.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not found, "read these through lilicorr_runtime.settings:\n" + "\n".join(found)


def test_the_scan_finds_each_way_of_reading_the_environment(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\nfrom os import environ, getenv\n"
        "a = os.environ.get('LILICORR_A')\nb = os.getenv('LILICORR_B', 'x')\nc = os.environ['LILICORR_C']\n"
        "d = 'LILICORR_D' in os.environ\ne = environ.get('LILICORR_E')\nf = getenv('LILICORR_F')\n"
        "os.environ['LILICORR_G'] = '1'\n"  # a write, not a read
    )
    assert [name for _, name in _environment_reads(probe)] == [f"LILICORR_{c}" for c in "ABCDEF"]


@pytest.mark.parametrize(
    "setting", [s for s in settings.SETTINGS if s.choices is not None], ids=lambda s: s.name
)
def test_every_choice_setting_reads_its_default_its_spellings_and_refuses_the_rest(setting, monkeypatch):
    assert setting.default in setting.choices.values()
    monkeypatch.delenv(setting.name, raising=False)
    assert setting.read() == setting.default
    monkeypatch.setenv(setting.name, "  ")
    assert setting.read() == setting.default
    for spelling, value in setting.choices.items():
        monkeypatch.setenv(setting.name, f" {spelling.upper()} ")
        assert setting.read() == value
    monkeypatch.setenv(setting.name, "sometimes")
    with pytest.raises(settings.SettingError, match=f"{setting.name}='sometimes'") as refused:
        setting.read()
    assert isinstance(refused.value, ValueError)
    assert setting.default in str(refused.value)
    with pytest.raises(settings.SettingError, match=setting.name):
        settings.check()


def test_typed_readers(monkeypatch):
    for setting in settings.SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
    settings.check()
    assert settings.stream_k() is True
    assert settings.gguf_loader() == "direct"
    monkeypatch.setenv("LILICORR_STREAM_K", "no")
    assert settings.stream_k() is False
    monkeypatch.setenv("LILICORR_GGUF_LOADER", "Transformers")
    assert settings.gguf_loader() == "transformers"


def test_cache_files_default_off_and_named(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for setting, file in ((settings.TILE_CACHE, "step_tiles.json"), (settings.KERNEL_CACHE, "kernels.json")):
        monkeypatch.delenv(setting.name, raising=False)
        assert settings.cache_file(setting) == tmp_path / "lilicorr" / file
        monkeypatch.setenv(setting.name, " OFF ")
        assert settings.cache_file(setting) is None
        monkeypatch.setenv(setting.name, "~/tables/t.json")
        assert settings.cache_file(setting) == Path("~/tables/t.json").expanduser()
        monkeypatch.setenv(setting.name, str(tmp_path / "x.json"))
        assert settings.cache_file(setting) == tmp_path / "x.json"
    assert settings.tile_cache() == tmp_path / "x.json" and settings.kernel_cache() == tmp_path / "x.json"


def test_smoke_refuses_a_bad_setting_as_a_usage_error_before_loading(monkeypatch, tmp_path):
    from lilicorr_ckpt.errors import UsageError
    from lilicorr_ckpt.smoke.options import SmokeOptions
    from lilicorr_ckpt.smoke.run import run_smoke

    monkeypatch.setenv("LILICORR_GGUF_LOADER", "llama.cpp")
    missing = str(tmp_path / "nothing-here")  # never read: the setting is judged first
    with pytest.raises(UsageError, match="LILICORR_GGUF_LOADER='llama.cpp'.*direct, transformers"):
        run_smoke(SmokeOptions(path=missing, target=missing))


def test_a_retired_switch_is_ignored_with_one_warning(monkeypatch):
    import warnings

    monkeypatch.setattr(settings, "_warned", set())
    monkeypatch.setenv("LILICORR_LAYER_KERNEL", "on")
    with pytest.warns(RuntimeWarning, match="LILICORR_LAYER_KERNEL is ignored.*measured slower"):
        settings.check()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.check()  # once per process
    assert not set(settings.RETIRED) & {s.name for s in settings.SETTINGS}
    doc = DOC.read_text()
    assert all(f"`{name}" in doc for name in settings.RETIRED)


def test_a_refused_value_is_shown_cut_short(monkeypatch):
    """A value pasted by mistake (100 kB) is quoted in part, with its length, not repeated whole."""
    monkeypatch.setenv("LILICORR_STREAM_K", "x" * 100_000)
    with pytest.raises(settings.SettingError) as refused:
        settings.STREAM_K.read()
    message = str(refused.value)
    assert len(message) < 400 and "(100,000 characters)" in message and "expected one of" in message
