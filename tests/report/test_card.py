"""`lilicorr-ckpt card`: the drafter's README.md with Hub metadata, geometry, verdicts, serving, acceptance."""

from __future__ import annotations

import json
import shutil

import pytest
from huggingface_hub import ModelCard

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.runtimes import PROFILES

from helpers import REPO, run_cli

TINY = REPO / "examples" / "tiny-lilicorr"
TARGET = REPO / "examples" / "tiny-target"

PROFILE = {
    "tool": "lilicorr-ckpt smoke", "passed": True, "mean_accept_length": 2.5,
    "conditional_accept_rates": [0.9, 0.5, 0.25], "marginal_accept_rates": [0.9, 0.45, 0.1125],
    "target_model": {"id": "acme/target"}, "requests": [{}, {}, {}],
    "measurement_conditions": {"device": "cpu", "dtype": "float32", "limit": 2, "max_new_tokens": 64, "temperature": 0.0},
    "head_gain": {"overall": 0.12, "per_category": {"code": 0.2, "chat": 0.05}},
    "per_category": {"code": {"requests": 2, "mean_accept_length": 3.0, "conditional_accept_rates": [0.95, 0.6, 0.3]},
                     "chat": {"requests": 1, "mean_accept_length": 1.5, "conditional_accept_rates": [0.7, 0.2, 0.1]}},
}

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


@pytest.fixture
def drafter(tmp_path):
    return shutil.copytree(TINY, tmp_path / "tiny-lilicorr")


def test_a_new_card_has_hub_metadata_geometry_verdicts_and_serving(drafter):
    result = run_cli("card", str(drafter), "--target", str(TARGET), "--base-model", "acme/target",
                     "--repo-id", "acme/tiny-lilicorr")
    assert result.returncode == 0, result.stderr
    assert f"wrote {drafter / 'README.md'}" in result.stderr
    card = ModelCard.load(drafter / "README.md")
    assert card.data.base_model == "acme/target"
    assert card.data.tags == ["speculative-decoding", "draft-model", "dflash", "lilicorr", "sglang", "vllm",
                              "tensorrt-llm"]
    meta = card.data.to_dict()
    assert "pipeline_tag" not in meta and "library_name" not in meta
    text = card.text
    assert "| block size | 8 |" in text and "| candidates K | 4 |" in text and "| convolution | kernel 4, group 16 |" in text
    assert f"| {SG} | accepts | 0 | 0 |" in text
    assert "--speculative-algorithm DFLASH" in text and "--speculative-draft-model-path acme/tiny-lilicorr" in text
    assert '"method": "dflash", "model": "acme/tiny-lilicorr", "num_speculative_tokens": 7' in text
    assert "vllm serve acme/target" in text
    assert "Acceptance" not in text  # no profile given


def test_updating_keeps_metadata_and_prose_drops_misleading_keys_and_is_idempotent(drafter):
    (drafter / "README.md").write_text("---\nlicense: apache-2.0\npipeline_tag: text-generation\nlibrary_name: "
                                       "transformers\ntags:\n- mine\n- vllm\n---\n\n# My drafter\n\nTrained on X.\n")
    first = run_cli("card", str(drafter), "--target", str(TARGET), "--base-model", "acme/target")
    assert first.returncode == 0, first.stderr
    assert "note: removed pipeline_tag: text-generation" in first.stderr
    assert "note: removed library_name: transformers" in first.stderr
    once = (drafter / "README.md").read_text()
    card = ModelCard.load(drafter / "README.md")
    assert card.data.license == "apache-2.0" and card.data.tags[0] == "mine"
    assert "pipeline_tag" not in card.data.to_dict()
    assert card.text.index("Trained on X.") < card.text.index("## Speculative decoding drafter")
    (drafter / "README.md").write_text(once.replace("Trained on X.\n", "Trained on X.\n\nMore prose after.\n", 1) +
                                       "\n## Licence notes\n\nKept.\n")
    second = run_cli("card", str(drafter), "--target", str(TARGET), "--base-model", "acme/target")
    assert second.returncode == 0 and "updated" in second.stderr
    again = (drafter / "README.md").read_text()
    assert again.count("## Speculative decoding drafter") == 1
    assert "More prose after." in again and again.rstrip().endswith("Kept.")
    third = run_cli("card", str(drafter), "--target", str(TARGET), "--base-model", "acme/target")
    assert third.returncode == 0 and (drafter / "README.md").read_text() == again


def test_the_profile_adds_acceptance_per_category_and_position(drafter, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    out = run_cli("card", str(drafter), "--target", str(TARGET), "--profile", str(profile), "-o", "-")
    assert out.returncode == 0, out.stderr
    assert "| code | 2 | 3 | +20.0% |" in out.stdout and "| chat | 1 | 1.5 | +5.0% |" in out.stdout
    assert "| **all** | 3 | 2.5 | +12.0% |" in out.stdout
    assert "| conditional | 0.9 | 0.5 | 0.25 |" in out.stdout and "| marginal | 0.9 | 0.45 | 0.113 |" in out.stdout
    assert "| code (conditional) | 0.95 | 0.6 | 0.3 |" in out.stdout
    assert not (drafter / "README.md").exists()  # -o - prints
    assert "no base_model" in out.stderr  # a local target with no _name_or_path


def test_base_model_from_the_target_config_and_quantization_and_refusals(tmp_path):
    target = shutil.copytree(TARGET, tmp_path / "target")
    cfg = json.loads((target / "config.json").read_text())
    cfg["_name_or_path"] = "acme/target-from-config"
    (target / "config.json").write_text(json.dumps(cfg))
    refused = shutil.copytree(REPO / "examples" / "tiny-modelopt-nvfp4", tmp_path / "export")
    result = run_cli("card", str(refused), "--target", str(target))
    assert result.returncode == 0, result.stderr  # a card is written whatever the verdicts
    card = ModelCard.load(refused / "README.md")
    assert card.data.base_model == "acme/target-from-config"
    assert "nvfp4" in card.data.tags
    assert not {"sglang", "vllm", "tensorrt-llm"} & set(card.data.tags)  # no runtime accepts it
    assert f"| {VL} | refuses |" in card.text
    quantized = fixtures.write_checkpoint(tmp_path / "fp8", quant="FP8")
    assert run_cli("card", str(quantized), "--target", str(target)).returncode == 0
    assert "fp8" in ModelCard.load(quantized / "README.md").data.tags


def test_bad_input_is_named(drafter, tmp_path):
    (tmp_path / "bad.json").write_text('{"tool": "other"}')
    cases = [
        (("card", str(tmp_path / "nope"), "--target", str(TARGET)), 2, "no such directory"),
        (("card", str(drafter), "--target", str(TARGET), "--base-model", "not a repo"), 4, "is not a Hub repo id"),
        (("card", str(drafter), "--target", str(TARGET), "--profile", str(tmp_path / "bad.json")), 2,
         "is not a smoke profile"),
        (("card", str(drafter), "--target", str(TARGET), "--profile", str(tmp_path / "missing.json")), 2,
         "cannot read --profile"),
        (("card", str(drafter)), 4, "Missing option '--target'"),
    ]
    for args, code, needle in cases:
        r = run_cli(*args)
        assert r.returncode == code and needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (drafter / "README.md").exists()
