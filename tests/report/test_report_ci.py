"""-f github / -f markdown / -f github-output and `lilicorr-ckpt report` (re-rendering a saved JSON report)."""

from __future__ import annotations

import json

import pytest
from ghrunner import parse_github_output

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.report.ci import json_key_lines, pointer_line
from lilicorr_ckpt.runtimes import PROFILES

from helpers import REPO, run_cli

NVFP4 = REPO / "examples" / "tiny-modelopt-nvfp4"

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


def test_json_key_lines_follow_nesting_arrays_and_escapes():
    text = (
        '{\n  "a": 1,\n  "b": {\n    "c\\"q": [\n      10,\n      {"d": null}\n    ]\n  },\n  "e": "x:y"\n}\n'
    )
    lines = json_key_lines(text)
    assert lines["$.a"] == 2 and lines["$.b"] == 3 and lines['$.b.c"q'] == 4
    assert lines['$.b.c"q[0]'] == 5 and lines['$.b.c"q[1].d'] == 6 and lines["$.e"] == 9
    assert pointer_line(lines, "$.b.missing") == 3  # a missing key: its parent
    assert pointer_line(lines, "$.nothing") is None  # nothing to point at but the file
    assert json_key_lines("{not json") == {}


def test_github_annotations_point_at_the_config_key(tmp_path):
    cfg = fixtures.draft_config()
    cfg["dflash_config"]["mask_token_id"] = 10**6  # outside the vocabulary: LC115
    ckpt = fixtures.write_checkpoint(tmp_path / "bad", cfg)
    result = run_cli("validate", str(ckpt), "-f", "github")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    lc115 = next(line for line in lines if "title=LC115 mask-token" in line)
    line_no = int(lc115.split(",line=", 1)[1].split(",", 1)[0])
    assert '"mask_token_id"' in (ckpt / "config.json").read_text().splitlines()[line_no - 1]
    assert lc115.startswith(f"::error file={ckpt}/config.json,line=")
    assert "%0AFix: " in lc115 and "\n" not in lc115
    assert lines[-1].startswith(f"lilicorr-ckpt validate {ckpt}: FAIL (")


def test_properties_and_data_are_escaped_for_workflow_commands(tmp_path):
    weird = tmp_path / "a,b:c%d"
    fixtures.write_checkpoint(weird, fixtures.draft_config(dflash={"mask_token_id": 10**6}))
    out = run_cli("validate", str(weird), "-f", "github").stdout
    assert "a%2Cb%3Ac%25d/config.json" in out


def test_markdown_summary_and_github_output(tmp_path):
    md = run_cli("validate", str(NVFP4), "-f", "markdown", "--runtime", "vllm")
    assert md.returncode == 1
    assert md.stdout.startswith(f"### ❌ lilicorr-ckpt validate `{NVFP4}`: FAIL")
    assert f"| {VL} | ❌ refuses |" in md.stdout and "SGLang" not in md.stdout
    assert "<br>**fix:**" in md.stdout
    out = run_cli("validate", str(NVFP4), "-f", "github-output", "--runtime", "vllm")
    pairs = parse_github_output(out.stdout)
    assert pairs["exit-code"] == "1" and pairs["result"] == "fail" and pairs["verdict-vllm"] == "refuses"
    assert json.loads(pairs["verdicts"]) == {"vllm": "refuses"}
    assert all(
        line.startswith("ghadelimiter_") or "<<ghadelimiter_" in line or line in pairs.values()
        for line in out.stdout.splitlines()
    )  # every value in the delimiter form


def _resized(tensors):
    """Doubles the first lilicorr.* tensor's first dimension: one LC208 (shape) finding about that tensor."""
    name = sorted(n for n in tensors if n.startswith("lilicorr."))[0]
    dtype, shape, raw = tensors[name]
    tensors[name] = (dtype, (shape[0] * 2, *shape[1:]), raw + raw)


def _in_process(capsys, *args: str) -> str:
    with pytest.raises(SystemExit):
        main(list(args))
    return capsys.readouterr().out


