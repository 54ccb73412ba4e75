"""Every example in a `--help` runs as written from the repository root, and its output is checked (issues 22, 40).

An example that names files of the reader's own (a Hub repo, a waiver file, a server, a training target) sits
under a `# template: ...` line in the help: it is not run as written (`examples_of`); one in EXPECTED (template=True)
runs with the sandbox's stand-ins, any other must still parse. An unmarked example with no EXPECTED entry fails.
The examples are read from the help text itself (lilicorr-ckpt's commands, the pre-commit hook, `python -m
lilicorr_train`), so an edited example is the one that runs. Each runs in a fresh directory standing for the
repository root (`examples/`, `tests/data/`, `.cache/smollm2/` linked), which also holds the stand-ins (`./drafter` is the bundled drafter, `./Qwen3-8B` and
`./target` the bundled target, `./export` the bundled ModelOpt export, `Qwen/Qwen3-8B` and `acme/my-drafter` repos
in a local Hugging Face cache read offline: the offline equivalent of the Hub). An example with no entry in
EXPECTED fails the test: add what it must print. `smoke` examples run with SMOKE_CAP appended (one prompt per
category, a few tokens), so that each takes seconds on the tiny pair; an example that needs a GPU runs as written
when one is there and, without one, must say so and exit 2. The one on the SmolLM2 GGUF runs with
LILICORR_SLOW_EXAMPLES=1 (it is too heavy for the suite's budget).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.cli import cli, main

from helpers import REPO

EXAMPLES = REPO / "examples"
GGUF = REPO / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE_CAP = ("--limit", "1", "--max-new-tokens", "6", "--no-warmup")
# a --sweep example runs at batch sizes up to 8: three prompts per category (9), so that every size fits
SWEEP_CAP = ("--limit", "3", "--max-new-tokens", "6", "--no-warmup")
SHA = "0123456789abcdef0123456789abcdef01234567"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# --- the examples, as the help prints them -------------------------------------------------------------------


def _help(command: click.Command, name: str, program: click.Command | None = None) -> str:
    """The help text, in the settings of the program the command belongs to (its -h): a bare Context would make
    the command cache a help option of --help alone (click caches it per command), and a later `CMD -h` fails."""
    settings = (program or command).context_settings
    with click.Context(command, info_name=name, **settings) as ctx:
        return command.get_help(ctx)


PROGRAMS = ("lilicorr-ckpt ", "lilicorr-ckpt-pre-commit ", "python -m lilicorr_train ")
TEMPLATE = "# template:"


def examples_of(text: str) -> list[tuple[str, bool]]:
    """(example, is a template) for every example line of one help text. A `# template: ...` line marks the
    example lines right under it, up to the next line that is none (a blank line, prose, another comment): those
    name files of the reader's own and are not run as written (issue 40). A `\\` continues a line."""
    out = []
    marked = False
    for line in re.sub(r"\\\n\s*", "", text).splitlines():
        stripped = line.strip()
        if stripped.startswith(PROGRAMS) or stripped == "lilicorr-ckpt":
            out.append((stripped, marked))
        else:
            marked = stripped.startswith(TEMPLATE)
    return out


def help_examples() -> list[tuple[str, str, bool]]:
    """(where, example, is a template) for every example line of every command's help, hidden ones included, the
    pre-commit hook's and the training recipe's (`python -m lilicorr_train`)."""
    from lilicorr_ckpt.precommit import hook
    from lilicorr_train.__main__ import main as train

    helps = [("lilicorr-ckpt --help", _help(cli, "lilicorr-ckpt"))]
    for name, command in sorted(cli.commands.items()):
        helps.append((f"{name} --help", _help(command, name, cli)))
        for sub, subcommand in sorted(getattr(command, "commands", {}).items()):
            helps.append((f"{name} {sub} --help", _help(subcommand, sub, cli)))
    helps.append(("lilicorr-ckpt-pre-commit --help", _help(hook, "lilicorr-ckpt-pre-commit")))
    helps.append(("python -m lilicorr_train --help", _help(train, "python -m lilicorr_train")))
    for name, command in sorted(train.commands.items()):
        helps.append((f"python -m lilicorr_train {name} --help", _help(command, name, train)))
    return [(where, example, marked) for where, text in helps for example, marked in examples_of(text)]


def command_of(example: str) -> str:
    """The example without its trailing `# comment`, spaces collapsed (the key of EXPECTED)."""
    quote = None
    for i, char in enumerate(example):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and i and example[i - 1].isspace():
            return " ".join(example[:i].split())
    return " ".join(example.split())  # the typical flow aligns its columns


# --- a directory with the names the examples use -------------------------------------------------------------


def _cache_repo(cache: Path, repo_id: str, source: Path, refs: tuple[str, ...] = ("main",)) -> None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(source, repo / "snapshots" / SHA)
    (repo / "refs").mkdir()
    for ref in refs:
        (repo / "refs" / ref).write_text(SHA)


