"""A speculators drafter and its z-lab conversion get the same verdicts, and both smoke to the same acceptance on
the tiny bundled pair (issue 39, "Done when").

The bundled pair (examples/tiny-lilicorr drafting for examples/tiny-target) has a LiLiCorr head, which the
speculators layout cannot carry (convert refuses it: test_convert_layouts.py), so its DFlash backbone is the
drafter: written in the speculators layout as speculators saves a DFlash drafter
(tests/smoke/test_speculators_smoke.py `speculators_dflash`), then converted by `convert --to zlab`, and that z-lab
output converted back by `convert --to speculators`. All three are one drafter: validate gives each the same
verdicts from every release that reads the layout, and the CPU smoke the same acceptance, arm by arm and probe by
probe. The released loaders serve a speculators save and its z-lab conversion alike:
tests/conformance/vllm/test_vllm_producer_fixtures.py.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

pytest.importorskip("torch")

from convert_helpers import REPO, load_json, tensors_of  # noqa: E402
from smoke.test_speculators_smoke import speculators_dflash  # noqa: E402

from lilicorr_ckpt.checkpoint import load_checkpoint  # noqa: E402
from lilicorr_ckpt.checks.run import validate  # noqa: E402
from lilicorr_ckpt.runtimes import RELEASES  # noqa: E402
from lilicorr_ckpt.smoke import smoke  # noqa: E402

TARGET = REPO / "examples" / "tiny-target"
VLLM = [p.release_id for p in RELEASES["vllm"]]
SGLANG = [p.release_id for p in RELEASES["sglang"]]
# the timings differ run to run; everything else a smoke measures must not
TIMING = {"wall_time_s", "tokens_per_second", "speedup_vs_ar"}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from lilicorr_ckpt.cli import main

    def convert(*args: str) -> None:
        try:
            main(["convert", *args, "-q"])
        except SystemExit as exc:
            assert exc.code in (0, None), args

    root = tmp_path_factory.mktemp("speculators-pair")
    spec = speculators_dflash(root / "speculators")
    convert(str(spec), str(root / "zlab"), "--to", "zlab")
    convert(str(root / "zlab"), str(root / "back"), "--to", "speculators", "--verifier", "acme/tiny-target")
    return {"speculators": spec, "zlab": root / "zlab", "back": root / "back"}


def _verdicts(path: Path) -> dict[str, tuple[bool, int, int]]:
    return {
        v.runtime: (v.accepted, v.errors, v.warnings) for v in validate(str(path), runtime="every").runtimes
    }


def test_the_conversion_changes_the_layout_not_the_drafter(trio):
    assert "speculators_config" in load_json(trio["speculators"] / "config.json")
    zlab = load_json(trio["zlab"] / "config.json")
    assert "speculators_config" not in zlab and zlab["dflash_config"]["target_layer_ids"] == [
        i - 1 for i in load_json(trio["speculators"] / "config.json")["aux_hidden_state_layer_ids"]
    ]
    back = load_json(trio["back"] / "config.json")
    assert back["aux_hidden_state_layer_ids"] == [i + 1 for i in zlab["dflash_config"]["target_layer_ids"]]
    assert tensors_of(trio["speculators"]) == tensors_of(trio["zlab"]) == tensors_of(trio["back"])
    # read as one drafter: the same geometry (taps, block, mask token, widths) from each layout
    geometry = {k: load_checkpoint(str(p)).geometry for k, p in trio.items()}
    assert geometry["speculators"] == geometry["zlab"] == geometry["back"]
    assert geometry["zlab"].target_layer_ids == (0, 2)  # tiny-lilicorr's own taps


def test_same_verdicts_from_every_release_that_reads_the_layout(trio):
    spec, zlab, back = (_verdicts(trio[k]) for k in ("speculators", "zlab", "back"))
    for release in VLLM:
        assert spec[release] == zlab[release] == back[release], release
        assert spec[release][0] is True
    # SGLang reads no speculators config (LC017): the z-lab conversion is what it loads
    for release in SGLANG:
        assert spec[release][0] is False and zlab[release][0] is True
    rules = {
        k: {f.rule for f in validate(str(trio[k]), runtime="vllm>=0.31").findings if f.severity != "info"}
        for k in trio
    }
    assert rules["speculators"] == rules["zlab"] == set(), rules
    # the one warning of the round trip: served alone, vLLM needs the verifier's Hub id, and acme/tiny-target is one
    assert rules["back"] == set(), rules


def test_the_reference_runtime_builds_one_drafter_from_all_three(trio):
    import torch

    from lilicorr_ckpt.smoke.load import load_drafter

    drafters = {k: load_drafter(p, runtime="vllm") for k, p in trio.items()}
    spec = drafters["speculators"]
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1, 5, spec.fc.weight.shape[1], generator=gen)
    block = torch.randn(1, spec.block_size, spec.fc.weight.shape[0], generator=gen)
    outputs = {}
    for name, drafter in drafters.items():
        assert repr(drafter) == repr(spec), name
        a, b = spec.state_dict(), drafter.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        cache = drafter.new_cache()
        with torch.no_grad():  # one draft step: context rows from the target's taps, then [anchor, masks]
            drafter.append_context(cache, drafter.project_context(features))
            outputs[name] = drafter(cache, block)
    assert torch.equal(outputs["speculators"], outputs["zlab"])
    assert torch.equal(outputs["speculators"], outputs["back"])


def _measured(report) -> tuple[dict, list]:
    """What a smoke measured, less its timings: each arm's statistics, and each request's tokens, tau and blocks."""
    arms = {
        arm: {k: v for k, v in msgspec.to_builtins(stats).items() if k not in TIMING}
        for arm, stats in report.arms.items()
    }
    requests = [
        {k: v for k, v in msgspec.to_builtins(r).items() if k != "tokens_per_second"} for r in report.requests
    ]
    return arms, requests


def test_all_three_smoke_to_the_same_acceptance(trio):
    # the bundled pair's DFlash backbone alone drafts little (its head does the work): over these eight prompts one
    # draft is accepted, so acceptance is not the trivial 1.0 and a mis-wired conversion would show
    options = {"limit": 8, "max_new_tokens": 32, "probes": "code", "warmup": False, "runtime": "vllm"}
    measured = {k: _measured(smoke(str(p), target=str(TARGET), **options)) for k, p in trio.items()}
    arms, requests = measured["speculators"]
    assert len(requests) == 8 and arms["control"]["mean_accept_length"] > 1.0, arms["control"]
    assert all(r["lossless"] for r in requests)
    assert measured["zlab"] == measured["speculators"]
    assert measured["back"] == measured["speculators"]
