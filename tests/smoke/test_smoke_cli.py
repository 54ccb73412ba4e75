"""`lilicorr-ckpt smoke` end to end on tiny random targets (CPU, torch reference)."""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET

import jsonschema
import msgspec
import pytest
import torch
import transformers
from conftest import QUICK, Outcome
from smoke_helpers import PLAIN_TEMPLATE, drafter_config, tokenizer, write_target

import lilicorr_ckpt.smoke.run
import lilicorr_runtime
from lilicorr_ckpt import fixtures
from lilicorr_ckpt.report.smoke import junit_refusal, render_junit, render_text
from lilicorr_ckpt.smoke.profile import encode

from helpers import REPO, run_cli

SCHEMA = json.loads((REPO / "schemas" / "smoke-profile.schema.json").read_text())


def test_profile_follows_its_schema_and_describes_every_arm(smoke, drafter, target, tmp_path):
    out = tmp_path / "profile.json"
    result = smoke(drafter, "-t", target, *QUICK, "--min-head-gain", "-1", "--format", "json", "--out", out)
    assert result.code == 0, result.stderr
    report = result.report
    jsonschema.validate(report, SCHEMA)
    assert json.loads(out.read_text()) == report
    assert set(report["arms"]) == {"head", "control", "ar"} and report["primary_arm"] == "head"
    assert report["method"] == "lilicorr" and report["verification_method"] == "longest_prefix"
    n, b = report["num_speculative_tokens"], report["block_size"]
    assert (n, b, report["max_supported_k"]) == (7, 8, 7)
    assert list(report["per_category"]) == ["code", "chat", "math"]
    head = report["arms"]["head"]
    assert report["mean_accept_length"] == head["mean_accept_length"]
    assert len(report["conditional_accept_rates"]) == len(report["marginal_accept_rates"]) == n
    assert list(report["acceptance_length_histogram"]) == [str(c) for c in range(1, b + 1)]
    # block-weighted tau is the histogram's mean and 1 + the survival function's sum
    hist = {int(k): v for k, v in report["acceptance_length_histogram"].items()}
    assert report["mean_accept_length"] == pytest.approx(
        sum(k * v for k, v in hist.items()) / sum(hist.values()), abs=1e-6
    )
    assert report["validation"]["mean_consistency"]["passed"]
    assert report["validation"]["marginal_monotonicity"]["passed"]
    ar = report["arms"]["ar"]
    assert (
        ar["mean_accept_length"] == 1.0 and ar["speedup_vs_ar"] is None and ar["marginal_accept_rates"] == []
    )
    assert len(report["requests"]) == 3 and all(r["lossless"] for r in report["requests"])
    assert all(r["new_tokens"] == {"head": 24, "control": 24, "ar": 24} for r in report["requests"])
    # code prompts are raw completions; chat and math go through the template with thinking switched off
    chat = report["chat_template"]
    assert (chat["present"], chat["applied_prompts"], chat["raw_prompts"]) == (True, 2, 1)
    assert chat["thinking"] == "disabled" and chat["template_kwargs"] == {"enable_thinking": False}
    assert chat["eos_token_ids"] == []
    assert report["measurement_conditions"]["probe_counts"] == {"code": 1, "chat": 1, "math": 1}
    # where the time went, in order; the CPU compiles no kernels
    phases = report["measurement_conditions"]["phase_seconds"]
    assert list(phases) == ["start", "drafter", "target", "first_forward", "decoders", "decode", "lossless"]
    assert all(seconds >= 0 for seconds in phases.values()) and phases["decode"] > 0
    assert report["measurement_conditions"]["kernel_variants"] is None
    assert {g["name"]: g["status"] for g in report["gates"]} == {
        "measured": "pass",
        "lossless": "pass",
        "head-loaded": "pass",
        "kernel-parity": "skip",
    }