def sandbox(
    root: Path, drafter: Path = EXAMPLES / "tiny-lilicorr", *, embeddings: bool = False
) -> dict[str, str]:
    """Lay out root; the environment the examples run with. embeddings: ./export keeps the target's embedding
    table (model.embed_tokens.weight), as some ModelOpt exports do."""
    shutil.copytree(drafter, root / "drafter")
    for name in ("Qwen3-8B", "target"):
        shutil.copytree(EXAMPLES / "tiny-target", root / name)
    shutil.copytree(EXAMPLES / "tiny-modelopt-nvfp4", root / "modelopt-export")
    if embeddings:
        config = fixtures.draft_config()

        def add_embeddings(tensors: dict) -> None:
            vocab, hidden = config["vocab_size"], config["hidden_size"]
            tensors["model.embed_tokens.weight"] = ("BF16", (vocab, hidden), bytes(2 * vocab * hidden))

        fixtures.write_checkpoint(
            root / "export", config, quant="NVFP4", style="modelopt", mutate=add_embeddings
        )
    else:
        shutil.copytree(EXAMPLES / "tiny-modelopt-nvfp4", root / "export")
    (root / "examples").symlink_to(EXAMPLES)
    (root / "tests").mkdir()
    (root / "tests" / "data").symlink_to(REPO / "tests" / "data")  # the producer fixtures convert's help uses
    (root / "ci").mkdir()
    (root / "ci" / "lilicorr.toml").write_text(
        '[[waivers]]\nrules = ["LC314", "LC015"]\nreason = "unconfirmed loading checked by hand"\n'
    )
    (root / "my_prompts.jsonl").write_text(
        "".join(
            json.dumps({"id": f"mine/{i}", "category": "mine", "prompt": p, "chat": True}) + "\n"
            for i, p in enumerate(["hello there", "a tiny test"])
        )
    )
    if GGUF.is_file():
        (root / "SmolLM2.gguf").symlink_to(GGUF)
        (root / ".cache").mkdir()
        (root / ".cache" / "smollm2").symlink_to(GGUF.parent)  # as scripts/fetch_smollm2.sh leaves it
    (root / "run").mkdir()
    shutil.copy(EXAMPLES / "train_smollm2" / "log.jsonl", root / "run" / "log.jsonl")  # a training log
    cache = root / "hf-cache"
    _cache_repo(cache, "Qwen/Qwen3-8B", EXAMPLES / "tiny-target")
    _cache_repo(cache, "acme/my-drafter", EXAMPLES / "tiny-lilicorr", refs=("main", "v1.0"))
    return {
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "GITHUB_STEP_SUMMARY": str(root / "summary.md"),
        "NO_COLOR": "1",
        "OMP_NUM_THREADS": "1",
    }


@dataclass
class Ran:
    code: int
    out: str
    err: str
    root: Path


def _in_process(argv: list[str], root: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            pytest.raises(SystemExit) as exc,
        ):
            main(argv)
    finally:
        os.chdir(cwd)
    code = exc.value.code
    return (0 if code is None else int(code)), out.getvalue(), err.getvalue()


