"""The Python API (docs/api.md), `python -m lilicorr_ckpt`, and flags spelt the same across commands."""

from __future__ import annotations

import hashlib
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
MODELOPT = str(REPO / "examples" / "tiny-modelopt-nvfp4")


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


def test_convert_returns_the_record_it_wrote_and_raises_its_refusals(tmp_path):
    from lilicorr_ckpt.convert import ConversionRefused, ConvertOptions, convert

    dst = tmp_path / "out"
    result = convert(MODELOPT, str(dst), ConvertOptions(quiet=True))
    assert result.written and result.src == MODELOPT and result.dst == str(dst) and result.kept == []
    assert result.record == json.loads((dst / "conversion.json").read_text())
    on_disk = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in dst.iterdir()
        if p.name != "conversion.json"
    }
    assert result.record["written"] == on_disk and "model.safetensors" in on_disk
    # convert judges for the newest released engines unless told otherwise
    assert result.report.exit_code == 0 and [v.accepted for v in result.report.runtimes] == [True, True]
    again = lilicorr_ckpt.validate(
        str(dst), runtime="sglang,vllm"
    )  # the output, read back as validate reads it
    assert result.report.runtimes == again.runtimes and result.report.findings == again.findings
    dry = convert(MODELOPT, str(tmp_path / "dry"), ConvertOptions(dry_run=True, quiet=True))
    assert (
        not dry.written
        and not (tmp_path / "dry").exists()
        and dry.record["renames"] == result.record["renames"]
    )
    with pytest.raises(ConversionRefused, match="--no-repair") as refused:
        convert(MODELOPT, str(tmp_path / "unrepaired"), ConvertOptions(repair=False, quiet=True))
    assert refused.value.reasons and all("must stay floating point" in r for r in refused.value.reasons)
    with pytest.raises(lilicorr_ckpt.UsageError, match="already exists; pass --force"):
        convert(MODELOPT, str(dst), ConvertOptions(quiet=True))
    assert not (tmp_path / "unrepaired").exists()


def test_every_validate_format_renders_the_report_the_api_returned(make_ckpt):
    from lilicorr_ckpt.report.formats import VALIDATE, render_validate

    broken = make_ckpt("b", fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6}))
    report = lilicorr_ckpt.validate(str(broken), runtime="vllm")
    rendered = {fmt: render_validate(report, fmt) for fmt in VALIDATE}
    assert json.loads(rendered["json"]) == msgspec.to_builtins(report)
    assert all("LC104" in text for fmt, text in rendered.items() if fmt != "github-output"), rendered
    assert rendered["text"].splitlines()[-1].startswith("FAIL")
    assert (
        rendered["github-output"].startswith("exit-code<<")
        and '{"vllm":"refuses"}' in rendered["github-output"]
    )
    with pytest.raises(ValueError, match="unknown validate format 'yaml'"):
        render_validate(report, "yaml")


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
    code = (
        "import sys, lilicorr_ckpt; assert not any(m.startswith('lilicorr_ckpt.') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith('lilicorr_ckpt.'))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "lilicorr_ckpt", "validate", DRAFTER, "-q"], capture_output=True, text=True
    )
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
    code, _, err = run(
        capsys,
        "smoke",
        DRAFTER,
        "-t",
        TARGET,
        "--output",
        str(tmp_path / "a.json"),
        "--out",
        str(tmp_path / "b.json"),
    )
    assert code == 4 and "--out (its old spelling)" in err


def test_inspect_writes_to_a_file_and_quiet_is_the_verdicts(tmp_path, capsys):
    code, out, _ = run(capsys, "inspect", DRAFTER, "-f", "json", "-o", str(tmp_path / "i.json"))
    assert code == 0 and out == "" and json.loads((tmp_path / "i.json").read_text())["architecture"]
    code, out, _ = run(capsys, "inspect", DRAFTER, "-q")
    assert code == 0 and out.startswith("runtimes") and out.count("\n") == 1
