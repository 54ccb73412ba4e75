"""Gate arithmetic, profile identities, the probe sets, and the kernel-parity comparison (no decoding runs)."""

from __future__ import annotations

import json

import pytest
import torch

from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.smoke import probes as smoke_probes
from lilicorr_ckpt.smoke.gates import (
    ArmAgreement,
    Divergence,
    ParityCheck,
    head_gate,
    lossless_gate,
    parity_gate,
    position_gate,
)
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_ckpt.smoke.profile import dense_histogram, dense_rates, marginal_monotonicity, mean_consistency
from lilicorr_ckpt.smoke.run import kernel_parity
from lilicorr_runtime import SpeculativeDecoder, load_target, ops


def test_head_gate_threshold_is_control_times_one_plus_gain():
    assert head_gate(True, 2.1, 2.0, 0.05, {}).status == "pass"  # exactly at 2.0 x 1.05
    assert head_gate(True, 2.0999, 2.0, 0.05, {}).status == "fail"
    assert head_gate(True, 1.0, 2.0, -1.0, {}).status == "pass"
    assert head_gate(False, None, 2.0, 0.05, {}).status == "skip"
    same = ArmAgreement(requests=3, identical=3, head_accepted=40, control_accepted=40)
    tied = head_gate(True, 2.0, 2.0, 0.05, {"code": 0.0}, same)
    assert tied.status == "fail" and "top-1 candidates" in tied.summary and "code +0.0%" in tied.details[0]
    assert "block for block in all 3 request(s)" in tied.details[1]


def test_head_gate_claims_a_zero_head_only_when_every_block_matched_the_control():
    # equal overall tau by coincidence: the blocks differ, so the head did rerank (the reviewer's case)
    differ = ArmAgreement(requests=3, identical=0, head_accepted=7, control_accepted=7)
    gate = head_gate(True, 1.184, 1.184, 0.05, {"code": -0.167, "chat": 0.0, "math": 0.154}, differ)
    assert gate.status == "fail" and "top-1" not in gate.summary and "zero" not in gate.summary
    assert "(gain +0.0%: no gain over the control)" in gate.summary
    assert "code -16.7%, chat +0.0%, math +15.4%" in gate.details[0]
    assert "differ from the control's in 3 of 3 request(s)" in gate.details[1]
    # sampled arms draw differently whatever the head does: no block-level evidence, no diagnosis
    sampled = ArmAgreement(requests=3, identical=None, head_accepted=7, control_accepted=7)
    assert "top-1" not in head_gate(True, 1.5, 1.5, 0.05, {}, sampled).summary
    assert "top-1" not in head_gate(True, 1.5, 1.5, 0.05, {}).summary  # no evidence given
    # a head just below the required gain is not called gain-less
    assert "below the required +5.0%" in head_gate(True, 1.52, 1.5, 0.05, {}, differ).summary


def test_head_gate_is_inconclusive_when_the_drafter_alone_barely_predicts_the_target():
    nothing = ArmAgreement(requests=4, identical=4, head_accepted=0, control_accepted=0)
    gate = head_gate(True, 1.0, 1.0, 0.05, {}, nothing)
    assert (
        gate.status == "fail" and "inconclusive: no drafted token was accepted in either arm" in gate.summary
    )
    assert "top-1" not in gate.summary and "--min-head-gain -1" in gate.details[-1]
    weak = ArmAgreement(requests=4, identical=1, head_accepted=3, control_accepted=2)
    gate = head_gate(True, 1.005, 1.003, 0.05, {}, weak)
    assert "inconclusive: tau(control) is barely above 1" in gate.summary
    assert (
        "differ from the control's in 3 of 4" in gate.details[0]
        and "random or untrained drafter" in gate.details[1]
    )
    assert head_gate(True, 1.005, 1.003, -1.0, {}, weak).status == "pass"


def test_parity_gate_needs_gpu_and_at_least_one_block():
    assert parity_gate(False, None).status == "skip"
    assert parity_gate(True, []).status == "skip"
    ok = ParityCheck(block=0, op="topk_lse", passed=True)
    bad = ParityCheck(block=1, op="greedy_walk", passed=False, detail="output 0 differs")
    assert parity_gate(True, [ok]).status == "pass"
    failed = parity_gate(True, [ok, bad])
    assert failed.status == "fail" and failed.details == ["block 1 greedy_walk: output 0 differs"]


def test_position_floors_use_the_marginal_rates():
    assert position_gate([0.5, 0.25], [0.5, 0.25, 0.1], "head").status == "pass"
    low = position_gate([0.5, 0.3], [0.5, 0.25, 0.1], "head")
    assert low.status == "fail" and low.details == ["position 2: 0.250 < 0.300"]


