"""validate's vLLM verdict on the sibling-head cases and the rows of what changed between releases, what the
serving command's method does, convert's outputs, and the harness itself: every supported release, as in
test_vllm_conformance.py (its tables: RELEASED_SIBLINGS, CHANGES, PENDING), split from it so that the suite's
two test workers share the releases' work (`--dist loadfile` runs a file on one worker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import release_rows
import vllm_harness
from checks import test_sibling_heads as siblings
from checks.test_loader_audit import build
from test_vllm_conformance import PENDING, REPO, VERSIONS, _release_param, judge, pinned

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.convert.options import ConvertOptions
from lilicorr_ckpt.convert.pipeline import convert
from lilicorr_ckpt.errors import InputError, Refused, UsageError

__all__ = ["PENDING"]  # conftest.py marks this module's PENDING cases too


@_release_param
@pytest.mark.parametrize("case", siblings.CASES, ids=[c.name for c in siblings.CASES])
def test_validate_agrees_with_released_vllm_on_sibling_heads(built, released_vllm, case):
    path = built.get(case.name, lambda where: siblings.build(where.parent, case))
    judge(released_vllm, path, pinned(case.name, released_vllm.version), f"case {case.name}")


@_release_param
@pytest.mark.parametrize("row", release_rows.ROWS, ids=[r.row.name for r in release_rows.ROWS])
def test_validate_agrees_with_released_vllm_on_release_changes(built, released_vllm, row):
    path = built.get(row.row.name, lambda where: build(where.parent, row.row))
    judge(released_vllm, path, row.vllm.get(released_vllm.version), f"release row {row.row.audit}")


# the serving command's method against the checkpoint (vllm-0.34 audit B5/B6): (layout, directory name, method,
# release -> (verdict, the method the release settles on)). Up to 0.33 a command without a method serves a draft
# as a plain draft model unless its path names "dflash"/"dspark" or its architecture is DSpark's; 0.34 takes the
# method from the model class's declared speculator config, and refuses a method that disagrees with it
_UP_TO_033 = ("0.31.0", "0.32.0", "0.33.0")
METHOD_CASES = [
    (
        "lilicorr",
        "drafter",
        None,
        {**dict.fromkeys(_UP_TO_033, ("U", "draft_model")), "0.34.0": ("L", "dflash")},
    ),
    ("lilicorr", "my-dflash-drafter", None, dict.fromkeys(VERSIONS, ("L", "dflash"))),
    ("lilicorr", "drafter", "dspark", {**dict.fromkeys(_UP_TO_033, ("U", "dspark")), "0.34.0": ("R", None)}),
    (
        "lilicorr",
        "drafter",
        "draft_model",
        {**dict.fromkeys(_UP_TO_033, ("U", "draft_model")), "0.34.0": ("R", None)},
    ),
    ("dspark-specforge", "drafter", None, dict.fromkeys(VERSIONS, ("L", "dspark"))),
    ("dspark-specforge", "drafter", "dflash", dict.fromkeys(VERSIONS, ("R", None))),
]


@_release_param
@pytest.mark.parametrize(
    "layout, directory, method, expect",
    METHOD_CASES,
    ids=[f"{layout}-{directory}-{method}" for layout, directory, method, _ in METHOD_CASES],
)
def test_the_release_decides_the_method(built, released_vllm, layout, directory, method, expect):
    def write(where: Path) -> Path:
        config = fixtures.draft_config() if layout == "lilicorr" else fixtures.sibling_config(layout)
        return fixtures.write_checkpoint(where / directory, config)

    path = built.get(f"method-{layout}-{directory}", write)
    outcome = vllm_harness.serve(released_vllm, path, method=method)
    assert (outcome.verdict, outcome.facts.get("method")) == expect[released_vllm.version], str(outcome)


# ---------------------------------------------------------------- convert's outputs load in the release


def _modelopt_exports(base: Path) -> dict[str, Path]:
    """The bundled ModelOpt example and the exports tests/convert converts (ModelOpt's export quirks)."""
    cfg = fixtures.draft_config()
    exports = {"tiny-modelopt-nvfp4": REPO / "examples" / "tiny-modelopt-nvfp4"}
    variants = {
        "nvfp4": dict(quant="NVFP4"),
        "fp8": dict(quant="FP8"),
        "w4a16": dict(quant="W4A16_NVFP4"),
        "f32-nvfp4": dict(dtype="F32", quant="NVFP4"),
        "float": {},
        "sequential-prefixed-sharded": dict(
            quant="NVFP4", key_prefix="dflash_module.", naming="sequential", shards=2
        ),
        "conv": dict(config=fixtures.draft_config(conv=(4, 16)), quant="NVFP4"),
        "wide-mlp": dict(config=fixtures.draft_config(intermediate_size=136), quant="NVFP4"),
    }
    for name, kw in variants.items():
        kw = {"config": cfg, **kw}
        if kw.get("quant"):
            kw["style"] = "modelopt"
        exports[name] = fixtures.write_checkpoint(base / name, **kw)
    return exports


@pytest.fixture(scope="session")
def modelopt_exports(tmp_path_factory):
    return _modelopt_exports(tmp_path_factory.mktemp("exports"))


EXPORTS = (
    "tiny-modelopt-nvfp4",
    "nvfp4",
    "fp8",
    "w4a16",
    "f32-nvfp4",
    "float",
    "sequential-prefixed-sharded",
    "conv",
    "wide-mlp",
)
# the selections convert is asked for: this release alone, and every supported vLLM release (whose output must
# load in each); the newest release also under the plain `vllm` and `all`
CONVERT_FOR = ("vllm=={version}", f"vllm>={VERSIONS[0]}", "vllm", "all")


@_release_param
@pytest.mark.parametrize("runtime", CONVERT_FOR)
@pytest.mark.parametrize("export", EXPORTS)
def test_convert_output_loads_in_released_vllm(built, released_vllm, modelopt_exports, export, runtime):
    version = released_vllm.version
    if runtime in ("vllm", "all") and version != VERSIONS[-1]:
        pytest.skip(f"--runtime {runtime} converts for the newest vLLM ({VERSIONS[-1]}), not {version}")
    runtime = runtime.format(version=version)

    def run(dst: Path) -> Path:
        try:
            convert(str(modelopt_exports[export]), str(dst), ConvertOptions(runtime=runtime, quiet=True))
        except (InputError, Refused, UsageError) as exc:
            pytest.fail(f"convert --runtime {runtime} refused the {export} export: {exc}")
        return dst

    dst = built.get(f"convert-{export}-{runtime.replace('=', '')}", run)
    outcome = vllm_harness.serve(released_vllm, dst)
    assert outcome.verdict == "L", f"convert --runtime {runtime} of {export}: vLLM {version} {outcome}"


# ---------------------------------------------------------------- the harness itself


@_release_param
def test_a_released_module_neither_loaded_nor_stubbed_fails_loudly(released_vllm):
    # nothing of the release is stubbed by accident: an unlisted module is an error naming it
    from vllm_sandbox import SandboxError

    with pytest.raises(SandboxError, match="vllm.entrypoints"):
        released_vllm.sandbox.module("vllm.entrypoints.llm")


@_release_param
def test_infrastructure_stubs_refuse_to_compute(released_vllm):
    # a load that reached a CUDA kernel would fail, not pass
    import vllm_stubs

    with pytest.raises(vllm_stubs.InfrastructureCalled):
        released_vllm.sandbox.module("vllm._custom_ops").rms_norm()
