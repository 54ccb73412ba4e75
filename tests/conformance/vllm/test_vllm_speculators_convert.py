"""`convert --to speculators` output, served by the released vLLM (the harness executes its config translation,
model routing, weight loading and first draft step): it loads, as the z-lab output of the same drafter does.

The harness takes the target's shape from the draft config's top level; a speculators config nests it in
transformer_layer_config, so the target is read from there (the target is the user's model either way).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm_harness
import vllm_release

from lilicorr_ckpt.cli import main

REPO = Path(__file__).resolve().parents[3]
MODELOPT = REPO / "tests" / "data" / "producers" / "modelopt-0.48.0rc1"
NEWEST = vllm_release.versions()[-1]


def _convert(src: Path, dst: Path, *args: str) -> Path:
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(src), str(dst), "-q", *args])
    assert exc.value.code in (0, None)
    return dst


@pytest.fixture(scope="module")
def newest():
    vllm_release.engines().sources("vllm", NEWEST)  # skips without the sources (and no network)
    with vllm_release.loaded(NEWEST) as release:
        yield release


@pytest.mark.parametrize("fixture", ["dflash-bf16", "dflash2-bf16", "dspark-bf16", "dflash-nvfp4"])
def test_the_released_vllm_serves_the_speculators_output_as_the_zlab_one(
    newest, tmp_path, monkeypatch, fixture
):
    zlab = _convert(MODELOPT / fixture, tmp_path / "zlab", "-r", f"vllm=={NEWEST}")
    spec = _convert(MODELOPT / fixture, tmp_path / "spec", "--to", "speculators", "-r", f"vllm=={NEWEST}")
    served_zlab = vllm_harness.serve(newest, zlab)
    # the --speculative-config method the family takes (speculators_model_type dflash2 is served as dflash)
    served_spec = vllm_harness.serve(
        newest, spec, method="dspark" if fixture.startswith("dspark") else "dflash"
    )
    assert served_zlab.verdict == "L", served_zlab
    assert served_spec.verdict == "L", served_spec
