"""The compatibility matrix: each supported release loads the drafter as trained, refuses it, or serves it
silently wrong, as the card prints it."""

from __future__ import annotations

import numpy as np

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.report.compat import LOADS, REFUSES, SILENT, matrix, outcome
from lilicorr_ckpt.report.modelcard import card_section
from lilicorr_ckpt.runtimes import RELEASES


def _by_release(path) -> dict[str, str]:
    report = validate(str(path), runtime="every")
    return {v.runtime: outcome(report, v)[0] for v in report.runtimes}


def test_a_clean_drafter_loads_everywhere(tmp_path):
    got = _by_release(fixtures.write_checkpoint(tmp_path / "d", fixtures.draft_config()))
    # the first SGLang release builds the head under its Sequential names: the named form is refused there
    assert got.pop("sglang==0.5.21") == REFUSES
    assert set(got.values()) == {LOADS}


def test_a_missing_head_tensor_is_refused_until_vllm_dropped_its_coverage_check(tmp_path):
    path = fixtures.write_checkpoint(
        tmp_path / "d", fixtures.draft_config(), mutate=lambda t: t.pop("lilicorr.out_head.weight")
    )
    got = _by_release(path)
    assert got["vllm==0.34.0"] == SILENT
    assert got["vllm==0.33.0"] == REFUSES and got["sglang==0.5.23"] == REFUSES
    report = validate(str(path), runtime="every")
    f = next(f for f in report.findings if f.rule == "LC201")
    assert f.silent_for == ["vllm==0.34.0"]
    assert "vLLM 0.34.0 serves them at their initial values" in f.message
    assert "vLLM 0.31.0 to 0.33.0" in f.message and "refuse the load" in f.message


def test_unequal_fused_scales_load_silently_wrong_in_sglang_and_vllm(tmp_path):
    def mutate(t: fixtures.Tensors) -> None:
        t["layers.0.mlp.up_proj.weight_scale_2"] = ("F32", (), np.float32(0.25).tobytes())

    got = _by_release(
        fixtures.write_checkpoint(tmp_path / "d", fixtures.draft_config(), quant="NVFP4", mutate=mutate)
    )
    assert {k: v for k, v in got.items() if k.startswith("vllm")} == dict.fromkeys(
        [f"vllm=={p.version}" for p in RELEASES["vllm"]], SILENT
    )
    assert got["sglang==0.5.23"] == SILENT and got["trtllm"] == LOADS


def test_the_card_prints_the_matrix_per_engine(tmp_path):
    path = fixtures.write_checkpoint(
        tmp_path / "d", fixtures.draft_config(), mutate=lambda t: t.pop("lilicorr.out_head.weight")
    )
    every = validate(str(path), runtime="every")
    rows = dict(matrix(every))
    assert rows["vLLM"][SILENT] == ["0.34.0 (LC201)"]
    assert [x.split(" ")[0] for x in rows["vLLM"][REFUSES]] == ["0.31.0", "0.32.0", "0.33.0"]
    section = card_section(
        validate(str(path)),
        repo="me/d",
        base=None,
        quant_algo=None,
        license_=None,
        profile=None,
        unverified=[],
        releases=every,
    )
    assert "### Compatibility by engine release" in section
    assert "| vLLM | – | 0.31.0 (LC201), 0.32.0 (LC201), 0.33.0 (LC201) | 0.34.0 (LC201) |" in section
    assert "| vLLM 0.34.0 | loads silently wrong | 1 | 0 |" in section
