"""The pre-commit hook: changed files -> their checkpoint directories -> validate each once."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.precommit import checkpoint_dirs, skip_reason

from helpers import REPO

EXAMPLES = REPO / "examples"


def hook(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lilicorr_ckpt.precommit", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.fixture
def tree(tmp_path) -> Path:
    """A drafter repo: a good drafter, a refused export, the target, and a config.json that is not a model's."""
    shutil.copytree(EXAMPLES / "tiny-lilicorr", tmp_path / "drafter")
    shutil.copytree(EXAMPLES / "tiny-modelopt-nvfp4", tmp_path / "export")
    shutil.copytree(EXAMPLES / "tiny-target", tmp_path / "target")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "config.json").write_text('{"lint": true}\n')
    return tmp_path


def test_files_are_grouped_by_the_directory_that_holds_them():
    files = [
        "a/config.json",
        "a/model-00001-of-00002.safetensors",
        "b/hf_quant_config.json",
        "a/README.md",
        "model.safetensors.index.json",
        "a/model.safetensors.index.json",
        "c/notes.txt",
    ]
    assert checkpoint_dirs(files) == [Path("a"), Path("b"), Path(".")]


def test_what_is_skipped_and_why(tree):
    assert skip_reason(tree / "drafter") is None and skip_reason(tree / "export") is None
    assert skip_reason(tree / "target") == "not a drafter (no dflash_config; architectures: LlamaForCausalLM)"
    assert skip_reason(tree / "tools") == "not a drafter (no dflash_config; architectures: none)"
    assert skip_reason(tree / "gone") == "removed in this commit"
    (tree / "weights").mkdir()
    (tree / "weights" / "model.safetensors").write_bytes(b"")
    assert skip_reason(tree / "weights") is None  # weights without config.json: validate says what is missing


