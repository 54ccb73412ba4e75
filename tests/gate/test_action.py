"""The GitHub Action (action.yml) and its example workflow, run locally through their bash steps."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from actionrunner import REPO, load_workflow, load_yaml, run_action, run_bash, run_workflow_job, runner_env  # noqa: E402
from ghrunner import obeyed_commands  # noqa: E402

from lilicorr_ckpt.report.escape import markdown_text  # noqa: E402
from lilicorr_ckpt.runtimes import PROFILES  # noqa: E402

ACTION = REPO / "action.yml"
WORKFLOW = REPO / ".github" / "workflows" / "drafter-gate.yml"
SELFTEST = REPO / ".github" / "workflows" / "action-selftest.yml"
PRE = {"version": "preinstalled"}


def test_the_action_declares_what_the_gate_needs_and_passes_inputs_through_env_only():
    doc = load_yaml(ACTION)
    assert doc["runs"]["using"] == "composite"
    for name in (
        "path",
        "target",
        "runtime",
        "strict",
        "deep",
        "ignore",
        "config",
        "smoke",
        "sarif-file",
        "upload-sarif",
        "summary",
        "version",
        "index-url",
    ):
        assert name in doc["inputs"], name
        assert doc["inputs"][name].get("description")
    assert doc["inputs"]["smoke"]["default"] == "false"
    for name in ("exit-code", "verdicts", "verdict-sglang", "verdict-vllm", "verdict-trtllm"):
        assert name in doc["outputs"]
    for step in doc["runs"]["steps"]:
        if "run" in step:
            assert step["shell"] == "bash"
            assert "${{" not in step["run"], f"step {step.get('id')}: an expression pasted into a script"
    upload = [s for s in doc["runs"]["steps"] if "uses" in s]
    assert len(upload) == 1 and upload[0]["uses"].startswith("github/codeql-action/upload-sarif@")
    assert upload[0]["with"]["category"] and upload[0]["with"]["sarif_file"]
    assert "inputs.upload-sarif == 'true'" in upload[0]["if"]


def test_an_accepted_drafter_passes_with_outputs_summary_and_sarif(tmp_path):
    sarif = tmp_path / "out" / "validate.sarif"
    run = run_action(
        {
            **PRE,
            "path": "examples/tiny-lilicorr",
            "target": "examples/tiny-target",
            "strict": "true",
            "sarif-file": str(sarif),
        },
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert run.outputs["exit-code"] == "0" and run.outputs["result"] == "pass"
    assert (run.outputs["verdict-sglang"], run.outputs["verdict-vllm"], run.outputs["verdict-trtllm"]) == (
        "accepts",
    ) * 3
    assert json.loads(run.outputs["verdicts"]) == {
        "sglang": "accepts",
        "vllm": "accepts",
        "trtllm": "accepts",
    }
    assert (
        "### ✅ lilicorr-ckpt validate `examples/tiny-lilicorr` against `examples/tiny-target` `--strict`: PASS"
        in run.summary
    )
    assert f"| {markdown_text(PROFILES['sglang'].display)} | ✅ accepts | 0 | 0 |" in run.summary
    doc = json.loads(sarif.read_text())
    assert doc["version"] == "2.1.0" and doc["runs"][0]["results"] == []
    assert run.outputs["sarif-file"] == str(sarif)
    assert "PASS 0 errors, 0 warnings" in run.stdout  # the readable log
    assert "::error" not in run.stdout
    assert run.step("gate").stdout.strip() == "lilicorr-ckpt: the gate passes"
    # the verdict is in the log once (not also from validate's stderr and the annotations' summing-up line)
    assert (run.stdout + run.stderr).count("PASS") == 1, run.stdout + run.stderr


def test_a_refused_checkpoint_fails_the_gate_with_annotations(tmp_path):
    run = run_action({**PRE, "path": "examples/tiny-modelopt-nvfp4", "upload-sarif": "true"}, tmp_path)
    assert run.returncode == 1
    assert run.outputs["exit-code"] == "1" and run.outputs["result"] == "fail"
    assert run.outputs["verdict-vllm"] == "refuses"
    errors = [line for line in run.stdout.splitlines() if line.startswith("::error ")]
    assert errors and all("file=examples/tiny-modelopt-nvfp4/" in line for line in errors)
    assert any("title=LC306 must-be-float::" in line for line in errors)
    assert any(line.startswith("::warning ") for line in run.stdout.splitlines())
    assert (
        f"| {markdown_text(PROFILES['vllm'].display)} | ❌ refuses |" in run.summary
        and "`LC306` must-be-float" in run.summary
    )
    validate = run.step("validate").outputs
    assert validate["sarif-written"] == "true" and Path(validate["sarif-file"]).is_file()
    assert validate["sarif-category"] == "lilicorr-ckpt/all/examples-tiny-modelopt-nvfp4"
    assert run.step("gate").returncode == 1


def test_a_range_of_releases_gives_a_verdict_each(tmp_path):
    run = run_action({**PRE, "path": "examples/tiny-lilicorr", "runtime": "vllm>=0.33"}, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    verdicts = json.loads(run.outputs["verdicts"])
    assert verdicts == {"vllm==0.33.0": "accepts", "vllm==0.34.0": "accepts"}
    assert run.step("validate").outputs["verdict-vllm-0_34_0"] == "accepts"
    assert "vLLM 0.33.0" in run.summary and "vLLM 0.34.0" in run.summary


def test_a_warning_only_checkpoint_passes_unless_strict(tmp_path):
    from lilicorr_ckpt import fixtures

    # float16 weights: LC121, a warning for every runtime (a descending target_layer_ids is an error for SGLang)
    ckpt = fixtures.write_checkpoint(tmp_path / "warn", fixtures.draft_config(), dtype="F16")
    (tmp_path / "lax").mkdir()
    (tmp_path / "strict").mkdir()
    lax = run_action({**PRE, "path": str(ckpt)}, tmp_path / "lax")
    strict = run_action({**PRE, "path": str(ckpt), "strict": "true"}, tmp_path / "strict")
    assert lax.returncode == 0 and lax.outputs["result"] == "pass"
    assert strict.returncode == 1 and strict.outputs["result"] == "fail"
    assert any(line.startswith("::warning ") for line in lax.stdout.splitlines())
    # under --strict the warning fails the job, so it is annotated as an error (as SARIF and JUnit have it)
    assert not any(line.startswith("::warning ") for line in strict.stdout.splitlines())
    warning = [line for line in strict.stdout.splitlines() if line.startswith("::error ") and "LC121" in line]
    # the annotation points at the key in config.json
    text = (ckpt / "config.json").read_text().splitlines()
    line = int(re.search(r",line=(\d+),", warning[0]).group(1))
    assert "torch_dtype" in text[line - 1]


def test_unreadable_input_is_an_error_annotation_with_the_reason(tmp_path):
    run = run_action({**PRE, "path": "examples/tiny-lilicorrr"}, tmp_path)
    assert run.returncode == 2
    assert run.outputs["exit-code"] == "2" and run.outputs["result"] == "error"
    assert (
        "::error title=lilicorr-ckpt validate (exit 2)::checkpoint "
        "'examples/tiny-lilicorrr' does not exist: no such directory; did you mean 'examples/tiny-lilicorr'"
        in run.stdout
    )
    assert "not validated (exit 2)" in run.summary and "no such directory" in run.summary
    # the report files exist all the same: the JSON with the reason (the SARIF, when asked, says
    # executionSuccessful false; tests/report/test_ci_outputs.py)
    assert "no such directory" in json.loads(Path(run.outputs["report-json"]).read_text())["error"]


def test_inputs_are_data_never_code(tmp_path):
    marker = tmp_path / "pwned"
    for evil in (
        f"$(touch {marker})",
        f"`touch {marker}`",
        f'"; touch {marker}; echo "',
        f"x'; touch {marker}; '",
    ):
        sub = tmp_path / str(abs(hash(evil)))
        sub.mkdir()
        run = run_action(
            {**PRE, "path": evil, "target": evil, "ignore": evil, "runtime": evil, "smoke-args": evil}, sub
        )
        assert run.returncode in (2, 4)
        assert not marker.exists(), evil


def test_smoke_without_a_target_is_an_error_and_a_failing_validate_does_not_skip_smoke(tmp_path):
    run = run_action({**PRE, "path": "examples/tiny-lilicorr", "smoke": "true"}, tmp_path)
    assert run.returncode == 4
    assert run.step("smoke").outputs["exit-code"] == "4"
    assert "::error title=lilicorr-ckpt smoke::smoke needs the target input" in run.stdout
    # validate failing still runs the smoke step (it decides nothing until the gate)
    sub = tmp_path / "fail"
    sub.mkdir()
    failing = run_action({**PRE, "path": "examples/tiny-modelopt-nvfp4", "smoke": "true"}, sub)
    assert [s.id for s in failing.steps] == ["install", "validate", "smoke", "gate"]
    assert failing.returncode == 1


def _fake_python(tmp: Path) -> tuple[Path, Path]:
    """python3 on PATH that records what it is asked and makes a venv whose python records pip calls."""
    log = tmp / "calls.log"
    bindir = tmp / "fakebin"
    bindir.mkdir()
    script = f"""#!{sys.executable}
