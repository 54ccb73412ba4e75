"""The README works as written: every command in it runs in a test and its output is checked (issue 22).

Commands are read from the README's ```bash blocks (split at `&&`) and from its inline `lilicorr-ckpt ...` code
that names no placeholder. `lilicorr-ckpt` commands run as written from the repository root; one that needs a
GPU says so (`# needs a CUDA GPU`) and runs when CUDA is there; one that reads the fetched SmolLM2 GGUF runs when
it is there. Installs and fetches need the network, which the suite has not: they are checked to be what CI
(.ci/run) runs, so CI runs them as written.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from lilicorr_ckpt.checks import RULES
from lilicorr_ckpt.cli import main, rules_markdown, rules_page
from lilicorr_ckpt.smoke.options import SmokeOptions

from helpers import REPO, run_cli

README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()
ACTION = (REPO / "action.yml").read_text()
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
GGUF = ".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GPU_MARK = "# needs a CUDA GPU"


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def readme_commands() -> list[tuple[str, str]]:
    """(command, its line's comment) for every command of the README, in order."""
    out = []
    for block in _bash_blocks(README):
        for line in block.splitlines():
            code, _, comment = line.partition("  # ")
            for part in code.split("&&"):
                if part.strip():
                    out.append((part.strip(), comment.strip()))
    for inline in re.findall(r"`(lilicorr-ckpt [^`]+)`", README):
        if not re.search(
            r"\b[A-Z][A-Z0-9_.]*\b|\[", inline
        ):  # PATH, SRC, REPORT.json, [--target T]: a synopsis
            out.append((inline, ""))
    return out


@dataclass
class Ran:
    code: int
    out: str
    err: str


def _run(command: str, capsys) -> Ran:
    argv = shlex.split(command)
    assert argv[0] == "lilicorr-ckpt"
    with pytest.raises(SystemExit) as exc:
        main(argv[1:])
    out, err = capsys.readouterr()
    return Ran(int(exc.value.code or 0), out, err)


def _validate_pass(ran: Ran) -> None:
    assert ran.code == 0, ran.out + ran.err
    assert ran.out.strip().splitlines()[-1].startswith("PASS 0 errors, 0 warnings"), ran.out


def _validate_every_engine_accepts(ran: Ran) -> None:
    # the README says so: the drafter's taps stop below the target's last layer (none LC148), so each engine's
    # newest release accepts it
    assert ran.code == 0, ran.out + ran.err
    assert "LC148" not in ran.out and "ERROR" not in ran.out, ran.out
    from lilicorr_ckpt.runtimes import PROFILES

    sglang, vllm, trtllm = (PROFILES[e].display for e in ("sglang", "vllm", "trtllm"))
    verdicts = f"{sglang}: accepts, {vllm}: accepts, {trtllm}: accepts"  # the newest release of each engine
    assert ran.out.strip().splitlines()[-1].endswith(verdicts), ran.out


def _rules_list(ran: Ran) -> None:
    assert ran.code == 0 and [line.split()[0] for line in ran.out.splitlines()] == list(RULES)


def _smoke_gpu(ran: Ran) -> None:
    # README (one H100, all 252 probes): every gate passes, the head-loaded one by its interval (+9.2%, +8.3 .. +10.1)
    lines = re.findall(r"^\s+(PASS|FAIL|SKIP)\s+(\S+)\s+(.*)$", ran.out, re.M)
    gates = {name: status for status, name, _ in lines}
    assert {"lossless", "head-loaded", "kernel-parity"} <= set(gates), ran.out
    assert set(gates.values()) == {"PASS"}, ran.out
    assert "over 252 prompts" in ran.out and ran.code == 0, ran.out + ran.err
    # where the time went, and on a GPU what the kernels cost before they ran (compiled ahead, read, tuned)
    assert re.search(r"^time \(s\): start [\d.]+, drafter .* in all$", ran.out, re.M), ran.out
    assert re.search(r"^kernels: \d+ of \d+ stored variants compiled ahead", ran.out, re.M), ran.out


def _pip_installs_this_checkout(command: str) -> None:
    """`pip install .` / `pip install ".[extras]"` / `pip install torch==X` / the CPU torch wheel: extras that
    pyproject declares, the torch pin CI uses, the CPU wheel as the Action installs it (lilicorr-ckpt itself is
    not on PyPI: never `pip install lilicorr-ckpt`)."""
    args = shlex.split(command)[2:]
    if args[:1] == ["torch"]:
        assert args == ["torch", "--index-url", CPU_INDEX], command
        assert f"pip install --quiet torch --index-url {CPU_INDEX}" in ACTION  # as the Action does
        return
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10
        import tomli as tomllib
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for arg in args:
        if arg == "-e":
            continue
        if arg.startswith("torch=="):
            assert f"pip install {arg}" in CI, f"CI does not install {arg}"
            continue
        m = re.fullmatch(r"\.(?:\[([a-z,]+)\])?", arg)
        assert m, f"{command}: not this checkout"
        assert all(e in extras for e in (m.group(1) or "").split(",") if e), f"{command}: unknown extra"


@dataclass
class Expect:
    check: Callable[[Ran], None] | None = None  # a lilicorr-ckpt command run as written
    ci: bool = False  # needs the network: .ci/run runs it
    covered_by: str | None = None  # run as written by this test (path::function), which checks its output
    gpu: bool = False
    gguf: bool = False
    # a smoke run of minutes, too long for the suite (docs/performance.md times it): its options are parsed and
    # pass smoke's checks, and this checks what it would run
    options: Callable[[SmokeOptions], None] | None = None


def _cpu_smoke_options(options: SmokeOptions) -> None:
    # README: 68 prompts (30 code, 30 chat, the 8 math probes), batched, in bfloat16, on the CPU, judged for every
    # engine's newest release (the default runtime selection)
    from lilicorr_ckpt.smoke.probes import counts, load_probes

    assert not options.gpu and options.runtime == "all" and options.dtype == "bfloat16"
    assert options.batch == 32 and not options.warmup and options.temperature == 0
    assert options.min_head_gain == 0.05  # the gate as it ships
    probes = load_probes(options.probes, options.limit)
    assert counts(probes) == {"code": 30, "chat": 30, "math": 8}
    assert f"{len(probes)} prompts (`--limit {options.limit}`" in README
    assert (REPO / options.path).is_dir() and options.target == GGUF


EXPECTED: dict[str, Expect] = {
    "pip install .": Expect(ci=True),
    "lilicorr-ckpt validate examples/tiny-lilicorr": Expect(_validate_pass),
    f"pip install torch --index-url {CPU_INDEX}": Expect(ci=True),
    "pip install torch==2.13.0": Expect(ci=True),
    'pip install ".[runtime]"': Expect(ci=True),
    "scripts/fetch_smollm2.sh": Expect(ci=True),
    f"lilicorr-ckpt validate examples/smollm2-lilicorr --target {GGUF} --strict": Expect(
        _validate_every_engine_accepts, gguf=True
    ),
    f"lilicorr-ckpt smoke examples/smollm2-lilicorr --target {GGUF} --gpu --limit 0": Expect(
        _smoke_gpu, gpu=True, gguf=True
    ),
    f"lilicorr-ckpt smoke examples/smollm2-lilicorr --target {GGUF} --dtype bfloat16 --batch 32 "
    "--limit 30 --no-warmup": Expect(options=_cpu_smoke_options),
    "lilicorr-ckpt rules": Expect(_rules_list),
    # the bundled pair on the CPU: a minute, so run once, where the smoke tests check what it prints
    "lilicorr-ckpt smoke examples/tiny-lilicorr --target examples/tiny-target": Expect(
        covered_by="tests/smoke/test_smoke_cli.py::test_the_bundled_example_pair_runs_as_documented"
    ),
}

COMMANDS = readme_commands()


def test_every_readme_command_has_an_expectation():
    missing = [c for c, _ in COMMANDS if c not in EXPECTED]
    assert missing == [], f"README commands with no entry in EXPECTED: {missing}"
    assert set(EXPECTED) == {c for c, _ in COMMANDS}, "EXPECTED names commands the README no longer has"


def test_a_command_that_needs_a_gpu_says_so():
    for command, comment in COMMANDS:
        assert ("--gpu" in shlex.split(command)) == (comment == GPU_MARK.removeprefix("# ")), command
        assert EXPECTED[command].gpu == ("--gpu" in shlex.split(command))


@pytest.mark.parametrize("command", [c for c, _ in COMMANDS if EXPECTED.get(c, Expect()).ci])
def test_what_needs_the_network_is_what_ci_runs(command):
    if command.startswith("pip install"):
        _pip_installs_this_checkout(command)
    elif command == "scripts/fetch_smollm2.sh":
        script = REPO / command
        assert script.is_file() and script.stat().st_mode & 0o111 and f"{command} ||" in CI
        assert GGUF.rsplit("/", 1)[-1] in script.read_text()  # it fetches the file the README then uses
    else:
        assert f"&& {command}" in CI, f"CI does not run {command}"


@pytest.mark.parametrize("command", [c for c, _ in COMMANDS if EXPECTED.get(c, Expect()).check])
def test_readme_command_runs_as_written(command, capsys, monkeypatch):
    expect = EXPECTED[command]
    if expect.gguf and not (REPO / GGUF).is_file():
        pytest.skip("needs the SmolLM2 GGUF (scripts/fetch_smollm2.sh)")
    if expect.gpu:
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU (the README says so)")
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("NO_COLOR", "1")
    expect.check(_run(command, capsys))


@pytest.mark.parametrize("command", [c for c, _ in COMMANDS if EXPECTED.get(c, Expect()).options])
def test_a_minutes_long_readme_smoke_parses_and_passes_smokes_option_checks(command, capsys, monkeypatch):
    from lilicorr_ckpt.errors import SmokeRefused
    from lilicorr_ckpt.smoke import options as smoke_options

    seen: list[SmokeOptions] = []

    def runner():
        def run(options: SmokeOptions, progress: object, started: float | None = None) -> None:
            seen.append(options)  # smoke's option checks passed to get here
            raise SmokeRefused("not run here")

        return run

    monkeypatch.setattr(smoke_options, "runner", runner)
    monkeypatch.chdir(REPO)
    ran = _run(command, capsys)
    assert ran.code == 1 and "not run here" in ran.err and len(seen) == 1, ran.err
    smoke_options.check_options(seen[0])
    EXPECTED[command].options(seen[0])


@pytest.mark.parametrize("command", [c for c, _ in COMMANDS if EXPECTED.get(c, Expect()).covered_by])
def test_a_slow_readme_command_is_run_as_written_by_the_test_named(command):
    path, _, name = EXPECTED[command].covered_by.partition("::")
    tree = ast.parse((REPO / path).read_text())
    [function] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    calls = [
        [a.value for a in call.args if isinstance(a, ast.Constant)]
        for call in ast.walk(function)
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "run_cli"
    ]
    assert shlex.split(command)[1:] in calls, f"{path}::{name} does not run `{command}` as written"


def test_quick_start_holds_what_a_newcomer_needs():
    """Two one-line blocks: install from this checkout and validate the bundled drafter; the runtime extra (CPU
    wheel) and smoke on the bundled pair. No rule table, no test suite: those are in docs/ (issue 40)."""
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip() for b in _bash_blocks(quick)]
    assert len(blocks) == 2 and all("\n" not in b for b in blocks)
    assert blocks[0] == "pip install . && lilicorr-ckpt validate examples/tiny-lilicorr"
    assert blocks[1].endswith("&& lilicorr-ckpt smoke examples/tiny-lilicorr --target examples/tiny-target")
    assert "pytest" not in quick and "| LC" not in quick and "not on PyPI" in quick
    assert "pip install lilicorr-ckpt" not in README


