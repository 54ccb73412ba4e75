"""The Python API (docs/api.md), `python -m lilicorr_ckpt`, and flags spelt the same across commands."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

import lilicorr_ckpt
from lilicorr_ckpt import fixtures
from lilicorr_ckpt.cli import main

from helpers import REPO

DRAFTER = str(REPO / "examples" / "tiny-lilicorr")
TARGET = str(REPO / "examples" / "tiny-target")


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_validate_returns_the_report_the_command_line_prints(make_ckpt, capsys):
    broken = make_ckpt("b", fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6}))
    report = lilicorr_ckpt.validate(str(broken), runtime="vllm", target=TARGET)
    assert isinstance(report, lilicorr_ckpt.Report)
    assert report.exit_code == 1 and [v.runtime for v in report.runtimes] == ["vllm"]
    assert any(f.rule == "LC104" for f in report.findings)
    _, out, _ = run(capsys, "validate", str(broken), "--runtime", "vllm", "--target", TARGET, "-f", "json")
    assert msgspec.to_builtins(report) == json.loads(out)


def test_validate_applies_waivers_and_raises_input_errors(make_ckpt, tmp_path):
    warned = make_ckpt("w", fixtures.draft_config(block_size=16))
    assert lilicorr_ckpt.validate(str(warned), strict=True).exit_code == 1
    waived = lilicorr_ckpt.validate(str(warned), strict=True, ignore="LC111")
    assert waived.exit_code == 0 and waived.summary.waived == 1
    with pytest.raises(lilicorr_ckpt.InputError, match="no such directory"):
        lilicorr_ckpt.validate(str(tmp_path / "missing"))
    with pytest.raises(lilicorr_ckpt.UsageError, match="not a rule id"):
        lilicorr_ckpt.validate(str(warned), ignore="XX999")


def test_convert_and_smoke_entry_points_exist_and_refuse_unknown_options():
    from lilicorr_ckpt.convert import ConvertOptions, convert
    from lilicorr_ckpt.smoke import SmokeOptions, smoke

    assert callable(convert) and ConvertOptions().runtime == "all" and SmokeOptions(path="a", target="b").limit == 8
    with pytest.raises(lilicorr_ckpt.UsageError, match="bogus"):
        smoke(DRAFTER, target=TARGET, bogus=1)


def test_load_drafter_is_the_tooling_s_validating_loader_and_not_the_runtime_s(make_ckpt):
    torch = pytest.importorskip("torch")
    import lilicorr_runtime
    from lilicorr_ckpt.smoke.load import load_drafter

    assert lilicorr_ckpt.load_drafter is load_drafter and "load_drafter" in lilicorr_ckpt.__all__
    assert not hasattr(lilicorr_runtime, "load_drafter") and "load_drafter" not in lilicorr_runtime.__all__
    drafter = lilicorr_ckpt.load_drafter(DRAFTER, runtime="vllm", dtype="bf16")
    assert next(drafter.parameters()).dtype == torch.bfloat16
    broken = make_ckpt("b", fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6}))
    with pytest.raises(lilicorr_runtime.CheckpointRefused, match="LC104"):
        lilicorr_ckpt.load_drafter(str(broken), runtime="vllm")


def test_python_dash_m_runs_the_cli_and_importing_the_package_stays_light():
    code = ("import sys, lilicorr_ckpt; assert not any(m.startswith('lilicorr_ckpt.') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('lilicorr_ckpt.'))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
    proc = subprocess.run([sys.executable, "-m", "lilicorr_ckpt", "validate", DRAFTER, "-q"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS")


@pytest.mark.parametrize("command", ["validate", "inspect", "report", "card", "smoke", "convert"])
def test_every_command_takes_quiet(command, capsys):
    _, out, _ = run(capsys, command, "--help")
    assert "-q, --quiet" in out


@pytest.mark.parametrize("command", ["validate", "inspect", "report", "card", "smoke"])
def test_one_name_for_writing_the_report_to_a_file(command, capsys):
    _, out, _ = run(capsys, command, "--help")
    assert "-o, --output" in out and "--out " not in out


def test_the_old_out_spelling_is_a_hidden_alias(tmp_path, capsys):
    code, _, err = run(capsys, "smoke", DRAFTER, "-t", TARGET, "--output", str(tmp_path / "a.json"),
                       "--out", str(tmp_path / "b.json"))
    assert code == 4 and "--out (its old spelling)" in err


def test_inspect_writes_to_a_file_and_quiet_is_the_verdicts(tmp_path, capsys):
    code, out, _ = run(capsys, "inspect", DRAFTER, "-f", "json", "-o", str(tmp_path / "i.json"))
    assert code == 0 and out == "" and json.loads((tmp_path / "i.json").read_text())["architecture"]
    code, out, _ = run(capsys, "inspect", DRAFTER, "-q")
    assert code == 0 and out.startswith("runtimes") and out.count("\n") == 1
