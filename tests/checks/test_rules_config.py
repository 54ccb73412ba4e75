"""Config rules (LC0xx, LC1xx): each triggered by one realistic defect in an otherwise valid checkpoint.

Each config key as the loaders read it (where they look, what they default, what they refuse).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.runtimes import PROFILES

from ._support import (
    ALL,
    DROP,
    assert_clean,
    describe,
    dflash_edit,
    edit_config,
    hits,
    one,
    problems,
    refused_by,
    run,
)

Edit = Callable[[dict[str, Any]], Any]

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


nested = dflash_edit


def top(**changes: Any) -> Edit:
    def apply(cfg: dict[str, Any]) -> None:
        for key, value in changes.items():
            if value is DROP:
                cfg.pop(key, None)
            else:
                cfg[key] = value

    return apply


def both(*edits: Edit) -> Edit:
    def apply(cfg: dict[str, Any]) -> None:
        for e in edits:
            e(cfg)

    return apply


class Case(NamedTuple):
    id: str
    rule: str
    severity: str
    runtimes: list[str]  # [] = the finding is independent of the runtime
    edit: Edit | None = None  # applied to config.json after the (valid) checkpoint is written
    config: dict[str, Any] = {}  # draft_config(**config): geometry the tensors are written for
    contains: tuple[str, ...] = ()  # fragments the message must name
    expected: str | None = None
    actual: str | None = None
    also: frozenset[str] = frozenset()  # other rules a defect legitimately brings along
    write: dict[str, Any] = {}


H_EQ_M = {"dflash": {"lilicorr_hidden_size": 64}}  # head as wide as the draft: no token_proj

CASES = [
    # ---- LC0xx: schema and architecture
    Case(
        "hidden-size-string",
        "LC001",
        "error",
        [],
        top(hidden_size="64"),
        contains=("$.hidden_size", '"64"', "integer"),
        expected="an integer",
        also=frozenset({"LC204"}),
    ),
    # ---- how each release reads a value's type (types.py; found by tests/conformance/fuzz)
    Case(
        "causal-string-read-as-truth",
        "LC004",
        "warning",
        ["vllm"],
        nested(causal="false"),
        contains=("truth value", '"false" counts as true'),
        # a true value: TensorRT-LLM refuses a causal draft, SGLang never reads it (bidirectional layers)
        also=frozenset({"LC001", "LC117", "LC133"}),
    ),
    Case(
        "rms-norm-eps-integer",
        "LC005",
        "error",
        ["sglang", "vllm"],
        top(rms_norm_eps=0),
        contains=("$.rms_norm_eps", "Qwen3Config", "float"),
        also=frozenset({"LC181"}),  # an eps of 0 is no floor either, for every runtime
    ),
    Case(
        "rms-norm-eps-negative",
        "LC181",
        "error",
        [],
        top(rms_norm_eps=-1e-6),
        contains=("rms_norm_eps is -1e-06", "no positive floor"),
    ),
    Case(
        "rms-norm-eps-nan",
        "LC181",
        "error",
        [],
        top(rms_norm_eps=float("nan")),
        contains=("rms_norm_eps is nan",),
    ),
    Case(
        "attention-bias-null",
        "LC005",
        "error",
        ["sglang", "vllm"],
        top(attention_bias=None),
        contains=("$.attention_bias", "bool"),
    ),
    Case(
        "model-type-absent", "LC006", "error", ["sglang", "vllm"], top(model_type=DROP), contains=("absent",)
    ),
    Case("model-type-digits", "LC006", "error", ["sglang", "vllm"], top(model_type="2"), contains=('"2"',)),
    Case(
        "text-config-key", "LC007", "error", ["sglang", "vllm"], top(text_config=0), contains=("text_config",)
    ),
    Case("eagle-config-number", "LC008", "error", ["vllm"], top(eagle_config=0), contains=("eagle_config",)),
    Case(
        "vocab-size-huge",
        "LC009",
        "error",
        ["sglang", "trtllm", "vllm"],
        top(vocab_size=2**40),
        contains=("$.vocab_size", "out of memory"),
        also=frozenset({"LC204", "LC205", "LC208", "LC209", "LC115", "LC120"}),
    ),
    Case(
        "topk-fraction",
        "LC001",
        "error",
        ["trtllm", "vllm"],  # SGLang's _parse_lilicorr_config int()s it: the trained 4 (LC004)
        nested(lilicorr_candidate_topk=4.5),
        contains=("$.dflash_config.lilicorr_candidate_topk", "4.5"),
        also=frozenset({"LC004"}),
    ),
    Case(
        "misspelt-nested-key",
        "LC003",
        "info",
        [],
        nested(lilicorr_topk=4),
        contains=("$.dflash_config.lilicorr_topk",),
    ),
    Case(
        "architectures-absent",
        "LC010",
        "error",
        [],
        top(architectures=DROP),
        contains=("architectures",),
        actual="absent",
    ),
    Case(
        "architecture-unknown",
        "LC010",
        "error",
        [],
        top(architectures=["LlamaForCausalLM"]),
        contains=("LlamaForCausalLM",),
        actual="LlamaForCausalLM",
    ),
    # TensorRT-LLM routes projector_type "lilicorr" / lilicorr_enabled true to LiLiCorr whatever
    # architectures says; SGLang and vLLM follow architectures and drop the head
    Case(
        "dflash-arch-with-head-tensors",
        "LC011",
        "error",
        ["sglang", "vllm"],
        top(architectures=["DFlashDraftModel"]),
        contains=("DFlashDraftModel", "lilicorr.*", "projector_type"),
        expected="LiLiCorrDraftModel",
        actual="DFlashDraftModel",
    ),
    Case(
        "dflash-arch-with-head-tensors-unrouted",
        "LC011",
        "error",
        [],
        both(top(architectures=["DFlashDraftModel"]), nested(projector_type=DROP, lilicorr_enabled=DROP)),
        contains=("DFlashDraftModel", "lilicorr.*"),
        expected="LiLiCorrDraftModel",
        actual="DFlashDraftModel",
    ),
    Case(
        "lilicorr-arch-without-head",
        "LC011",
        "error",
        [],
        top(architectures=["LiLiCorrDraftModel"]),
        config={"head": False},
        contains=("no lilicorr.* tensors", "DFlashDraftModel"),
        also=frozenset({"LC101"}),
    ),
    # sibling heads (DFlash2, DSpark, Domino): test_sibling_heads.py
    # ---- LC10x: LiLiCorr geometry
    Case(
        "key-missing",
        "LC101",
        "error",
        [],
        nested(lilicorr_factor_dim=DROP),
        contains=("dflash_config.lilicorr_factor_dim",),
        expected="present",
        actual="absent",
    ),
    Case(
        "key-at-top-level",
        "LC101",
        "error",
        [],
        both(nested(lilicorr_logit_scale=DROP), top(lilicorr_logit_scale=10.0)),
        contains=("dflash_config.lilicorr_logit_scale", "top level"),
    ),
    Case(
        "logit-scale-nan",
        "LC102",
        "error",
        [],
        nested(lilicorr_logit_scale=math.nan),
        contains=("lilicorr_logit_scale", "nan"),
    ),
    Case(
        "vector-eps-inf",
        "LC102",
        "error",
        [],
        nested(lilicorr_vector_eps=math.inf),
        contains=("lilicorr_vector_eps", "inf"),
    ),
    Case(
        "num-layers-zero",
        "LC103",
        "error",
        [],
        nested(lilicorr_num_layers=0),
        contains=("lilicorr_num_layers is 0",),
        expected="> 0",
        actual="0",
    ),
    Case(
        "mlp-ratio-negative",
        "LC103",
        "error",
        [],
        nested(lilicorr_mlp_ratio=-2.0),
        contains=("lilicorr_mlp_ratio is -2.0",),
    ),
    Case(
        "mlp-width-rounds-to-zero",
        "LC103",
        "error",
        [],
        nested(lilicorr_mlp_ratio=0.01),
        contains=("int(lilicorr_hidden_size * lilicorr_mlp_ratio) is 0",),
        also=frozenset({"LC208"}),
    ),
    # only MLX (no --runtime profile) requires K <= V
    Case(
        "topk-above-vocab",
        "LC124",
        "warning",
        [],
        None,
        config={"vocab_size": 8, "dflash": {"lilicorr_candidate_topk": 16, "mask_token_id": 7}},
        contains=("lilicorr_candidate_topk 16 exceeds vocab_size 8", "MLX"),
    ),
    Case(
        "topk-not-power-of-two",
        "LC104",
        "error",
        ["sglang", "vllm"],
        None,
        config={"dflash": {"lilicorr_candidate_topk": 3}},
        contains=("lilicorr_candidate_topk is 3", "power of two"),
        actual="3",
    ),
    Case(
        "topk-power-of-two-above-16",
        "LC104",
        "error",
        ["sglang", "vllm"],
        None,
        config={"dflash": {"lilicorr_candidate_topk": 32}},
        contains=("lilicorr_candidate_topk is 32",),
    ),
    Case(
        "head-width-zero",
        "LC105",
        "error",
        ["trtllm"],
        nested(lilicorr_hidden_size=0),
        config=H_EQ_M,
        contains=("lilicorr_hidden_size is 0", "TensorRT-LLM"),
        expected=">= 1 (the real width, 64)",
        actual="0",
    ),
    Case(
        "head-width-negative",
        "LC105",
        "error",
        [],
        nested(lilicorr_hidden_size=-32),
        contains=("lilicorr_hidden_size is -32",),
        expected=">= 0",
    ),
    Case(
        "heads-do-not-divide",
        "LC106",
        "error",
        [],
        None,
        config={"dflash": {"lilicorr_num_heads": 5}},
        contains=("lilicorr_num_heads 5", "head width 32"),
        actual="5",
    ),
    Case(
        "vector-eps-half",
        "LC107",
        "error",
        ["trtllm"],
        nested(lilicorr_vector_eps=0.5),
        contains=("lilicorr_vector_eps is 0.5",),
        expected="in (0, 0.5)",
        actual="0.5",
    ),
    Case(
        "vector-eps-one",
        "LC107",
        "error",
        ["trtllm"],
        nested(lilicorr_vector_eps=1.0),
        contains=("lilicorr_vector_eps is 1.0",),
    ),
    Case(
        "lilicorr-disabled",
        "LC108",
        "error",
        [],
        nested(lilicorr_enabled=False),
        contains=("lilicorr_enabled is false",),
        expected="true",
        actual="false",
    ),
    # ---- LC11x: DFlash keys
    Case(
        "block-size-conflict",
        "LC111",
        "warning",
        [],
        top(block_size=16),
        contains=("dflash_config.block_size is 8", "top-level block_size is 16"),
        expected="8",
        actual="16",
    ),
    Case(
        "block-size-one",
        "LC112",
        "error",
        [],
        both(top(block_size=1), nested(block_size=1)),
        contains=("block_size is 1",),
        expected=">= 2",
        actual="1",
    ),
    Case(
        "target-layer-ids-empty",
        "LC113",
        "error",
        [],
        nested(target_layer_ids=[]),
        contains=("target_layer_ids is empty",),
        also=frozenset({"LC204"}),
    ),
    Case(
        "target-layer-ids-negative",
        "LC113",
        "error",
        [],
        nested(target_layer_ids=[-1, 2]),
        contains=("negative ids [-1]",),
    ),
    Case(
        "target-layer-ids-duplicate",
        "LC113",
        "error",
        [],
        nested(target_layer_ids=[2, 2]),
        contains=("repeats [2]",),
    ),
    Case(
        "target-layer-ids-shifted",
        "LC113",
        "error",
        [],
        nested(target_layer_ids=[1, 4]),
        contains=("[4]", "num_target_layers 4", "shifted by +1"),
        expected="ids in 0..3",
    ),
    Case(
        "target-layer-ids-descending",
        "LC114",
        "warning",
        ["trtllm"],
        nested(target_layer_ids=[2, 0]),
        contains=("[2, 0]",),
        also=frozenset({"LC145"}),
    ),
    # SGLang's targets and vLLM capture in layer order: fc reads [0, 2] where it was trained on [2, 0]
    Case(
        "target-layer-ids-permuted",
        "LC145",
        "error",
        ["sglang", "vllm"],
        nested(target_layer_ids=[2, 0]),
        contains=("[2, 0]", "in layer order", "[0, 2]"),
        expected="[0, 2]",
        also=frozenset({"LC114"}),
    ),
    # the id num_target_layers - 1 is captured by no Qwen3 target of SGLang (it captures layer i at layer i + 1)
    Case(
        "target-layer-ids-last-layer",
        "LC148",
        "error",
        ["sglang"],
        nested(target_layer_ids=[0, 3]),
        contains=("includes 3", "last layer", "1 of its 2 features"),
    ),
    Case(
        "mask-missing",
        "LC115",
        "error",
        [],
        nested(mask_token_id=DROP),
        contains=("mask_token_id is missing",),
        actual="absent",
    ),
    Case(
        "mask-at-vocab-size",
        "LC115",
        "error",
        [],
        nested(mask_token_id=512),
        contains=("mask_token_id 512", "vocab_size 512"),
        expected="< 512",
        actual="512",
    ),
    Case("mask-negative", "LC115", "error", [], nested(mask_token_id=-1), expected=">= 0", actual="-1"),
    Case(
        "mask-top-level-only",
        "LC127",
        "info",
        [],
        both(nested(mask_token_id=DROP), top(mask_token_id=511)),
        contains=("top level",),
    ),
    Case(
        "conv-taps-without-group",
        "LC116",
        "error",
        ["sglang", "trtllm", "vllm"],
        nested(conv_kernel_size=4),
        contains=("conv_kernel_size is 4",),
    ),
    Case(
        "conv-group-without-taps",
        "LC116",
        "error",
        ["sglang", "vllm"],
        nested(conv_group_size=16),
        contains=("conv_group_size is 16",),
    ),
    Case(
        "conv-negative",
        "LC116",
        "error",
        ["sglang", "trtllm", "vllm"],
        nested(conv_kernel_size=-1, conv_group_size=-1),
        contains=("conv_kernel_size is -1",),
        expected=">= 0",
        actual="-1",
    ),
    Case(
        "conv-group-does-not-divide",
        "LC116",
        "error",
        ["sglang", "trtllm", "vllm"],
        nested(conv_kernel_size=4, conv_group_size=24),
        contains=("hidden_size 64", "conv_group_size 24"),
    ),
    # TRT refuses a causal draft; SGLang never reads it (full layers bidirectional); vLLM honours it
    Case(
        "causal-nested",
        "LC117",
        "error",
        ["trtllm"],
        nested(causal=True),
        contains=("causal", f"{TR} refuses"),
        expected="false",
        actual="true",
        also=frozenset({"LC133"}),
    ),
    # SGLang never reads dflash_config.causal: its full layers run bidirectionally (a silent mis-load)
    Case(
        "causal-nested-run-bidirectionally-by-sglang",
        "LC133",
        "error",
        ["sglang"],
        nested(causal=True),
        contains=(f"{SG} never reads it", "bidirectionally"),
        also=frozenset({"LC117"}),
    ),
    Case(
        "causal-top-level",
        "LC117",
        "error",
        ["trtllm"],
        top(is_causal=True),
        contains=("is_causal",),
        also=frozenset({"LC133"}),
    ),
    # SGLang's parse_dflash_draft_config reads output_multiplier from dflash_config only, > 0 (default 1)
    Case(
        "output-multiplier-zero",
        "LC123",
        "error",
        ["sglang"],
        nested(output_multiplier=0.0),
        contains=("dflash_config.output_multiplier is 0.0", "> 0"),
        expected="> 0",
    ),
    Case(
        "output-multiplier-negative",
        "LC123",
        "error",
        ["sglang"],
        nested(output_multiplier=-1.5),
        contains=("output_multiplier is -1.5",),
    ),
    Case(
        "kv-heads-do-not-divide",
        "LC118",
        "error",
        [],
        None,
        config={"num_key_value_heads": 3},
        contains=("num_key_value_heads 3", "num_attention_heads 4"),
    ),
    Case(
        "layer-types-length",
        "LC119",
        "error",
        [],
        top(layer_types=["full_attention"]),
        contains=("1 entries", "2 draft layers"),
        expected="2",
        actual="1",
    ),
    Case(
        "layer-types-too-long",
        "LC143",
        "warning",
        ["trtllm"],
        top(layer_types=["full_attention"] * 3),
        contains=("3 entries", "2 draft layers"),
        expected="2",
        actual="3",
        also=frozenset({"LC119"}),
    ),
    # transformers' validate_layer_type, in the config class SGLang and vLLM build: the length must match
    Case(
        "layer-types-too-long-refused-by-the-config-class",
        "LC119",
        "error",
        ["sglang", "vllm"],
        top(layer_types=["full_attention"] * 3),
        contains=("3 entries", "Qwen3Config"),
        expected="2",
        also=frozenset({"LC143"}),
    ),
    # Qwen3Config keeps sliding_window only with use_sliding_window: SGLang and vLLM then find none
    Case(
        "sliding-window-dropped-without-use-sliding-window",
        "LC119",
        "error",
        ["sglang", "vllm"],
        top(layer_types=["sliding_attention", "full_attention"], sliding_window=8),
        contains=("use_sliding_window is not true", "qwen3 config class"),
        expected="true",
        also=frozenset({"LC144"}),
    ),
    Case(
        "use-swa-window-dropped-without-use-sliding-window",
        "LC119",
        "error",
        ["vllm"],
        both(top(layer_types=DROP, sliding_window=8), nested(use_swa=True)),
        contains=("use_swa is true", "drops sliding_window"),
        also=frozenset({"LC138", "LC144"}),
    ),
    # ---- keys the speculators and the DFlash backbone read (vLLM)
    Case(
        "logit-scale-zero-refused",
        "LC103",
        "error",
        ["sglang", "trtllm"],
        nested(lilicorr_logit_scale=0.0),
        contains=("lilicorr_logit_scale is 0.0",),
        also=frozenset({"LC170"}),
    ),
    Case(
        "logit-scale-zero-served",
        "LC170",
        "warning",
        ["vllm"],
        nested(lilicorr_logit_scale=0.0),
        contains=("lilicorr_logit_scale is 0.0", f"{VL} serves it as declared", "alike"),
        also=frozenset({"LC103"}),
    ),
    Case(
        "logit-scale-negative-served",
        "LC170",
        "warning",
        ["vllm"],
        nested(lilicorr_logit_scale=-2.0),
        contains=("in reverse",),
        also=frozenset({"LC103"}),
    ),
    Case(
        "eagle-aux-layer-ids-override",
        "LC173",
        "error",
        ["vllm"],
        top(eagle_aux_hidden_state_layer_ids=[2, 4]),
        contains=("[2, 4]", "target_layer_ids + 1 ([1, 3])"),
        expected="[1, 3]",
        actual="[2, 4]",
    ),
    Case(
        "sample-from-anchor",
        "LC174",
        "error",
        ["vllm"],
        nested(sample_from_anchor=True),
        contains=("sample_from_anchor is true", f"{VL} refuses it"),
    ),
    Case(
        "no-aux-hidden-state",
        "LC175",
        "error",
        ["vllm"],
        nested(use_aux_hidden_state=False),
        contains=("dflash_config.use_aux_hidden_state", "drops fc.weight"),
    ),
    Case(
        "no-aux-hidden-state-eagle-config",
        "LC175",
        "error",
        ["vllm"],
        top(eagle_config={"use_aux_hidden_state": False}),
        contains=("eagle_config.use_aux_hidden_state",),
    ),
    # dflash.py DFlashMLP builds swigluoai from config.swiglu_alpha / swiglu_limit
    Case(
        "swigluoai-without-constants",
        "LC131",
        "error",
        ["sglang"],
        top(hidden_act="swigluoai"),
        contains=("swiglu_alpha and swiglu_limit", "AttributeError"),
        also=frozenset({"LC132"}),
    ),
    Case(
        "sliding-without-window",
        "LC119",
        "error",
        [],
        top(layer_types=["sliding_attention", "full_attention"]),
        contains=("sliding_window",),
    ),
    Case(
        "layer-type-unknown",
        "LC119",
        "error",
        [],
        top(layer_types=["full_attention", "linear_attention"]),
        contains=("linear_attention",),
    ),
    Case(
        "reduced-draft-vocab",
        "LC120",
        "error",
        ["trtllm", "vllm"],
        top(draft_vocab_size=256),
        contains=("draft vocabulary",),
        also=frozenset({"LC149"}),
    ),
    Case(
        "remapped-draft-vocab",
        "LC120",
        "error",
        ["trtllm"],  # vLLM never reads the key (only draft_vocab_size): LC149 there
        top(draft_id_to_target_id=[0, 1, 2]),
        also=frozenset({"LC149"}),
    ),
    Case(
        "draft-vocab-never-read-by-sglang",
        "LC149",
        "warning",
        ["sglang"],
        top(draft_vocab_size=256),
        contains=("never reads", "full head"),
        also=frozenset({"LC120"}),
    ),
    Case(
        "intermediate-size-padded-by-sglang",
        "LC183",
        "warning",
        ["sglang"],
        top(intermediate_size=DROP),
        contains=("22016", "zero-pads"),
        also=frozenset({"LC118", "LC215"}),
    ),
    Case("fp16", "LC121", "warning", [], None, write={"dtype": "F16"}, contains=("float16",)),
    Case("vocab-size-absent", "LC122", "error", [], top(vocab_size=DROP), contains=("vocab_size",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_config_rule(ckpt, case: Case):
    path = ckpt(fixtures.draft_config(**case.config), **case.write)
    if case.edit:
        edit_config(path, case.edit)
    report = run(path)
    found = [f for f in hits(report, case.rule, case.severity) if sorted(f.runtimes) == sorted(case.runtimes)]
    assert found, describe(report)
    text = " ".join(f.message for f in found)
    for fragment in case.contains:
        assert fragment in text, text
    if case.expected is not None:
        assert case.expected in [f.expected for f in found], [f.expected for f in found]
    if case.actual is not None:
        assert case.actual in [f.actual for f in found], [f.actual for f in found]
    assert all(f.file in (None, "config.json") for f in found)
    assert problems(report, ignore={case.rule, *case.also}) == [], describe(report)
    if not case.also:
        want = sorted(case.runtimes or ALL) if case.severity == "error" else []
        assert refused_by(report) == want, describe(report)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({}, id="plain"),
        pytest.param({"conv": (4, 16)}, id="conv"),
        pytest.param(H_EQ_M, id="head-as-wide-as-draft"),
        pytest.param({"head": False}, id="dflash-no-head"),
        pytest.param({"attention_bias": True}, id="attention-bias"),
        pytest.param({"dflash": {"lilicorr_candidate_topk": 16, "lilicorr_vector_eps": 0.49}}, id="limits"),
    ],
)
def test_valid_configs_pass(ckpt, config):
    assert_clean(run(ckpt(fixtures.draft_config(**config))))


def test_vector_eps_zero_is_refused_by_sglang_and_served_without_a_floor_by_vllm(ckpt):
    path = ckpt(fixtures.draft_config())
    edit_config(path, nested(lilicorr_vector_eps=0.0))
    report = run(path)
    by = {tuple(sorted(f.runtimes)): f.message for f in hits(report, "LC103", "error")}
    assert set(by) == {("sglang", "trtllm"), ("vllm",)}, describe(report)
    assert "lilicorr_vector_eps is 0" in by["sglang", "trtllm"] and "refuse it" in by["sglang", "trtllm"]
    assert "loads it without a check, then serves" in by["vllm",] and "no floor" in by["vllm",]
    assert refused_by(report) == sorted(ALL), describe(report)


def test_owned_head_is_refused_for_sglang_only(ckpt):
    # SGLang's DFlash draft has no lm_head parameter: the owned head is dropped and the target's used
    report = run(ckpt(fixtures.draft_config(own_lm_head=True)))
    assert problems(report) == [("LC404", "error", ("sglang",))], describe(report)
    assert refused_by(report) == ["sglang"]


def test_duplicate_key_warns(ckpt):
    path = ckpt()
    text = (path / "config.json").read_text()
    # a second vocab_size, as hand-edited configs end up with; JSON readers keep the last one
    (path / "config.json").write_text(
        text.replace('"vocab_size": 512,', '"vocab_size": 512,\n  "vocab_size": 512,')
    )
    report = run(path)
    f = one(report, "LC002", "warning")
    assert "vocab_size" in f.message
    assert problems(report) == [("LC002", "warning", ())]


def test_block_size_absent_differs_per_runtime(ckpt):
    # trained with B = 16 (SGLang's default), so SGLang would load it; vLLM and TRT refuse the config
    path = ckpt(fixtures.draft_config(block_size=16, dflash={"block_size": 16}))
    edit_config(path, both(top(block_size=DROP), nested(block_size=DROP)))
    report = run(path)
    found = {(f.rule, tuple(f.runtimes)): f for f in hits(report, "LC110") + hits(report, "LC125")}
    assert {k: f.severity for k, f in found.items()} == {
        ("LC125", ("sglang",)): "warning",
        ("LC110", ("vllm",)): "error",
        ("LC110", ("trtllm",)): "error",
    }, describe(report)
    assert "16" in found[("LC125", ("sglang",))].message
    assert refused_by(report) == ["trtllm", "vllm"]
    assert problems(report, ignore={"LC110", "LC125"}) == []


def test_block_size_absent_with_other_trained_size_breaks_sglang_too(ckpt):
    # trained with B = 8: SGLang's silent default 16 builds a lattice that does not fit the tensors
    path = ckpt()
    edit_config(path, both(top(block_size=DROP), nested(block_size=DROP)))
    report = run(path)
    shapes = {f.pointer for f in hits(report, "LC208")}
    assert {"lilicorr.slot_embedding", "lilicorr.relative_slot_bias"} <= shapes, describe(report)
    assert refused_by(report) == ALL


def test_block_size_only_top_level_is_informational(ckpt):
    path = ckpt()
    edit_config(path, nested(block_size=DROP))
    report = run(path)
    assert one(report, "LC126").severity == "info"
    assert_clean(report)


def test_target_layer_ids_missing_is_refused(ckpt):
    path = ckpt()
    edit_config(path, nested(target_layer_ids=DROP))
    report = run(path)
    f = one(report, "LC113", "error")
    assert f.runtimes == [] and f.actual == "absent"
    assert "build_target_layer_ids" in f.message  # names SGLang's silent fallback


def test_runtime_selection_filters_runtime_specific_rules(ckpt):
    path = ckpt(fixtures.draft_config(dflash={"lilicorr_candidate_topk": 3}))
    assert hits(run(path, runtime="trtllm"), "LC104") == []
    assert [f.runtimes for f in hits(run(path, runtime="vllm"), "LC104")] == [["vllm"]]


def test_conv_kernel_longer_than_block_is_a_trtllm_refusal(ckpt):
    path = ckpt(fixtures.draft_config(conv=(9, 16)))
    report = run(path)
    f = one(report, "LC116", "error")
    assert "exceeds block_size 8" in f.message
    assert f.runtimes == ["trtllm"]
    assert refused_by(report) == ["trtllm"]


def test_dflash_architecture_with_stray_lilicorr_keys_only_warns(ckpt):
    path = ckpt(fixtures.draft_config(head=False))
    keys = {
        k: v
        for k, v in fixtures.draft_config()["dflash_config"].items()
        if k.startswith("lilicorr_") and k != "lilicorr_enabled"
    }
    edit_config(path, nested(**keys))
    report = run(path)
    assert one(report, "LC013").severity == "warning"
    assert problems(report) == [("LC013", "warning", ())], describe(report)


def test_dflash_architecture_routed_by_projector_type_without_head_is_refused_by_trtllm(ckpt):
    # TensorRT-LLM routes projector_type "lilicorr" to LiLiCorr, which then finds no head tensors
    path = ckpt(fixtures.draft_config(head=False))
    keys = {
        k: v
        for k, v in fixtures.draft_config()["dflash_config"].items()
        if k.startswith("lilicorr_") or k == "projector_type"
    }
    edit_config(path, nested(**keys))
    report = run(path)
    assert problems(report) == [("LC011", "error", ("trtllm",)), ("LC013", "warning", ("sglang", "vllm"))], (
        describe(report)
    )
    assert refused_by(report) == ["trtllm"]
