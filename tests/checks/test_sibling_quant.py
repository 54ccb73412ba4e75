"""validate alone on the sibling-head quantization cases (_sibling_quant.py): for each engine's newest release, it
refuses with exactly the pinned rules on the sibling linear, and accepts where the pinned loader loads (the
known disagreements, PENDING, aside). The conformance suites serve the same cases with every release's loader."""

from __future__ import annotations

import pytest

from lilicorr_ckpt.families import dspark
from lilicorr_ckpt.runtimes import PROFILES

from ._sibling_quant import CASES, PENDING, nemotron_35, sibling_rules, verdict


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_gives_the_pinned_rules(tmp_path, case, engine):
    path = case.build(tmp_path / case.name)
    accepted, errors = verdict(path, PROFILES[engine].release_id)
    assert sibling_rules(errors) == set(case.rules[engine]), errors
    if (case.name, engine) not in PENDING:
        assert accepted == (case.loader[engine] == "L"), errors


def test_the_lc307_message_names_the_served_module_and_the_statement(tmp_path):
    (case,) = [c for c in CASES if c.name == "markov_w2_float_unexcluded_nvfp4_rank16"]
    _, errors = verdict(case.build(tmp_path / "x"), "vllm")
    (message,) = errors["LC307"]
    assert "`model.markov_head.markov_w2`" in message and "ParallelLMHead" in message


def test_the_nemotron_selector_reads_what_sglang_reads():
    from lilicorr_ckpt import fixtures

    cfg = nemotron_35(fixtures.sibling_config("dspark-deepspec"))
    cfg["quantization_config"] = {"quant_algo": "W4A16_NVFP4"}
    assert dspark.nemotron_35(cfg)
    for change in (
        lambda c: c.update(architectures=["DSparkDraftModel"]),
        lambda c: c.update(has_embed_tokens=False),
        lambda c: c.update(has_lm_head=True),
        lambda c: c.update(quantization_config={"quant_algo": "NVFP4"}),
        lambda c: c.update(eagle_aux_hidden_state_layer_ids=c["dflash_config"]["target_layer_ids"]),
        lambda c: c["dflash_config"].pop("sample_from_anchor"),
    ):
        other = {**cfg, "dflash_config": dict(cfg["dflash_config"])}
        change(other)
        assert not dspark.nemotron_35(other)


def test_a_quantized_markov_w2_is_judged_in_the_layout_the_release_builds(tmp_path):
    from lilicorr_ckpt import fixtures

    from ._sibling_quant import MARKOV_W2, _quantized_markov_w2

    def mutate(tensors):
        _quantized_markov_w2("NVFP4")(tensors)
        tensors.pop(f"{MARKOV_W2}.weight_scale")

    cfg = fixtures.sibling_config("dspark-specforge", markov_rank=16)
    path = fixtures.write_checkpoint(tmp_path / "x", cfg, quant="NVFP4", mutate=mutate)
    accepted, errors = verdict(path, "vllm==0.34.0")
    assert not accepted and "its weight_scale is absent" in errors["LC208"][0], errors
    assert "ParallelLMHead" in errors["LC208"][0]
    _, errors = verdict(path, "sglang==0.5.23")
    assert "builds it as a float linear" in errors["LC209"][0], errors
