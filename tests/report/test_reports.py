import json
import xml.etree.ElementTree as ET

import jsonschema
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.report import schemas
from lilicorr_ckpt.runtimes import PROFILES

from helpers import REPO, run_cli

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


@pytest.fixture
def broken(make_ckpt):
    # non-power-of-two top-k: refused by SGLang and vLLM, accepted by TensorRT-LLM
    return make_ckpt("broken", fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6}))


@pytest.fixture
def warned(make_ckpt):
    # conflicting block sizes: a warning only
    return make_ckpt("warned", fixtures.draft_config(block_size=16))


def test_schema_files_are_in_sync_with_the_types():
    for name, schema in schemas.all_schemas().items():
        committed = REPO / "schemas" / name
        assert committed.exists(), f"missing schemas/{name}: run python scripts/sync_docs.py"
        assert committed.read_text() == schemas.render(schema), (
            f"schemas/{name} is stale: run python scripts/sync_docs.py"
        )


def test_the_schema_command_prints_the_committed_schemas(tmp_path):
    names = ["validate-report", "inspect", "smoke-profile", "smoke-engine"]
    assert run_cli("schema").stdout.split() == names
    for name in names:
        printed = run_cli("schema", name)
        assert (
            printed.returncode == 0
            and printed.stdout == (REPO / "schemas" / f"{name}.schema.json").read_text()
        )
    assert run_cli("schema", "nope").returncode == 4
    schemas.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(schemas.all_schemas())


def test_json_report_follows_its_schema_and_gives_per_runtime_verdicts(broken):
    result = run_cli("validate", str(broken), "--format", "json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    jsonschema.validate(report, json.loads((REPO / "schemas" / "validate-report.schema.json").read_text()))
    verdicts = {v["runtime"]: v["accepted"] for v in report["runtimes"]}
    assert verdicts == {"sglang": False, "vllm": False, "trtllm": True}
    [finding] = [f for f in report["findings"] if f["rule"] == "LC104"]
    assert finding["expected"] == "one of 1, 2, 4, 8, 16" and finding["actual"] == "6"
    assert finding["pointer"] == "$.dflash_config.lilicorr_candidate_topk" and finding["fix"]


def test_runtime_selection_changes_the_verdict(broken):
    assert run_cli("validate", str(broken), "--runtime", "trtllm").returncode == 0
    assert run_cli("validate", str(broken), "--runtime", "vllm").returncode == 1


def test_junit_has_a_testcase_per_runtime_and_fails_the_refusing_ones(broken):
    result = run_cli("validate", str(broken), "--format", "junit")
    suite = ET.fromstring(result.stdout)
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {SG, VL, TR}
    assert cases[SG].find("failure") is not None and "LC104" in cases[SG].find("failure").text
    assert cases[TR].find("failure") is None
    assert suite.get("failures") == "2"


def test_sarif_lists_rules_and_results(broken):
    doc = json.loads(run_cli("validate", str(broken), "--format", "sarif").stdout)
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    catalogue = [r["id"] for r in json.loads(run_cli("rules", "-f", "json").stdout)]
    assert sorted(rule_ids) == sorted(catalogue)  # the whole catalogue, not only the rules that fired
    result = next(r for r in run["results"] if r["ruleId"] == "LC104")
    assert result["level"] == "error" and rule_ids[result["ruleIndex"]] == "LC104"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("config.json")
    assert result["properties"]["runtimes"] == ["sglang", "vllm"]


def test_text_report_groups_by_severity_and_ends_with_a_summary(broken, warned):
    out = run_cli("validate", str(broken)).stdout
    assert "ERROR LC104 topk-power-of-two (sglang, vllm)" in out and "fix:" in out
    assert out.strip().splitlines()[-1].startswith("FAIL 1 error, 0 warnings")
    assert f"{TR}: accepts" in out and f"{SG}: refuses" in out
    result = run_cli("validate", str(warned))
    assert result.returncode == 0 and "WARN  LC111" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("PASS 0 errors, 1 warning")


def test_strict_fails_on_warnings_and_output_writes_a_file(warned, tmp_path):
    assert run_cli("validate", str(warned), "--strict").returncode == 1
    out = tmp_path / "report.json"
    result = run_cli("validate", str(warned), "--format", "json", "--output", str(out))
    assert result.returncode == 0 and result.stdout == ""
    assert json.loads(out.read_text())["summary"]["warnings"] == 1


def test_inspect_json_follows_its_schema(make_ckpt):
    path = make_ckpt(config=fixtures.draft_config(conv=(4, 16)), quant="NVFP4")
    result = run_cli("inspect", str(path), "--format", "json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, json.loads((REPO / "schemas" / "inspect.schema.json").read_text()))
    comps = {c["component"]: c for c in doc["components"]}
    assert set(comps) == {"backbone", "conv", "head"}
    assert comps["conv"]["tensors"] == 8
    assert doc["quantization"]["quant_algo"] == "NVFP4" and doc["runtimes"] == {
        "sglang": True,
        "vllm": True,
        "trtllm": True,
    }
    text = run_cli("inspect", str(path)).stdout
    assert "conv       4 taps, group 16" in text and "NVFP4" in text


def test_names_from_the_checkpoint_are_escaped_and_cannot_forge_a_line(make_ckpt):
    # a tensor named to forge a PASS line, with an ANSI escape and an XML-invalid control character
    import xml.etree.ElementTree as ET

    import numpy as np
    from safetensors.numpy import save_file

    from helpers import run_cli

    path = make_ckpt()
    evil = "x\nPASS 0 errors, 0 warnings\x1b[2J\x01"
    save_file({evil: np.zeros(2, dtype=np.float32)}, str(path / "extra.safetensors"))
    text = run_cli("validate", str(path))
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert (
        not any(line.startswith("PASS") for line in lines)
        and "\x1b" not in text.stdout
        and "\x01" not in text.stdout
    )
    assert "x\\x0aPASS 0 errors, 0 warnings\\x1b[2J\\x01" in text.stdout
    junit = run_cli("validate", str(path), "-f", "junit")
    ET.fromstring(junit.stdout)  # well-formed XML despite the control characters
    assert "\\x01" in junit.stdout
    shown = run_cli("inspect", str(path))
    assert "\x1b" not in shown.stdout and "\x01" not in shown.stdout