def test_changed_files_validate_each_checkpoint_once(tree):
    result = hook(
        "drafter/config.json",
        "drafter/model.safetensors",
        "target/config.json",
        "tools/config.json",
        cwd=tree,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("lilicorr-ckpt validate drafter") == 1
    assert "PASS 0 errors, 0 warnings" in result.stdout
    assert (
        "skipped target: not a drafter" in result.stdout and "skipped tools: not a drafter" in result.stdout
    )
    failing = hook("export/model.safetensors", "drafter/config.json", cwd=tree)
    assert failing.returncode == 1
    assert "lilicorr-ckpt validate export" in failing.stdout and "FAIL" in failing.stdout
    assert "lilicorr-ckpt validate drafter" in failing.stdout  # the others are still reported


def test_nothing_to_check_passes(tree):
    result = hook("tools/config.json", cwd=tree)
    assert result.returncode == 0
    assert "no drafter checkpoint among the changed files" in result.stdout


def test_unreadable_checkpoint_is_exit_2_with_its_reason(tree):
    (tree / "drafter" / "model.safetensors").write_bytes(b"\x00" * 4)
    result = hook("drafter/model.safetensors", cwd=tree)
    assert result.returncode == 2
    assert "drafter: error: model.safetensors: truncated safetensors file" in result.stderr


def test_options_reach_validate(tmp_path):
    owned = fixtures.write_checkpoint(
        tmp_path / "owned", fixtures.draft_config(own_lm_head=True)
    )  # LC404: SGLang
    warned = fixtures.write_checkpoint(
        tmp_path / "warned", fixtures.draft_config(block_size=16)
    )  # LC111 warning
    assert hook("owned/config.json", cwd=tmp_path).returncode == 1
    assert hook("owned/config.json", "--runtime", "vllm", cwd=tmp_path).returncode == 0
    assert hook(str(warned / "config.json"), cwd=tmp_path).returncode == 0
    assert hook(str(warned / "config.json"), "--strict", cwd=tmp_path).returncode == 1
    waived = hook("owned/config.json", "--strict", "--ignore", "LC404", cwd=tmp_path)
    assert waived.returncode == 0 and "waived LC404" in waived.stdout
    (owned / "lilicorr.toml").write_text('[[waivers]]\nrule = "LC404"\nreason = "checked on SGLang"\n')
    # the waiver file beside the checkpoint applies to the hook as to validate
    assert hook("owned/config.json", "--strict", cwd=tmp_path).returncode == 0
    assert hook("owned/config.json", "--runtime", "tensorrt", cwd=tmp_path).returncode == 4
    # a release, and a range: a verdict per release; an unsupported release is a usage error naming the supported
    # (LC404 is waived by the file above; SGLang 0.5.21 also refuses the named head names, LC228)
    assert hook("owned/config.json", "--runtime", "sglang==0.5.21", cwd=tmp_path).returncode == 1
    assert hook("owned/config.json", "--runtime", "vllm>=0.32", cwd=tmp_path).returncode == 0
    bad = hook("owned/config.json", "--runtime", "vllm==0.1.0", cwd=tmp_path)
    assert bad.returncode == 4 and "Supported: sglang" in bad.stderr


def test_file_names_that_look_like_options_are_files(tree):
    from lilicorr_ckpt.precommit import split_arguments

    shutil.copytree(tree / "drafter", tree / "-rf")
    shutil.copytree(tree / "export", tree / "--strict")
    # what pre-commit runs with the manifest's default args ([--]) and with a repo's own args lacking the --
    for args in (["--", "-rf/config.json"], ["-rf/config.json"], ["--runtime", "vllm", "-rf/config.json"]):
        result = hook(*args, cwd=tree)
        assert result.returncode == 0, (args, result.stdout + result.stderr)
        assert "lilicorr-ckpt validate -rf" in result.stdout and "PASS" in result.stdout
    # a directory named like an option, and the real option beside it
    failing = hook("--strict", "--", "--strict/model.safetensors", cwd=tree)
    assert failing.returncode == 1 and "lilicorr-ckpt validate --strict --strict" in failing.stdout
    assert checkpoint_dirs(["-rf/config.json", "--x/a.safetensors"]) == [Path("-rf"), Path("--x")]
    assert split_arguments(["--strict", "-rf/config.json", "-t", "./t", "-x/hf_quant_config.json"]) == [
        "--strict",
        "-t",
        "./t",
        "--",
        "-rf/config.json",
        "-x/hf_quant_config.json",
    ]


def test_an_unexpected_failure_is_exit_2_naming_the_directory_not_a_traceback(tree, monkeypatch, capsys):
    import lilicorr_ckpt.checks.run as run_module
    from lilicorr_ckpt import precommit

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(run_module, "validate", broken)
    monkeypatch.chdir(tree)
    with pytest.raises(SystemExit) as exc:
        precommit.main(["--", "drafter/config.json", "export/config.json"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    assert "drafter: internal error: RuntimeError: boom" in err and "export: internal error" in err
    assert "Traceback" not in out + err

    def crash(*args, **kwargs):
        raise ValueError("outside any directory")

    monkeypatch.setattr(precommit, "checkpoint_dirs", crash)
    with pytest.raises(SystemExit) as exc:
        precommit.main(["--", "drafter/config.json"])
    assert (
        exc.value.code == 2 and "internal error: ValueError: outside any directory" in capsys.readouterr().err
    )


def test_config_option_reaches_the_hook(tmp_path):
    fixtures.write_checkpoint(tmp_path / "owned", fixtures.draft_config(own_lm_head=True))  # LC404
    waivers = tmp_path / "elsewhere" / "waivers.toml"
    waivers.parent.mkdir()
    waivers.write_text('[[waivers]]\nrule = "LC404"\nreason = "checked on SGLang"\n')
    assert hook("--", "owned/config.json", cwd=tmp_path).returncode == 1
    assert hook("--config", str(waivers), "--", "owned/config.json", cwd=tmp_path).returncode == 0
    bad = hook("--config", str(tmp_path / "none.toml"), "--", "owned/config.json", cwd=tmp_path)
    assert bad.returncode == 4 and "no such file" in bad.stderr


def test_dir_mode_validates_what_it_is_given(tree):
    assert hook("--dir", "drafter", cwd=tree).returncode == 0
    assert hook("--dir", "drafter", "export", cwd=tree).returncode == 1
    target = hook("--dir", "target", cwd=tree)  # explicit: not skipped, and validate says what it is
    assert target.returncode == 2 and "is a target model, not a drafter" in target.stdout + target.stderr
    missing = hook("--dir", "drafterr", cwd=tree)
    assert missing.returncode == 2 and "no such directory; did you mean 'drafter'?" in missing.stderr
    usage = hook("--dir", cwd=tree)
    assert usage.returncode == 4 and "--dir needs at least one checkpoint directory" in usage.stderr


def test_the_hook_manifest_matches_the_entry_point():
    yaml = pytest.importorskip("yaml")
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"lilicorr-ckpt-validate", "lilicorr-ckpt-validate-dir"}

    pattern = re.compile(hooks["lilicorr-ckpt-validate"]["files"])
    for name in (
        "config.json",
        "a/b/config.json",
        "x/model-00001-of-00003.safetensors",
        "hf_quant_config.json",
        "d/model.safetensors.index.json",
    ):
        assert pattern.search(name), name
    for name in ("config.json.bak", "README.md", "a/myconfig.json", "tokenizer_config.json"):
        assert not pattern.search(name), name
    assert (
        hooks["lilicorr-ckpt-validate"]["require_serial"] is True
    )  # one run sees every file: one per directory
    assert hooks["lilicorr-ckpt-validate-dir"]["pass_filenames"] is False
    assert hooks["lilicorr-ckpt-validate"]["args"] == ["--"]  # the file names pre-commit appends follow a --
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'lilicorr-ckpt-pre-commit = "lilicorr_ckpt.precommit:main"' in pyproject
    assert hooks["lilicorr-ckpt-validate"]["entry"] == "lilicorr-ckpt-pre-commit"


@pytest.mark.slow
def test_pre_commit_try_repo(tree, tmp_path_factory):
    """The manifest through pre-commit itself: one `try-repo` (each builds the hook environment afresh, a pip
    install of this checkout, so it runs once) of both hooks over every file of a drafter repo."""
    if shutil.which("pre-commit") is None:
        pytest.skip("pre-commit is not installed")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path_factory.mktemp("pre-commit-home")),
        "NO_COLOR": "1",
        "HF_HUB_OFFLINE": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
    }
    env.pop("PYTHONPATH", None)  # the hook runs from the environment pre-commit builds, not this checkout
    shutil.rmtree(tree / "export")  # every checkpoint left passes: the file hook's verdict is pre-commit's
    shutil.copytree(tree / "drafter", tree / "-rf")  # a directory named like an option
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)
    ran = subprocess.run(
        ["pre-commit", "try-repo", str(REPO), "--all-files", "--verbose"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = ran.stdout
    # the file hook: the manifest's files pattern picks the checkpoints' files (not README.md), its `--` keeps
    # -rf/config.json a file, each directory is validated once and the rest skipped with the reason: it passes
    assert re.search(r"^lilicorr-ckpt validate\.+Passed$", out, re.M), out + ran.stderr
    assert (
        out.count("lilicorr-ckpt validate drafter\n") == 1 and out.count("lilicorr-ckpt validate -rf\n") == 1
    )
    assert out.count("PASS 0 errors, 0 warnings") == 2
    assert "skipped target: not a drafter" in out and "skipped tools: not a drafter" in out
    # the directory hook without its args: the entry point's exit code reaches pre-commit, which fails the run
    assert re.search(r"^lilicorr-ckpt validate \(directory\)\.+Failed$", out, re.M), out
    assert "- exit code: 4" in out and "--dir needs at least one checkpoint directory" in out
    assert ran.returncode == 1, out + ran.stderr
