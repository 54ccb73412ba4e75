"""The head-kind registry (lilicorr_ckpt/families): what the reader, the checks and the reports learn from it."""

from __future__ import annotations

import json

import pytest

from lilicorr_ckpt import families
from lilicorr_ckpt.checkpoint.config import parse_config, target_model_architecture
from lilicorr_ckpt.checkpoint.geometry import resolve_geometry
from lilicorr_ckpt.fixtures import SIBLING_LAYOUTS, manifest_for, sibling_config
from lilicorr_ckpt.runtimes import PROFILES


def test_every_family_module_has_the_same_names():
    wanted = {
        "NAME",
        "TITLE",
        "ARCHITECTURES",
        "PROJECTOR_TYPE",
        "CONFIG_KEYS",
        "HEAD_PREFIXES",
        "HEAD_NAMES",
        "HUB_TAGS",
        "ROUTES",
        "FIXTURES",
        "DESCRIBED_KEYS",
        "carried",
        "head_tensors",
        "describe",
    }
    for name, module in families.FAMILIES.items():
        assert wanted <= set(vars(module)), name
        assert name == module.NAME
    assert list(families.FAMILIES) == ["lilicorr", "dflash", "dflash2", "dspark", "domino"]


def test_architectures_name_one_family_each():
    assert families.ARCHITECTURES == {
        "LiLiCorrDraftModel": "lilicorr",
        "DFlashDraftModel": "dflash",
        "DFlash2DraftModel": "dflash2",
        "DFlash2BeamDraftModel": "dflash2",
        "MiniMaxDFlash2DraftModel": "dflash2",
        "DSparkDraftModel": "dspark",
        "Qwen3DSparkModel": "dspark",
        "DominoDraftModel": "domino",
    }
    assert families.SIBLINGS == ("dflash2", "dspark", "domino")


@pytest.mark.parametrize(
    ("architecture_family", "projector_type", "head"),
    [
        ("dflash", "domino", "domino"),
        ("dflash", "dspark", "dspark"),
        ("dflash", "dflash2", "dflash2"),
        (
            "dflash",
            "lilicorr",
            "dflash",
        ),  # LiLiCorr under DFlashDraftModel is Geometry.lilicorr_enabled's to say
        ("dflash", None, "dflash"),
        ("lilicorr", "domino", "lilicorr"),
        (None, "domino", None),
    ],
)
def test_head_family_reads_projector_type_only_under_dflash(architecture_family, projector_type, head):
    assert families.head_family(architecture_family, projector_type) == head


@pytest.mark.parametrize(
    ("name", "owner"),
    [
        ("candidate_selector.successor_codebook", "dflash2"),
        ("markov_head.markov_w1.weight", "dspark"),
        ("markov_w1.weight", "dspark"),
        ("confidence_proj.bias", "dspark"),
        ("prefix_gru.weight_ih_l0", "domino"),
        ("embed_proj.2.weight", "domino"),
        ("lilicorr.out_head.weight", None),
        ("layers.0.mlp.gate_proj.weight", None),
        ("gate_proj.weight.extra", None),
    ],
)
def test_sibling_owner(name, owner):
    assert families.sibling_owner(name) == owner


@pytest.mark.parametrize(
    ("config", "drafter"),
    [
        ({"dflash_config": {}}, True),
        (
            {"dflash_config": None, "architectures": ["LlamaForCausalLM"]},
            True,
        ),  # a broken drafter: the checks judge it
        ({"architectures": ["DSparkDraftModel"]}, True),
        ({"architectures": ["Qwen3DFlashForCausalLM"]}, True),  # names a family
        ({"architectures": ["LlamaForCausalLM"], "lilicorr_hidden_size": 0}, True),
        ({"architectures": ["LlamaForCausalLM"]}, False),
        ({"architectures": "DFlashDraftModel"}, False),  # not a list: no architecture at all
        ({}, False),
    ],
)
def test_one_is_drafter_and_the_target_test_agrees(config, drafter):
    assert families.is_drafter(config) is drafter
    if drafter:
        assert target_model_architecture(config) is None


@pytest.mark.parametrize("layout", SIBLING_LAYOUTS)
def test_each_fixture_layout_builds_its_family_head(layout):
    config = sibling_config(layout)
    geometry = resolve_geometry(parse_config(json.dumps(config).encode()).config)
    family = families.FAMILIES[geometry.family or ""]
    assert layout in family.FIXTURES
    manifest = manifest_for(config)
    head = manifest.names("head")
    assert head and all(families.sibling_owner(n) == family.NAME for n in head)
    assert "head" not in manifest.incomplete


def test_routes_are_per_runtime_and_first_match_wins():
    sglang, vllm, trtllm = PROFILES["sglang"], PROFILES["vllm"], PROFILES["trtllm"]
    assert sglang.sibling_route("domino", "DFlashDraftModel")[0] == "loads"
    assert sglang.sibling_route("domino", "DominoDraftModel")[0] == "refuses"
    assert vllm.sibling_route("domino", "DFlashDraftModel")[0] == "refuses"  # its "*" row
    assert trtllm.sibling_route("dspark", "Qwen3DSparkModel")[0] == "unconfirmed"
    verdict, why = vllm.sibling_route("dflash2", "DFlashDraftModel")  # no row: not loaded as that head
    assert verdict == "refuses" and "does not load a dflash2 head declared as DFlashDraftModel" in why
    for family in families.SIBLINGS:
        assert set(families.FAMILIES[family].ROUTES) <= set(PROFILES), family