def test_a_zero_head_ties_the_control_exactly_and_fails_the_head_gate(
    smoke, zero_head_drafter, target, zero_head_report
):
    failed = Outcome(1, encode(zero_head_report).decode(), "")
    assert zero_head_report.passed is False
    jsonschema.validate(failed.report, SCHEMA)
    arms = failed.report["arms"]
    assert arms["head"]["mean_accept_length"] == arms["control"]["mean_accept_length"]
    assert arms["head"]["acceptance_length_histogram"] == arms["control"]["acceptance_length_histogram"]
    gate = failed.gate("head-loaded")
    assert gate["status"] == "fail" and "top-1 candidates" in gate["summary"]
    assert failed.report["passed"] is False

    waived = smoke(zero_head_drafter, "-t", target, *QUICK, "--min-head-gain", "-1", "--format", "json")
    assert waived.code == 0 and waived.gate("head-loaded")["status"] == "pass"


def test_a_head_that_picks_the_targets_token_clears_the_control(smoke, good_head_drafter, constant_target):
    # the target always emits token 0; the constructed head always commits token 0 (K spans the vocabulary),
    # while the control takes the drafter's argmax
    result = smoke(
        good_head_drafter, "-t", constant_target, *QUICK, "--min-head-gain", "2", "--format", "json"
    )
    assert result.code == 0, result.stdout
    arms = result.report["arms"]
    assert arms["head"]["mean_accept_length"] == 8.0 and arms["head"]["marginal_accept_rates"] == [1.0] * 7
    assert arms["control"]["mean_accept_length"] < 8.0 / 3
    assert result.report["head_gain"]["overall"] > 2


def test_a_random_head_that_ties_the_control_by_coincidence_is_not_called_a_zero_head(smoke, drafter, target):
    # the reviewer's run: overall tau equal, per-category gains -16.7% / +15.4%, the blocks differ
    result = smoke(
        drafter,
        "-t",
        target,
        "--limit",
        "1",
        "--max-new-tokens",
        "16",
        "--no-warmup",
        "--quiet",
        "--format",
        "json",
    )
    arms = result.report["arms"]
    assert arms["head"]["mean_accept_length"] == arms["control"]["mean_accept_length"]
    assert any(g != 0 for g in result.report["head_gain"]["per_category"].values())
    gate = result.gate("head-loaded")
    assert result.code == 1 and gate["status"] == "fail"
    assert "top-1" not in gate["summary"] and "zero or missing head" not in gate["summary"]
    # three prompts of a random pair: the interval spans tens of percent, and the gate says so instead of judging
    assert gate["summary"].startswith("inconclusive: 3 prompts are too few to judge a 5% gain: about ")
    assert gate["inconclusive"] and not gate["interval"]["conclusive"] and gate["interval"]["prompts"] == 3
    assert any("blocks differ from the control's in 3 of 3 request(s)" in d for d in gate["details"])


def test_a_speculative_arm_that_leaves_greedy_decoding_fails_as_a_runtime_bug(
    smoke, drafter, target, monkeypatch
):
    class Corrupting(lilicorr_runtime.SpeculativeDecoder):
        def generate(self, prompt_ids, max_new_tokens, eos_token_ids=()):
            result = super().generate(prompt_ids, max_new_tokens, eos_token_ids=eos_token_ids)
            if self.mode == "control":
                result.tokens[5] = (result.tokens[5] + 1) % 15
            return result

    monkeypatch.setattr(lilicorr_ckpt.smoke.run, "SpeculativeDecoder", Corrupting)
    result = smoke(drafter, "-t", target, *QUICK, "--min-head-gain", "-1", "--format", "json")
    assert result.code == 1
    gate = result.gate("lossless")
    assert gate["status"] == "fail" and "runtime bug" in gate["summary"] and "3 of 6" in gate["summary"]
    assert all("control" in d and "token 5" in d and "not a tie" in d for d in gate["details"])
    assert all(r["lossless"] is False for r in result.report["requests"])


