from __future__ import annotations

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.cli import main


class Run:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:  # shown by pytest when an assertion fails
        return f"Run(code={self.code}, out={self.out!r}, err={self.err!r})"


@pytest.fixture
def cli(capsys):
    """cli("convert", SRC, DST, ...) -> Run, in-process, exit code included."""

    def run(*args: str) -> Run:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def export(tmp_path):
    """export(name="src", config=None, **write_checkpoint kwargs) -> Path; ModelOpt style by default."""

    def make(name: str = "src", config=None, **kw):
        if kw.get("quant") and "style" not in kw:
            kw["style"] = "modelopt"
        return fixtures.write_checkpoint(tmp_path / name, config, **kw)

    return make