def test_tensor_findings_point_at_the_index_entry_or_the_shard(tmp_path, capsys):
    sharded = fixtures.write_checkpoint(tmp_path / "sharded", shards=2, mutate=_resized)
    [annotation] = [
        line
        for line in _in_process(capsys, "validate", str(sharded), "-f", "github").splitlines()
        if "title=LC208" in line
    ]
    name = annotation.split("::", 2)[2].split("`")[1]
    assert f"file={sharded}/model.safetensors.index.json,line=" in annotation
    line = int(annotation.split(",line=", 1)[1].split(",", 1)[0])
    assert f'"{name}"' in (sharded / "model.safetensors.index.json").read_text().splitlines()[line - 1]
    sarif = json.loads(_in_process(capsys, "validate", str(sharded), "-f", "sarif"))
    [result] = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "LC208"]
    location = result["locations"][0]
    assert location["physicalLocation"]["region"] == {"startLine": line}
    assert location["logicalLocations"][0]["fullyQualifiedName"] == name
    single = fixtures.write_checkpoint(tmp_path / "single", mutate=_resized)  # no index: the shard's header
    [annotation] = [
        line
        for line in _in_process(capsys, "validate", str(single), "-f", "github").splitlines()
        if "title=LC208" in line
    ]
    assert f"file={single}/model.safetensors,line=1," in annotation


def test_report_rerenders_a_saved_json_report(tmp_path):
    saved = tmp_path / "r.json"
    assert run_cli("validate", str(NVFP4), "-f", "json", "-o", str(saved)).returncode == 1
    for fmt in ("text", "junit", "sarif", "markdown", "github"):
        direct = run_cli("validate", str(NVFP4), "-f", fmt)
        again = run_cli("report", str(saved), "-f", fmt)
        assert again.returncode == 0
        assert again.stdout == direct.stdout, fmt
    # text is the default, as --help says (issue 40: -f was required while the help called text the default)
    plain = run_cli("report", str(saved))
    assert plain.returncode == 0 and plain.stdout == run_cli("validate", str(NVFP4)).stdout
    assert "[default: text]" in run_cli("report", "--help").stdout
    sarif = tmp_path / "v.sarif"
    assert run_cli("report", str(saved), "-f", "sarif", "-o", str(sarif)).returncode == 0
    assert json.loads(sarif.read_text())["version"] == "2.1.0"


def test_report_refuses_what_is_not_a_report(tmp_path):
    (tmp_path / "x.json").write_text('{"tool": "something else"}')
    bad = run_cli("report", str(tmp_path / "x.json"), "-f", "text")
    assert bad.returncode == 2 and "is not a `lilicorr-ckpt validate -f json` report" in bad.stderr
    missing = run_cli("report", str(tmp_path / "nope.json"), "-f", "text")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    usage = run_cli("report", str(tmp_path / "x.json"), "-f", "html")
    assert usage.returncode == 4 and "'html' is not one of" in usage.stderr
    for r in (bad, missing, usage):
        assert "Traceback" not in r.stderr


def test_strict_says_so_and_says_why_a_warning_fails(tmp_path, capsys):
    warned = fixtures.write_checkpoint(
        tmp_path / "warned", fixtures.draft_config(block_size=16)
    )  # LC111 only
    text = _in_process(capsys, "validate", str(warned), "--strict")
    assert text.splitlines()[0] == f"lilicorr-ckpt validate {warned} --strict"
    assert text.splitlines()[-1].startswith("FAIL 0 errors, 1 warning")
    md = _in_process(capsys, "validate", str(warned), "--strict", "-f", "markdown")
    lines = md.splitlines()
    assert lines[0] == f"### ❌ lilicorr-ckpt validate `{warned}` `--strict`: FAIL"
    assert lines[2].startswith(
        "Failed under `--strict`: every runtime's verdict below is *accepts*, and 1 warning fails the gate"
    )
    rows = [line for line in lines if line.startswith("| ") and "accepts" in line]
    assert rows and all("⚠️ accepts (its warnings fail `--strict`)" in row for row in rows)
    assert any("⚠️ warning (fails `--strict`)" in line for line in lines)
    lax = _in_process(capsys, "validate", str(warned), "-f", "markdown").splitlines()
    assert lax[0].endswith(": PASS") and "--strict" not in "\n".join(lax) and "✅ accepts" in "\n".join(lax)
