"""The loader audit (docs/validate.md) as a corpus: one checkpoint per audited row, named after what the peer
loaders do with it, with the verdict each runtime gets.

Verdicts: 0 = accepted with no warning, "w" = accepted with a warning, 1 = refused (an error). Every case starts
from the valid LiLiCorr fixture and changes one thing.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.manifest import legacy_name
from lilicorr_ckpt.runtimes import PROFILES, QKV

from ._support import DROP, RUNTIMES, describe, edit_config, edit_json, run

Tensors = fixtures.Tensors
Edit = Callable[[dict[str, Any]], Any]

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


class Row(NamedTuple):
    name: str  # the peer behaviour
    audit: str  # the audit row (docs/validate.md)
    expect: tuple[Any, Any, Any]  # sglang, vllm, trtllm
    config: dict[str, Any] = {}  # draft_config(**config): what the tensors are written for
    edit: Edit | None = None  # then applied to config.json
    mutate: Callable[[Tensors], None] | None = None
    write: dict[str, Any] = {}
    raw: Callable[[str], str] | None = None  # then applied to config.json's text (whole-number floats)
    rules: tuple[str, ...] = ()  # rule ids that must be among the findings
    base: Callable[[], dict[str, Any]] | None = (
        None  # the config to start from instead of draft_config(**config)
    )
    edit_hf: Edit | None = None  # applied to hf_quant_config.json


def nested(**changes: Any) -> Edit:
    def apply(cfg: dict[str, Any]) -> None:
        for key, value in changes.items():
            if value is DROP:
                cfg["dflash_config"].pop(key, None)
            else:
                cfg["dflash_config"][key] = value

    return apply


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


def fuse_qkv(t: Tensors) -> None:
    for i in (0, 1):
        p = f"layers.{i}.self_attn."
        q, k, v = (t.pop(p + f"{x}_proj.weight") for x in "qkv")
        t[p + "qkv_proj.weight"] = (q[0], (q[1][0] + k[1][0] + v[1][0], q[1][1]), q[2] + k[2] + v[2])


def add(name: str, shape: tuple[int, ...], dtype: str = "BF16") -> Callable[[Tensors], None]:
    size = 2 if dtype == "BF16" else 1
    n = 1
    for s in shape:
        n *= s
    return lambda t: t.__setitem__(name, (dtype, shape, b"\0" * (n * size)))


def drop(*names: str) -> Callable[[Tensors], None]:
    def apply(t: Tensors) -> None:
        for n in names:
            del t[n]

    return apply


def retype(name: str, dtype: str, shape: tuple[int, ...]) -> Callable[[Tensors], None]:
    n = 1
    for s in shape:
        n *= s
    return lambda t: t.__setitem__(name, (dtype, shape, b"\1" * (n * (2 if dtype == "BF16" else 1))))


def legacy_duplicate(t: Tensors) -> None:
    name = "lilicorr.feature_norm.weight"
    t[legacy_name(name)] = t[name]


def no_quant_metadata(path: Path) -> None:
    edit_config(path, top(quantization_config=DROP))
    (path / "hf_quant_config.json").unlink()


def drop_lilicorr_geometry(cfg: dict[str, Any]) -> None:
    for key in [k for k in cfg["dflash_config"] if k.startswith("lilicorr_") and k != "lilicorr_enabled"]:
        del cfg["dflash_config"][key]


def rename(old: str, new: str) -> Callable[[Tensors], None]:
    """Rename the tensors whose name starts with `old`."""

    def apply(t: Tensors) -> None:
        for n in [n for n in t if n.startswith(old)]:
            t[new + n[len(old) :]] = t.pop(n)

    return apply


def chain(*fns: Callable[[Tensors], None]) -> Callable[[Tensors], None]:
    def apply(t: Tensors) -> None:
        for fn in fns:
            fn(t)

    return apply


def nested_inline_without_group_size(cfg: dict[str, Any]) -> None:
    """config.json's quantization_config in ModelOpt's nested form, without its group_size."""
    flat = cfg["quantization_config"]
    cfg["quantization_config"] = {
        "producer": flat["producer"],
        "quantization": {
            "quant_algo": flat["quant_algo"],
            "kv_cache_quant_algo": None,
            "exclude_modules": flat["ignore"],
        },
    }


def embedding_4d(t: Tensors) -> None:
    """slot_embedding [1, 1, S, 1, h] stored as [1, S, 1, h] (the leading singleton dropped)."""
    dtype, shape, data = t["lilicorr.slot_embedding"]
    t["lilicorr.slot_embedding"] = (dtype, shape[:1] + shape[2:], data)


def drop_first(fragment: str) -> Callable[[Tensors], None]:
    def apply(t: Tensors) -> None:
        del t[next(n for n in sorted(t) if fragment in n)]

    return apply


def rescale(name: str, value: float) -> Callable[[Tensors], None]:
    def apply(t: Tensors) -> None:
        dtype, shape, _ = t[name]
        t[name] = (dtype, shape, struct.pack("<f", value))

    return apply


def inline_exclusions(fn: Callable[[list[str]], list[str]]) -> Edit:
    return lambda c: c["quantization_config"].__setitem__("ignore", fn(c["quantization_config"]["ignore"]))


def file_exclusions(fn: Callable[[list[str]], list[str]]) -> Edit:
    return lambda d: d["quantization"].__setitem__(
        "exclude_modules", fn(d["quantization"]["exclude_modules"])
    )


def without(pattern: str) -> Callable[[list[str]], list[str]]:
    def apply(patterns: list[str]) -> list[str]:
        assert pattern in patterns
        return [p for p in patterns if p != pattern]

    return apply


def servable_plus(*modules: str) -> set[str]:
    manifest = fixtures.manifest_for(fixtures.draft_config())
    return fixtures.servable_quantized(manifest) | set(modules)


# ---- helpers of the SGLang 0.5.23 rows


def regroup(group: int) -> Callable[[Tensors], None]:
    """Every NVFP4 weight_scale reshaped for `group`-column blocks (values arbitrary: only shapes are read)."""

    def apply(t: Tensors) -> None:
        for name in [n for n in t if n.endswith(".weight_scale") and t[n][0] == "F8_E4M3"]:
            rows, blocks = t[name][1]
            shape = (rows, blocks * 16 // group)
            t[name] = ("F8_E4M3", shape, b"\x38" * (shape[0] * shape[1]))

    return apply


def group_size(group: int) -> Edit:
    return lambda c: c["quantization_config"].__setitem__("group_size", group)


def file_group_size(group: int) -> Edit:
    return lambda d: d["quantization"].__setitem__("group_size", group)


def nested_inline(cfg: dict[str, Any]) -> None:
    """config.json's quantization_config in the nested form, as ModelOpt's spec exporter writes it."""
    qc = cfg["quantization_config"]
    cfg["quantization_config"] = {
        "producer": qc["producer"],
        "quantization": {
            "quant_algo": qc["quant_algo"],
            "kv_cache_quant_algo": None,
            "group_size": qc["group_size"],
            "exclude_modules": qc["ignore"],
        },
    }


def move_exclusions(key: str) -> Edit:
    return lambda c: c["quantization_config"].__setitem__(key, c["quantization_config"].pop("ignore"))


def _no_attention(patterns: list[str]) -> list[str]:
    return [
        p for p in patterns if not any(x in p for x in ("qkv", "q_proj", "k_proj", "v_proj", "self_attn"))
    ]


def attention_by_path(patterns: list[str]) -> list[str]:
    """q/k/v excluded by their layers' attention path, literally (`layers.0.self_attn`): SGLang's is_layer_skipped
    matches an ancestor on dotted boundaries; o_proj, under the same path, is stored float too."""
    return _no_attention(patterns) + ["layers.0.self_attn", "layers.1.self_attn"]


def some_shards(patterns: list[str]) -> list[str]:
    """q and k named exactly, v only by a glob: the literal shard match disagrees across q/k/v."""
    return (
        _no_attention(patterns)
        + [f"layers.{i}.self_attn.{x}_proj" for i in (0, 1) for x in "qk"]
        + ["*self_attn.v_proj"]
    )


def encoder_aliases(t: Tensors) -> None:
    t["encoder.fc.weight"] = t.pop("fc.weight")
    t["encoder.output_norm_enc.weight"] = t.pop("hidden_norm.weight")


def dflash_servable_plus(*modules: str) -> set[str]:
    manifest = fixtures.manifest_for(fixtures.draft_config(head=False))
    return fixtures.servable_quantized(manifest) | set(modules)


QKV_MODULES = tuple(f"layers.{i}.self_attn.{x}_proj" for i in (0, 1) for x in "qkv")
assert all(any(m.endswith(p.rsplit(".", 1)[-1]) for p in QKV) for m in QKV_MODULES)
SLIDING = top(layer_types=["sliding_attention", "sliding_attention"])

ROWS = [
    # 1.a issue examples
    Row("fused_qkv_split_by_qkvparallellinear", "E1", (0, 0, 0), mutate=fuse_qkv),
    Row(
        "nested_output_multiplier_zero_refused_by_sglang",
        "E2",
        (1, 0, 0),
        edit=nested(output_multiplier=0),
        rules=("LC123",),
    ),
    Row(
        "top_level_output_multiplier_ignored_by_sglang",
        "E2",
        (0, 0, 0),
        edit=top(output_multiplier=0),
        rules=("LC129",),
    ),
    Row(
        "num_target_layers_absent_taken_from_the_taps_by_sglang",
        "E3",
        (0, 0, 0),
        edit=both(top(num_target_layers=DROP), nested(num_target_layers=DROP)),
    ),
    Row(
        "trt_slices_raw_qkv",
        "E6/Q1",
        (0, 0, 1),
        write={"quant": "NVFP4", "quantize": servable_plus(*QKV_MODULES)},
        rules=("LC306",),
    ),
    Row(
        "hidden_act_gelu_refused_by_dflash_mlp",
        "E7",
        (1, 1, "w"),
        edit=top(hidden_act="gelu"),
        rules=("LC131", "LC132"),
    ),
    Row(
        "trt_routes_qwen3_with_projector_type",
        "E8",
        (1, 1, 0),
        edit=both(top(architectures=["Qwen3ForCausalLM"]), nested(lilicorr_enabled=DROP)),
        rules=("LC010",),
    ),
    Row(
        "trt_routes_qwen3_with_lilicorr_enabled",
        "E8",
        (1, 1, 0),
        edit=both(top(architectures=["Qwen3ForCausalLM"]), nested(projector_type=DROP)),
        rules=("LC010",),
    ),
    Row(
        "vllm_honours_causal_sglang_runs_bidirectionally",
        "E9a/E10",
        (1, 0, 1),
        edit=nested(causal=True),
        rules=("LC117", "LC133", "LC134"),
    ),
    Row(
        "top_level_is_causal_honoured_by_sglang",
        "E10",
        (0, 0, 1),
        edit=top(is_causal=True),
        rules=("LC117", "LC134"),
    ),
    Row(
        "swa_window_zero_refused_by_trt_literal_in_vllm",
        "E9b",
        (0, "w", 1),
        edit=both(top(sliding_window=8), nested(use_swa=True, swa_window_size=0)),
        rules=("LC135", "LC136", "LC137"),
    ),
    Row("sglang_drops_owned_lm_head", "E11", (1, 0, 0), config={"own_lm_head": True}, rules=("LC404",)),
    # 1.b config keys, geometry, routing
    Row(
        "lilicorr_key_missing_refused",
        "C1",
        (1, 1, 1),
        edit=nested(lilicorr_logit_scale=DROP),
        rules=("LC101",),
    ),
    Row("lilicorr_disabled_refused", "C3", (1, 1, 1), edit=nested(lilicorr_enabled=False), rules=("LC108",)),
    Row(
        "topk_not_power_of_two_refused_by_fused_topk",
        "C4",
        (1, 1, 0),
        config={"dflash": {"lilicorr_candidate_topk": 3}},
        rules=("LC104",),
    ),
    Row(
        "head_width_zero_means_draft_width_except_trt",
        "C5",
        (0, 0, 1),
        config={"dflash": {"lilicorr_hidden_size": 0}},
        rules=("LC105",),
    ),
    Row("heads_do_not_divide_width", "C6", (1, 1, 1), edit=nested(lilicorr_num_heads=3), rules=("LC106",)),
    Row(
        "vector_eps_half_refused_by_trt",
        "C7",
        (0, 0, 1),
        edit=nested(lilicorr_vector_eps=0.5),
        rules=("LC107",),
    ),
    Row(
        "logit_scale_nonpositive",
        "C8",
        (1, "w", 1),
        edit=nested(lilicorr_logit_scale=0.0),
        rules=("LC103", "LC170"),
    ),
    Row(
        "integral_float_topk_cast_by_sglang_only",
        "C9",
        (0, 1, 1),
        raw=lambda s: s.replace('"lilicorr_candidate_topk": 4', '"lilicorr_candidate_topk": 4.0'),
        rules=("LC139", "LC141"),
    ),
    Row(
        "integral_float_num_layers_crashes_vllm",
        "C10",
        (1, 1, "w"),
        raw=lambda s: s.replace('"num_hidden_layers": 2', '"num_hidden_layers": 2.0'),
        rules=("LC139", "LC140"),
    ),
    Row(
        "integral_float_mask_token_refused_by_sglang",
        "C11",
        (1, 0, 0),
        raw=lambda s: s.replace('"mask_token_id": 511', '"mask_token_id": 511.0'),
        rules=("LC139",),
    ),
    Row(
        "target_layer_ids_not_a_list", "C13", (1, 1, 1), edit=nested(target_layer_ids="0,2"), rules=("LC001",)
    ),
    Row(
        "target_layer_ids_out_of_range",
        "C15",
        (1, 1, 1),
        edit=nested(target_layer_ids=[0, 4]),
        rules=("LC113",),
    ),
    Row(
        "num_target_layers_zero_refused_by_sglang",
        "C17",
        (1, 0, 0),
        edit=top(num_target_layers=0),
        rules=("LC142",),
    ),
    Row(
        "block_size_absent_defaulted_by_sglang",
        "C18",
        ("w", 1, 1),
        config={"block_size": 16, "dflash": {"block_size": 16}},
        edit=both(top(block_size=DROP), nested(block_size=DROP)),
        rules=("LC110", "LC125"),
    ),
    Row(
        "block_size_conflict_nested_wins",
        "C19",
        ("w", "w", "w"),
        config={"dflash": {"block_size": 16}},
        rules=("LC111",),
    ),
    Row(
        "block_size_one_refused",
        "C20",
        (1, 1, 1),
        edit=both(top(block_size=1), nested(block_size=1)),
        rules=("LC112",),
    ),
    Row("mask_token_absent", "C21", (1, 1, 1), edit=nested(mask_token_id=DROP), rules=("LC115",)),
    Row("mask_token_negative", "C22", (1, 1, 1), edit=nested(mask_token_id=-1), rules=("LC115",)),
    Row("vllm_asserts_no_mask_hidden", "C23", (1, 1, 1), mutate=add("mask_hidden", (64,)), rules=("LC204",)),
    Row("conv_half_declared", "C24", (1, 1, 1), edit=nested(conv_kernel_size=2), rules=("LC116",)),
    Row(
        "conv_kernel_exceeds_block_refused_by_trt",
        "C25",
        (0, 0, 1),
        config={"conv": (16, 16)},
        rules=("LC116",),
    ),
    Row(
        "conv_group_not_dividing_width",
        "C26",
        (1, 1, 1),
        config={"conv": (2, 16)},
        edit=nested(conv_group_size=3),
        rules=("LC116",),
    ),
    Row("layer_types_short", "C28", (1, 1, 1), edit=top(layer_types=["full_attention"]), rules=("LC119",)),
    Row(
        "layer_types_long_extra_entries_ignored",
        "C29",
        (1, 1, "w"),
        edit=top(layer_types=["full_attention"] * 3),
        rules=("LC143", "LC119"),
    ),
    Row(
        "unknown_layer_type",
        "C30",
        (1, 1, 1),
        edit=top(layer_types=["full_attention", "linear_attention"]),
        rules=("LC119",),
    ),
    Row(
        "sliding_without_window_vllm_reads_swa_window_size",
        "C31",
        (1, 0, 1),
        edit=both(SLIDING, nested(swa_window_size=8)),
        rules=("LC119",),
    ),
    Row(
        "use_swa_ignored_by_sglang",
        "C33",
        (1, "w", "w"),
        edit=both(top(layer_types=DROP), nested(use_swa=True, swa_window_size=8)),
        rules=("LC138", "LC144"),
    ),
    Row(
        "attention_sink_bias_not_bool", "C37", (1, 1, 1), edit=nested(attention_sink_bias=1), rules=("LC001",)
    ),
    Row(
        "reduced_vocab_refused", "C38", ("w", 1, 1), edit=top(draft_vocab_size=511), rules=("LC120", "LC149")
    ),
    Row(
        "qwen3_architecture_without_projector_refused",
        "C39",
        (1, 1, 1),
        edit=both(
            top(architectures=["Qwen3ForCausalLM"]), nested(projector_type=DROP, lilicorr_enabled=DROP)
        ),
        rules=("LC010",),
    ),
    Row(
        "dflash_architecture_with_head_tensors_drops_them",
        "C40",
        (1, 1, 1),
        edit=both(
            top(architectures=["DFlashDraftModel"]), nested(projector_type=DROP, lilicorr_enabled=DROP)
        ),
        rules=("LC011",),
    ),
    Row(
        "laguna_backbone_refused_by_trt_generic_gqa",
        "C41",
        (1, 1, 1),
        edit=top(architectures=["LagunaForCausalLM", "LiLiCorrDraftModel"]),
        rules=("LC010",),
    ),
    # 1.c tensors, coverage, dtypes
    Row("head_tensor_missing", "T1", (1, 1, 1), mutate=drop("lilicorr.out_head.weight"), rules=("LC201",)),
    Row(
        "head_tensor_surplus",
        "T2",
        (1, 1, 1),
        mutate=add("lilicorr.layers.9.attn_norm.weight", (32,)),
        rules=("LC202",),
    ),
    Row(
        "identity_token_proj_surplus",
        "T3",
        (1, 1, 1),
        config={"dflash": {"lilicorr_hidden_size": 64}},
        mutate=add("lilicorr.token_proj.weight", (64, 64)),
        rules=("LC202",),
    ),
    Row(
        "legacy_sequential_names_refused_by_vllm_named_mlp",
        "T4",
        (1, 1, 0),
        write={"naming": "sequential"},
        rules=("LC216", "LC217"),
    ),
    Row("legacy_and_named_duplicate", "T5", (1, 1, 1), mutate=legacy_duplicate, rules=("LC211",)),
    Row(
        "conv_tensors_without_keys_dropped",
        "T7",
        (1, 1, 1),
        config={"conv": (2, 16)},
        edit=nested(conv_kernel_size=DROP, conv_group_size=DROP),
        rules=("LC205",),
    ),
    Row(
        "conv_keys_without_tensors_random_kernels",
        "T8",
        (1, 1, 1),
        edit=nested(conv_kernel_size=2, conv_group_size=16),
        rules=("LC206",),
    ),
    Row(
        "fc_width_mismatch", "T10", (1, 1, 1), mutate=retype("fc.weight", "BF16", (64, 192)), rules=("LC208",)
    ),
    Row(
        "embed_tokens_copy_dropped_used_or_replaced",
        "T11",
        ("w", "w", "w"),
        mutate=add("embed_tokens.weight", (512, 64)),
        rules=("LC218",),
    ),
    Row(
        "undeclared_lm_head",
        "T12",
        ("w", "w", 1),
        mutate=add("lm_head.weight", (512, 64)),
        rules=("LC402", "LC406", "LC407"),
    ),
    Row("own_head_flag_without_tensor", "T13", (0, 1, 1), edit=top(has_own_lm_head=True), rules=("LC401",)),
    Row(
        "training_prefix_not_stripped",
        "T16",
        (1, 1, 1),
        write={"key_prefix": "dflash_module."},
        rules=("LC212",),
    ),
    Row("model_prefix_stripped", "T17", (0, 0, 0), write={"key_prefix": "model."}, rules=("LC213",)),
    Row("fp16_dtype_overflows", "T18", ("w", "w", "w"), write={"dtype": "F16"}, rules=("LC121",)),
    Row("packed_without_metadata", "T19", (1, 1, 1), write={"quant": "NVFP4"}, rules=("LC311",)),
    # 1.d quantization
    Row(
        "feature_mlp_down_proj_quantized_forced_float_by_sglang",
        "Q2",
        (1, 0, 0),
        write={"quant": "NVFP4", "quantize": servable_plus("lilicorr.feature_mlp.down_proj")},
        rules=("LC306",),
    ),
    Row(
        "factor_heads_fp8_raw_linear_except_trt",
        "Q3",
        (1, 1, 0),
        write={"quant": "FP8", "quantize": servable_plus("lilicorr.out_head")},
        rules=("LC306",),
    ),
    Row(
        "in_proj_quantized_bare_parameter",
        "Q4",
        (1, 1, 1),
        mutate=retype("lilicorr.layers.0.attn.in_proj_weight", "U8", (96, 16)),
        rules=("LC209",),
    ),
    Row(
        "flat_quant_exclusions_under_exclude_modules",
        "E4",
        (0, 0, 0),
        write={"quant": "NVFP4"},
        edit=lambda c: c["quantization_config"].__setitem__(
            "exclude_modules", c["quantization_config"].pop("ignore")
        ),
    ),
    Row(
        "flat_nvfp4_without_group_size_defaults_to_16",
        "E4",
        (0, 0, 0),
        write={"quant": "NVFP4"},
        edit=lambda c: c["quantization_config"].pop("group_size"),
    ),
    Row("w4a16_without_input_scale_loads", "Q6", (0, 0, 0), write={"quant": "W4A16_NVFP4"}),
    Row(
        "nvfp4_missing_weight_scale_2",
        "Q7",
        (1, 1, 1),
        write={"quant": "NVFP4"},
        mutate=drop("lilicorr.token_proj.weight_scale_2"),
        rules=("LC304",),
    ),
    # rows added by the second audit pass
    Row(
        "trt_reads_hf_quant_config_sglang_vllm_the_inline_copy",
        "E5/Q11",
        ("w", 1, "w"),
        write={"quant": "NVFP4"},
        edit=inline_exclusions(without("*feature_mlp.down_proj")),
        rules=("LC301", "LC307", "LC309"),
    ),
    Row(
        "inline_copy_right_file_wrong_refused_by_trt",
        "E5/Q11",
        ("w", "w", 1),
        write={"quant": "NVFP4"},
        edit_hf=file_exclusions(without("*feature_mlp.down_proj")),
        rules=("LC301", "LC307"),
    ),
    Row("no_lilicorr_geometry_at_all", "C2", (1, 1, 1), edit=drop_lilicorr_geometry, rules=("LC101",)),
    Row(
        "target_layer_ids_whole_number_floats_cast",
        "C12",
        (0, 0, 0),
        edit=nested(target_layer_ids=[0.0, 2.0]),
    ),
    Row("target_layer_ids_empty", "C14", (1, 1, 1), edit=nested(target_layer_ids=[]), rules=("LC113",)),
    Row(
        "target_layer_ids_absent_guessed_or_width_from_checkpoint",
        "C16",
        (1, 1, 1),
        edit=both(nested(target_layer_ids=DROP), top(target_layer_ids=DROP)),
        rules=("LC113",),
    ),
    Row(
        "dflash2_selector_top_k_alone_refused",
        "C27",
        (1, 1, "w"),
        base=lambda: fixtures.sibling_config("dflash2"),
        edit=nested(selector_top_k=DROP),
        rules=("LC150", "LC015"),
    ),
    Row(
        "sliding_layers_causal_in_sglang_vllm_symmetric_in_trt",
        "C32",
        (1, 1, 0),
        edit=both(SLIDING, top(sliding_window=8)),
        rules=("LC119",),
    ),
    Row(
        "mixed_sliding_and_full_layers_runner_dependent",
        "C34",
        (1, 1, 0),
        edit=top(layer_types=["sliding_attention", "full_attention"], sliding_window=8),
        rules=("LC119",),
    ),
    Row(
        "rope_theta_absent_defaulted_by_the_config_class",
        "C35",
        (0, 0, 0),
        edit=top(rope_theta=DROP),
        rules=("LC147",),
    ),
    Row("max_position_embeddings_absent_defaulted", "C36", (0, 0, 0), edit=top(max_position_embeddings=DROP)),
    Row("servable_modules_quantized_load", "Q5", (0, 0, 0), write={"quant": "NVFP4"}),
    Row(
        "unsupported_head_quant_algo_refused",
        "Q8",
        (1, 1, 1),
        write={"quant": "NVFP4"},
        edit=lambda c: c["quantization_config"].__setitem__("quant_algo", "W8A16"),
        edit_hf=lambda d: d["quantization"].__setitem__("quant_algo", "W8A16"),
        rules=("LC312",),
    ),
    Row(
        "layer_index_exclusion_renumbered_by_vllm",
        "Q9",
        ("w", "w", "w"),
        write={"quant": "NVFP4"},
        edit=inline_exclusions(lambda p: [*p, "layers.7.*"]),
        edit_hf=file_exclusions(lambda p: [*p, "layers.7.*"]),
        rules=("LC310",),
    ),
    Row(
        "gate_and_up_calibrated_independently_load",
        "Q10",
        (1, 1, 0),  # loads in all three; SGLang and vLLM serve gate_up with the larger scale (silently wrong)
        write={"quant": "NVFP4"},
        mutate=rescale("layers.0.mlp.up_proj.weight_scale_2", 0.25),
        rules=("LC327",),
    ),
    Row(
        "slot_embedding_4d_loaded_by_trt_only", "T6", (1, 1, 0), mutate=embedding_4d, rules=("LC208", "LC219")
    ),
    Row(
        "conv_partial",
        "T9",
        (1, 1, 1),
        config={"conv": (2, 16)},
        mutate=drop_first(".attention_conv."),
        rules=("LC207",),
    ),
    Row("t2d_tensor_not_read", "T14", (1, 0, 1), mutate=add("t2d", (512,)), rules=("LC204", "LC225")),
    Row(
        "rotary_buffer_not_read",
        "T15",
        (0, 0, 1),
        mutate=add("rotary_emb.inv_freq", (8,)),
        rules=("LC204", "LC225"),
    ),
    # ---- vLLM 0.33.0: conditions of the released wheel (docs/validate.md, the vLLM table; ids from 60)
    Row(
        "vllm_captures_taps_in_layer_order",
        "C60",
        (1, 1, "w"),
        edit=nested(target_layer_ids=[2, 0]),
        rules=("LC114", "LC145"),
    ),
    Row(
        "vllm_reads_eagle_aux_layer_ids_first",
        "C61",
        (0, 1, 0),
        edit=top(eagle_aux_hidden_state_layer_ids=[2, 4]),
        rules=("LC173",),
    ),
    Row(
        "eagle_aux_layer_ids_equal_to_the_taps",
        "C62",
        (0, 0, 0),
        edit=top(eagle_aux_hidden_state_layer_ids=[1, 3]),
    ),
    Row(
        "vllm_refuses_sample_from_anchor",
        "C63",
        (0, 1, 0),
        edit=nested(sample_from_anchor=True),
        rules=("LC174",),
    ),
    Row(
        "vllm_drops_fc_without_aux_hidden_state",
        "C64",
        (0, 1, 0),
        edit=nested(use_aux_hidden_state=False),
        rules=("LC175",),
    ),
    Row(
        "sliding_window_kept_with_use_sliding_window",
        "C65",
        ("w", "w", "w"),
        edit=both(SLIDING, top(sliding_window=8, use_sliding_window=True)),
        rules=("LC144",),
    ),
    Row(
        "target_layer_ids_duplicated",
        "C66",
        (1, 1, 1),
        edit=nested(target_layer_ids=[2, 2]),
        rules=("LC113",),
    ),
    Row(
        "mask_token_id_at_the_top_level_only",
        "C67",
        (0, 0, 0),
        edit=both(nested(mask_token_id=DROP), top(mask_token_id=511)),
    ),
    Row(
        "vllm_renames_midlayer",
        "T60",
        (1, 0, 1),
        config={"head": False, "num_hidden_layers": 1},
        mutate=rename("layers.0.", "midlayer."),
        rules=("LC226", "LC227"),
    ),
    Row(
        "vllm_renames_encoder_aliases",
        "T61",
        (0, 0, 1),
        mutate=chain(
            rename("fc.weight", "encoder.fc.weight"), rename("hidden_norm.", "encoder.output_norm_enc.")
        ),
        rules=("LC226", "LC227"),
    ),
    Row(
        "backbone_tensor_missing_served_uninitialised",
        "T62",
        (1, 1, 1),
        mutate=drop("layers.0.mlp.down_proj.weight"),
        rules=("LC203",),
    ),
    Row(
        "surplus_bias_dropped_by_ignore_suffix",
        "T63",
        (1, 1, 1),
        mutate=add("layers.0.self_attn.q_proj.bias", (64,)),
        rules=("LC204",),
    ),
    Row(
        "tensor_of_a_layer_not_built",
        "T64",
        (1, 1, 1),
        mutate=add("layers.2.input_layernorm.weight", (64,)),
        rules=("LC204",),
    ),
    Row(
        "qkv_shards_named_exactly_do_not_exclude_fused_qkv",
        "Q60",
        ("w", 1, "w"),
        write={"quant": "NVFP4"},
        edit=inline_exclusions(
            lambda p: (
                [x for x in p if x not in ("*q_proj", "*k_proj", "*v_proj", "*qkv_proj")]
                + [f"layers.{i}.self_attn.{x}_proj" for i in (0, 1) for x in "qkv"]
            )
        ),
        edit_hf=file_exclusions(
            lambda p: (
                [x for x in p if x not in ("*q_proj", "*k_proj", "*v_proj", "*qkv_proj")]
                + [f"layers.{i}.self_attn.{x}_proj" for i in (0, 1) for x in "qkv"]
            )
        ),
        rules=("LC307",),
    ),
    Row(
        "draft_layer_index_exclusion_renumbered_by_vllm",
        "Q61",
        (1, "w", "w"),
        write={"quant": "NVFP4", "quantize": servable_plus() - {"layers.0.mlp.down_proj"}},
        edit=inline_exclusions(lambda p: [*p, "layers.0.mlp.down_proj"]),
        edit_hf=file_exclusions(lambda p: [*p, "layers.0.mlp.down_proj"]),
        rules=("LC310",),
    ),
    Row(
        "backbone_weight_scale_2_missing_served_from_garbage",
        "Q62",
        (1, 1, 1),
        write={"quant": "NVFP4"},
        mutate=drop("layers.0.mlp.down_proj.weight_scale_2"),
        rules=("LC304",),
    ),
    Row(
        "nested_w4a16_in_hf_quant_config_only",
        "Q63",
        (0, 1, 0),
        write={"quant": "W4A16_NVFP4"},
        edit=top(quantization_config=DROP),
        rules=("LC302",),
    ),
    Row(
        "nested_inline_nvfp4_without_group_size",
        "Q64",
        (1, 1, "w"),
        write={"quant": "NVFP4"},
        edit=nested_inline_without_group_size,
        rules=("LC303",),
    ),
    Row("flat_w4a16_loads", "Q65", (0, 0, 0), write={"quant": "W4A16_NVFP4"}),
    # ---- SGLang 0.5.23 (its released wheel, executed by tests/conformance/sglang): conditions found there
    Row(
        "swigluoai_activation_loaded_by_sglang",
        "C42",
        (0, 1, "w"),
        edit=top(hidden_act="swigluoai", swiglu_alpha=1.702, swiglu_limit=7.0),
        rules=("LC131", "LC132"),
    ),
    Row(
        "swigluoai_without_its_constants_crashes_sglang",
        "C43",
        (1, 1, "w"),
        edit=top(hidden_act="swigluoai"),
        rules=("LC131",),
    ),
    Row(
        "taps_not_ascending_captured_in_layer_order",
        "C44",
        (1, 1, "w"),
        edit=nested(target_layer_ids=[2, 0]),
        rules=("LC145", "LC114"),
    ),
    Row(
        "taps_repeated_captured_once",
        "C45",
        (1, 1, 1),
        edit=nested(target_layer_ids=[2, 2]),
        rules=("LC113",),
    ),
    Row(
        "tap_on_the_last_target_layer_never_captured",
        "C46",
        (1, 0, 0),
        edit=nested(target_layer_ids=[0, 3]),
        rules=("LC148",),
    ),
    Row(
        "mask_token_beyond_the_vocabulary", "C47", (1, 1, 1), edit=nested(mask_token_id=512), rules=("LC115",)
    ),
    Row(
        "sliding_layers_with_use_sliding_window_loaded_by_sglang",
        "C48",
        ("w", "w", "w"),
        edit=both(SLIDING, top(sliding_window=8, use_sliding_window=True)),
        rules=("LC144",),
    ),
    Row("encoder_aliases_read_by_sglang", "T20", (0, 0, 1), mutate=encoder_aliases, rules=("LC226", "LC227")),
    Row(
        "w4a16_group_32_refused_by_marlin",
        "Q12",
        (1, 0, 0),
        write={"quant": "W4A16_NVFP4"},
        mutate=regroup(32),
        edit=group_size(32),
        edit_hf=file_group_size(32),
        rules=("LC325",),
    ),
    Row(
        "nvfp4_group_32_refused_by_marlin",
        "Q13",
        (1, 0, 0),
        write={"quant": "NVFP4"},
        mutate=regroup(32),
        edit=group_size(32),
        edit_hf=file_group_size(32),
        rules=("LC325",),
    ),
    Row(
        "nested_quantization_config_in_config_json_flattened_by_sglang",
        "Q14",
        (1, "w", "w"),
        write={"quant": "NVFP4"},
        edit=nested_inline,
        rules=("LC326", "LC307"),
    ),
    Row(
        "fp8_flat_exclusions_under_exclude_modules_not_read",
        "Q15",
        (1, 0, 0),
        write={"quant": "FP8"},
        edit=move_exclusions("exclude_modules"),
        rules=("LC320",),
    ),
    Row(
        "nvfp4_flat_exclusions_under_modules_to_not_convert_read_by_sglang",
        "Q16",
        ("w", 1, "w"),
        write={"quant": "NVFP4"},
        edit=move_exclusions("modules_to_not_convert"),
        rules=("LC320",),
    ),
    Row(
        "exclusion_naming_an_ancestor_module_path",
        "Q17",
        ("w", "w", "w"),
        write={
            "quant": "NVFP4",
            "quantize": servable_plus() - {f"layers.{i}.self_attn.o_proj" for i in (0, 1)},
        },
        edit=inline_exclusions(attention_by_path),
        edit_hf=file_exclusions(attention_by_path),
    ),
    Row(
        "exclusions_naming_some_qkv_shards_refused_by_sglang",
        "Q18",
        (1, 1, "w"),
        write={"quant": "NVFP4"},
        edit=inline_exclusions(some_shards),
        edit_hf=file_exclusions(some_shards),
        rules=("LC313",),
    ),
    Row(
        "plain_dflash_fc_quantized_is_an_nn_linear_in_sglang",
        "Q19",
        (1, 0, 0),
        config={"head": False},
        write={"quant": "NVFP4", "quantize": dflash_servable_plus("fc")},
        rules=("LC306",),
    ),
    Row(
        "fp8_per_channel_per_token_refused_by_sglang",
        "Q20",
        (1, 0, 0),
        write={"quant": "FP8_PER_CHANNEL_PER_TOKEN"},
        rules=("LC312",),
    ),
    Row(
        "hf_quant_config_only",
        "Q21",
        (0, 0, 0),
        write={"quant": "NVFP4"},
        edit=lambda c: c.pop("quantization_config"),
    ),
    Row(
        "fp8_input_scale_missing_on_fc",
        "Q22",
        (1, 1, 1),
        write={"quant": "FP8"},
        mutate=drop("fc.input_scale"),
        rules=("LC304",),
    ),
]


def build(tmp_path: Path, row: Row) -> Path:
    config = row.base() if row.base else fixtures.draft_config(**row.config)
    path = fixtures.write_checkpoint(tmp_path / row.name, config, mutate=row.mutate, **row.write)
    if row.edit:
        edit_config(path, row.edit)
    if row.edit_hf:
        edit_json(path / "hf_quant_config.json", row.edit_hf)
    if row.raw:
        text = (path / "config.json").read_text()
        new = row.raw(text)
        assert new != text, "the raw edit changed nothing"
        (path / "config.json").write_text(new)
    if row.name == "packed_without_metadata":
        no_quant_metadata(path)
    return path


def verdicts(report) -> tuple[Any, ...]:
    by = {v.runtime: v for v in report.runtimes}
    return tuple(1 if not by[r].accepted else ("w" if by[r].warnings else 0) for r in RUNTIMES)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_loader_audit(tmp_path, row: Row):
    report = run(build(tmp_path, row))
    assert verdicts(report) == row.expect, describe(report)
    fired = {f.rule for f in report.findings}
    assert set(row.rules) <= fired, (row.rules, describe(report))


def test_the_corpus_names_each_case_once():
    assert len({r.name for r in ROWS}) == len(ROWS)


def test_packed_without_metadata_really_has_no_metadata(tmp_path):
    path = build(tmp_path, next(r for r in ROWS if r.name == "packed_without_metadata"))
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    assert not (path / "hf_quant_config.json").exists()


AUDIT_DOC = Path(__file__).resolve().parents[2] / "docs" / "validate.md"


def audit_table_ids() -> set[str]:
    """Every row id of the loader-audit table in docs/validate.md (a row may name several: `E9a, E10`)."""
    text = AUDIT_DOC.read_text()
    section = text.split("## The loader audit", 1)[1].split("\n## ", 1)[0]
    ids: set[str] = set()
    for line in section.splitlines():
        m = re.match(r"\| ((?:[ECTQ]\d+[a-z]?)(?:, [ECTQ]\d+[a-z]?)*) \|", line)
        if m:
            ids.update(m.group(1).split(", "))
    return ids


def corpus_ids() -> set[str]:
    return {i for r in ROWS for i in r.audit.split("/")}


def test_every_audit_row_has_a_case():
    ids = audit_table_ids()
    assert len(ids) >= 80, sorted(ids)
    assert sorted(ids - corpus_ids()) == [], "audit rows without a corpus case"


def test_every_case_names_an_audit_row():
    assert sorted(corpus_ids() - audit_table_ids()) == []


def _row(name: str) -> Row:
    return next(r for r in ROWS if r.name == name)


def test_rope_theta_defaults_are_named_per_runtime(tmp_path):
    path = build(tmp_path, _row("rope_theta_absent_defaulted_by_the_config_class"))
    found = next(f for f in run(path).findings if f.rule == "LC147")
    assert f"{SG}, {VL} and {TR} assume the transformers config class's default" in found.message
    alone = run(path, runtime="vllm")
    assert [(f.rule, f.severity) for f in alone.findings if f.rule == "LC147"] == [("LC147", "info")]


def test_sliding_semantics_warn_only_where_the_selected_runtimes_differ(tmp_path):
    path = build(tmp_path, _row("sliding_layers_with_use_sliding_window_loaded_by_sglang"))
    f = next(f for f in run(path).findings if f.rule == "LC144")
    assert f"{SG} and {VL} run them causally" in f.message and f"{TR} runs them non-causally" in f.message
    assert not [f for f in run(path, runtime="sglang").findings if f.rule == "LC144"]


def test_each_runtime_is_judged_on_the_quantization_copy_it_reads(tmp_path):
    report = run(build(tmp_path, _row("trt_reads_hf_quant_config_sglang_vllm_the_inline_copy")))
    lc307 = [f for f in report.findings if f.rule == "LC307"]
    assert lc307 and all(f.runtimes == ["vllm"] for f in lc307), describe(report)
    lc301 = next(f for f in report.findings if f.rule == "LC301")
    assert f"{TR} acts on hf_quant_config.json" in lc301.message