def test_lossless_gate_tells_ties_from_bugs():
    tie = Divergence(
        request="a", seed=0, arm="head", position=3, expected=1, emitted=2, logit_gap=1e-6, tie=True
    )
    bug = Divergence(
        request="b", seed=0, arm="control", position=0, expected=1, emitted=2, logit_gap=4.0, tie=False
    )
    passed = lossless_gate(4, [tie], 0.0, "bfloat16")
    assert passed.status == "pass" and "numerical tie" in passed.summary
    failed = lossless_gate(4, [tie, bug], 0.0, "bfloat16")
    assert failed.status == "fail" and "1 of 4" in failed.summary and "(control)" in failed.summary
    assert lossless_gate(4, [bug], 0.7, "float32").status == "skip"


def test_profile_identities_catch_a_truncated_vector_and_a_rising_survival_function():
    # histogram {1: 40, 2: 30, 3: 30}: marginals [0.6, 0.3], mean 1.9
    assert mean_consistency(1.9, [0.6, 0.3]).passed
    cut = mean_consistency(1.9, dense_rates([0.6, 0.3], 1))
    assert not cut.passed and cut.implied_mean_accept_length == 1.6
    assert dense_rates([0.6], 3) == [0.6, 0.0, 0.0]
    assert dense_histogram([40, 30], 4) == {1: 40, 2: 30, 3: 0, 4: 0}
    rising = marginal_monotonicity([0.5, 0.6, 0.1])
    assert not rising.passed and rising.violations[0].position == 1


def test_bundled_probes_and_their_licences_ship_in_the_package():
    from importlib import resources

    probes = resources.files("lilicorr_ckpt").joinpath("probes")
    names = {p.name for p in probes.iterdir()}
    assert {"code.jsonl", "chat.jsonl", "math.jsonl", "NOTICE.md"} <= names
    assert any(n.startswith("LICENSE-") for n in names)
    loaded = smoke_probes.load_probes("code,chat,math", 0)
    assert smoke_probes.counts(loaded) == {"code": 164, "chat": 80, "math": 8}
    assert not any(p.chat for p in loaded if p.category == "code")
    assert all(p.chat for p in loaded if p.category != "code")
    assert smoke_probes.counts(smoke_probes.load_probes("math,code", 3)) == {"math": 3, "code": 3}


def test_a_file_named_like_a_category_does_not_shadow_the_bundled_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "math").write_text("not a probe file")
    assert smoke_probes.counts(smoke_probes.load_probes("math")) == {"math": 8}
    assert smoke_probes.is_probe_file("mine.jsonl") and smoke_probes.is_probe_file("./math")


def test_probe_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text(json.dumps({"id": "a", "category": "c", "prompt": "p", "chat": "yes"}) + "\n")
    with pytest.raises(InputError, match=r"p.jsonl:1: 'chat' must be a boolean"):
        smoke_probes.load_probes(str(bad))
    bad.write_text(
        "\n".join(json.dumps({"id": "a", "category": "c", "prompt": "p", "chat": True}) for _ in range(2))
    )
    with pytest.raises(InputError, match=r"p.jsonl:2: duplicate id 'a'"):
        smoke_probes.load_probes(str(bad))
    bad.write_text("\n")
    with pytest.raises(InputError, match="holds no prompts"):
        smoke_probes.load_probes(str(bad))
    with pytest.raises(UsageError, match="--limit"):
        smoke_probes.load_probes("code", -1)


@pytest.fixture(scope="module")
def head_decoder(drafter, target):
    model = load_target(target)
    decoder = SpeculativeDecoder(model, load_drafter(drafter), mode="head", keep_proposals=True)
    prompt = model.tokenizer("the rain in spain stays mainly")["input_ids"]
    return decoder, prompt


def test_kernel_parity_agrees_with_identical_ops(head_decoder):
    decoder, prompt = head_decoder
    checks = kernel_parity(decoder, prompt, 7, 0.0, (), blocks=3)
    assert [(c.block, c.op) for c in checks][:3] == [(0, "topk_lse"), (0, "greedy_walk"), (0, "sample_walk")]
    assert len(checks) == 9 and all(c.passed for c in checks)


def test_kernel_parity_reports_a_kernel_that_walks_another_path(head_decoder, monkeypatch):
    decoder, prompt = head_decoder

    def wrong_walk(start, pairs, ids):  # another candidate at the last slot
        path = ops.greedy_walk_reference(start, pairs, ids)
        path[:, -1] = torch.where(path[:, -1] == ids[:, -1, 0], ids[:, -1, 1], ids[:, -1, 0])
        return path

    monkeypatch.setattr(ops, "greedy_walk", wrong_walk)  # the dispatcher smoke compares with its reference
    checks = kernel_parity(decoder, prompt, 7, 0.0, (), blocks=2)
    failed = [c for c in checks if not c.passed]
    assert [(c.block, c.op) for c in failed] == [(0, "greedy_walk"), (1, "greedy_walk")]
    assert "differs first at (0, 6)" in failed[0].detail