def test_the_test_command_in_the_contributing_guide_is_what_ci_runs():
    guide = (REPO / "docs" / "contributing.md").read_text()
    setup = guide.split("## Setting up and checking a change", 1)[1].split("\n## ", 1)[0]
    assert _bash_blocks(setup)[0].splitlines()[0] in CI


def test_the_rule_table_is_in_docs_rules_md_generated_from_the_catalogue():
    page = (REPO / "docs" / "rules.md").read_text()
    assert rules_markdown() in page and all(f"| {rid} |" in page for rid in RULES)
    assert "rules:begin" not in README and "| LC001 |" not in README  # the README links there instead
    assert "docs/rules.md" in README


def test_rules_page_has_an_anchor_per_rule_for_sarif_help_links():
    page = (REPO / "docs" / "rules.md").read_text()
    assert page == rules_page(), "docs/rules.md is stale: run python scripts/sync_docs.py"
    assert all(f'<a id="{rid.lower()}"></a>' in page for rid in RULES)


def test_every_rule_id_is_named_by_some_test():
    # a tripwire, not proof: a rule no test names has certainly never been triggered by one
    sources = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    untested = [rid for rid in RULES if rid not in sources]
    assert untested == [], f"rules without a test that triggers them: {untested}"


def test_bundled_examples_are_reproducible(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_examples", REPO / "examples" / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in module.EXAMPLES:
        for committed in sorted((REPO / "examples" / name).iterdir()):
            fresh = tmp_path / name / committed.name
            assert fresh.read_bytes() == committed.read_bytes(), f"examples/{name}/{committed.name} drifted"


def test_modelopt_example_is_refused_for_the_documented_reasons():
    result = run_cli("validate", str(REPO / "examples" / "tiny-modelopt-nvfp4"), "--format", "json")
    assert result.returncode == 1
    fired = {f["rule"] for f in json.loads(result.stdout)["findings"]}
    assert {"LC306", "LC310", "LC322"} <= fired
