"""--verify: source and output through lilicorr_runtime, exact for renames, bf16 rounding for repairs."""

from __future__ import annotations

import sys

import pytest
from convert_helpers import EXAMPLE, load_json

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint import names


def test_verify_without_the_runtime_is_a_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails as if the runtime extra were not installed
    monkeypatch.delitem(sys.modules, "lilicorr_ckpt.convert.verify", raising=False)  # and not imported yet
    run = cli("convert", EXAMPLE, tmp_path / "out", "--verify")
    assert run.code == 4 and "pip install 'lilicorr-ckpt[runtime]'" in run.err
    assert not (tmp_path / "out").exists()


torch = pytest.importorskip("torch", reason="--verify needs torch")
runtime = pytest.importorskip("lilicorr_runtime", reason="--verify needs lilicorr_runtime")
pytest.importorskip(
    "lilicorr_runtime.model.probe", reason="--verify needs lilicorr_runtime.model.probe.reference_outputs"
)

from lilicorr_ckpt.convert.verify import compare  # noqa: E402


def test_a_rename_only_conversion_reproduces_the_source_bit_for_bit(cli, export, tmp_path):
    src = export(config=fixtures.draft_config(conv=(4, 16)), key_prefix="dflash_module.", naming="sequential")
    run = cli("convert", src, tmp_path / "out", "--verify")
    assert run.code == 0, run
    verify = load_json(tmp_path / "out" / "conversion.json")["verify"]
    assert verify["passed"] and verify["mode"] == "exact"
    assert {"draft_logits", "start", "pairs"} <= set(verify["outputs"])
    assert all(s["identical"] for s in verify["outputs"].values())
    assert "bit-identical" in run.out


def test_repairs_stay_within_bf16_rounding_of_the_quantized_source(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "out", "--verify", "--runtime", "all")
    assert run.code == 0, run
    verify = load_json(tmp_path / "out" / "conversion.json")["verify"]
    assert verify["passed"] and verify["mode"] == "bf16-rounding"
    logits = verify["outputs"]["draft_logits"]
    assert not logits["identical"] and 0 < logits["max_abs_diff"] < 0.01 * logits["max_abs_value"]
    assert not list(tmp_path.glob(".out.convert-*"))  # the reference copy is gone too


def test_a_swapped_tensor_is_caught_and_nothing_is_written(cli, export, tmp_path, monkeypatch):
    src = export()
    real = names.map_name
    swap = {
        "lilicorr.out_head.bias": "lilicorr.in_head.bias",
        "lilicorr.in_head.bias": "lilicorr.out_head.bias",
    }

    def buggy(source):  # a renaming bug that validate cannot see: same names, same shapes
        m = real(source)
        return m.__class__(m.source, swap.get(m.canonical, m.canonical), m.prefixes, m.legacy)

    import lilicorr_ckpt.convert.plan as plan

    monkeypatch.setattr(plan, "map_name", buggy)
    assert cli("convert", src, tmp_path / "plain").code == 0  # validate alone accepts it
    run = cli("convert", src, tmp_path / "out", "--verify")
    assert run.code == 1
    assert "--verify: the output does not reproduce the source" in run.err and "start" in run.err
    assert not (tmp_path / "out").exists()


def test_compare_flags_differences_beyond_the_tolerance():
    a = {"x": torch.tensor([1.0, 2.0, 3.0]), "ids": torch.tensor([1, 2])}
    same, problems = compare(a, {k: v.clone() for k, v in a.items()}, exact=True)
    assert problems == [] and same["x"]["identical"]
    near = {"x": torch.tensor([1.0, 2.0, 3.001]), "ids": torch.tensor([1, 2])}
    assert compare(a, near, exact=True)[1]  # renames must be exact
    assert compare(a, near, exact=False)[1] == []  # within bf16 rounding
    far = {"x": torch.tensor([1.0, 2.0, 3.5]), "ids": torch.tensor([1, 3])}
    problems = compare(a, far, exact=False)[1]
    assert len(problems) == 2 and "exceeds bf16 rounding" in " ".join(problems)
    assert compare(a, {"x": a["x"]}, exact=True)[1] == [
        "output 'ids' is produced by only one of the source and the converted drafter"
    ]
