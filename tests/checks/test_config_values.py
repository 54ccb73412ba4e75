"""Config values as each release reads them (issue 36's fuzzer classes): what validate says per release, each case
the differential fuzzer found against the executed released loaders (tests/conformance/fuzz/corpus_values.py runs
them against the loaders themselves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lilicorr_ckpt import fixtures

from ._support import edit_config, hits, run


def checkpoint(tmp_path: Path, config: dict[str, Any] | None = None, **top: Any) -> Path:
    path = fixtures.write_checkpoint(tmp_path / "ckpt", config)
    edit_config(path, lambda c: c.update(top))
    return path


def errors(path: Path, runtime: str) -> set[str]:
    return {f.rule for f in run(path, runtime=runtime).findings if f.severity == "error"}


def runtimes_of(path: Path, rule: str, runtime: str) -> list[str]:
    return sorted({r for f in hits(run(path, runtime=runtime), rule, "error") for r in f.runtimes})


def test_a_null_text_config_is_refused_by_sglang_only(tmp_path: Path) -> None:
    # transformers' get_text_config passes over a null text config; SGLang's get_hf_text_config asserts on it
    path = checkpoint(tmp_path, text_config=None)
    assert runtimes_of(path, "LC007", "sglang,vllm") == ["sglang"]


def test_a_null_decoder_is_refused_by_no_release(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, decoder=None)
    assert "LC007" not in errors(path, "sglang,vllm")


def test_a_text_config_value_is_refused_by_both(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, text_config=0)
    assert runtimes_of(path, "LC007", "sglang,vllm") == ["sglang", "vllm"]


@pytest.mark.parametrize("value, refused_by", [(-3, ["sglang", "trtllm", "vllm"]), (0, ["sglang", "trtllm"])])
def test_head_dim_below_one(tmp_path: Path, value: int, refused_by: list[str]) -> None:
    # vLLM's DFlash attention reads `head_dim or hidden_size // num_heads`: 0 is absent there
    path = checkpoint(tmp_path, head_dim=value)
    found = hits(run(path), "LC118", "error")
    assert sorted({r for f in found for r in f.runtimes} or ["sglang", "trtllm", "vllm"]) == refused_by


def test_target_hidden_size_is_read_by_vllm_only(tmp_path: Path) -> None:
    negative = checkpoint(tmp_path / "a", target_hidden_size=-3)
    assert "LC118" in errors(negative, "vllm") and "LC118" not in errors(negative, "sglang")
    whole = checkpoint(tmp_path / "b", target_hidden_size=64.0)
    assert "LC139" in errors(whole, "vllm") and "LC139" not in errors(whole, "sglang")
    falsy = checkpoint(tmp_path / "c", target_hidden_size="")  # `target_hidden_size or hidden_size`
    assert "LC001" not in errors(falsy, "vllm")
    truthy = checkpoint(tmp_path / "d", target_hidden_size="64")
    assert "LC001" in errors(truthy, "vllm") and "LC001" not in errors(truthy, "sglang")


@pytest.mark.parametrize("value", [True, "2"])
def test_lilicorr_mlp_ratio_must_be_a_number_for_vllm(tmp_path: Path, value: Any) -> None:
    path = checkpoint(tmp_path)
    edit_config(path, lambda c: c["dflash_config"].__setitem__("lilicorr_mlp_ratio", value))
    assert "LC001" in errors(path, "vllm")
    # SGLang: float() of it (a numeric string is its number; float(true) is a ratio of 1, no trained head's)
    assert ("LC001" in errors(path, "sglang")) is (value is True)


def test_sglang_casts_the_lilicorr_integers(tmp_path: Path) -> None:
    path = checkpoint(tmp_path)
    edit_config(path, lambda c: c["dflash_config"].__setitem__("lilicorr_factor_dim", "16"))
    assert "LC001" not in errors(path, "sglang")
    assert "LC001" in errors(path, "vllm")


@pytest.mark.parametrize("value, refused", [(float("nan"), True), ([1], True), (0, False), ("x", False)])
def test_is_neox_style_is_hashed_and_compared_by_vllm(tmp_path: Path, value: Any, refused: bool) -> None:
    path = checkpoint(tmp_path, is_neox_style=value)
    assert ("LC001" in errors(path, "vllm")) is refused


@pytest.mark.parametrize(
    "config, value, refused",
    [
        (fixtures.draft_config(), 2, True),  # block 8: 7 tokens, not a multiple of 2
        (fixtures.draft_config(), 7, False),  # at most n_predict
        (fixtures.draft_config(), 0, True),  # a ZeroDivisionError
        (fixtures.draft_config(), "3", True),  # a TypeError
        (fixtures.draft_config(), True, False),  # a count of 1
        (fixtures.draft_config(), 2**40, False),  # more than the tokens drafted
        (fixtures.sibling_config("dspark-deepspec"), 0, False),  # DSpark's config class reads block_size
    ],
)
def test_n_predict_against_the_block(
    tmp_path: Path, config: dict[str, Any], value: Any, refused: bool
) -> None:
    path = checkpoint(tmp_path, config, n_predict=value)
    assert ("LC182" in errors(path, "vllm==0.31.0")) is refused
    assert ("LC182" in errors(path, "vllm==0.34.0")) is refused
    assert "LC182" not in errors(path, "sglang")


@pytest.mark.parametrize("value, refused", [("", False), (0, False), ("x", True), (True, True)])
def test_a_falsy_rope_scaling_is_absent(tmp_path: Path, value: Any, refused: bool) -> None:
    # transformers: `rope_parameters = rope_scaling or rope_parameters`
    path = checkpoint(tmp_path, rope_scaling=value)
    for runtime in ("sglang", "vllm"):
        assert ("LC001" in errors(path, runtime)) is refused


def test_vllm_reads_has_own_lm_head_as_a_flag_and_sglang_not_at_all(tmp_path: Path) -> None:
    falsy = checkpoint(tmp_path / "a", has_own_lm_head=0)
    assert "LC001" not in errors(falsy, "sglang,vllm")
    truthy = checkpoint(tmp_path / "b", has_own_lm_head="1")
    assert runtimes_of(truthy, "LC001", "sglang,vllm") == ["vllm"]


def test_vllm_casts_the_nested_mask_token_id(tmp_path: Path) -> None:
    path = checkpoint(tmp_path)
    edit_config(path, lambda c: c["dflash_config"].__setitem__("mask_token_id", "511"))
    assert runtimes_of(path, "LC001", "sglang,vllm") == ["sglang"]


def test_a_draft_id_map_key_alone_is_not_read_by_vllm(tmp_path: Path) -> None:
    # vLLM builds draft_id_to_target_id from draft_vocab_size against the target's vocabulary, never from the key
    path = checkpoint(tmp_path / "a", draft_id_to_target_id=[0, 1])
    assert "LC120" not in errors(path, "vllm")
    warned = hits(run(path, runtime="vllm"), "LC149", "warning")
    assert (
        warned
        and "`draft_id_to_target_id`" in warned[0].message
        and warned[0].pointer == "$.draft_id_to_target_id"
    )
    reduced = checkpoint(tmp_path / "b", draft_vocab_size=32)
    assert "LC120" in errors(reduced, "vllm")


def test_a_huge_size_is_refused_only_where_read(tmp_path: Path) -> None:
    config = fixtures.draft_config()
    config["dflash_config"].update(intermediate_size=2**40, vocab_size=2**40)
    nested = checkpoint(tmp_path / "a", config, block_size=2**40)  # dflash_config's block_size overrides it
    assert "LC009" not in errors(nested, "sglang,vllm")
    top = checkpoint(tmp_path / "b", vocab_size=2**40)
    assert runtimes_of(top, "LC009", "sglang,vllm") == ["sglang", "vllm"]


def test_conv_keys_on_a_head_without_convolutions_are_refused_by_sglang_only(tmp_path: Path) -> None:
    # vLLM reads conv_* for LiLiCorr and DFlash2 only; SGLang's parse_dflash_draft_config for every head
    config = fixtures.draft_config(head=False)
    config["dflash_config"].update(conv_group_size=-3)
    path = checkpoint(tmp_path, config)
    assert runtimes_of(path, "LC116", "sglang,vllm") == ["sglang"]


def test_a_whole_float_in_a_key_dflash_config_overrides_is_not_read(tmp_path: Path) -> None:
    # SGLang reads `dflash_config.get("mask_token_id", top-level)`; vLLM reads num_target_layers nowhere
    mask = checkpoint(tmp_path / "a", mask_token_id=2.0)
    assert "LC139" not in errors(mask, "sglang,vllm")
    taps = checkpoint(tmp_path / "b", num_target_layers=4.0)
    assert "LC139" not in errors(taps, "vllm")


def test_a_size_cast_with_int_is_judged_at_the_cast_value_per_release(tmp_path: Path) -> None:
    # vLLM qwen3_dflash2.py and SGLang parse_dflash_draft_config read DFlash2's conv_kernel_size with int():
    # the convolution is built, so neither LC116 nor LC205 fires; the type is a warning there (LC004)
    config = fixtures.sibling_config("dflash2")
    config["dflash_config"]["conv_kernel_size"] = str(config["dflash_config"]["conv_kernel_size"])
    path = fixtures.write_checkpoint(tmp_path / "a", config)
    report = run(path, runtime="sglang,vllm")
    assert not {"LC001", "LC116", "LC205"} & {f.rule for f in report.findings if f.severity == "error"}
    assert sorted(r for f in hits(report, "LC004", "warning") for r in f.runtimes) == ["sglang", "vllm"]
    # vLLM's LiLiCorr compares conv_kernel_size uncast (a TypeError); SGLang casts: absent for one, 2 for the other
    lone = fixtures.draft_config()
    lone["dflash_config"]["conv_kernel_size"] = "2"
    solo = fixtures.write_checkpoint(tmp_path / "b", lone)
    pair = hits(run(solo, runtime="sglang,vllm"), "LC116", "error")
    assert [f.runtimes for f in pair] == [["sglang"]] and "conv_kernel_size is 2" in pair[0].message
    assert "LC001" in errors(solo, "vllm") and "LC001" not in errors(solo, "sglang")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2.5, 0.0])
def test_vllm_lilicorr_tests_a_convolution_size_as_it_is(tmp_path: Path, value: float) -> None:
    # lilicorr.py LiLiCorr.__init__: `< 0`, then `bool(taps) != bool(groups)` on the values as written: NaN, an
    # infinity or 2.5 beside an absent group size is refused, 0.0 is no convolution (the corpus runs NaN and 16.0
    # against the loaders; the JSON ops there write no infinity, fraction or 0.0)
    config = fixtures.draft_config()
    config["dflash_config"]["conv_kernel_size"] = value
    path = fixtures.write_checkpoint(tmp_path / "a", config)
    pair = hits(run(path, runtime="vllm"), "LC116", "error")
    if value == 0.0:
        assert not pair and "LC139" not in errors(path, "vllm")
    else:
        assert [f.runtimes for f in pair] == [["vllm"]] and "both or neither" in pair[0].message
        assert "conv_kernel_size" in (pair[0].fix or "")


@pytest.mark.parametrize(
    "key, value, refused",
    [
        ("conv_kernel_size", 2.5, False),  # int() is the trained 2: the trained convolution loads
        ("conv_kernel_size", 1.5, True),  # int() is 1: the trained 2-tap tensors do not fit
        ("conv_kernel_size", 0.5, True),  # int() is 0: a convolution of no taps
        ("conv_group_size", 16.5, False),
        ("conv_group_size", 12.5, True),  # 12 does not divide hidden_size 64
    ],
)
def test_a_fraction_beside_a_set_partner_is_its_int(
    tmp_path: Path, key: str, value: float, refused: bool
) -> None:
    # vLLM lilicorr.py LiLiCorr.__init__ passes both tests, qwen3_dflash2.py DFlash2Qwen3DecoderLayer int()s each;
    # SGLang dflash_utils.py _parse_optional_int int()s them alike
    path = fixtures.write_checkpoint(tmp_path / "a", fixtures.draft_config(conv=(2, 16)))
    edit_config(path, lambda c: c["dflash_config"].update({key: value}))
    for runtime in ("vllm", "sglang"):
        found = errors(path, runtime)
        assert bool(found) == refused, (runtime, found)
        assert "LC001" not in found
    if not refused:
        assert sorted(r for f in hits(run(path, runtime="vllm"), "LC004", "warning") for r in f.runtimes) == [
            "vllm"
        ]


def test_false_is_no_convolution_for_vllm_lilicorr(tmp_path: Path) -> None:
    # lilicorr.py LiLiCorr.__init__: `false < 0` is False, `bool(false)` is no convolution, as 0
    config = fixtures.draft_config()
    config["dflash_config"]["conv_kernel_size"] = False
    path = fixtures.write_checkpoint(tmp_path / "a", config)
    assert not errors(path, "sglang,vllm")
    true = fixtures.draft_config()
    true["dflash_config"]["conv_kernel_size"] = True  # 1 beside no group size: both or neither
    lone = fixtures.write_checkpoint(tmp_path / "b", true)
    assert "LC116" in errors(lone, "vllm") and "LC116" in errors(lone, "sglang")


def test_vllm_reads_input_embedding_scale_and_draft_vocab_size(tmp_path: Path) -> None:
    # qwen3_dflash2.py float()s input_embedding_scale; qwen3_dflash.py sizes the id map by draft_vocab_size
    config = fixtures.sibling_config("dflash2")
    config["dflash_config"]["input_embedding_scale"] = ""
    path = fixtures.write_checkpoint(tmp_path / "a", config)
    assert runtimes_of(path, "LC001", "sglang,vllm") == ["vllm"]
    negative = fixtures.write_checkpoint(
        tmp_path / "b", {**fixtures.sibling_config("dflash2"), "draft_vocab_size": -3}
    )
    found = hits(run(negative, runtime="sglang,vllm"), "LC118", "error")
    assert [f.runtimes for f in found] == [["vllm"]] and "draft_vocab_size is -3" in found[0].message


def test_an_absent_intermediate_size_is_padded_by_sglang(tmp_path: Path) -> None:
    # SGLang builds Qwen3Config's 22016 and zero-pads the trained MLP tensors; vLLM's narrow fails
    path = checkpoint(tmp_path, fixtures.draft_config(head=False))
    edit_config(path, lambda c: c.pop("intermediate_size"))
    report = run(path, runtime="sglang,vllm")
    assert [f.runtimes for f in hits(report, "LC118", "error")] == [["vllm"]]
    warned = hits(report, "LC183", "warning")
    assert [f.runtimes for f in warned] == [["sglang"]] and "22016" in warned[0].message
    # a llama drafter: LlamaConfig's default is 11008, which SGLang builds and pads into alike
    llama = checkpoint(tmp_path / "llama", {**fixtures.draft_config(head=False), "model_type": "llama"})
    edit_config(llama, lambda c: c.pop("intermediate_size"))
    warned = hits(run(llama, runtime="sglang,vllm"), "LC183", "warning")
    assert [f.runtimes for f in warned] == [["sglang"]] and "llama config class's default 11008" in warned[
        0
    ].message


def test_a_nan_output_multiplier_is_refused_on_dflash2_only(tmp_path: Path) -> None:
    # SGLang's `<= 0` check lets NaN through; only DFlash2 multiplies its logits by it (both engines)
    plain = fixtures.draft_config(head=False)
    plain["dflash_config"]["output_multiplier"] = float("nan")
    assert not {"LC123", "LC184"} & errors(checkpoint(tmp_path / "a", plain), "sglang,vllm")
    config = fixtures.sibling_config("dflash2")
    config["dflash_config"]["output_multiplier"] = float("nan")
    path = fixtures.write_checkpoint(tmp_path / "b", config)
    assert runtimes_of(path, "LC184", "sglang,vllm") == ["sglang", "vllm"]


def test_a_float_cast_value_is_judged_per_release(tmp_path: Path) -> None:
    # SGLang float()s lilicorr_vector_eps ("0" is 0.0, refused); vLLM keeps the string (LC001)
    config = fixtures.draft_config()
    config["dflash_config"]["lilicorr_vector_eps"] = "0"
    path = checkpoint(tmp_path, config)
    assert "LC103" in errors(path, "sglang") and "LC001" in errors(path, "vllm")


def test_a_quantization_config_without_method_is_unquantized_for_vllm(tmp_path: Path) -> None:
    # vLLM reads quant_method "" as no quantization; SGLang refuses the empty method
    path = checkpoint(tmp_path, fixtures.draft_config(head=False), quantization_config={"value": 2})
    found = hits(run(path, runtime="sglang,vllm"), "LC316", "error")
    assert [f.runtimes for f in found] == [["sglang"]] and "no quant_method" in found[0].message


def test_vllm_scales_the_draft_logits_by_logit_scale(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, logit_scale=float("nan"))
    assert runtimes_of(path, "LC184", "sglang,vllm") == ["vllm"]


def test_a_rank_zero_selector_beside_its_tensors_is_refused_by_vllm(tmp_path: Path) -> None:
    path = fixtures.write_checkpoint(tmp_path, fixtures.sibling_config("dflash2"))
    edit_config(path, lambda c: c["dflash_config"].update(selector_rank=0))
    assert "LC150" in errors(path, "vllm")


def test_an_explicit_is_causal_wins_over_dflash_config_causal(tmp_path: Path) -> None:
    # SGLang and vLLM read is_causal first: a false one runs bidirectionally whatever dflash_config.causal says
    config = fixtures.draft_config(head=False)
    config["dflash_config"]["causal"] = True
    path = checkpoint(tmp_path, config, is_causal=False)
    report = run(path, runtime="sglang,vllm")
    assert not hits(report, "LC133", "error") and not hits(report, "LC134", "info")


def test_a_top_level_size_read_only_without_dflash_configs_is_cast(tmp_path: Path) -> None:
    # SGLang parse_dflash_draft_config: Domino's gru_hidden_dim is dflash_config's, else the top-level one, through
    # int(): a top-level "32" alone builds a 32-wide GRU the 16-wide trained tensors do not fit
    path = fixtures.write_checkpoint(tmp_path / "a", fixtures.sibling_config("domino"))

    def move(config: dict[str, Any], value: Any) -> None:
        config["dflash_config"].pop("gru_hidden_dim")
        config["gru_hidden_dim"] = value

    edit_config(path, lambda c: move(c, "32"))
    assert "LC208" in errors(path, "sglang==0.5.23")
    edit_config(path, lambda c: c.update(gru_hidden_dim="16"))
    assert not errors(path, "sglang==0.5.23")
    # beside dflash_config's value the top-level one is not read: nothing is cast
    edit_config(
        path,
        lambda c: c.update(gru_hidden_dim="32", dflash_config={**c["dflash_config"], "gru_hidden_dim": 16}),
    )
    assert not errors(path, "sglang==0.5.23")


def test_is_causal_and_dflash_config_causal_disagreeing_is_a_warning(tmp_path: Path) -> None:
    # both engines read an explicit is_causal first (vLLM _dflash_layer_causal, SGLang _get_dflash_attention_type)
    config = fixtures.sibling_config("dflash2")  # is_causal false
    config["dflash_config"]["causal"] = True
    report = run(fixtures.write_checkpoint(tmp_path / "a", config), runtime="sglang,vllm")
    warned = hits(report, "LC185", "warning")
    assert sorted(r for f in warned for r in f.runtimes) == ["sglang", "vllm"]
    assert "is_causal is false but dflash_config.causal is true" in warned[0].message
    assert "layers bidirectionally" in warned[0].message and not report.summary.errors
    # a true is_causal beside a false dflash_config.causal is reported as the is_causal read (LC134)
    config = {**fixtures.sibling_config("dflash2"), "is_causal": True}
    report = run(fixtures.write_checkpoint(tmp_path / "b", config), runtime="vllm")
    assert not hits(report, "LC185", "warning") and hits(report, "LC134", "info")


def test_a_non_positive_dflash2_output_multiplier_fails_vllm_first_step(tmp_path: Path) -> None:
    # vLLM's get_top_k_tokens refuses a scale <= 0 for DFlash2's candidates; a DFlash head never applies it
    config = fixtures.sibling_config("dflash2")
    config["dflash_config"]["output_multiplier"] = -1.0
    found = hits(run(fixtures.write_checkpoint(tmp_path / "a", config), runtime="vllm"), "LC123", "error")
    assert found and "first draft step fails" in found[0].message
    plain = fixtures.draft_config(head=False)
    plain["dflash_config"]["output_multiplier"] = -1.0
    assert "LC123" not in errors(checkpoint(tmp_path / "b", plain), "vllm")
