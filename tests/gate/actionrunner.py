"""Run a composite action's bash steps (and a workflow job's) locally, the way the GitHub runner does.

Each `run:` step runs as `bash --noprofile --norc -eo pipefail FILE` with its `env:` evaluated, its own
GITHUB_OUTPUT file, and the shared GITHUB_STEP_SUMMARY. Only the expression forms the action and the example
workflow use are understood (`inputs.X`, `steps.ID.outputs.X`, `steps.ID.outcome`); anything else fails the
test rather than being guessed. `uses:` steps other than the action under test are recorded, not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ghrunner import parse_github_output

REPO = Path(__file__).resolve().parents[2]
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class StepResult:
    id: str | None
    returncode: int
    stdout: str
    stderr: str
    outputs: dict[str, str]


@dataclass
class ActionRun:
    steps: list[StepResult] = field(default_factory=list)
    skipped_uses: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    returncode: int = 0

    @property
    def stdout(self) -> str:
        return "".join(s.stdout for s in self.steps)

    @property
    def stderr(self) -> str:
        return "".join(s.stderr for s in self.steps)

    def step(self, step_id: str) -> StepResult:
        return next(s for s in self.steps if s.id == step_id)


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


class _WorkflowLoader(yaml.SafeLoader):
    """YAML as GitHub reads a workflow: only true/false are booleans (PyYAML's YAML 1.1 would read the `on:` key
    as True)."""


_WorkflowLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_WorkflowLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_workflow(text: str) -> dict[str, Any]:
    return yaml.load(text, Loader=_WorkflowLoader)  # a SafeLoader subclass


def parse_outputs(text: str) -> dict[str, str]:
    """A step's $GITHUB_OUTPUT as the runner reads it (strict: a malformed entry fails the test)."""
    return parse_github_output(text)


def _evaluate(expr: str, inputs: dict[str, str], steps: dict[str, dict[str, str]]) -> str:
    m = re.fullmatch(r"inputs\.([\w-]+)", expr)
    if m:
        return inputs[m.group(1)]
    m = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
    if m:
        return steps.get(m.group(1), {}).get(m.group(2), "")
    m = re.fullmatch(r"steps\.([\w-]+)\.outcome", expr)
    if m:
        return steps.get(m.group(1), {}).get("__outcome__", "")
    if expr in ("github.action_repository", "github.action_ref"):
        return ""  # `uses: ./`: a local action has neither
    raise AssertionError(f"expression the local runner does not know: ${{{{ {expr} }}}}")


def substitute(value: Any, inputs: dict[str, str], steps: dict[str, dict[str, str]]) -> str:
    return _EXPR.sub(lambda m: _evaluate(m.group(1), inputs, steps), str(value))


def runner_env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A runner-like environment whose `lilicorr-ckpt` on PATH is this checkout."""
    shims = tmp / "shims"
    shims.mkdir(exist_ok=True)
    shim = shims / "lilicorr-ckpt"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lilicorr_ckpt.cli "$@"\n')
    shim.chmod(0o755)
    (tmp / "runner-temp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_"))}
    env.update(
        {
            "PATH": f"{shims}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "NO_COLOR": "1",
            "RUNNER_TEMP": str(tmp / "runner-temp"),
            "GITHUB_WORKSPACE": str(REPO),
            "GITHUB_ACTION_PATH": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf-home"),
        }
    )
    env.update(extra or {})
    return env


def run_bash(
    script: str, env: dict[str, str], tmp: Path, cwd: Path
) -> tuple[subprocess.CompletedProcess, dict]:
    out_file = tmp / f"output-{len(list(tmp.glob('output-*')))}"
    out_file.write_text("")
    script_file = out_file.with_suffix(".sh")
    script_file.write_text(script)
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script_file)],
        env={**env, "GITHUB_OUTPUT": str(out_file)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, parse_outputs(out_file.read_text())


def run_action(
    inputs: dict[str, str],
    tmp: Path,
    *,
    action: Path = REPO / "action.yml",
    env: dict[str, str] | None = None,
    only: set[str] | None = None,
) -> ActionRun:
    """Run the action's bash steps in order (those in `only`, when given). Like the runner, a failing step
    stops the rest; the returned returncode is the first failing step's."""
    doc = load_yaml(action)
    declared = doc["inputs"]
    unknown = set(inputs) - set(declared)
    assert not unknown, f"inputs the action does not declare: {unknown}"
    for name, spec in declared.items():
        if spec.get("required") and name not in inputs:
            raise AssertionError(f"required input {name} not given")
    values = {name: str(inputs.get(name, spec.get("default", ""))) for name, spec in declared.items()}
    base_env = runner_env(tmp, env)
    summary = tmp / "step-summary.md"
    summary.touch()
    base_env["GITHUB_STEP_SUMMARY"] = str(summary)
    result = ActionRun()
    step_outputs: dict[str, dict[str, str]] = {}
    for step in doc["runs"]["steps"]:
        if "uses" in step:
            result.skipped_uses.append(step)
            continue
        if only is not None and step.get("id") not in only:
            continue
        assert step.get("shell") == "bash"
        env = {
            **base_env,
            **{k: substitute(v, values, step_outputs) for k, v in (step.get("env") or {}).items()},
        }
        proc, outputs = run_bash(step["run"], env, tmp, REPO)
        result.steps.append(StepResult(step.get("id"), proc.returncode, proc.stdout, proc.stderr, outputs))
        if step.get("id"):
            step_outputs[step["id"]] = outputs
        if proc.returncode != 0:
            result.returncode = proc.returncode
            break
    result.outputs = {
        name: substitute(spec["value"], values, step_outputs) for name, spec in doc.get("outputs", {}).items()
    }
    result.summary = summary.read_text()
    return result


def run_workflow_job(
    workflow: Path,
    job: str,
    tmp: Path,
    *,
    input_overrides: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> list[tuple[str, int]]:
    """Run one job of a workflow: `uses: ./` steps through run_action, `run:` steps in bash; returns
    (step name, exit code) for every step that ran. Checkout and setup-python are this machine's."""
    doc = load_yaml(workflow)
    steps_state: dict[str, dict[str, str]] = {}
    ran = []
    for i, step in enumerate(doc["jobs"][job]["steps"]):
        name = step.get("id") or step.get("name") or f"step {i}"
        if step.get("uses") == "./":
            sub = tmp / f"{job}-{i}"
            sub.mkdir()
            with_inputs = {k: str(v) for k, v in (step.get("with") or {}).items()}
            action = run_action({**with_inputs, **(input_overrides or {})}, sub, env=env)
            outcome = "success" if action.returncode == 0 else "failure"
            steps_state[step.get("id", name)] = {**action.outputs, "__outcome__": outcome}
            ran.append((name, action.returncode))
            if action.returncode and not step.get("continue-on-error"):
                break
        elif "uses" in step:
            continue  # actions/checkout, actions/setup-python: this checkout and this interpreter
        else:
            run_env = {
                **runner_env(tmp, env),
                **{k: substitute(v, {}, steps_state) for k, v in (step.get("env") or {}).items()},
            }
            assert "${{" not in step["run"], f"{name}: expressions belong in env:, not in the script"
            proc, _ = run_bash(step["run"], run_env, tmp, REPO)
            ran.append((name, proc.returncode))
            if proc.returncode:
                break
    return ran
