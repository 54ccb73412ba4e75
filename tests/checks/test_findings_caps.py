"""A rule that fires for every tensor of a hostile checkpoint is summarised, not repeated: at most
MAX_FINDINGS_PER_RULE findings per rule and MAX_SUBJECTS subjects per finding, each cut said so in the report."""

from __future__ import annotations

import json

import numpy as np

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checks.findings import MAX_FINDINGS_PER_RULE, MAX_SUBJECTS, Finding, bound_findings
from lilicorr_ckpt.checks.run import validate

JUNK = 1500


def _with_junk(tensors: fixtures.Tensors) -> None:
    raw = np.zeros(1, dtype=np.uint8).tobytes()
    for i in range(JUNK):
        tensors[f"junk.{i:04d}"] = ("U8", (1,), raw)


def test_a_rule_firing_per_tensor_is_one_hundred_findings_and_a_count(tmp_path):
    d = fixtures.write_checkpoint(
        tmp_path / "d", fixtures.draft_config(num_hidden_layers=1), shards=2, mutate=_with_junk
    )
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    other = {
        "model-00001-of-00002.safetensors": "model-00002-of-00002.safetensors",
        "model-00002-of-00002.safetensors": "model-00001-of-00002.safetensors",
    }
    index["weight_map"] = {name: other[shard] for name, shard in index["weight_map"].items()}  # all misplaced
    index_path.write_text(json.dumps(index))
    report = validate(str(d))
    misplaced = [f for f in report.findings if f.rule == "LC603"]
    total = len(index["weight_map"])
    assert len(misplaced) == MAX_FINDINGS_PER_RULE
    assert misplaced[-1].message.endswith(
        f"({total - MAX_FINDINGS_PER_RULE} more LC603 findings like it are not listed one by one)"
    )
    summarised = total - MAX_FINDINGS_PER_RULE + 1  # the summary stands for these, and keeps their subjects
    assert (
        len(misplaced[-1].subjects) == MAX_SUBJECTS
        and misplaced[-1].subjects_omitted == summarised - MAX_SUBJECTS
    )
    unexpected = next(f for f in report.findings if f.rule == "LC204")
    assert unexpected.message.startswith(f"{JUNK} tensors no loader reads")
    assert len(unexpected.subjects) == MAX_SUBJECTS and unexpected.subjects_omitted == JUNK - MAX_SUBJECTS
    assert report.summary.errors == sum(f.severity == "error" for f in report.findings)


def _finding(i: int, subjects: list[str], runtimes: list[str]) -> Finding:
    return Finding(
        rule="LC605",
        name="n",
        severity="error",
        message=f"m{i}",
        file=f"f{i % 2}",
        pointer=f"p{i}",
        subjects=subjects,
        runtimes=runtimes,
    )


def test_findings_within_the_caps_are_kept_as_they_are():
    findings = [_finding(i, [f"s{i}"], []) for i in range(MAX_FINDINGS_PER_RULE)]
    assert bound_findings(findings) == findings


def test_a_summary_keeps_order_runtimes_and_counts_every_subject_left_out():
    other = Finding(rule="LC001", name="n", severity="warning", message="other")
    many = [
        _finding(i, [f"s{i}.{j}" for j in range(20)], ["vllm"] if i % 2 else ["sglang"])
        for i in range(MAX_FINDINGS_PER_RULE + 200)
    ]
    out = bound_findings([other, *many, other])
    assert out[0] == other and out[-1] == other and len(out) == MAX_FINDINGS_PER_RULE + 2
    summary = out[-2]
    assert summary.message == "m99 (200 more LC605 findings like it are not listed one by one)"
    assert summary.runtimes == ["sglang", "vllm"] and summary.file is None and summary.pointer is None
    assert len(summary.subjects) == MAX_SUBJECTS and summary.subjects[0] == "s99.0"
    assert len(summary.subjects) + summary.subjects_omitted == 201 * 20