def test_baseline_passes_unchanged_fails_on_a_drop_and_on_other_conditions(smoke, drafter, target, tmp_path):
    base = tmp_path / "base.json"
    common = (drafter, "-t", target, *QUICK, "--min-head-gain", "-1", "--format", "json")
    assert smoke(*common, "--out", base).code == 0
    same = smoke(*common, "--baseline", base)
    assert same.code == 0 and same.gate("baseline")["status"] == "pass"
    assert all(i["relative_delta"] == 0 for i in same.report["baseline"]["items"])

    better = json.loads(base.read_text())
    better["arms"]["control"]["mean_accept_length"] *= 1.2
    raised = tmp_path / "raised.json"
    raised.write_text(json.dumps(better))
    dropped = smoke(*common, "--baseline", raised, "--tolerance", "0.1")
    assert dropped.code == 1
    gate = dropped.gate("baseline")
    assert gate["status"] == "fail" and gate["details"][0].startswith("control tau:")
    assert smoke(*common, "--baseline", raised, "--tolerance", "0.2").code == 0

    other = smoke(
        drafter,
        "-t",
        target,
        *QUICK[:2],
        "--max-new-tokens",
        "16",
        "--no-warmup",
        "--min-head-gain",
        "-1",
        "--format",
        "json",
        "--baseline",
        base,
    )
    assert other.code == 1 and "max_new_tokens: baseline 24, now 16" in other.gate("baseline")["details"]


def test_a_head_free_dflash_checkpoint_runs_control_and_target_only(smoke, target, tmp_path):
    dflash = fixtures.write_checkpoint(tmp_path / "dflash", drafter_config(head=False))
    result = smoke(dflash, "-t", target, *QUICK, "--format", "json")
    assert result.code == 0
    report = result.report
    assert report["method"] == "dflash" and report["primary_arm"] == "control"
    assert set(report["arms"]) == {"control", "ar"} and report["head_gain"]["overall"] is None
    assert report["mean_accept_length"] == report["arms"]["control"]["mean_accept_length"]
    assert result.gate("head-loaded")["status"] == "skip"


def test_user_probe_file_with_its_own_categories(smoke, drafter, target, tmp_path):
    probes = tmp_path / "mine.jsonl"
    lines = [
        {
            "id": f"q{i}",
            "category": "short" if i < 3 else "long",
            "prompt": "tell me a tale " * (i + 1),
            "chat": i % 2 == 0,
        }
        for i in range(5)
    ]
    probes.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    result = smoke(
        drafter,
        "-t",
        target,
        "--probes",
        probes,
        "--limit",
        "2",
        "--max-new-tokens",
        "12",
        "--quiet",
        "--min-head-gain",
        "-1",
        "--format",
        "json",
    )
    assert result.code == 0
    report = result.report
    assert [r["id"] for r in report["requests"]] == ["q0", "q1", "q3", "q4"]
    assert list(report["per_category"]) == ["short", "long"]
    assert report["measurement_conditions"]["probe_counts"] == {"short": 2, "long": 2}
    assert report["chat_template"]["applied_prompts"] == 2 and report["chat_template"]["raw_prompts"] == 2


def test_a_template_without_a_thinking_switch_is_recorded_as_such(smoke, drafter, tmp_path):
    target = write_target(tmp_path / "plain", chat_template=PLAIN_TEMPLATE, eos=True)
    report = smoke(
        drafter, "-t", target, *QUICK, "--probes", "chat", "--min-head-gain", "-1", "--format", "json"
    ).report
    chat = report["chat_template"]
    assert chat["thinking"] == "no-switch" and chat["template_kwargs"] == {}
    assert chat["eos_token_ids"] == [2] and chat["eos_tokens"] == ["<|im_end|>"]


def test_sampled_runs_pool_the_seeds_and_skip_the_lossless_gate(smoke, drafter, target):
    args = (
        drafter,
        "-t",
        target,
        *QUICK,
        "--probes",
        "math",
        "--temperature",
        "0.8",
        "--seeds",
        "3,4",
        "--min-head-gain",
        "-1",
        "--format",
        "json",
    )
    first = smoke(*args)
    assert first.code == 0
    report = first.report
    assert [r["seed"] for r in report["requests"]] == [3, 4]
    assert report["measurement_conditions"]["seeds"] == [3, 4] and report["arms"]["head"]["requests"] == 2
    assert first.gate("lossless")["status"] == "skip"
    # the warm-up decodes with the measured decoders, which are re-seeded before the timed runs
    warmed = smoke(*[a for a in args if a != "--no-warmup"]).report
    assert warmed["measurement_conditions"]["warmup"] is True
    assert [r["tau"] for r in warmed["requests"]] == [r["tau"] for r in report["requests"]]
    assert warmed["acceptance_length_histogram"] == report["acceptance_length_histogram"]


