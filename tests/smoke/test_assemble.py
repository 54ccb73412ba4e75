"""The torch-free half of smoke: the report assembled from decoded runs, the arms' agreement, and the target's
files checked before anything loads (smoke/assemble.py, smoke/target_files.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lilicorr_ckpt.smoke.assemble import agreement, assemble
from lilicorr_ckpt.smoke.gates import Divergence
from lilicorr_ckpt.smoke.options import SmokeOptions
from lilicorr_ckpt.smoke.probes import Probe
from lilicorr_ckpt.smoke.profile import ChatTemplate, DraftCheckpoint, MeasurementConditions, TargetRecord
from lilicorr_runtime import BlockRecord, GenerationResult, acceptance_stats

N = 3  # drafted positions per block


def result(mode: str, accepted: list[int], wall: float = 1.0) -> GenerationResult:
    drafted = 0 if mode == "ar" else N
    blocks = [BlockRecord(drafted, a, a + 1) for a in accepted]
    tokens = [5] * (1 + sum(b.committed for b in blocks))  # the prefill's token, then each block's
    return GenerationResult(
        mode=mode,
        prompt_tokens=4,
        tokens=tokens,
        blocks=blocks,
        wall_time_s=wall,
        block_size=1 if mode == "ar" else N + 1,
    )


def runs() -> list:
    code, chat = Probe("code-1", "code", "x", False), Probe("chat-1", "chat", "y", True)
    return [
        (
            code,
            0,
            [1, 2, 3, 4],
            {
                "head": result("head", [3, 1]),
                "control": result("control", [1, 1]),
                "ar": result("ar", [0] * 6, wall=2.0),
            },
        ),
        (
            chat,
            0,
            [1, 2, 3, 4],
            {"head": result("head", [2]), "control": result("control", [2]), "ar": result("ar", [0] * 3)},
        ),
    ]


def report(divergences=(), temperature: float = 0.0, loaded: str = "transformers", **options):
    opts = SmokeOptions(path="d", target="t", temperature=temperature, **options)
    conditions = MeasurementConditions(
        probes="code,chat",
        probe_counts={"code": 1, "chat": 1},
        probe_digest="0",
        limit=1,
        max_new_tokens=8,
        temperature=temperature,
        seeds=[0],
        warmup=False,
        device="cpu",
        dtype="float32",
        kernel_backend="torch",
    )
    return assemble(
        opts=opts,
        runs=runs(),
        arms=["head", "control", "ar"],
        has_head=True,
        n=N,
        block_size=N + 1,
        draft_info=DraftCheckpoint(
            id="d",
            architecture="LiLiCorrDraftModel",
            head=True,
            candidate_topk=4,
            conv_kernel_size=None,
            quant_algo=None,
            runtime="all",
        ),
        target_info=TargetRecord(
            id="t",
            source="directory",
            architecture="LlamaForCausalLM",
            hidden_size=64,
            num_layers=4,
            vocab_size=16,
            loaded=loaded,
        ),
        chat=ChatTemplate(
            present=False,
            applied_prompts=0,
            raw_prompts=2,
            thinking="not-applied",
            template_kwargs={},
            template_sha256=None,
            eos_token_ids=[],
            eos_tokens=[],
        ),
        conditions=conditions,
        divergences=list(divergences),
        parity=None,
        parity_reason="",
        baseline=None,
        acceptance_stats=acceptance_stats,
    )


def test_assemble_counts_the_arms_and_the_head_gain():
    r = report()
    # head: blocks committing 4, 2, 3 -> tau 3; control: 2, 2, 3 -> tau 7/3
    assert r.arms["head"].mean_accept_length == 3.0
    assert r.arms["control"].mean_accept_length == round(7 / 3, 6)
    assert r.head_gain.overall == pytest.approx(3.0 / (7 / 3) - 1, abs=1e-6)
    assert (
        r.per_category["chat"].arms["head"].mean_accept_length
        == 3.0
        == r.per_category["chat"].arms["control"].mean_accept_length
    )
    assert r.head_gain.per_category["chat"] == pytest.approx(0.0)
    # tokens per second against target-only decoding: 11 tokens in 2 s, and 11 in 3 s (rounded to 3 places)
    assert r.arms["head"].tokens_per_second == 5.5 and r.arms["ar"].tokens_per_second == 3.667
    assert r.arms["head"].speedup_vs_ar == round(5.5 / 3.667, 4)
    assert [q.tau["head"] for q in r.requests] == [3.0, 3.0]
    assert all(q.lossless for q in r.requests)
    assert r.primary_arm == "head" and r.method == "lilicorr"
    # +28.6% over two prompts is no evidence: the head gate cannot decide, and an undecided gate fails the run
    gate = {g.name: g for g in r.gates}["head-loaded"]
    assert gate.status == "fail" and gate.inconclusive and "2 prompts are too few" in gate.summary
    assert not r.passed and all(g.status != "fail" for g in r.gates if g.name != "head-loaded")


def test_the_target_line_says_why_a_gguf_took_transformers_route():
    from lilicorr_ckpt.report.smoke import render_text

    def target_line(loaded: str) -> str:
        r = report(loaded=loaded)
        assert r.target_model.loaded == loaded
        return next(line for line in render_text(r).splitlines() if line.startswith("  target "))

    slow = target_line("transformers' GGUF loader (pre-tokenizer 'llama-bpe')")
    assert slow.endswith("; transformers' GGUF loader (pre-tokenizer 'llama-bpe')")
    for quiet in ("read directly from the GGUF", "transformers"):  # the usual routes add nothing
        assert target_line(quiet).endswith("transformers eager forward")


def test_a_divergence_marks_its_request_lossy_and_fails_the_run():
    d = Divergence(
        request="code-1", seed=0, arm="head", position=2, expected=5, emitted=6, logit_gap=3.0, tie=False
    )
    r = report(divergences=[d])
    assert [q.lossless for q in r.requests] == [False, True]
    assert {g.name: g.status for g in r.gates}["lossless"] == "fail" and not r.passed
    assert all(q.lossless is None for q in report(temperature=0.7).requests)  # sampled: not checked


def test_floors_add_their_gates():
    # head tau 3.0; marginal acceptance: 3/3, 2/3, 1/3 at positions 1-3
    gates = {g.name: g.status for g in report(min_tau=3.5, min_accept_rates=(0.9, 0.5)).gates}
    assert gates["min-tau"] == "fail" and gates["min-accept-rates"] == "pass"
    gates = {g.name: g.status for g in report(min_tau=3.0, min_accept_rates=(0.9, 0.7)).gates}
    assert gates["min-tau"] == "pass" and gates["min-accept-rates"] == "fail"
    assert {g.name for g in report().gates} == {"measured", "lossless", "head-loaded", "kernel-parity"}


def test_agreement_compares_the_head_blocks_with_the_control_blocks():
    a = agreement(runs(), temperature=0.0)
    assert (a.requests, a.identical, a.head_accepted, a.control_accepted) == (2, 1, 6, 4)
    assert agreement(runs(), temperature=1.0).identical is None  # sampled arms draw differently


TORCH_FREE = """
import sys
sys.modules["torch"] = None  # any import of torch now raises
from pathlib import Path
from lilicorr_ckpt.checkpoint.target import resolve_target_spec
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.smoke.assemble import agreement, assemble
from lilicorr_ckpt.smoke.target_files import check_target_files
root = Path(sys.argv[1])
(root / "config.json").write_text('{"model_type": "llama"}')
(root / "pytorch_model.bin").write_bytes(b"x")
try:
    check_target_files(resolve_target_spec(str(root)), str(root))
except InputError as exc:
    print("REFUSED", exc)
print("HEAVY", sorted(m for m in ("torch", "transformers", "lilicorr_runtime") if sys.modules.get(m)))
"""


def test_the_arithmetic_and_the_target_file_checks_run_without_torch(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert "REFUSED" in out.stdout and "holds only pickle weights (pytorch_model.bin)" in out.stdout, (
        out.stdout + out.stderr
    )
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
