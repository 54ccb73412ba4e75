"""`lilicorr-ckpt card`: the drafter's README.md with Hub metadata, geometry, verdicts, serving, training,
acceptance and citation; what it prints from its inputs is shown as text, never obeyed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys

import pytest
import yaml
from huggingface_hub import ModelCard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.report.modelcard import BEGIN, END, md, sh, split_front_matter
from lilicorr_ckpt.runtimes import PROFILES

from helpers import REPO, run_cli

TINY = REPO / "examples" / "tiny-lilicorr"
TARGET = REPO / "examples" / "tiny-target"
TRAIN = REPO / "examples" / "train_smollm2"
# a real `smoke --output` profile: examples/tiny-lilicorr against examples/tiny-target on the CPU, 2 prompts per
# category, 24 new tokens (its head-loaded gate failed: an untrained drafter accepts almost nothing)
CPU_PROFILE = json.loads((REPO / "tests" / "report" / "data" / "tiny-smoke-profile.json").read_text())
SGLANG, VLLM, TRTLLM = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


def gpu_profile() -> dict:
    """The CPU profile as a passing GPU run would have written it (the card only reads these fields)."""
    doc = json.loads(json.dumps(CPU_PROFILE))
    doc["measurement_conditions"].update(device="NVIDIA H200", dtype="bfloat16", kernel_backend="triton")
    doc["gates"] = [{**g, "status": "pass"} for g in doc["gates"]]
    doc["passed"] = True
    return doc


@pytest.fixture
def drafter(tmp_path):
    return shutil.copytree(TINY, tmp_path / "tiny-lilicorr")


@pytest.fixture
def card(capsys):
    """card(*args) -> (exit code, stdout, stderr): `lilicorr-ckpt card ...` in this process."""

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(["card", *map(str, args)])
        out, err = capsys.readouterr()
        return exc.value.code, out, err

    return run


def write_json(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


# --- what a card holds --------------------------------------------------------------------------------------------


def test_a_new_card_has_hub_metadata_geometry_verdicts_and_serving(drafter, card):
    code, _, err = card(
        drafter,
        "--target",
        TARGET,
        "--base-model",
        "acme/target",
        "--repo-id",
        "acme/tiny-lilicorr",
        "--license",
        "Apache-2.0",
    )
    assert code == 0, err
    assert f"wrote {drafter / 'README.md'}" in err and "warning" not in err
    parsed = ModelCard.load(drafter / "README.md")
    assert parsed.data.base_model == "acme/target" and parsed.data.license == "apache-2.0"
    assert parsed.data.tags == [
        "speculative-decoding",
        "draft-model",
        "dflash",
        "lilicorr",
        "sglang",
        "vllm",
        "tensorrt-llm",
    ]
    meta = parsed.data.to_dict()
    assert "pipeline_tag" not in meta and "library_name" not in meta
    text = parsed.text
    assert (
        "| block size | 8 |" in text
        and "| candidates K | 4 |" in text
        and "| convolution | kernel 4, group 16 |" in text
    )
    assert "- **Licence:** apache-2.0" in text and "- **Target (verifier):** acme/target" in text
    for display in (SGLANG, VLLM, TRTLLM):  # the runtimes' own names, versions included, from the profiles
        assert f"| {md(display)} | accepts | 0 | 0 |" in text
    sglang, vllm, trtllm = bash_blocks(text)
    assert shlex.split(sglang.replace("\\\n", " ")) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "acme/target",
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        "acme/tiny-lilicorr",
    ]
    words = shlex.split(vllm.replace("\\\n", " "))
    assert words[:3] == ["vllm", "serve", "acme/target"] and words[3] == "--speculative-config"
    assert json.loads(words[4]) == {
        "method": "dflash",
        "model": "acme/tiny-lilicorr",
        "num_speculative_tokens": 7,
    }
    # TensorRT-LLM: tagged, so it has its command too (DFlashDecodingConfig through trtllm-serve --config)
    assert shlex.split(trtllm) == ["trtllm-serve", "acme/target", "--config", "dflash.yaml"]
    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)\n```", text, re.S).group(1))
    assert spec == {
        "speculative_config": {
            "decoding_type": "DFlash",
            "speculative_model": "acme/tiny-lilicorr",
            "max_draft_len": 7,
        }
    }
    assert "[DFlash](https://arxiv.org/abs/2602.06036) + [LiLiCorr](https://arxiv.org/abs/2608.20530)" in text
    bibtex = re.search(r"```bibtex\n(.*?)\n```", text, re.S).group(1)
    assert "eprint        = {2608.20530}" in bibtex and "Rusanovsky, Matan" in bibtex
    assert "Acceptance" not in text and "### Training" not in text  # no profile, no training given


def test_updating_keeps_metadata_and_prose_drops_misleading_keys_and_is_idempotent(drafter, card):
    (drafter / "README.md").write_text(
        "---\nlicense: apache-2.0\npipeline_tag: text-generation\nlibrary_name: "
        "transformers\ntags:\n- mine\n- vllm\n---\n\n# My drafter\n\nTrained on X.\n"
    )
    code, _, err = card(drafter, "--target", TARGET, "--base-model", "acme/target")
    assert code == 0, err
    assert (
        "note: removed pipeline_tag: text-generation" in err
        and "note: removed library_name: transformers" in err
    )
    once = (drafter / "README.md").read_text()
    parsed = ModelCard.load(drafter / "README.md")
    assert (
        parsed.data.license == "apache-2.0" and parsed.data.tags[0] == "mine"
    )  # the README's licence is kept
    assert "- **Licence:** apache-2.0" in parsed.text
    assert "pipeline_tag" not in parsed.data.to_dict()
    assert parsed.text.index("Trained on X.") < parsed.text.index("## Speculative decoding drafter")
    (drafter / "README.md").write_text(
        once.replace("Trained on X.\n", "Trained on X.\n\nMore prose after.\n", 1)
        + "\n## Licence notes\n\nKept.\n"
    )
    code, _, err = card(drafter, "--target", TARGET, "--base-model", "acme/target")
    assert code == 0 and "updated" in err
    again = (drafter / "README.md").read_text()
    assert again.count("## Speculative decoding drafter") == 1
    assert "More prose after." in again and again.rstrip().endswith("Kept.")
    assert card(drafter, "--target", TARGET, "--base-model", "acme/target")[0] == 0
    assert (drafter / "README.md").read_text() == again


def test_output_elsewhere_updates_the_readme_s_card(drafter, card):
    (drafter / "README.md").write_text("---\nlicense: mit\n---\n\n# Mine\n\nProse.\n")
    code, out, _ = card(drafter, "--target", TARGET, "-o", "-")
    assert code == 0 and out.startswith("---\nlicense: mit\n") and "Prose." in out and BEGIN in out
    assert (
        drafter / "README.md"
    ).read_text() == "---\nlicense: mit\n---\n\n# Mine\n\nProse.\n"  # printed only


def test_base_model_from_the_target_config_quantization_and_refusing_runtimes(tmp_path, card):
    target = shutil.copytree(TARGET, tmp_path / "target")
    cfg = json.loads((target / "config.json").read_text())
    cfg["_name_or_path"] = "acme/target-from-config"
    (target / "config.json").write_text(json.dumps(cfg))
    refused = shutil.copytree(REPO / "examples" / "tiny-modelopt-nvfp4", tmp_path / "export")
    code, _, err = card(refused, "--target", target, "--repo-id", "acme/export")
    assert code == 0, err  # a card is written whatever the verdicts
    parsed = ModelCard.load(refused / "README.md")
    assert parsed.data.base_model == "acme/target-from-config"
    assert "nvfp4" in parsed.data.tags
    assert not {"sglang", "vllm", "tensorrt-llm"} & set(parsed.data.tags)  # no runtime accepts it ...
    assert bash_blocks(parsed.text) == [] and "trtllm-serve" not in parsed.text  # ... so no command either
    assert f"| {md(VLLM)} | refuses |" in parsed.text and "refuse this checkpoint" in parsed.text
    quantized = fixtures.write_checkpoint(tmp_path / "fp8", quant="FP8")
    assert card(quantized, "--target", target, "--repo-id", "acme/fp8")[0] == 0
    assert "fp8" in ModelCard.load(quantized / "README.md").data.tags


def test_a_head_free_drafter_cites_no_head(tmp_path, card):
    plain = fixtures.write_checkpoint(tmp_path / "plain", fixtures.draft_config(head=False))
    code, out, err = card(plain, "--target", TARGET, "-o", "-")
    assert code == 0, err
    assert (
        "[DFlash](https://arxiv.org/abs/2602.06036)" in out
        and "2608.20530" not in out
        and "bibtex" not in out
    )
    assert "lilicorr" not in yaml.safe_load(out.split("---\n")[1])["tags"]


def test_licence_from_the_flag_the_readme_or_stated_unknown(drafter, card):
    code, out, err = card(drafter, "--target", TARGET, "-o", "-")
    assert code == 0 and "- **Licence:** not stated" in out and "license" not in out.split("---\n")[1]
    assert "note: no licence" in err
    code, _, err = card(drafter, "--target", TARGET, "--license", "not a licence!")
    assert code == 4 and "is not a licence identifier" in err and not (drafter / "README.md").exists()


def test_the_repo_id_is_checked_and_a_guessed_one_is_a_warning(drafter, card):
    code, out, err = card(drafter, "--target", TARGET, "-o", "-", "-q")
    assert code == 0
    assert (
        "warning: no --repo-id: the serving commands name the drafter 'tiny-lilicorr'" in err
    )  # shown with -q too
    assert "--speculative-draft-model-path tiny-lilicorr" in out
    for bad in ("adv/..", "a..b/c", "-x/y", "a b", "org/name/extra"):
        code, _, err = card(drafter, "--target", TARGET, "--repo-id", bad)
        assert code == 4 and "--repo-id" in err and "is not a Hub repo id" in err, (bad, err)
    assert not (drafter / "README.md").exists()


# --- the training -----------------------------------------------------------------------------------------------


def test_training_from_logs_and_flags(drafter, card):
    code, out, err = card(
        drafter,
        "--target",
        TARGET,
        "-o",
        "-",
        "--training-log",
        TRAIN / "log.jsonl",
        "--training-log",
        TRAIN / "finetune.jsonl",
        "--training-data",
        "answers the target wrote to 46,622 prompts",
        "--training-recipe",
        "joint DFlash + LiLiCorr",
    )
    assert code == 0, err
    assert "- **Data:** answers the target wrote to 46,622 prompts" in out
    assert "- **Recipe:** joint DFlash + LiLiCorr" in out
    # 7000 steps each; the first run was resumed once (339 s + 259 s), the fine-tune twice (184 + 311 + 269 s)
    assert "| 1 | log.jsonl | 7000 | 2 | 598 s | 12.342 → 1.977 | 0.013 → 2.908 | 0.019 → 3.589 |" in out
    assert "| 2 | finetune.jsonl | 7000 | 3 | 765 s | 4.453 → 3.269 | 1.061 → 1.464 | 1.356 → 1.966 |" in out


def test_a_broken_training_log_is_named(drafter, tmp_path, card):
    for content, needle in (
        ('{"step": 25, "dflash": 1.0}\nnot json\n', "line 2 is not JSON"),
        ('{"step": 25, "dflash": "high"}\n', "line 1: dflash is 'high', not a number"),
        ('{"planned_steps": 100}\n', "has no training records"),
        ("[1]\n", "line 1 is not a JSON object"),
    ):
        (tmp_path / "log.jsonl").write_text(content)
        code, _, err = card(drafter, "--target", TARGET, "--training-log", tmp_path / "log.jsonl")
        assert code == 2 and f"--training-log {tmp_path / 'log.jsonl'}" in err and needle in err, err
    assert not (drafter / "README.md").exists()


# --- the acceptance profile ---------------------------------------------------------------------------------


def test_the_profile_adds_acceptance_per_benchmark_with_counts_hardware_and_versions(drafter, tmp_path, card):
    profile = write_json(tmp_path / "profile.json", gpu_profile())
    code, out, err = card(drafter, "--target", TARGET, "--profile", profile, "-o", "-")
    assert code == 0, err
    assert "Unverified" not in out and "warning: publishing" not in err
    assert "on NVIDIA H200 (bfloat16, triton draft ops, lilicorr_runtime, batch 1)" in out
    assert "torch 2.13.0+cpu, transformers 5.24.0" in out  # the versions the profile recorded
    # tau with the tokens / verifications it divides, the head's gain, position 1 with accepted / reached
    assert "| HumanEval (code) | 2 | 1.034 (30/29) | 1.000 (30/30) | +3.4% | 0.034 (1/29) |" in out
    assert (
        "| GSM8K, the 8 CoT exemplars (math) | 2 | 1.024 (43/42) | 1.000 (43/43) | +2.4% | 0.024 (1/42) |"
        in out
    )
    assert "| **all** | 6 | 1.017 (119/117) | 1.000 (119/119) | +1.7% | 0.017 (2/117) |" in out
    assert "| head | conditional | 0.017 (2/117) | 0.000 (0/2) | – (0/0) |" in out
    assert "| head | marginal | 0.017 (2/117) | 0.000 (0/117) | 0.000 (0/117) |" in out
    table = out[out.index("| benchmark |") : out.index("Speed in the measured run")]
    numbers = re.findall(r"(?<![\d(/.+-])\d+\.\d+(?![\d/%])", table)  # tau and rates (gains are percentages)
    assert len(numbers) > 20 and all(re.fullmatch(r"\d\.\d{3}", n) for n in numbers), numbers  # never "0.6"
    assert re.findall(r"[+-]\d+\.\d+%", table) == ["+3.4%", "+0.0%", "+2.4%", "+1.7%"]
    # the run's speed at its batch: the profile has no sweep
    assert "| 1 | 91 | 23 | 0.25× | 31 | 0.34× |" in out
    assert "Gates: measured PASS, lossless PASS, head-loaded PASS, kernel-parity PASS" in out


def test_a_head_free_drafter_s_profile_shows_its_one_arm(tmp_path, card):
    plain = fixtures.write_checkpoint(tmp_path / "plain", fixtures.draft_config(head=False))
    doc = gpu_profile()
    doc.update(method="dflash", primary_arm="control")
    doc["draft_checkpoint"].update(architecture="DFlashDraftModel", head=False, candidate_topk=None)
    for entry in [doc, *doc["per_category"].values()]:
        entry["arms"].pop("head")
    code, out, err = card(
        plain, "--target", TARGET, "--profile", write_json(tmp_path / "p.json", doc), "-o", "-"
    )
    assert code == 0, err
    assert "| benchmark | prompts | τ | position 1 accepted |" in out and "LiLiCorr head" not in out
    assert "| **all** | 6 | 1.000 (119/119) | 0.000 (0/119) |" in out
    assert "| control | conditional | 0.000 (0/119) |" in out and "| head |" not in out


def test_a_failed_or_cpu_profile_is_refused_unless_allowed(drafter, tmp_path, card):
    cpu = write_json(tmp_path / "cpu.json", CPU_PROFILE)
    code, _, err = card(drafter, "--target", TARGET, "--profile", cpu)
    assert code == 1 and "refused" in err and "is not a verified measurement" in err
    assert "its gates failed: head-loaded" in err and "measured on the CPU (cpu (x86_64)" in err
    assert "--allow-unverified" in err and not (drafter / "README.md").exists()
    code, _, err = card(drafter, "--target", TARGET, "--profile", cpu, "--allow-unverified")
    assert code == 0 and "warning: publishing an unverified profile" in err
    text = (drafter / "README.md").read_text()
    assert (
        "> **Unverified measurement** (published with `--allow-unverified`): its gates failed: head-loaded;"
        in text
    )


def test_a_profile_of_another_drafter_is_refused(drafter, tmp_path, card):
    other = gpu_profile()
    other["block_size"] = 16
    other["draft_checkpoint"]["candidate_topk"] = 8
    code, _, err = card(drafter, "--target", TARGET, "--profile", write_json(tmp_path / "p.json", other))
    assert code == 1 and "it measured another drafter: block size 16 there, 8 here" in err
    assert "candidates K 8 there, 4 here" in err and not (drafter / "README.md").exists()


def test_a_profile_with_impossible_numbers_is_named(drafter, tmp_path, card):
    doc = gpu_profile()
    doc["arms"]["head"]["conditional_accept_rates"][0] = 1.7
    code, _, err = card(drafter, "--target", TARGET, "--profile", write_json(tmp_path / "p.json", doc))
    assert (
        code == 2 and "holds numbers no smoke run writes: $.arms.head.conditional_accept_rates outside" in err
    )


# --- output escaping: one rule per context, reruns give the same bytes ------------------------------------------

HOSTILE = "LiLiCorrDraftModel<!-- lilicorr-ckpt card:end -->\n| x | y |\n<script>alert(1)</script> \u202egnp.exe *b* [l](http://e.vil)"


def test_a_hostile_architecture_is_text_and_the_card_does_not_grow(tmp_path, card):
    config = json.loads((TINY / "config.json").read_text())
    config["architectures"] = [HOSTILE]
    hostile = fixtures.write_checkpoint(tmp_path / "hostile", config)
    assert card(hostile, "--target", TARGET, "--repo-id", "acme/x")[0] == 0
    first = (hostile / "README.md").read_bytes()
    assert card(hostile, "--target", TARGET, "--repo-id", "acme/x")[0] == 0
    assert (hostile / "README.md").read_bytes() == first  # byte-identical: the section was found and replaced
    text = first.decode()
    assert text.count("<!--") == 2 and text.count(BEGIN) == 1 and text.count(END) == 1
    assert "<script>" not in text and "&lt;script&gt;" in text and "\u202e" not in text and "\\u202e" in text
    row = next(line for line in text.splitlines() if line.startswith("| architecture |"))
    assert (
        row.count("|") - row.count("\\|") == 3
    )  # one row of two cells: the pipes and the newline are escaped
    assert not re.search(r"(?<!\\)\]\(", row) and "http\\://" in row  # no link, no autolink


def test_markdown_escaping_renders_as_the_text():
    for text in (HOSTILE, "a_b _c_ **d** `e` ~~f~~ $g$ \\h &amp; www.x.org"):
        escaped = md(text)
        assert "\n" not in escaped and "<" not in escaped and "`" not in escaped.replace("\\`", "")
        assert not re.search(r"(?<!\\)[*_|~$\[\]]", escaped.replace("a_b", "")), escaped


@pytest.mark.parametrize(
    "name",
    ["my drafter; touch pwned", "$(touch pwned)", "it's", "tab\there", "new\nline", "é\u202e<!-- x -->`y`"],
)
def test_a_shell_unsafe_directory_name_is_quoted_in_the_serving_commands(tmp_path, card, name):
    try:
        path = shutil.copytree(TINY, tmp_path / name)
    except OSError:
        pytest.skip("the file system refuses that name")
    code, out, _ = card(path, "--target", TARGET, "--base-model", "acme/target", "-o", "-")
    assert code == 0
    sglang = bash_blocks(out)[0]
    word = sglang.rsplit("--speculative-draft-model-path ", 1)[1]
    assert "\n" not in word
    # bash reads the word back as the directory's name, and runs nothing else
    echoed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, cwd=tmp_path)
    assert echoed.returncode == 0 and echoed.stdout == name.encode() and not (tmp_path / "pwned").exists()
    vllm = bash_blocks(out)[1]
    config_word = vllm.rsplit("--speculative-config ", 1)[1]
    spec = subprocess.run(["bash", "-c", f"printf %s {config_word}"], capture_output=True).stdout.decode()
    assert json.loads(spec)["model"] == name
    assert out.count("<!--") == 2


def test_sh_words_round_trip_through_bash():
    words = ["plain/word", "a b", "'", '"', "\\", "$HOME", "`id`", "\x01\x7f", "\u2028", "<>", "!x"]
    line = " ".join(sh(w) for w in words)
    echoed = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True)
    assert echoed.stdout.decode().split("\0")[:-1] == words


def test_front_matter_is_serialised_not_pasted(drafter, card):
    (drafter / "README.md").write_text(
        '---\nlicense: mit\ntitle: "a: b # c"\nnote: "line one\\nline two"\n'
        "odd: ['---', '<!-- lilicorr-ckpt card:end -->']\n---\n\nProse.\n"
    )
    assert card(drafter, "--target", TARGET, "--base-model", "acme/target")[0] == 0
    text = (drafter / "README.md").read_text()
    meta, body = split_front_matter(text, "README.md")
    assert meta["title"] == "a: b # c" and meta["note"] == "line one\nline two"
    assert meta["odd"] == ["---", "<!-- lilicorr-ckpt card:end -->"] and meta["base_model"] == "acme/target"
    assert ModelCard.load(drafter / "README.md").data.to_dict()["title"] == "a: b # c"
    assert body.count(BEGIN) == 1  # the marker in a metadata value is not the section's
    assert card(drafter, "--target", TARGET, "--base-model", "acme/target")[0] == 0
    assert (drafter / "README.md").read_text() == text


def test_a_read_only_readme_is_left_alone_and_a_writable_one_keeps_its_mode(drafter, card):
    readme = drafter / "README.md"
    readme.write_text("# Mine\n")
    readme.chmod(0o444)
    code, _, err = card(drafter, "--target", TARGET)
    assert (
        code == 1
        and "is read-only (mode 0444); card leaves it as it is" in err
        and "Nothing was written" in err
    )
    assert readme.read_text() == "# Mine\n" and stat.S_IMODE(readme.stat().st_mode) == 0o444
    readme.chmod(0o640)
    assert card(drafter, "--target", TARGET)[0] == 0
    assert BEGIN in readme.read_text() and stat.S_IMODE(readme.stat().st_mode) == 0o640


def test_stray_markers_are_refused_not_eaten(drafter, card):
    prose = f"# Mine\n\n{BEGIN}\n\nA paragraph I wrote after a marker.\n"
    (drafter / "README.md").write_text(prose)
    code, _, err = card(drafter, "--target", TARGET)
    assert (
        code == 1
        and "markers do not pair up" in err
        and "card:begin markers at line(s) 3, card:end at line(s) none" in err
    )
    assert (drafter / "README.md").read_text() == prose


def test_user_text_flags_are_text(drafter, card):
    code, out, _ = card(
        drafter,
        "--target",
        TARGET,
        "-o",
        "-",
        "--training-data",
        f"<img src=x onerror=alert(1)> {END} | cell",
    )
    assert code == 0 and "<img" not in out and "&lt;img src=x onerror=alert(1)&gt;" in out
    assert out.count(END) == 1 and "\\| cell" in out


# --- hostile input: a message naming it, never an internal error ------------------------------------------------


def _profile_with(**changes) -> dict:
    doc = gpu_profile()
    doc.update(changes)
    return doc


BAD_PROFILES = [
    ("per_category is a list", _profile_with(per_category=[1]), "at `$.per_category`"),
    ("a category is a number", _profile_with(per_category={"code": 5}), "at `$.per_category[...]`"),
    ("head_gain is a list", _profile_with(head_gain=[1]), "at `$.head_gain`"),
    (
        "a gain is text",
        _profile_with(head_gain={"overall": "x", "per_category": {}}),
        "at `$.head_gain.overall`",
    ),
    ("conditions is a list", _profile_with(measurement_conditions=[1]), "at `$.measurement_conditions`"),
    ("target_model is text", _profile_with(target_model="x"), "at `$.target_model`"),
    ("requests is a number", _profile_with(requests=5), "at `$.requests`"),
    ("rates are a number", _profile_with(conditional_accept_rates=5), "at `$.conditional_accept_rates`"),
    ("not a profile", {"tool": "other"}, "is not a smoke profile"),
]


@pytest.mark.parametrize("label,doc,needle", BAD_PROFILES, ids=[b[0] for b in BAD_PROFILES])
def test_a_malformed_profile_is_named(drafter, tmp_path, card, label, doc, needle):
    path = write_json(tmp_path / "p.json", doc)
    code, _, err = card(drafter, "--target", TARGET, "--profile", path)
    assert code == 2 and f"--profile {path}" in err and needle in err and "internal error" not in err, err


def test_unreadable_profiles_are_named(drafter, tmp_path, card):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    for path, needle in (
        (tmp_path / "deep.json", "is nested too deeply to read"),
        (tmp_path / "binary.json", "is not JSON"),
        (tmp_path, "is a directory"),
        ("/dev/zero", "is a character device"),
        (tmp_path / "missing.json", "cannot read --profile"),
    ):
        code, _, err = card(drafter, "--target", TARGET, "--profile", path)
        assert code == 2 and needle in err and "internal error" not in err, (path, err)


BAD_READMES = [
    ("not UTF-8", b"\xff\xfe---\n", "is not UTF-8 text (byte 0"),
    ("tags a number", b"---\ntags: 5\n---\n", "tags must be a list of strings, found 5"),
    ("tags holding a mapping", b"---\ntags:\n- {a: b}\n---\n", "tags must be a list of strings"),
    ("tags holding a list", b"---\ntags: [[a]]\n---\n", "tags must be a list of strings"),
    ("front matter a list", b"---\n- a\n---\nbody\n", "its front matter is a YAML list, not a mapping"),
    ("front matter a string", b"---\nhello\n---\n", "its front matter is a YAML str"),
    (
        "YAML that does not parse",
        b"---\n: : :\n  - [\n---\n",
        "its YAML front matter cannot be read (line 2)",
    ),
    ("a python tag", b"---\na: !!python/object:os.system ls\n---\n", "could not determine a constructor"),
    ("a number as a key", b"---\n1: 2\n---\n", "front matter key 1 is not a string"),
    ("licence a number", b"---\nlicense: 5\n---\n", "license is 5, not a licence id"),
]


@pytest.mark.parametrize("label,content,needle", BAD_READMES, ids=[b[0] for b in BAD_READMES])
def test_a_malformed_readme_is_named_and_kept(drafter, card, label, content, needle):
    (drafter / "README.md").write_bytes(content)
    code, _, err = card(drafter, "--target", TARGET)
    assert (
        code == 2 and str(drafter / "README.md") in err and needle in err and "internal error" not in err
    ), err
    assert (drafter / "README.md").read_bytes() == content


def test_bad_input_is_named(drafter, tmp_path, card):
    cases = [
        (("card", tmp_path / "nope", "--target", TARGET), 2, "no such directory"),
        (("card", drafter, "--target", TARGET, "--base-model", "not a repo"), 4, "is not a Hub repo id"),
        (("card", drafter, "--target", TARGET, "--base-model", "adv/.."), 4, "is not a Hub repo id"),
        (("card", drafter), 4, "Missing option '--target'"),
    ]
    for args, code, needle in cases:
        got, _, err = card(*args[1:])
        assert got == code and needle in err and "internal error" not in err, (args, err)
    assert not (drafter / "README.md").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_are_refused_not_read(drafter, tmp_path):
    os.mkfifo(tmp_path / "profile.json")
    target = shutil.copytree(TARGET, tmp_path / "target")
    (target / "config.json").unlink()
    os.mkfifo(target / "config.json")
    (drafter / "README.md").unlink(missing_ok=True)
    os.mkfifo(drafter / "README.md")
    for args, needle in (
        (
            ["--target", str(TARGET), "--profile", str(tmp_path / "profile.json"), "-o", "-"],
            "profile.json is a FIFO (named pipe)",
        ),
        (["--target", str(target), "-o", "-"], "config.json is a FIFO (named pipe)"),
        (["--target", str(TARGET), "-o", "-"], "README.md is a FIFO (named pipe)"),
    ):
        # in a subprocess with a deadline: the bug this guards against is a read that never returns
        result = subprocess.run(
            [sys.executable, "-m", "lilicorr_ckpt.cli", "card", str(drafter), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2 and needle in result.stderr, result.stderr


def test_help_names_every_option_and_exit_code():
    result = run_cli("card", "--help")
    assert result.returncode == 0
    for option in (
        "--license",
        "--training-log",
        "--training-data",
        "--training-recipe",
        "--allow-unverified",
        "--repo-id",
        "--profile",
        "--base-model",
    ):
        assert option in result.stdout
    text = " ".join(result.stdout.split())
    assert "1 refused, nothing written" in text and "4 usage error" in text


GGUF = REPO / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.real_target
@pytest.mark.skipif(not GGUF.is_file(), reason="run scripts/fetch_smollm2.sh to fetch the GGUF")
def test_the_bundled_card_is_what_its_own_card_command_writes(card, monkeypatch, tmp_path):
    bundled = REPO / "examples" / "smollm2-lilicorr"
    committed = (bundled / "README.md").read_text()
    command = next(b for b in bash_blocks(committed) if b.startswith("lilicorr-ckpt card "))
    args = shlex.split(command.replace("\\\n", " "))  # parsed as bash would, never run by a shell
    assert args[:2] == ["lilicorr-ckpt", "card"] and "-o" not in args
    monkeypatch.chdir(REPO)
    shutil.copyfile(bundled / "README.md", tmp_path / "README.md")  # the card updates the README it writes
    code, out, err = card(*args[2:], "-o", str(tmp_path / "README.md"))
    assert code == 0, err
    stale = "examples/smollm2-lilicorr is stale: run the card command its README shows"
    assert (tmp_path / "README.md").read_text() == committed, stale
    assert (tmp_path / "acceptance.svg").read_bytes() == (bundled / "acceptance.svg").read_bytes(), stale


@pytest.fixture(scope="module")
def tiny_report():
    from lilicorr_ckpt.checks.run import validate

    return validate(str(TINY), target=str(TARGET))


README_PIECES = st.sampled_from(
    [
        "---",
        "\n",
        "\r\n",
        "license: mit",
        "tags: [a, b]",
        "title: x",
        "# Head",
        "prose",
        "| a | b |",
        "<b>",
        BEGIN,
        END,
        "<!-- lilicorr-ckpt card:begin -->",
        "\u202e",
        " ",
        ":",
        "- item",
        "```",
        "\ufeff",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(README_PIECES, max_size=24))
def test_any_readme_the_card_accepts_it_rewrites_to_a_fixed_point(tiny_report, pieces):
    from lilicorr_ckpt.errors import InputError, Refused
    from lilicorr_ckpt.report.modelcard import CardOptions, build_card

    opts = CardOptions(repo="acme/tiny", base="acme/target", quant_algo=None, license=None)
    try:
        once, _ = build_card("".join(pieces), tiny_report, opts)
    except (InputError, Refused):
        return  # refused with a message (stray markers, front matter that is no mapping): nothing written
    twice, _ = build_card(once, tiny_report, opts)
    assert twice == once
    meta, body = split_front_matter(once, "README.md")
    assert body.count(BEGIN) == 1 and body.count(END) == 1 and meta["base_model"] == "acme/target"