def test_floors_on_tau_and_positions(smoke, zero_head_drafter, target, zero_head_report):
    common = (zero_head_drafter, "-t", target, *QUICK, "--min-head-gain", "-1", "--format", "json")
    report = json.loads(encode(zero_head_report))
    tau, first = report["mean_accept_length"], report["marginal_accept_rates"][0]
    ok = smoke(*common, "--min-tau", str(tau), "--min-accept-rates", f"{first},0")
    assert (
        ok.code == 0
        and ok.gate("min-tau")["status"] == "pass"
        and ok.gate("min-accept-rates")["status"] == "pass"
    )
    low = smoke(*common, "--min-tau", str(tau + 0.01), "--min-accept-rates", f"{first + 0.01}")
    assert low.code == 1
    assert low.gate("min-tau")["status"] == "fail" and low.gate("min-accept-rates")["status"] == "fail"


def test_text_and_junit_reports(zero_head_report):
    text = render_text(zero_head_report)
    lines = text.splitlines()
    assert lines[-1] == "FAIL 1 of 3 gates failed (1 skipped)"
    assert any(line.startswith("head ") for line in lines) and any(
        line.startswith("control ") for line in lines
    )
    assert "enable_thinking=False" in text and "FAIL  head-loaded" in text
    junit = ET.fromstring(render_junit(zero_head_report))
    cases = {c.get("name"): c for c in junit.iter("testcase")}
    assert set(cases) == {"measured", "lossless", "head-loaded", "kernel-parity"}
    assert (
        cases["head-loaded"].find("failure") is not None
        and cases["kernel-parity"].find("skipped") is not None
    )
    assert junit.get("failures") == "1" and junit.get("skipped") == "1"


def test_reports_show_names_from_the_inputs_escaped_never_obeyed(zero_head_report):
    # an architecture, a path, a tokenizer's eos text and a gate detail carrying a newline, an ESC sequence and
    # a control character: none may forge a report line, reach the terminal, or break the XML
    forged = "x\nPASS 3 gates passed\x1b[2J\x07"
    r = zero_head_report
    report = msgspec.structs.replace(
        r,
        draft_checkpoint=msgspec.structs.replace(
            r.draft_checkpoint, id="/tmp/" + forged, architecture=forged
        ),
        chat_template=msgspec.structs.replace(
            r.chat_template, eos_tokens=[forged] * len(r.chat_template.eos_tokens)
        ),
        gates=[
            msgspec.structs.replace(g, details=[*g.details, forged], name=g.name + forged) for g in r.gates
        ],
    )
    text = render_text(report)
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.startswith("PASS") for line in text.splitlines())
    assert text.splitlines()[-1] == "FAIL 1 of 3 gates failed (1 skipped)"
    assert "x\\x0aPASS 3 gates passed\\x1b[2J\\x07" in text  # shown as visible escapes
    junit = ET.fromstring(render_junit(report))  # parses: no control character in the XML
    assert all("\x1b" not in (c.get("name") or "") for c in junit.iter("testcase"))
    ET.fromstring(junit_refusal("/tmp/" + forged, forged + "\nsecond line"))


# -- refusals and bad input ---------------------------------------------------------------------------------


def test_a_checkpoint_validate_refuses_exits_1_with_its_error_lines(smoke, target, tmp_path):
    refused = fixtures.write_checkpoint(tmp_path / "k6", drafter_config(lilicorr_candidate_topk=6))
    result = smoke(refused, "-t", target, *QUICK)
    assert result.code == 1 and result.stdout == ""
    assert "ERROR LC104" in result.stderr and "fix:" in result.stderr
    junit = ET.fromstring(smoke(refused, "-t", target, *QUICK, "--format", "junit").stdout)
    assert junit.get("failures") == "1" and "LC104" in junit.find("testcase/failure").text
    # TensorRT-LLM accepts any top-k, and the run goes ahead
    assert smoke(refused, "-t", target, *QUICK, "--runtime", "trtllm", "--min-head-gain", "-1").code == 0