import os, sys
log = {str(log)!r}
with open(log, "a") as f:
    f.write(os.path.basename(sys.argv[0]) + " " + " ".join(sys.argv[1:]) + "\\n")
{_DELEGATE}
if sys.argv[1:3] == ["-m", "venv"]:
    d = os.path.join(sys.argv[3], "bin")
    os.makedirs(d, exist_ok=True)
    me = open(sys.argv[0]).read()
    for name in ("python", "lilicorr-ckpt"):
        p = os.path.join(d, name)
        open(p, "w").write(me)
        os.chmod(p, 0o755)
"""
    for name in ("python3",):
        p = bindir / name
        p.write_text(script)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bindir, log


_DELEGATE = f"""
if os.path.basename(sys.argv[0]) == "lilicorr-ckpt":  # the installed tool: this checkout's (workflow plumbing)
    os.execv({sys.executable!r}, [{sys.executable!r}, "-m", "lilicorr_ckpt.cli", *sys.argv[1:]])
"""


@pytest.mark.parametrize(
    "version, smoke, expected",
    [
        ("", "false", ["{REPO}"]),
        ("0.1.0", "false", ["lilicorr-ckpt==0.1.0"]),
        ("", "true", ["torch --index-url https://download.pytorch.org/whl/cpu", "{REPO}[runtime]"]),
        (
            "0.2.0",
            "true",
            ["torch --index-url https://download.pytorch.org/whl/cpu", "lilicorr-ckpt[runtime]==0.2.0"],
        ),
        (
            "0.2.0 https://pkgs.example/simple",
            "false",
            ["--index-url https://pkgs.example/simple lilicorr-ckpt==0.2.0"],
        ),
        (
            "https://pkgs.example/simple",
            "false",
            ["{REPO}"],
        ),  # an index without a version: the action's checkout
    ],
)
def test_the_install_step_uses_a_venv_and_cpu_torch_only_for_smoke(tmp_path, version, smoke, expected):
    bindir, log = _fake_python(tmp_path)
    env = {"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    number, _, index = version.rpartition(" ") if " " in version else (version, "", "")
    if number.startswith("https:"):
        number, index = "", number
    run = run_action(
        {"path": "x", "version": number, "index-url": index, "smoke": smoke},
        tmp_path,
        env=env,
        only={"install"},
    )
    assert run.returncode == 0, run.stderr
    calls = log.read_text().splitlines()
    venv = f"{tmp_path}/runner-temp/lilicorr-ckpt-venv"
    assert calls[0] == f"python3 -m venv {venv}"
    installs = [
        c.split("install --quiet ", 1)[1] for c in calls if " install --quiet " in c and "--upgrade" not in c
    ]
    assert installs == [e.format(REPO=REPO) for e in expected]
    assert run.step("install").outputs["bin"] == f"{venv}/bin"


def test_the_install_step_refuses_a_version_that_is_not_one(tmp_path):
    bindir, log = _fake_python(tmp_path)
    env = {"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    # an injection attempt: a command whose payload only leaves a marker file, and a forged workflow command
    marker = tmp_path / "injected"
    run = run_action(
        {"path": "x", "version": f"1.0; touch {marker}\n::error title=forged::x"},
        tmp_path,
        env=env,
        only={"install"},
    )
    assert run.returncode == 1
    [command] = obeyed_commands(run.stdout)
    assert command.message == "the version input must be empty, 'preinstalled' or a version number"
    assert f"version input given: $'1.0; touch {marker}\\n::error title=forged::x'" in run.stdout  # one line
    assert not log.exists() and not marker.exists()


def test_the_gate_step_alone_fails_without_a_validate_result(tmp_path):
    doc = load_yaml(ACTION)
    gate = next(s for s in doc["runs"]["steps"] if s.get("id") == "gate")
    proc, _ = run_bash(
        gate["run"], {**runner_env(tmp_path), "VALIDATE_RC": "", "SMOKE_RC": ""}, tmp_path, REPO
    )
    assert proc.returncode == 2


@pytest.mark.parametrize(
    "workflow, job, steps", [(WORKFLOW, "gate", 1), (SELFTEST, "outputs", 2), (SELFTEST, "refuses", 2)]
)
def test_the_example_workflows_pass_on_the_bundled_examples(tmp_path, workflow, job, steps):
    ran = run_workflow_job(workflow, job, tmp_path, input_overrides=PRE)
    assert ran[-1][1] == 0, ran
    assert len(ran) == steps


@pytest.mark.slow
def test_the_selftest_smoke_job(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ran = run_workflow_job(
        SELFTEST,
        "smoke",
        tmp_path,
        input_overrides={
            **PRE,
            "smoke-args": "--limit 1 --max-new-tokens 4 --probes code --no-warmup --min-head-gain -1",
        },
    )
    assert ran == [("smoke", 0), ("smoke ran and passed", 0)]


WORKFLOW_KEYS = {"name", "run-name", "on", "permissions", "env", "defaults", "concurrency", "jobs"}
EVENTS = {
    "push",
    "pull_request",
    "pull_request_target",
    "workflow_dispatch",
    "schedule",
    "release",
    "workflow_call",
}
JOB_KEYS = {
    "name",
    "runs-on",
    "steps",
    "permissions",
    "needs",
    "if",
    "env",
    "timeout-minutes",
    "strategy",
    "continue-on-error",
    "defaults",
    "concurrency",
    "outputs",
    "environment",
    "container",
    "services",
}
STEP_KEYS = {
    "id",
    "name",
    "uses",
    "run",
    "with",
    "env",
    "if",
    "shell",
    "continue-on-error",
    "timeout-minutes",
    "working-directory",
}
PERMISSIONS = {
    "actions",
    "checks",
    "contents",
    "deployments",
    "id-token",
    "issues",
    "packages",
    "pages",
    "pull-requests",
    "security-events",
    "statuses",
    "attestations",
    "discussions",
}


def assert_a_complete_workflow(doc: dict) -> None:
    """What GitHub needs of a workflow file, checked by hand (the keys and shapes of the workflow syntax; every
    input given to this action is one it declares)."""
    assert set(doc) <= WORKFLOW_KEYS, set(doc) - WORKFLOW_KEYS
    assert "on" in doc and "jobs" in doc, "a workflow needs `on:` and `jobs:`"
    triggers = doc["on"]
    events = {triggers} if isinstance(triggers, str) else set(triggers)
    assert events and events <= EVENTS, events
    assert set(doc.get("permissions", {})) <= PERMISSIONS
    assert all(v in ("read", "write", "none") for v in doc.get("permissions", {}).values())
    inputs = set(load_yaml(ACTION)["inputs"])
    for name, job in doc["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name) and set(job) <= JOB_KEYS, name
        assert job["runs-on"] and job["steps"], name
        for step in job["steps"]:
            assert set(step) <= STEP_KEYS and ("uses" in step) != ("run" in step), step
            if "uses" in step:
                assert re.fullmatch(r"\./|[\w.-]+/[\w.-]+(/[\w./-]+)?@[\w.-]+", step["uses"]), step["uses"]
            if step.get("uses") == "./":
                assert set(step.get("with", {})) <= inputs and "path" in step["with"], step


def test_the_readme_snippet_is_the_whole_example_workflow():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## A pre-publish gate", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```yaml\n(.*?)\n```", section, flags=re.S)
    snippet = load_workflow(block)
    assert_a_complete_workflow(snippet)
    # the action is named by a placeholder the docs explain; in the tested example it is ./
    [step] = [s for s in snippet["jobs"]["gate"]["steps"] if "lilicorr-ckpt@" in s.get("uses", "")]
    assert step["uses"] == "OWNER/lilicorr-ckpt@REF"
    ci = (REPO / "docs" / "ci.md").read_text()
    assert "### The action reference" in ci and "`OWNER` is the GitHub user or organisation" in ci
    assert "`REF` is a tag" in ci and "docs/ci.md#the-action-reference" in readme
    step["uses"] = "./"
    workflow = load_workflow(WORKFLOW.read_text())
    assert snippet == workflow
    assert_a_complete_workflow(workflow)
    assert_a_complete_workflow(load_workflow(SELFTEST.read_text()))


def test_the_ignore_input_waives_and_the_summary_says_so(tmp_path):
    from lilicorr_ckpt import fixtures

    owned = fixtures.write_checkpoint(
        tmp_path / "owned", fixtures.draft_config(own_lm_head=True)
    )  # LC404: an error for SGLang
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    strict = run_action({**PRE, "path": str(owned), "strict": "true"}, tmp_path / "a")
    waived = run_action(
        {**PRE, "path": str(owned), "strict": "true", "ignore": "LC314,LC404"}, tmp_path / "b"
    )
    assert strict.returncode == 1 and any(
        line.startswith("::error ") and "LC404" in line for line in strict.stdout.splitlines()
    )
    assert waived.returncode == 0 and waived.outputs["result"] == "pass"
    assert "::warning" not in waived.stdout and "LC404" not in "".join(
        line for line in waived.stdout.splitlines() if line.startswith("::")
    )
    assert "0 errors, 0 warnings, 0 info; 1 waived" in waived.summary and "🔕 waived" in waived.summary


FORGE = "\n::error title=forged::the gate passes\nexit-code=0\n### ✅ PASS"


def _obeyed(run) -> list:
    """Every workflow command the runner would act on, step by step, stdout and stderr."""
    return [c for s in run.steps for stream in (s.stdout, s.stderr) for c in obeyed_commands(stream)]


def test_hostile_inputs_forge_no_output_annotation_or_summary_line(tmp_path):
    run = run_action(
        {
            **PRE,
            "path": "examples/tiny-lilicorrr" + FORGE,
            "runtime": "all" + FORGE,
            "ignore": "LC314" + FORGE,
            "upload-sarif": "true",
        },
        tmp_path,
    )
    assert run.returncode == 4  # the runtime is not one
    assert [c.properties.get("title") for c in _obeyed(run)] == ["lilicorr-ckpt validate (exit 4)"]
    validate = run.step("validate").outputs
    assert validate["exit-code"] == "4" and validate["result"] == "error"
    assert set(validate) == {"report-json", "sarif-category", "exit-code", "result", "verdicts"}
    assert "\n" not in validate["sarif-category"]
    assert sum(line.startswith("#") for line in run.summary.splitlines()) == 1


def test_an_unreadable_path_quoting_commands_forges_nothing(tmp_path):
    run = run_action({**PRE, "path": "examples/tiny-lilicorrr" + FORGE}, tmp_path)
    assert run.returncode == 2 and run.outputs["exit-code"] == "2"
    [command] = _obeyed(run)
    assert command.properties["title"] == "lilicorr-ckpt validate (exit 2)"
    assert sum(line.startswith("#") for line in run.summary.splitlines()) == 1


def test_the_smoke_step_forges_nothing_from_the_path_or_its_log(tmp_path):
    # smoke fails at once (no such drafter); its ::error and summary quote the path
    run = run_action(
        {**PRE, "path": "examples/tiny-lilicorrr" + FORGE, "target": "examples/tiny-target", "smoke": "true"},
        tmp_path,
        only={"install", "smoke"},
    )
    smoke = run.step("smoke")
    code = smoke.outputs["exit-code"]
    assert code in ("2", "4") and set(smoke.outputs) == {"exit-code"}
    [command] = _obeyed(run)
    assert command.properties == {"title": f"lilicorr-ckpt smoke (exit {code})"}
    assert command.message.startswith("smoke failed on examples/tiny-lilicorrr\\x0a::error")
    assert "::stop-commands::" in smoke.stdout  # smoke's own output is shown, not obeyed
    headings = [line for line in run.summary.splitlines() if line.startswith("#")]
    assert len(headings) == 1 and headings[0].startswith(
        "### ❌ lilicorr-ckpt smoke `examples/tiny-lilicorrr\\x0a"
    )


def test_the_package_builds_without_setuptools_warnings():
    # each pip build step printed setuptools' licence deprecation banner: three in the Action's log
    setuptools = pytest.importorskip("setuptools")
    import warnings

    from packaging.version import Version

    if Version(setuptools.__version__) < Version("77"):
        pytest.skip("SPDX licence strings need setuptools >= 77 (the build requires it)")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    finally:
        os.chdir(cwd)
    noisy = [
        str(w.message).splitlines()[0]
        for w in caught
        if "setuptools" in type(w.message).__module__ or "Setuptools" in type(w.message).__name__
    ]
    assert noisy == [], noisy
    assert dist.get_name() == "lilicorr-ckpt"