def run_example(example: str, root: Path, env: dict[str, str], *, fresh_process: bool) -> Ran:
    """Run one example line in root: `lilicorr-ckpt ARGS [| PROGRAM ...] [> FILE | >> FILE]`."""
    tokens = [
        re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), t)
        for t in shlex.split(example, comments=True)
    ]
    pipe: list[str] = []
    redirect: tuple[str, str] | None = None
    if "|" in tokens:
        cut = tokens.index("|")
        tokens, pipe = tokens[:cut], tokens[cut + 1 :]
    for op in (">>", ">"):
        if op in tokens:
            cut = tokens.index(op)
            tokens, redirect = tokens[:cut], (op, tokens[cut + 1])
    if tokens[:3] == ["python", "-m", "lilicorr_train"]:
        tokens = ["lilicorr_train", *tokens[3:]]
    program, *argv = tokens
    if program == "lilicorr-ckpt" and argv[:1] == ["smoke"]:
        argv += SWEEP_CAP if "--sweep" in argv else SMOKE_CAP
    if program == "lilicorr-ckpt-pre-commit":
        command = [sys.executable, "-m", "lilicorr_ckpt.precommit", *argv]
        fresh_process = True
    elif program == "lilicorr_train":
        command = [sys.executable, "-m", "lilicorr_train", *argv]
        fresh_process = True
    else:
        assert program == "lilicorr-ckpt", example
        command = [sys.executable, "-m", "lilicorr_ckpt.cli", *argv]
    if fresh_process:
        proc = subprocess.run(
            command,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update({k: v for k, v in env.items() if k in ("GITHUB_STEP_SUMMARY", "NO_COLOR")})
        try:
            code, out, err = _in_process(argv, root)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    if redirect is not None:
        with open(root / redirect[1], "a" if redirect[0] == ">>" else "w") as f:
            f.write(out)
        out = ""
    if pipe:
        assert shutil.which(pipe[0]), f"{example}: needs {pipe[0]}"
        piped = subprocess.run(pipe, input=out, capture_output=True, text=True, cwd=root, timeout=60)
        assert piped.returncode == 0, piped.stderr
        out = piped.stdout
    return Ran(code, out, err, root)


# --- what each example must do -------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return text.strip().splitlines()


def _gates(out: str) -> dict[str, str]:
    return {
        m.group(2): m.group(1) for m in re.finditer(r"^\s+(PASS|FAIL|SKIP|INCONCLUSIVE)\s+(\S+)", out, re.M)
    }


def _ok(ran: Ran, code: int = 0) -> None:
    assert ran.code == code, f"exit {ran.code}\n{ran.out}\n{ran.err}"


def _validate_pass(ran: Ran) -> None:
    _ok(ran)
    assert _lines(ran.out)[-1].startswith("PASS 0 errors, 0 warnings"), ran.out


def _validate_one_runtime(ran: Ran) -> None:
    _validate_pass(ran)
    assert _lines(ran.out)[-1].endswith(": accepts") and _lines(ran.out)[-1].count("accepts") == 1


def _junit_file(ran: Ran) -> None:
    _ok(ran)
    assert ET.fromstring((ran.root / "validate.xml").read_text()).get("failures") == "0" and ran.out == ""
    assert ": PASS - 0 errors, 0 warnings" in ran.err  # the log's one line


def _report_files(ran: Ran) -> None:
    _ok(ran)
    assert "PASS 0 errors, 0 warnings" in ran.out
    assert json.loads((ran.root / "v.sarif").read_text())["version"] == "2.1.0"
    assert ET.fromstring((ran.root / "v.xml").read_text()).get("failures") == "0"


def _hub(ran: Ran) -> None:
    _ok(ran)
    assert ran.out.startswith("lilicorr-ckpt validate acme/my-drafter@v1.0\n") and "PASS 0 errors" in ran.out


def _inspect_text(ran: Ran) -> None:
    _ok(ran)
    assert "LiLiCorrDraftModel" in ran.out and "runtimes" in ran.out, ran.out


def _inspect_jq(ran: Ran) -> None:
    _ok(ran)
    assert ran.out.strip() == "4"  # the bundled drafter's top-k


def _converted(ran: Ran, runtime: str = "sglang") -> dict:
    _ok(ran)
    assert (ran.root / "drafter" / "conversion.json").is_file() and f"validate  {runtime}: accepts" in ran.out
    return json.loads((ran.root / "drafter" / "config.json").read_text())


def _convert_plain(ran: Ran) -> None:
    _converted(ran)
    assert len(list((ran.root / "drafter").glob("*.safetensors"))) == 1


def _convert_dry_run(ran: Ran) -> None:
    _ok(ran)
    assert not (ran.root / "drafter").exists() and "validate  sglang: accepts" in ran.out


def _convert_sequential(ran: Ran) -> None:
    _converted(ran, "trtllm")
    data = (ran.root / "drafter" / "model.safetensors").read_bytes()
    names = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert any(re.search(r"\.mlp\.\d+\.", name) for name in names)  # the legacy Sequential names


def _convert_refused(ran: Ran) -> None:
    _ok(ran, 1)
    assert not (ran.root / "drafter").exists() and "Nothing was written to ./drafter" in ran.out + ran.err


def _convert_set(ran: Ran) -> None:
    assert _converted(ran)["dflash_config"]["lilicorr_logit_scale"] == 12


def _convert_sharded(ran: Ran) -> None:
    _converted(ran)
    index = json.loads((ran.root / "drafter" / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in (ran.root / "drafter").glob("*.safetensors"))
    assert len(shards) >= 2 and sorted(set(index["weight_map"].values())) == shards


def _convert_to_speculators(ran: Ran) -> None:
    _ok(ran)
    config = json.loads((ran.root / "dflash2-spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash2" and "model_type" not in config
    assert config["sliding_window_non_causal"] is True  # ModelOpt trained every layer bidirectionally
    assert "layout    z-lab -> speculators" in ran.out and "validate  vllm: accepts" in ran.out


def _convert_to_zlab(ran: Ran) -> None:
    _ok(ran)
    config = json.loads((ran.root / "dflash-zlab" / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [1, 3, 4] and "speculators_config" not in config
    assert (
        "layout    speculators -> z-lab" in ran.out and "validate  sglang: accepts, vllm: accepts" in ran.out
    )


def _convert_verify(ran: Ran) -> None:
    _converted(ran)
    assert "verify" in ran.out.lower()


def _smoke_consistent(ran: Ran) -> dict[str, str]:
    """The gates ran and the exit code is theirs (a random drafter's head gate may pass or not on a few tokens)."""
    gates = _gates(ran.out)
    assert {"measured", "lossless", "head-loaded"} <= set(gates), ran.out + ran.err
    assert ran.code == (1 if {"FAIL", "INCONCLUSIVE"} & set(gates.values()) else 0), ran.out + ran.err
    return gates


def _smoke_ran(ran: Ran) -> None:
    assert _smoke_consistent(ran)["lossless"] == "PASS"


def _smoke_sweep(ran: Ran) -> None:
    assert _smoke_consistent(ran)["lossless"] == "PASS"
    table = ran.out.split("speed by batch size")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in table[2:5]] == ["1", "4", "8"], ran.out  # a row per size, in order
    assert all(line.endswith("9/9") for line in table[2:5]), (
        ran.out
    )  # the same tokens at every size (SWEEP_CAP)


def _gpu(ran: Ran) -> None:
    if _cuda():
        assert ran.code in (0, 1) and _gates(ran.out).get("kernel-parity") == "PASS", ran.out + ran.err
    else:  # without a GPU it says so
        assert ran.code == 2 and "--gpu needs a CUDA device" in ran.err, ran.out + ran.err


def _smoke_gguf(ran: Ran) -> None:
    assert _smoke_consistent(ran)["lossless"] == "PASS"
    assert "prompts  math 1 (1)" in ran.out  # --probes math (capped to one prompt)


def _smoke_baseline(ran: Ran) -> None:
    cases = {c.get("name"): c for c in ET.fromstring(ran.out).iter("testcase")}
    failed = {name for name, c in cases.items() if c.find("failure") is not None}
    assert ran.code == (1 if failed else 0), ran.out + ran.err
    assert {"lossless", "baseline"} <= set(cases) - failed, (
        ran.out
    )  # the same run again: within the tolerance


def _smoke_sampled(ran: Ran) -> None:
    assert _smoke_consistent(ran)["lossless"] == "SKIP"  # sampled: nothing to compare token for token
    assert "prompts  mine 1 (1)" in ran.out and "seeds 0,1,2" in ran.out


def _engine_not_running(ran: Ran) -> None:
    # no SGLang or vLLM runs beside the suite: the example prints the command that starts one and says that
    # nothing answers (tests/smoke/test_engine.py runs --engine against loopback servers)
    assert ran.code == 2, ran.err
    assert "must serve this drafter, started as:" in ran.err
    assert "python -m sglang.launch_server" in ran.err or "vllm serve" in ran.err


def _card_repo_id(ran: Ran) -> None:
    _ok(ran)
    card = (ran.root / "card.md").read_text()
    assert (
        "license: apache-2.0" in card
        and "me/tiny-lilicorr" in card
        and "<!-- lilicorr-ckpt card:begin" in card
    )
    assert not (
        EXAMPLES / "tiny-lilicorr" / "README.md"
    ).exists()  # -o card.md: the bundled example is left alone


def _card_with_profile(ran: Ran) -> None:
    if _cuda():
        _ok(ran)
        card = (ran.root / "card.md").read_text()
        assert "acceptance" in card.lower() and "answers the target wrote" in card
        assert "](acceptance.svg)" in card and (ran.root / "acceptance.svg").is_file()  # the chart, beside it
    else:  # a CPU profile is not published without --allow-unverified
        _ok(ran, 1)
        assert "is not a verified measurement" in ran.err and "--allow-unverified" in ran.err
        assert not (ran.root / "card.md").exists() and not (ran.root / "acceptance.svg").exists()


def _flow_converted(ran: Ran) -> None:
    _ok(ran)
    assert (ran.root / "my-drafter" / "conversion.json").is_file()
    assert "validate  sglang: accepts, vllm: accepts, trtllm: accepts" in ran.out


def _smoke_page(ran: Ran) -> None:
    _smoke_consistent(ran)
    profile = json.loads((ran.root / "profile.json").read_text())
    page = (ran.root / "smoke.html").read_text()
    svg = ET.fromstring(re.search(r"<svg .*?</svg>", page, re.S).group(0))
    drawn = {
        (r.get("data-arm"), int(r.get("data-position"))): float(r.get("data-value"))
        for r in svg.iter("{http://www.w3.org/2000/svg}rect")
        if r.get("class") == "bar" and r.get("data-scope") == "all"
    }
    for arm in ("head", "control"):
        for i, rate in enumerate(profile["arms"][arm]["marginal_accept_rates"]):
            assert drawn[(arm, i + 1)] == pytest.approx(rate, abs=1e-6)


def _generated(ran: Ran) -> None:
    _ok(ran)
    assert (ran.root / "data.npz").is_file()


def _trained(ran: Ran) -> None:
    _ok(ran)
    assert (ran.root / "run" / "log.jsonl").is_file()


def _exported(ran: Ran) -> None:
    _ok(ran)
    assert json.loads((ran.root / "export" / "config.json").read_text())["architectures"]


def _report_text(ran: Ran) -> None:
    _validate_pass(ran)


def _saved_report(ran: Ran) -> None:
    _ok(ran)
    assert json.loads((ran.root / "report.json").read_text())["exit_code"] == 0


def _report_github(ran: Ran) -> None:
    _ok(ran)
    assert _lines(ran.out) == [_lines(ran.out)[-1]] and _lines(ran.out)[-1].startswith(
        "lilicorr-ckpt validate examples/tiny-lilicorr: PASS"
    )  # nothing to annotate: the summing-up line only


def _report_markdown(ran: Ran) -> None:
    _ok(ran)
    summary = (ran.root / "summary.md").read_text()
    assert (
        summary.startswith("### ✅ lilicorr-ckpt validate `examples/tiny-lilicorr`: PASS") and ran.out == ""
    )


def _report_sarif(ran: Ran) -> None:
    _ok(ran)
    assert json.loads((ran.root / "validate.sarif").read_text())["runs"][0]["results"] == []


def _runtimes_every(ran: Ran) -> None:
    from lilicorr_ckpt.runtimes import EVERY_RELEASE

    _ok(ran)
    heads = [line for line in _lines(ran.out) if not line.startswith(" ")]
    assert [h.split("  (")[0] for h in heads] == [p.display for p in EVERY_RELEASE]


def _runtimes_engine(ran: Ran) -> None:
    from lilicorr_ckpt.runtimes import RELEASES

    _ok(ran)
    heads = [line for line in _lines(ran.out) if not line.startswith(" ")]
    assert [h.split("  (")[0] for h in heads] == [RELEASES["sglang"][-1].display]
    assert "newest" in heads[0]


def _runtimes_jq(ran: Ran) -> None:
    from lilicorr_ckpt.runtimes import RELEASES

    _ok(ran)
    # vLLM checked LiLiCorr's head coverage until the release that dropped the check
    assert _lines(ran.out) == [p.head_coverage for p in RELEASES["vllm"]]
    assert _lines(ran.out)[0] == "refused" and _lines(ran.out)[-1] == "initialised"


def _rules_list(ran: Ran) -> None:
    from lilicorr_ckpt.checks import RULES

    _ok(ran)
    assert [line.split()[0] for line in _lines(ran.out)] == list(RULES)


def _rule_long(ran: Ran) -> None:
    _ok(ran)
    assert ran.out.startswith("LC314 quant-unconfirmed") and "Fix:" in ran.out


def _rule_retired(ran: Ran) -> None:
    _ok(ran)
    assert "LC403" in ran.out and "retired" in ran.out.lower() and "LC404" in ran.out


def _error_ids(ran: Ran) -> None:
    from lilicorr_ckpt.checks import RULES

    _ok(ran)
    assert [json.loads(line) for line in _lines(ran.out)] == [
        r.id for r in RULES.values() if r.severity == "error"
    ]


def _schema_file(ran: Ran) -> None:
    _ok(ran)
    assert (ran.root / "validate-report.schema.json").read_text() == (
        REPO / "schemas" / "validate-report.schema.json"
    ).read_text()


def _workflow_output(ran: Ran) -> None:
    from ghrunner import parse_github_output

    _ok(ran)
    assert parse_github_output((ran.root / "GITHUB_OUTPUT").read_text()) == {
        "exit-code": "2",
        "result": "error",
    }


def _workflow_annotate(ran: Ran) -> None:
    _ok(ran)
    assert ran.out == "::error title=lilicorr-ckpt validate (exit 2)::cannot read ./drafter\n"


def _workflow_log(ran: Ran) -> None:
    from ghrunner import obeyed_commands

    _ok(ran)
    assert "::error::x" in ran.out and obeyed_commands(ran.out) == []


def _workflow_summary(ran: Ran) -> None:
    _ok(ran)
    assert ran.out.startswith("### ✅ lilicorr-ckpt smoke `./drafter`: PASS\n\n```\nok\n```\n")


def _hook_files(ran: Ran) -> None:
    _ok(ran)
    assert "lilicorr-ckpt validate examples/tiny-lilicorr --strict" in ran.out and "PASS 0 errors" in ran.out


def _hook_dir(ran: Ran) -> None:
    _ok(ran)
    assert "lilicorr-ckpt validate examples/tiny-lilicorr --target examples/tiny-target" in ran.out
    assert "PASS 0 errors" in ran.out


@dataclass
class Expect:
    check: Callable[[Ran], None]
    before: list[str] = field(default_factory=list)  # steps run first, unchecked (see _prepare)
    fresh_process: bool = False  # reads the HF cache (its location is read when huggingface_hub is imported)
    drafter: Path = EXAMPLES / "tiny-lilicorr"
    needs_gguf: bool = False
    needs_torch: bool = False
    embeddings: bool = False  # ./export carries an embedding table (for --drop)
    # a `# template:` example (it names files of the reader's): run in the sandbox, which has them (a Hub repo in
    # the local cache, ci/lilicorr.toml, my_prompts.jsonl); every other example runs as written from the repo root
    template: bool = False


NO_DST = ["rm -r drafter"]  # convert writes ./drafter
NVFP4 = "examples/tiny-modelopt-nvfp4"  # the bundled ModelOpt NVFP4 export
SAVED = ["lilicorr-ckpt validate examples/tiny-lilicorr -f json -o report.json"]
PROFILE = ["lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --output profile.json"]
GPU_PROFILE = [
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --gpu --output profile.json"
]
TRAIN_GENERATE = (
    "python -m lilicorr_train generate --target examples/tiny-target --out data.npz --prompts 8 --max-new-tokens 12 "
    "--device cpu"
)
TRAIN_RUN = (
    "python -m lilicorr_train train run --target examples/tiny-target --data data.npz --mask-token-id 511 "
    "--init-layer 3 --steps 2 --batch-size 2 --anchors 4 --device cpu"
)
FLOW = ["lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 my-drafter -r all"]

EXPECTED: dict[str, Expect] = {
    # lilicorr-ckpt --help: the typical flow (its convert leaves my-drafter for the next two)
    "lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 my-drafter -r all": Expect(_flow_converted),
    "lilicorr-ckpt inspect my-drafter": Expect(_inspect_text, before=FLOW),
    "lilicorr-ckpt validate my-drafter --target examples/tiny-target": Expect(_validate_pass, before=FLOW),
    "lilicorr-ckpt smoke examples/tiny-lilicorr --target examples/tiny-target": Expect(
        _smoke_ran, needs_torch=True
    ),
    "lilicorr-ckpt rules": Expect(_rules_list),
    # runtimes --help
    "lilicorr-ckpt runtimes": Expect(_runtimes_every),
    "lilicorr-ckpt runtimes sglang": Expect(_runtimes_engine),
    "lilicorr-ckpt runtimes 'vllm>=0' -f json | jq -r '.[].head_coverage'": Expect(_runtimes_jq),
    # validate --help
    "lilicorr-ckpt validate examples/tiny-lilicorr": Expect(_validate_pass),
    "lilicorr-ckpt validate examples/tiny-lilicorr --target examples/tiny-target --runtime sglang": Expect(
        _validate_one_runtime
    ),
    "lilicorr-ckpt validate examples/tiny-lilicorr -f junit -o validate.xml --strict": Expect(_junit_file),
    "lilicorr-ckpt validate examples/tiny-lilicorr --strict --sarif v.sarif --junit v.xml": Expect(
        _report_files
    ),
    "lilicorr-ckpt validate acme/my-drafter@v1.0": Expect(_hub, fresh_process=True, template=True),
    "lilicorr-ckpt validate examples/tiny-lilicorr --strict --ignore LC314,LC015": Expect(_validate_pass),
    "lilicorr-ckpt validate examples/tiny-lilicorr --strict --config ci/lilicorr.toml": Expect(
        _validate_pass, template=True
    ),
    # inspect --help
    "lilicorr-ckpt inspect examples/tiny-lilicorr": Expect(_inspect_text),
    "lilicorr-ckpt inspect examples/tiny-lilicorr -f json | jq .geometry.candidate_topk": Expect(_inspect_jq),
    # convert --help: run from the repository root (the sandbox links examples/ and tests/data/)
    f"lilicorr-ckpt convert {NVFP4} ./drafter": Expect(_convert_plain, before=NO_DST),
    f"lilicorr-ckpt convert {NVFP4} ./drafter --dry-run": Expect(_convert_dry_run, before=NO_DST),
    f"lilicorr-ckpt convert {NVFP4} ./drafter -r trtllm --naming sequential": Expect(
        _convert_sequential, before=NO_DST
    ),
    f"lilicorr-ckpt convert {NVFP4} ./drafter --no-repair": Expect(_convert_refused, before=NO_DST),
    f"lilicorr-ckpt convert {NVFP4} ./drafter --set dflash_config.lilicorr_logit_scale=12": Expect(
        _convert_set, before=NO_DST
    ),
    f"lilicorr-ckpt convert {NVFP4} ./drafter --max-shard-size 50KB --force": Expect(
        _convert_sharded, before=NO_DST
    ),
    f"lilicorr-ckpt convert {NVFP4} ./drafter --verify": Expect(
        _convert_verify, before=NO_DST, needs_torch=True
    ),
    "lilicorr-ckpt convert tests/data/producers/modelopt-0.48.0rc1/dflash2-bf16 ./dflash2-spec --to speculators": Expect(
        _convert_to_speculators
    ),
    "lilicorr-ckpt convert tests/data/producers/speculators-0.9.0/dflash-bf16 ./dflash-zlab": Expect(
        _convert_to_zlab
    ),
    # smoke --help (each capped: SMOKE_CAP; its first example is the typical flow's, above)
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target": Expect(
        _smoke_ran, needs_torch=True
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --output profile.json --html smoke.html": Expect(
        _smoke_page, needs_torch=True
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --baseline profile.json --format junit": Expect(
        _smoke_baseline, before=PROFILE, needs_torch=True
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --gpu": Expect(
        _gpu, needs_torch=True
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --sweep 1,4,8": Expect(
        _smoke_sweep, needs_torch=True
    ),
    "lilicorr-ckpt smoke examples/smollm2-lilicorr -t .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "
    "--probes math --limit 4 --max-new-tokens 64": Expect(_smoke_gguf, needs_gguf=True, needs_torch=True),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --probes my_prompts.jsonl --temperature 0.7 --seeds 0,1,2": Expect(
        _smoke_sampled, needs_torch=True, template=True
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --engine sglang=http://localhost:30000": Expect(
        _engine_not_running, template=True
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --engine vllm=http://localhost:8000 -c 8": Expect(
        _engine_not_running, template=True
    ),
    # card --help (the profile of its last example comes from the GPU smoke before it; without a GPU the CPU
    # profile made instead must be refused as unverified)
    "lilicorr-ckpt card examples/tiny-lilicorr --target examples/tiny-target --repo-id me/tiny-lilicorr --license apache-2.0 -o card.md": Expect(
        _card_repo_id
    ),
    "lilicorr-ckpt smoke examples/tiny-lilicorr --target examples/tiny-target --gpu --output profile.json": Expect(
        _gpu, needs_torch=True
    ),
    "lilicorr-ckpt card examples/tiny-lilicorr --target examples/tiny-target --profile profile.json --training-log examples/train_smollm2/log.jsonl "
    '--training-data "answers the target wrote" -o card.md': Expect(
        _card_with_profile, before=GPU_PROFILE if _cuda() else PROFILE, needs_torch=True
    ),
    # report --help: its first example leaves report.json
    "lilicorr-ckpt validate examples/tiny-lilicorr -f json -o report.json": Expect(_saved_report),
    "lilicorr-ckpt report report.json": Expect(_report_text, before=SAVED),
    "lilicorr-ckpt report report.json -f github": Expect(_report_github, before=SAVED),
    'lilicorr-ckpt report report.json -f markdown >> "$GITHUB_STEP_SUMMARY"': Expect(
        _report_markdown, before=SAVED, template=True
    ),
    "lilicorr-ckpt report report.json -f sarif -o validate.sarif": Expect(_report_sarif, before=SAVED),
    # rules --help
    "lilicorr-ckpt rules LC314": Expect(_rule_long),
    "lilicorr-ckpt rules LC403": Expect(_rule_retired),
    "lilicorr-ckpt rules -f json | jq '.[] | select(.severity == \"error\") | .id'": Expect(_error_ids),
    # schema --help
    "lilicorr-ckpt schema validate-report > validate-report.schema.json": Expect(_schema_file),
    # the hidden workflow plumbing (action.yml)
    'lilicorr-ckpt workflow output exit-code 2 result error >> "$GITHUB_OUTPUT"': Expect(
        _workflow_output, template=True
    ),
    'lilicorr-ckpt workflow annotate error "cannot read ./drafter" --title "lilicorr-ckpt validate (exit 2)"': Expect(
        _workflow_annotate
    ),
    "lilicorr-ckpt workflow log stderr.txt": Expect(
        _workflow_log, before=["write stderr.txt ::error::x"], template=True
    ),
    'lilicorr-ckpt workflow summary --title "lilicorr-ckpt smoke" --path ./drafter --status PASS --log smoke.txt': Expect(
        _workflow_summary, before=["write smoke.txt ok"], template=True
    ),
    # python -m lilicorr_train --help: the tiny pair, two steps on the CPU (./run is the sandbox's log folder)
    TRAIN_GENERATE: Expect(_generated, needs_torch=True),
    TRAIN_RUN: Expect(_trained, before=["rm -r run", TRAIN_GENERATE], needs_torch=True),
    "python -m lilicorr_train export run --out export": Expect(
        _exported, before=["rm -r run", "rm -r export", TRAIN_GENERATE, TRAIN_RUN], needs_torch=True
    ),
    # the pre-commit hook's help
    "lilicorr-ckpt-pre-commit --strict -- examples/tiny-lilicorr/config.json examples/tiny-lilicorr/model.safetensors": Expect(
        _hook_files
    ),
    "lilicorr-ckpt-pre-commit --dir examples/tiny-lilicorr --target examples/tiny-target": Expect(_hook_dir),
}


def _prepare(step: str, root: Path, env: dict[str, str]) -> None:
    """A `before` step: `rm -r NAME`, `write FILE TEXT`, or an (unchecked) example."""
    verb, _, rest = step.partition(" ")
    if verb == "rm":
        shutil.rmtree(root / rest.split()[-1])
    elif verb == "write":
        name, _, text = rest.partition(" ")
        (root / name).write_text(text + "\n")
    else:
        run_example(step, root, env, fresh_process=False)


ALL = help_examples()
TEMPLATES = {command_of(example) for _, example, marked in ALL if marked}


def test_every_help_example_has_an_expectation():
    """An example runs as written from the repository root (an EXPECTED entry checks what it prints), or it is
    marked `# template:` (issue 40). An unmarked example with no entry fails here."""
    missing = [
        f"{where}: {command_of(example)}"
        for where, example, marked in ALL
        if not marked and command_of(example) not in EXPECTED
    ]
    assert missing == [], "help examples neither in EXPECTED nor marked `# template:`: " + "; ".join(missing)
    stale = set(EXPECTED) - {command_of(example) for _, example, _ in ALL}
    assert stale == set(), f"EXPECTED entries no help shows any more: {stale}"
    wrong = {c for c, e in EXPECTED.items() if e.template != (c in TEMPLATES)}
    assert wrong == set(), f"EXPECTED's template= disagrees with the help's `# template:` marks: {wrong}"


def test_the_template_mark_covers_the_examples_under_it_only():
    text = """Examples:
  lilicorr-ckpt validate examples/tiny-lilicorr
  # template: acme/x is your repo
  lilicorr-ckpt validate acme/x
  lilicorr-ckpt validate acme/y \\
      --strict

  lilicorr-ckpt rules
  # a plain comment
  lilicorr-ckpt runtimes
"""
    assert examples_of(text) == [
        ("lilicorr-ckpt validate examples/tiny-lilicorr", False),
        ("lilicorr-ckpt validate acme/x", True),
        ("lilicorr-ckpt validate acme/y --strict", True),
        ("lilicorr-ckpt rules", False),
        ("lilicorr-ckpt runtimes", False),
    ]


def _argv_parses(group: click.Group, prog: str, argv: list[str]) -> None:
    """Click parses argv as the command line would (options exist, values are valid), running nothing; a path
    the template names need not exist (it is the reader's)."""
    # the group's own settings (its -h), as the command line gets them: a bare Context would make each command
    # cache a help option of --help alone (click caches it per command), and a later `CMD -h` would fail
    ctx = click.Context(group, info_name=prog, **group.context_settings)
    command = group.get_command(ctx, argv[0])
    assert command is not None and not isinstance(command, click.Group), argv
    try:
        with command.make_context(argv[0], list(argv[1:]), parent=ctx):
            pass
    except click.BadParameter as exc:
        assert "does not exist" in str(exc.message), exc.format_message()


@pytest.mark.parametrize("example", sorted(TEMPLATES - set(EXPECTED)))
def test_a_template_that_is_not_run_still_parses(example):
    """A template names the reader's files, so it is not run; its options must still be ones the command takes."""
    from lilicorr_train.__main__ import main as train

    for part in example.split("&&"):
        tokens = shlex.split(part, comments=True)
        for op in ("|", ">>", ">"):
            tokens = tokens[: tokens.index(op)] if op in tokens else tokens
        if tokens[:3] == ["python", "-m", "lilicorr_train"]:
            _argv_parses(train, "python -m lilicorr_train", tokens[3:])
        else:
            assert tokens[0] == "lilicorr-ckpt", example
            _argv_parses(cli, "lilicorr-ckpt", tokens[1:])


@pytest.mark.parametrize("example", sorted({command_of(e) for _, e, _ in ALL} & set(EXPECTED)))
def test_help_example_runs_and_prints_what_it_says(example, tmp_path):
    expect = EXPECTED[example]
    if expect.needs_gguf and not GGUF.is_file():
        pytest.skip("needs the SmolLM2 GGUF (scripts/fetch_smollm2.sh)")
    if expect.needs_gguf and not os.environ.get("LILICORR_SLOW_EXAMPLES"):
        # loading the 135M GGUF costs ~50 s of CPU and 1.4 GB, beyond the suite's budget; the suite's GGUF smoke
        # is tests/smoke/test_smoke_real_target.py
        pytest.skip("loads the SmolLM2 GGUF (50 s, 1.4 GB): set LILICORR_SLOW_EXAMPLES=1 to run it")
    if expect.needs_torch:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    root = tmp_path / "work"
    root.mkdir()
    env = sandbox(root, expect.drafter, embeddings=expect.embeddings)
    env["GITHUB_OUTPUT"] = str(root / "GITHUB_OUTPUT")
    for step in expect.before:
        _prepare(step, root, env)
    ran = run_example(example, root, env, fresh_process=expect.fresh_process)
    assert "Traceback" not in ran.err, ran.err
    expect.check(ran)