def test_a_drafter_built_for_another_target_exits_1(smoke, target, tmp_path):
    other = fixtures.write_checkpoint(tmp_path / "wide", fixtures.draft_config())  # vocabulary 512, mask 511
    result = smoke(other, "-t", target, *QUICK)
    assert result.code == 1 and result.stdout == ""
    assert "drafter and target do not match: vocabulary, mask token" in result.stderr
    assert "ERROR LC504 target-mask-token: mask_token_id 511 is outside target" in result.stderr
    assert "embedding table (16 rows)" in result.stderr and "lilicorr-ckpt validate" in result.stderr


def test_a_target_of_another_vocabulary_exits_1(smoke, drafter, tmp_path):
    # the target's embedding and lm_head are padded to 32 rows beyond its 16-token tokenizer; the drafter (vocabulary
    # 16, mask token 15) fits everything else, but scoring its candidates needs the target's 32-row vocabulary
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=32,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "padded")
    tokenizer().save_pretrained(tmp_path / "padded")
    result = smoke(drafter, "-t", tmp_path / "padded", *QUICK, "--min-head-gain", "-1")
    assert result.code == 1 and result.stdout == ""
    assert "drafter and target do not match: vocabulary" in result.stderr
    assert (
        f"ERROR LC503 target-vocab: draft vocab_size 16 != target {tmp_path / 'padded'} vocab_size 32"
        in result.stderr
    )
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    # a drafter declaring the padded vocabulary fits it
    wide = fixtures.write_checkpoint(
        tmp_path / "wide32", fixtures.draft_config(vocab_size=32, dflash={"mask_token_id": 15})
    )
    assert smoke(wide, "-t", tmp_path / "padded", *QUICK, "--min-head-gain", "-1").code == 0


def test_a_target_with_missing_weights_exits_2_naming_them(smoke, drafter, target, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "no-lm-head"
    shutil.copytree(target, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    result = smoke(drafter, "-t", broken, *QUICK, "--min-head-gain", "-1")
    assert result.code == 2 and result.stdout == ""
    assert "does not hold the weights its config describes: missing lm_head.weight" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    # a drafter checkpoint passed as the target has no embedding table or lm_head of its own
    mistaken = smoke(drafter, "-t", drafter, *QUICK)
    # named as validate names it (issue 15): read_target refuses it before smoke's own weight check runs
    assert mistaken.code == 2 and "is a drafter, not a target" in mistaken.stderr
    assert "--target takes the model the drafter drafts for" in mistaken.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("-t", "{tmp}/nowhere"), 2, "does not exist"),
        (("-t", "{tmp}/model.bin"), 2, "is a file but not a .gguf"),
        (("-t", "{target}", "--probes", "{tmp}/bad.jsonl"), 2, "bad.jsonl:2: not JSON"),
        (("-t", "{target}", "--probes", "{tmp}/missing.jsonl"), 2, "missing.jsonl' does not exist"),
        (("-t", "{target}", "--probes", "{tmp}/keyless.jsonl"), 2, "keyless.jsonl:1: missing key 'chat'"),
        (("-t", "{target}", "--probes", "code,poetry"), 4, "unknown category poetry"),
        (("-t", "{target}", "--seeds", "1,2"), 4, "needs --temperature > 0"),
        (
            ("-t", "{target}", "--temperature", "nan"),
            4,
            "--temperature must be a finite number in [0, 100], got nan",
        ),
        (
            ("-t", "{target}", "--temperature", "inf"),
            4,
            "--temperature must be a finite number in [0, 100], got inf",
        ),
        (
            ("-t", "{target}", "--temperature", "1e308"),
            4,
            "--temperature must be a finite number in [0, 100]",
        ),
        (
            ("-t", "{target}", "--temperature", "0.5", "--seeds", "18446744073709551616"),
            4,
            "--seeds must be integers in [0, 2**63 - 1], got 18446744073709551616",
        ),
        (
            ("-t", "{target}", "--temperature", "0.5", "--seeds", "-1"),
            4,
            "--seeds must be integers in [0, 2**63 - 1]",
        ),
        (("-t", "{target}", "--min-tau", "nan"), 4, "--min-tau must be a finite number, got nan"),
        (("-t", "{target}", "--min-head-gain", "inf"), 4, "--min-head-gain must be a finite number"),
        (("-t", "{target}", "--tolerance", "nan"), 4, "--tolerance must be a finite number"),
        (("-t", "{target}", "-k", str(2**63)), 4, "--num-speculative-tokens must be >= 1"),
        (("-t", "{target}", "-k", "9"), 4, "exceeds the drafter's 7 slots"),
        (("-t", "{target}", "--min-accept-rates", "0.5,x"), 4, "comma-separated numbers"),
        (("-t", "{target}", "--baseline", "{tmp}/bad.jsonl"), 2, "is not a smoke profile"),
    ],
)
def test_bad_input_exits_with_a_message(smoke, drafter, target, tmp_path, args, code, message):
    (tmp_path / "model.bin").write_bytes(b"\0")
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "category": "c", "prompt": "p", "chat": true}\n{oops\n')
    (tmp_path / "keyless.jsonl").write_text('{"id": "a", "category": "c", "prompt": "p"}\n')
    filled = [a.format(tmp=tmp_path, target=target) for a in args]
    result = smoke(drafter, *filled, *QUICK)
    assert result.code == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("nodir/p.json", "--output {tmp}/nodir/p.json: directory {tmp}/nodir does not exist"),
        ("adir", "--output {tmp}/adir is a directory; give a file name, e.g. {tmp}/adir/profile.json"),
        ("afile/p.json", "--output {tmp}/afile/p.json: {tmp}/afile is not a directory"),
    ],
)
def test_an_unwritable_out_path_is_refused_before_anything_loads(
    smoke, drafter, target, tmp_path, monkeypatch, out, message
):
    import lilicorr_ckpt.smoke.run

    def must_not_run(*args, **kwargs):
        raise AssertionError("smoke measured although --out cannot be written")

    monkeypatch.setattr(lilicorr_ckpt.smoke.run, "run_smoke", must_not_run)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    result = smoke(drafter, "-t", target, *QUICK, "-o", tmp_path / out)
    assert result.code == 4, result.stderr
    assert result.stderr.strip() == f"lilicorr-ckpt: usage error: {message.format(tmp=tmp_path)}"
    assert result.stdout == ""


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_an_out_path_in_a_read_only_directory_is_refused_before_anything_loads(
    smoke, drafter, target, tmp_path
):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = smoke(drafter, "-t", target, *QUICK, "--out", locked / "p.json")
    finally:
        locked.chmod(0o700)
    assert result.code == 4 and "is not writable" in result.stderr and result.stdout == ""


