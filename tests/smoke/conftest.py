"""Session fixtures for the smoke tests: tiny on-disk targets and drafters, and an in-process CLI runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from smoke_helpers import drafter_config, good_head, write_target, zero_head  # noqa: E402

from lilicorr_ckpt import fixtures  # noqa: E402
from lilicorr_ckpt.cli import main  # noqa: E402

# one prompt per bundled category, few tokens: every run stays around a second
QUICK = ("--limit", "1", "--max-new-tokens", "24", "--no-warmup", "--quiet")


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smoke")


@pytest.fixture(scope="session")
def target(smoke_dir: Path) -> Path:
    return write_target(smoke_dir / "target")


@pytest.fixture(scope="session")
def constant_target(smoke_dir: Path) -> Path:
    return write_target(smoke_dir / "constant-target", constant=True)


@pytest.fixture(scope="session")
def drafter(smoke_dir: Path) -> Path:
    return fixtures.write_checkpoint(smoke_dir / "drafter", drafter_config())


@pytest.fixture(scope="session")
def zero_head_drafter(smoke_dir: Path) -> Path:
    return fixtures.write_checkpoint(smoke_dir / "zero-head", drafter_config(), mutate=zero_head)


@pytest.fixture(scope="session")
def good_head_drafter(smoke_dir: Path) -> Path:
    return fixtures.write_checkpoint(
        smoke_dir / "good-head", drafter_config(lilicorr_candidate_topk=16), mutate=good_head
    )


@pytest.fixture(scope="session")
def zero_head_report(zero_head_drafter: Path, target: Path):
    """One QUICK smoke run of the zero-head drafter, shared by the format tests (json, text, junit render the
    same SmokeReport the CLI would print)."""
    from lilicorr_ckpt.smoke.options import SmokeOptions
    from lilicorr_ckpt.smoke.run import run_smoke

    return run_smoke(
        SmokeOptions(
            path=str(zero_head_drafter),
            target=str(target),
            gpu=False,
            probes="code,chat,math",
            limit=1,
            max_new_tokens=24,
            temperature=0.0,
            seeds=(0,),
            num_speculative_tokens=None,
            min_tau=None,
            min_accept_rates=(),
            min_head_gain=0.05,
            baseline=None,
            tolerance=0.05,
            dtype=None,
            runtime="all",
            warmup=False,
        )
    )


class Outcome:
    def __init__(self, code: int, stdout: str, stderr: str):
        self.code, self.stdout, self.stderr = code, stdout, stderr

    @property
    def report(self) -> dict:
        return json.loads(self.stdout)

    def gate(self, name: str) -> dict:
        return next(g for g in self.report["gates"] if g["name"] == name)


@pytest.fixture
def smoke(capsys: pytest.CaptureFixture[str]):
    """smoke(*args) -> Outcome: `lilicorr-ckpt smoke ...` in this process (torch is imported once)."""

    def run(*args: str) -> Outcome:
        with pytest.raises(SystemExit) as exit_info:
            main(["smoke", *map(str, args)])
        out = capsys.readouterr()
        return Outcome(exit_info.value.code, out.out, out.err)

    return run
