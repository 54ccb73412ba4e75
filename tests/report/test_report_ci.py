"""-f github / -f markdown / -f github-output and `lilicorr-ckpt report` (re-rendering a saved JSON report)."""

from __future__ import annotations

import json

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.report.ci import json_key_lines, pointer_line
from lilicorr_ckpt.runtimes import PROFILES

from helpers import REPO, run_cli

NVFP4 = REPO / "examples" / "tiny-modelopt-nvfp4"

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


def test_json_key_lines_follow_nesting_arrays_and_escapes():
    text = '{\n  "a": 1,\n  "b": {\n    "c\\"q": [\n      10,\n      {"d": null}\n    ]\n  },\n  "e": "x:y"\n}\n'
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
    pairs = dict(line.split("=", 1) for line in out.stdout.splitlines())
    assert pairs["exit-code"] == "1" and pairs["result"] == "fail" and pairs["verdict-vllm"] == "refuses"
    assert json.loads(pairs["verdicts"]) == {"vllm": "refuses"}


def test_report_rerenders_a_saved_json_report(tmp_path):
    saved = tmp_path / "r.json"
    assert run_cli("validate", str(NVFP4), "-f", "json", "-o", str(saved)).returncode == 1
    for fmt in ("text", "junit", "sarif", "markdown", "github"):
        direct = run_cli("validate", str(NVFP4), "-f", fmt)
        again = run_cli("report", str(saved), "-f", fmt)
        assert again.returncode == 0
        assert again.stdout == direct.stdout, fmt
    sarif = tmp_path / "v.sarif"
    assert run_cli("report", str(saved), "-f", "sarif", "-o", str(sarif)).returncode == 0
    assert json.loads(sarif.read_text())["version"] == "2.1.0"


def test_report_refuses_what_is_not_a_report(tmp_path):
    (tmp_path / "x.json").write_text('{"tool": "something else"}')
    bad = run_cli("report", str(tmp_path / "x.json"), "-f", "text")
    assert bad.returncode == 2 and "is not a `lilicorr-ckpt validate -f json` report" in bad.stderr
    missing = run_cli("report", str(tmp_path / "nope.json"), "-f", "text")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    usage = run_cli("report", str(tmp_path / "x.json"))
    assert usage.returncode == 4
    for r in (bad, missing, usage):
        assert "Traceback" not in r.stderr
