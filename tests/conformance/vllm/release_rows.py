"""Corpus rows for what changed between the supported vLLM releases, where the loader-audit corpus
(tests/checks/test_loader_audit.py) has none. Built with the corpus's own Row and build helpers, served by every
release (test_vllm_conformance.py), each recording what every release does with it, as executed.

The audits: /work/notes/vllm-0.31-0.32-audit.md (D1-D4) and /work/notes/vllm-0.34-audit.md (B1-B11). Covered by
the corpus already: D1's flat NVFP4 exclusions under exclude_modules (`flat_quant_exclusions_under_exclude_modules`,
E4) and FP8 ones (Q15), D2's renumbered draft-layer index (Q61), B1's missing head / convolution / owned lm_head /
head scale (T1, T8, T9, T13, Q7).

B3's other case (an input vocabulary larger than the target's, without embed_tokens) cannot arise here: the
harness serves a draft with a target of the draft's own vocabulary (vllm_harness.target_for).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from checks.test_loader_audit import Row, servable_plus

from lilicorr_ckpt import fixtures

L, R, C, SW = "L", "R", "C", "SW"
# validate's verdicts are judged by the harness against the release, not pinned here
NOT_PINNED = (None, None, None)


class ReleaseRow(NamedTuple):
    row: Row
    vllm: dict[str, str]  # vLLM release -> what it does with the checkpoint (R, C, L, SW; U: not executed)


def dflash2(**changes: Any) -> dict[str, Any]:
    return fixtures.sibling_config("dflash2", **changes)


def dspark() -> dict[str, Any]:
    return fixtures.sibling_config("dspark-deepspec")


def beam_layout() -> dict[str, Any]:
    cfg = dflash2(
        architectures=["DFlash2BeamDraftModel"],
        layer_types=["sliding_attention", "sliding_attention"],
        use_sliding_window=True,
        sliding_window=16,
    )
    cfg["dflash_config"]["final_logit_softcapping"] = 30.0
    return cfg


DOWN_PROJ = {m for m in servable_plus() if m.endswith("down_proj")}


def exclusions(old: tuple[str, ...], new: tuple[str, ...]):
    """config.json's flat `ignore` and hf_quant_config.json's `exclude_modules`: `old` replaced by `new`."""

    def edit(patterns: list[str]) -> list[str]:
        assert set(old) <= set(patterns), (old, patterns)
        return [p for p in patterns if p not in old] + list(new)

    return (
        lambda c: c["quantization_config"].__setitem__("ignore", edit(c["quantization_config"]["ignore"])),
        lambda d: d["quantization"].__setitem__(
            "exclude_modules", edit(d["quantization"]["exclude_modules"])
        ),
    )


BARE_DOWN_PROJ = exclusions(("*down_proj",), ("down_proj",))
QKV_BY_WILDCARD = exclusions(("*q_proj", "*k_proj", "*v_proj", "*qkv_proj"), ("layers.*.self_attn.qkv_proj",))


def mixed_precision(cfg: dict[str, Any]) -> None:
    """The NVFP4 export's metadata in ModelOpt's nested MIXED_PRECISION form: every quantized module named in
    `quantized_layers` (as the checkpoint names it) with its algorithm, in config.json and hf_quant_config.json."""
    flat = cfg["quantization_config"]
    nested = {
        "producer": flat["producer"],
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None,
            "exclude_modules": flat["ignore"],
            "quantized_layers": {
                m: {"quant_algo": "NVFP4", "group_size": flat["group_size"]} for m in sorted(servable_plus())
            },
        },
    }
    cfg["quantization_config"] = nested


def mixed_precision_file(hf: dict[str, Any]) -> None:
    hf["quantization"] = {
        "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": None,
        "exclude_modules": hf["quantization"]["exclude_modules"],
        "quantized_layers": {m: {"quant_algo": "NVFP4", "group_size": 16} for m in sorted(servable_plus())},
    }


def drop_prefix(prefix: str):
    def apply(t: fixtures.Tensors) -> None:
        for name in [n for n in t if n.startswith(prefix)]:
            del t[name]

    return apply


ROWS = [
    # 0.34 B2: config/speculative.py hf_config_override reroutes DFlash2DraftModel with a truthy no_rope_layers to
    # ricursive_dflash2.py, whose listed layer indices run without RoPE. A SmolLM3/Llama4-style 0/1 flag list
    # (1 = the layer uses RoPE) is read as indices: [1, 0] turns both layers NoPE
    ReleaseRow(
        Row(
            "dflash2_no_rope_layers_flag_list", "B2", NOT_PINNED, base=lambda: dflash2(no_rope_layers=[1, 0])
        ),
        {"0.31.0": L, "0.32.0": L, "0.33.0": L, "0.34.0": SW},
    ),
    # an index list: layer 1 NoPE in 0.34 (every layer keeps RoPE up to 0.33, which never reads the key)
    ReleaseRow(
        Row("dflash2_no_rope_layers_index_list", "B2", NOT_PINNED, base=lambda: dflash2(no_rope_layers=[1])),
        {"0.31.0": L, "0.32.0": L, "0.33.0": L, "0.34.0": SW},
    ),
    # 0.33 D4: DFlash2BeamDraftModel registered (vllm/models/beam, its nvidia/dflash2.py drafter); 0.31/0.32 do
    # not register it. The project's DFlash2 layout (full attention) trips the Beam drafter's asserts
    ReleaseRow(
        Row(
            "dflash2_beam_architecture",
            "D4",
            NOT_PINNED,
            base=lambda: dflash2(architectures=["DFlash2BeamDraftModel"]),
        ),
        {"0.31.0": R, "0.32.0": R, "0.33.0": C, "0.34.0": C},
    ),
    # ... and in the layout the Beam drafter is built for (beam/nvidia/dflash2.py: every layer sliding and
    # bidirectional, dflash_config.final_logit_softcapping)
    ReleaseRow(
        Row("dflash2_beam_sliding_layout", "D4", NOT_PINNED, base=beam_layout),
        {"0.31.0": R, "0.32.0": R, "0.33.0": L, "0.34.0": L},
    ),
    # 0.33 D3: the nested form's MIXED_PRECISION gets quant_method modelopt_mixed (0.31/0.32: "Unknown ModelOpt
    # quant algo"); its quantized_layers name the modules as the checkpoint does
    ReleaseRow(
        Row(
            "nested_mixed_precision",
            "D3",
            NOT_PINNED,
            write={"quant": "NVFP4"},
            edit=mixed_precision,
            edit_hf=mixed_precision_file,
        ),
        {"0.31.0": R, "0.32.0": R, "0.33.0": L, "0.34.0": L},
    ),
    # 0.33 D2: a bare `down_proj` excludes every down_proj in 0.31/0.32 (a substring of each module name), none in
    # 0.33+ (map_draft_quant_config makes it `model.down_proj`); every down_proj is stored float
    ReleaseRow(
        Row(
            "bare_down_proj_exclusion",
            "D2",
            NOT_PINNED,
            write={"quant": "NVFP4", "quantize": servable_plus() - DOWN_PROJ},
            edit=BARE_DOWN_PROJ[0],
            edit_hf=BARE_DOWN_PROJ[1],
        ),
        {"0.31.0": L, "0.32.0": L, "0.33.0": R, "0.34.0": R},
    ),
    # 0.33 D2: `layers.*.self_attn.qkv_proj` (neither `*` nor `model.` first) matches nothing in 0.31/0.32, whose
    # fnmatch is anchored at `model.`; q/k/v are stored float
    ReleaseRow(
        Row(
            "qkv_proj_wildcard_exclusion",
            "D2",
            NOT_PINNED,
            write={"quant": "NVFP4"},
            edit=QKV_BY_WILDCARD[0],
            edit_hf=QKV_BY_WILDCARD[1],
        ),
        {"0.31.0": C, "0.32.0": C, "0.33.0": L, "0.34.0": L},
    ),
    # 0.34 B3: a DSpark draft whose output vocabulary (draft_vocab_size) is smaller than the target's, without
    # lm_head and d2t: refused up to 0.33 ("must include lm_head weights"); 0.34 serves the lm_head at its
    # initial values and d2t as the identity (spec_decode/dspark/utils.py load_dspark_model shares the target's
    # lm_head only for an equal vocabulary)
    ReleaseRow(
        Row(
            "dspark_reduced_vocab_without_lm_head_or_d2t",
            "B3",
            NOT_PINNED,
            base=lambda: fixtures.sibling_config("dspark-deepspec", draft_vocab_size=256),
        ),
        {"0.31.0": R, "0.32.0": R, "0.33.0": R, "0.34.0": SW},
    ),
    # 0.34 B4: a DSpark confidence head declared without its tensors is dropped up to 0.33; 0.34 keeps it at its
    # initial values, read only under adaptive verification (off here)
    ReleaseRow(
        Row(
            "dspark_confidence_head_missing",
            "B4",
            NOT_PINNED,
            base=dspark,
            mutate=drop_prefix("confidence_head."),
        ),
        {"0.31.0": L, "0.32.0": L, "0.33.0": L, "0.34.0": L},
    ),
]
