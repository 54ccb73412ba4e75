"""DFlash2, DSpark (three layouts) and Domino heads: each published layout, and each broken variant, with the
verdict per runtime (0 accepted without warning, "w" accepted with a warning, 1 refused).

What the loaders do with each layout is in docs/validate.md (sibling heads); what is UNCONFIRMED there is a
warning (LC015) for that runtime, never silence.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.load import load_checkpoint
from lilicorr_ckpt.checks.run import geometry_summary

from ._support import DROP, RUNTIMES, describe, edit_config, run

Tensors = fixtures.Tensors


class Sib(NamedTuple):
    name: str
    layout: str
    expect: tuple[Any, Any, Any]  # sglang, vllm, trtllm
    rules: tuple[str, ...] = ()  # must be among the findings
    top: dict[str, Any] = {}  # sibling_config(layout, **top): what the tensors are written for
    edit: Callable[[dict[str, Any]], Any] | None = None  # then applied to config.json
    mutate: Callable[[Tensors], None] | None = None
    write: dict[str, Any] = {}


def nested(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def apply(cfg: dict[str, Any]) -> None:
        for k, v in changes.items():
            if v is DROP:
                cfg["dflash_config"].pop(k, None)
            else:
                cfg["dflash_config"][k] = v

    return apply


def top(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def apply(cfg: dict[str, Any]) -> None:
        for k, v in changes.items():
            if v is DROP:
                cfg.pop(k, None)
            else:
                cfg[k] = v

    return apply


def drop(name: str) -> Callable[[Tensors], None]:
    return lambda t: t.pop(name)


def add(name: str, shape: tuple[int, ...], dtype: str = "BF16") -> Callable[[Tensors], None]:
    n = 1
    for s in shape:
        n *= s
    return lambda t: t.__setitem__(name, (dtype, shape, b"\0" * n * (2 if dtype == "BF16" else 1)))


def reshape(name: str, shape: tuple[int, ...], dtype: str = "BF16") -> Callable[[Tensors], None]:
    return add(name, shape, dtype)


SELECTOR = "candidate_selector.hidden_projection.weight"
MARKOV_W1 = "markov_head.markov_w1.weight"
GRU = "prefix_gru.weight_ih_l0"

CASES = [
    # every published layout
    Sib("dflash2_published_layout_loads_unconfirmed_everywhere", "dflash2", (0, 0, "w"), ("LC015",)),
    Sib(
        "dspark_deepspec_qwen3dsparkmodel_served_by_sglang_and_vllm",
        "dspark-deepspec",
        (0, 0, "w"),
        ("LC015",),
    ),
    # vLLM 0.33.0: config/speculative.py rewrites a Qwen3 DSparkDraftModel to Qwen3DSparkModel
    Sib(
        "dspark_specforge_draftmodel_rewritten_to_qwen3_by_vllm", "dspark-specforge", (0, 0, "w"), ("LC015",)
    ),
    Sib(
        "dspark_modelopt_flat_layout_loaded_by_no_serving_stack",
        "dspark-modelopt",
        (1, 1, "w"),
        ("LC014", "LC152"),
    ),
    # vLLM 0.33.0 has no Domino model (LC014)
    Sib("domino_as_dflash_with_projector_served_by_sglang", "domino", (0, 1, "w"), ("LC014", "LC015")),
    # wrong architecture
    Sib(
        "domino_draftmodel_refused_by_sglang",
        "domino",
        (1, 1, "w"),
        ("LC014",),
        edit=top(architectures=["DominoDraftModel"]),
    ),
    Sib(
        "dflash2_tensors_under_plain_dflash_are_dropped",
        "dflash2",
        (1, 1, 1),
        ("LC016",),
        edit=lambda c: (
            c.__setitem__("architectures", ["DFlashDraftModel"]),
            c["dflash_config"].pop("projector_type"),
        ),
    ),
    Sib(
        "markov_head_under_lilicorr_is_dropped",
        "dspark-deepspec",
        (1, 1, 1),
        ("LC016",),
        edit=top(architectures=["LiLiCorrDraftModel"]),
    ),
    # DSpark's confidence head (RuntimeProfile dspark_confidence_head): SGLang builds none by default (ragged
    # verification off) and skips its tensors, vLLM builds it for a truthy enable_confidence_head and reads it only
    # under adaptive verification: what only the opt-in meets is LC229 (a warning naming it)
    Sib(
        "dspark_confidence_head_narrower_unbuilt_by_sglang_refused_by_vllm",
        "dspark-deepspec",
        ("w", 1, 1),
        ("LC229", "LC208"),
        edit=top(confidence_head_with_markov=False),
    ),
    Sib(
        "dspark_confidence_head_missing_loads_where_unread",
        "dspark-deepspec",
        ("w", "w", 1),
        ("LC229", "LC201"),
        mutate=lambda t: [t.pop(n) for n in list(t) if n.startswith("confidence_head.")],
    ),
    Sib(
        "dspark_confidence_flag_zero_skips_the_head",
        "dspark-deepspec",
        ("w", "w", 1),
        ("LC229", "LC004"),
        edit=top(enable_confidence_head=0),
    ),
    # missing / surplus / misshaped / quantized-must-be-float
    Sib("dflash2_selector_projection_missing", "dflash2", (1, 1, 1), ("LC201",), mutate=drop(SELECTOR)),
    Sib("dspark_markov_w1_missing", "dspark-deepspec", (1, 1, 1), ("LC201",), mutate=drop(MARKOV_W1)),
    Sib("domino_gru_missing", "domino", (1, 1, 1), ("LC201",), mutate=drop(GRU)),
    Sib(
        "dflash2_selector_surplus",
        "dflash2",
        (1, 1, 1),
        ("LC202",),
        mutate=add("candidate_selector.hidden_projection.bias", (8,)),
    ),
    Sib(
        "dspark_gated_projection_surplus_on_vanilla",
        "dspark-deepspec",
        (1, 1, 1),
        ("LC202",),
        mutate=add("markov_head.gate_proj.weight", (8, 72)),
    ),
    Sib(
        "domino_gru_bias_surplus", "domino", (1, 1, 1), ("LC202",), mutate=add("prefix_gru.bias_ih_l0", (48,))
    ),
    Sib(
        "dflash2_codebook_misshaped",
        "dflash2",
        (1, 1, 1),
        ("LC208",),
        mutate=reshape("candidate_selector.predecessor_codebook", (511, 8)),
    ),
    Sib(
        "dspark_markov_w2_misshaped",
        "dspark-deepspec",
        (1, 1, 1),
        ("LC208",),
        mutate=reshape("markov_head.markov_w2.weight", (512, 4)),
    ),
    Sib(
        "domino_embed_proj_misshaped",
        "domino",
        (1, 1, 1),
        ("LC208",),
        mutate=reshape("embed_proj.2.weight", (256, 8)),
    ),
    Sib(
        "dflash2_selector_quantized_must_be_float",
        "dflash2",
        (1, 1, 1),
        ("LC209",),
        mutate=reshape(SELECTOR, (8, 32), "U8"),
    ),
    Sib(
        "dspark_markov_table_quantized_must_be_float",
        "dspark-deepspec",
        (1, 1, 1),
        ("LC209",),
        mutate=reshape(MARKOV_W1, (512, 4), "U8"),
    ),
    Sib(
        "domino_gru_quantized_must_be_float",
        "domino",
        (1, 1, 1),
        ("LC209",),
        mutate=reshape(GRU, (48, 32), "U8"),
    ),
    Sib(
        "dflash2_conv_tensors_missing",
        "dflash2",
        (1, 1, 1),
        ("LC206",),
        mutate=lambda t: [t.pop(n) for n in [n for n in t if "_conv." in n]],
    ),
    Sib(
        "dspark_deepspec_frozen_lm_head_copy_warns",
        "dspark-deepspec",
        ("w", "w", "w"),
        ("LC405",),
        mutate=add("lm_head.weight", (512, 64)),
    ),
    Sib(
        "dspark_deepspec_frozen_embed_tokens_copy_warns",
        "dspark-deepspec",
        ("w", "w", "w"),
        ("LC218",),
        mutate=add("embed_tokens.weight", (512, 64)),
    ),
    # config keys
    Sib(
        "dflash2_selector_top_k_dropped", "dflash2", (1, 1, "w"), ("LC150",), edit=nested(selector_top_k=DROP)
    ),
    # vLLM 0.33.0 reads the selector keys with a plain index and checks no range (qwen3_dflash2.py)
    Sib(
        "dflash2_selector_top_k_one_loaded_by_vllm",
        "dflash2",
        (0, 0, "w"),
        ("LC015",),
        edit=nested(selector_top_k=1),
    ),
    Sib(
        "dflash2_selector_top_k_above_vocab_refused",
        "dflash2",
        (0, 1, "w"),
        ("LC150",),
        edit=nested(selector_top_k=513),
    ),
    Sib(
        "dflash2_without_conv_keys",
        "dflash2",
        (1, 1, 1),
        ("LC151",),
        edit=nested(conv_kernel_size=DROP, conv_group_size=DROP),
    ),
    Sib("dspark_markov_rank_zero", "dspark-deepspec", (1, 1, "w"), ("LC152",), edit=top(markov_rank=0)),
    # vLLM 0.33.0 builds the vanilla Markov head only: the rnn tensors have no parameter
    Sib(
        "dspark_rnn_head_refused_by_vllm",
        "dspark-deepspec",
        (0, 1, "w"),
        ("LC153",),
        top={"markov_head_type": "rnn"},
    ),
    Sib(
        "dspark_gated_head_refused_by_vllm",
        "dspark-deepspec",
        (0, 1, "w"),
        ("LC153",),
        top={"markov_head_type": "gated"},
    ),
    Sib(
        "dspark_unknown_head_type_refused",
        "dspark-deepspec",
        (1, 1, "w"),
        ("LC153",),
        edit=top(markov_head_type="lstm"),
    ),
    Sib("domino_shift_label_not_bool", "domino", (1, 1, "w"), ("LC155",), edit=nested(shift_label=1)),
    Sib("domino_prefix_len_two", "domino", (1, 1, "w"), ("LC156",), edit=nested(pure_draft_prefix_len=2)),
    Sib("domino_emb_dim_conflict", "domino", (1, 1, "w"), ("LC158",), edit=top(emb_dim=4)),
    Sib("domino_missing_gru_dim", "domino", (1, 1, "w"), ("LC157",), edit=nested(gru_hidden_dim=DROP)),
    Sib(
        "domino_block_size_one",
        "domino",
        (1, 1, "w"),
        ("LC159",),
        edit=lambda c: (c.__setitem__("block_size", 1), c["dflash_config"].__setitem__("block_size", 1)),
    ),
    # ---- SGLang 0.5.23 (its released wheel, executed by tests/conformance/sglang)
    Sib(
        "dflash2_without_selector_keys_refused_by_sglang",
        "dflash2",
        (1, 1, "w"),
        ("LC150",),
        edit=nested(selector_rank=DROP, selector_top_k=DROP),
    ),
    Sib(
        "dflash2_declared_as_dflash_drops_the_selector_in_sglang",
        "dflash2",
        (1, 1, "w"),
        ("LC014",),
        edit=top(architectures=["DFlashDraftModel"]),
    ),
    Sib(
        "dspark_gated_markov_head_loaded_by_sglang",
        "dspark-deepspec",
        (0, 1, "w"),
        ("LC153",),
        top={"markov_head_type": "gated"},
    ),
    Sib(
        "domino_quantized_fc_is_an_nn_linear_in_sglang",
        "domino",
        (1, 1, "w"),
        ("LC306",),
        write={"quant": "NVFP4", "quantize": {"fc"}},
    ),
    Sib(
        "domino_quantized_backbone_loaded_by_sglang",
        "domino",
        (0, 1, "w"),
        ("LC015",),
        write={"quant": "NVFP4"},
    ),
]


def build(tmp: Path, case: Sib) -> Path:
    path = fixtures.write_checkpoint(
        tmp / case.name, fixtures.sibling_config(case.layout, **case.top), mutate=case.mutate, **case.write
    )
    if case.edit:
        edit_config(path, case.edit)
    return path


def verdicts(report) -> tuple[Any, ...]:
    by = {v.runtime: v for v in report.runtimes}
    return tuple(1 if not by[r].accepted else ("w" if by[r].warnings else 0) for r in RUNTIMES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sibling_head(tmp_path, case: Sib):
    report = run(build(tmp_path, case))
    assert verdicts(report) == case.expect, describe(report)
    assert set(case.rules) <= {f.rule for f in report.findings}, describe(report)


def test_unconfirmed_findings_say_so(tmp_path):
    report = run(build(tmp_path, CASES[0]))
    warnings = [f for f in report.findings if f.rule == "LC015"]
    assert warnings and all("UNCONFIRMED" in f.message or "not read" in f.message for f in warnings), (
        describe(report)
    )


@pytest.mark.parametrize(
    "layout, keys",
    [
        ("dflash2", {"selector_rank": 8, "selector_top_k": 4, "conv_kernel_size": 2}),
        (
            "dspark-deepspec",
            {
                "markov_rank": 8,
                "markov_head_type": "vanilla",
                "confidence_head": True,
                "dspark_layout": "served",
            },
        ),
        ("dspark-modelopt", {"markov_rank": 8, "dspark_layout": "modelopt"}),
        ("domino", {"gru_hidden_dim": 16, "emb_dim": 8, "family": "domino"}),
    ],
)
def test_inspect_geometry_shows_the_sibling_head(tmp_path, layout, keys):
    path = fixtures.write_checkpoint(tmp_path / layout, fixtures.sibling_config(layout))
    geometry = geometry_summary(load_checkpoint(str(path)).geometry)
    assert {k: geometry[k] for k in keys} == keys


@pytest.mark.parametrize(
    "layout, line",
    [
        ("dflash2", "selector   rank 8, top-k 4 (DFlash2)"),
        (
            "dspark-deepspec",
            "markov     rank 8, vanilla head, with confidence head on [h ; W1[x]], served layout",
        ),
        ("domino", "domino     GRU hidden 16, emb_dim 8"),
    ],
)
def test_inspect_text_shows_the_sibling_head(tmp_path, layout, line):
    from lilicorr_ckpt.report.inspect import inspect_checkpoint, render_inspection

    text = render_inspection(
        inspect_checkpoint(str(fixtures.write_checkpoint(tmp_path / layout, fixtures.sibling_config(layout))))
    )
    assert line in text and "? = missing" not in text, text


@pytest.mark.parametrize(
    "layout, architecture, projector, served_names",
    [
        ("dflash2", "DFlash2DraftModel", "dflash2", ("candidate_selector.predecessor_codebook",)),
        ("dspark-deepspec", "Qwen3DSparkModel", None, ("markov_head.markov_w1.weight",)),
        # the Qwen3 class every runtime loads (vLLM rewrites a Qwen3 DSparkDraftModel to it; SGLang loads it directly)
        ("dspark-specforge", "Qwen3DSparkModel", None, ("markov_head.markov_w1.weight",)),
        # no serving loader reads Model-Optimizer's flat names: convert nests them and hoists the Markov keys
        (
            "dspark-modelopt",
            "Qwen3DSparkModel",
            "dspark",
            ("markov_head.markov_w1.weight", "confidence_head.proj.weight"),
        ),
        ("domino", "DFlashDraftModel", "domino", ("prefix_gru.weight_ih_l0",)),
    ],
)
def test_convert_writes_the_architecture_and_layout_the_runtimes_load(
    tmp_path, layout, architecture, projector, served_names
):
    import json

    from lilicorr_ckpt.checkpoint.source import open_source
    from lilicorr_ckpt.checkpoint.tensors import read_tensor_table
    from lilicorr_ckpt.convert.options import ConvertOptions
    from lilicorr_ckpt.convert.pipeline import convert

    cfg = fixtures.sibling_config(layout)
    runtime = "all"
    if layout == "domino":
        cfg["architectures"] = [
            "DominoDraftModel"
        ]  # as the reference checkpoint declares it; SGLang refuses it
        runtime = "sglang"  # vLLM 0.33.0 has no Domino model
    src = fixtures.write_checkpoint(tmp_path / "src", cfg)
    convert(str(src), str(tmp_path / "out"), ConvertOptions(runtime=runtime, quiet=True))
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out["architectures"] == [architecture]
    assert out["dflash_config"].get("projector_type") == projector
    names = set(read_tensor_table(open_source(str(tmp_path / "out"))).tensors)
    assert set(served_names) <= names
    assert not names & {"markov_w1.weight", "confidence_proj.weight"}
    if layout.startswith("dspark"):
        assert out["markov_rank"] == 8  # where SGLang and vLLM read it
    report = run(tmp_path / "out", runtime=runtime)
    assert [v.runtime for v in report.runtimes if not v.accepted] == [], describe(report)


def test_convert_refuses_a_dspark_layout_no_runtime_loads(tmp_path):
    from lilicorr_ckpt.convert.options import ConvertOptions
    from lilicorr_ckpt.convert.pipeline import convert
    from lilicorr_ckpt.errors import ConversionRefused

    src = fixtures.write_checkpoint(
        tmp_path / "src", fixtures.sibling_config("dspark-modelopt", model_type="deepseek_v3")
    )
    with pytest.raises(ConversionRefused) as info:
        convert(str(src), str(tmp_path / "out"), ConvertOptions(quiet=True))
    assert "no runtime loads this DSpark layout" in str(info.value)
    assert not (tmp_path / "out").exists()