def test_a_failed_profile_write_says_so_keeps_the_report_and_leaves_no_temporary_file(
    smoke, drafter, target, tmp_path, monkeypatch
):
    real_replace = os.replace

    def disk_full(src, dest):
        if str(src).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dest)

    monkeypatch.setattr("lilicorr_ckpt.outfile.os.replace", disk_full)
    out = tmp_path / "p.json"
    result = smoke(drafter, "-t", target, *QUICK, "--min-head-gain", "-1", "--format", "json", "--out", out)
    assert result.code == 2
    assert result.stderr.strip() == f"lilicorr-ckpt: error: cannot write {out}: No space left on device"
    assert result.report["passed"] is True  # the measurement reached stdout before the write failed
    assert list(tmp_path.iterdir()) == []


def test_help_describes_every_option_and_shows_examples_and_exit_codes():
    import click

    from lilicorr_ckpt.cli import cli

    command = cli.commands["smoke"]
    undocumented = [
        p.name for p in command.params if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert undocumented == []
    result = run_cli("smoke", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--max-new-tokens N Stop each generation after N new tokens" in text
    assert (
        "Examples (from the repository root): lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target"
        in text
    )
    assert "Exit codes: 0 every gate passed; 1 a gate failed" in text and "4 usage error" in text


@pytest.mark.slow
def test_the_bundled_example_pair_runs_as_documented():
    # docs/smoke.md: `lilicorr-ckpt smoke examples/tiny-lilicorr --target examples/tiny-target`, seconds on a CPU
    result = run_cli(
        "smoke",
        "examples/tiny-lilicorr",
        "--target",
        "examples/tiny-target",
        cwd=REPO,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 1, result.stderr  # a random drafter: the head gate cannot pass
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    status = {
        line.split()[1]: line.split()[0]
        for line in lines
        if line.startswith("  ") and line.split()[:1] in (["PASS"], ["FAIL"], ["SKIP"])
    }
    assert status == {"measured": "PASS", "lossless": "PASS", "head-loaded": "FAIL", "kernel-parity": "SKIP"}
    head = next(line for line in lines if "head-loaded" in line)
    assert "inconclusive" in head and "the drafter alone rarely predicts this target" in head
    assert "waive this gate with --min-head-gain -1" in result.stdout
    assert "vocab 512" in result.stdout and "eos 2 <|im_end|>" in result.stdout
    validated = run_cli("validate", "examples/tiny-lilicorr", "--target", "examples/tiny-target", cwd=REPO)
    assert validated.returncode == 0 and "PASS 0 errors, 0 warnings" in validated.stdout, validated.stdout


def test_the_bundled_target_stays_small_and_matches_the_drafter():
    target = REPO / "examples" / "tiny-target"
    assert sum(f.stat().st_size for f in target.iterdir()) < 600_000
    config = json.loads((target / "config.json").read_text())
    drafter = json.loads((REPO / "examples" / "tiny-lilicorr" / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]) == (
        drafter["hidden_size"],
        drafter["vocab_size"],
        drafter["num_target_layers"],
    )
    vocab = json.loads((target / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 512 and vocab["<|mask|>"] == drafter["dflash_config"]["mask_token_id"]


def test_a_target_by_repo_id_from_the_local_hf_cache(drafter, target, tmp_path):
    import shutil

    snapshot = tmp_path / "hub" / "models--tiny-org--tiny-target" / "snapshots" / "0123abcd"
    shutil.copytree(target, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    result = run_cli(
        "smoke",
        str(drafter),
        "-t",
        "tiny-org/tiny-target",
        *QUICK,
        "--probes",
        "math",
        "--min-head-gain",
        "-1",
        "--format",
        "json",
        env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)["target_model"]
    assert (model["source"], model["id"], model["vocab_size"]) == ("hf_cache", "tiny-org/tiny-target", 16)


def test_a_repo_id_missing_from_the_cache_exits_2(smoke, drafter):
    result = smoke(drafter, "-t", "no-such-org/no-such-target", *QUICK)
    assert result.code == 2 and "not in the Hugging Face cache" in result.stderr


def test_a_target_without_tokenizer_exits_2(smoke, drafter, tmp_path):
    bare = write_target(tmp_path / "bare", save_tokenizer=False)
    result = smoke(drafter, "-t", bare, *QUICK)
    assert result.code == 2 and "has no tokenizer" in result.stderr


def test_a_tokenizer_that_does_not_belong_to_the_target_exits_2(smoke, drafter, tmp_path):
    target = write_target(tmp_path / "mixed", save_tokenizer=False)  # 16 embedding rows
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # a 512-token tokenizer
        shutil.copy(REPO / "examples" / "tiny-target" / name, target / name)
    result = smoke(drafter, "-t", target, *QUICK)
    assert result.code == 2 and "outside its embedding table (16 rows)" in result.stderr
    assert "internal error" not in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_without_cuda_exits_2_with_a_message(smoke, drafter, target):
    # in this process (a fresh interpreter only added the import of torch: 4 s of the suite)
    result = smoke(drafter, "-t", target, "--gpu", "--quiet")
    assert result.code == 2
    assert "--gpu needs a CUDA device" in result.stderr and "Traceback" not in result.stderr


def test_the_command_line_stays_torch_free_until_smoke_runs():
    import subprocess
    import sys

    code = (
        "import sys, lilicorr_ckpt.cli, lilicorr_ckpt.smoke.profile, lilicorr_ckpt.smoke.cli; "
        "from lilicorr_ckpt.smoke import SmokeOptions; from lilicorr_ckpt.smoke.options import check_options; "
        "check_options(SmokeOptions(path='a', target='b')); "
        "assert 'torch' not in sys.modules and 'lilicorr_runtime' not in sys.modules; "
        "assert 'smoke' in lilicorr_ckpt.cli.cli.commands"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _target_copy(target, tmp_path, name):
    copy = tmp_path / name
    shutil.copytree(target, copy)
    return copy


def test_a_target_with_only_pickle_weights_is_refused_by_name_never_unpickled(
    smoke, drafter, target, tmp_path
):
    pickled = _target_copy(target, tmp_path, "pickled")
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"not a pickle: opening it would fail loudly")
    result = smoke(drafter, "-t", pickled, *QUICK)
    assert result.code == 2 and "holds only pickle weights (pytorch_model.bin)" in result.stderr, (
        result.stderr
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_hidden_layers", 1_000_000, "num_hidden_layers is 1000000, but the weights hold layers 0..3"),
        ("vocab_size", 10**9, "vocab_size is 1000000000, but the embedding has 16 rows"),
    ],
)
def test_a_target_config_that_overstates_its_weights_is_refused_before_allocation(
    smoke, drafter, target, tmp_path, key, value, message
):
    lying = _target_copy(target, tmp_path, "lying")
    config = json.loads((lying / "config.json").read_text())
    config[key] = value
    (lying / "config.json").write_text(json.dumps(config))
    result = smoke(drafter, "-t", lying, *QUICK)
    assert result.code == 2 and message in result.stderr, result.stderr


def test_a_prompt_beyond_the_targets_positions_is_refused(smoke, drafter, target, tmp_path):
    short = _target_copy(target, tmp_path, "short")
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 16
    (short / "config.json").write_text(json.dumps(config))
    result = smoke(drafter, "-t", short, *QUICK)
    assert result.code == 2 and "exceed the target's 16 positions" in result.stderr, result.stderr


def test_a_target_with_nan_logits_is_refused_on_the_first_forward(smoke, drafter, target, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = _target_copy(target, tmp_path, "nan-head")
    tensors = load_file(broken / "model.safetensors")
    tensors["lm_head.weight"] = torch.full_like(tensors["lm_head.weight"], float("nan"))
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    result = smoke(drafter, "-t", broken, *QUICK)
    assert result.code == 1 and "non-finite logits" in result.stderr, result.stderr


@pytest.mark.parametrize("value", [str(2**63 - 1), "1", "65537"])
def test_max_new_tokens_out_of_range_is_a_usage_error(smoke, drafter, target, value):
    result = smoke(drafter, "-t", target, "--limit", "1", "--no-warmup", "--quiet", "--max-new-tokens", value)
    assert result.code == 4 and "--max-new-tokens must be in [2, 65536]" in result.stderr, result.stderr


def test_an_eos_token_id_outside_the_vocabulary_is_an_input_error(smoke, drafter, target, tmp_path):
    odd = _target_copy(target, tmp_path, "odd-eos")
    generation = json.loads((odd / "generation_config.json").read_text())
    generation["eos_token_id"] = [10**12]
    (odd / "generation_config.json").write_text(json.dumps(generation))
    result = smoke(drafter, "-t", odd, *QUICK)
    assert (
        result.code == 2
        and "eos_token_id 1000000000000 is outside its vocabulary (16 tokens)" in result.stderr
    ), result.stderr


def test_smokes_progress_line_is_consoles_step_count(drafter, target):
    import io

    from lilicorr_ckpt.console import Progress
    from lilicorr_ckpt.smoke.options import SmokeOptions
    from lilicorr_ckpt.smoke.run import run_smoke

    stream = io.StringIO()
    progress = Progress(enabled=True, stream=stream, name="smoke")
    run_smoke(
        SmokeOptions(
            path=str(drafter), target=str(target), probes="chat", limit=1, max_new_tokens=4, warmup=False
        ),
        progress,
    )
    text = stream.getvalue()
    assert "  smoke: loading the drafter..." in text and "\n" not in text
    [(done, arms)] = set(re.findall(r"\] (\d)/(\d) ar ", text))  # one step per arm of the one prompt
    assert done == arms and arms in ("2", "3") and f"  smoke [{'#' * 24}]" in text
    # then the lossless check counts its requests
    assert progress.total == progress.done == 1 and "] 1/1 mt_bench/81 " in text
    quiet = Progress(3, enabled=False, stream=io.StringIO(), name="smoke")
    quiet.step("x")
    quiet.note("y")
    assert quiet.stream.getvalue() == "" and quiet.done == 1
