"""What `convert` writes for SGLang, served by every SGLang release: validate must judge each output as the release
loads it, and an output converted for a release must load there with the trained function.

The sources are the bundled ModelOpt NVFP4 example and ModelOpt-style exports the convert tests build (every
quantization algorithm, legacy head names, the training prefix, a sharded export); each is converted once for
each SGLang release alone (`--runtime sglang==VERSION`, with the head naming that release reads), for SGLang
(its newest release) and for every runtime, and each output is served by each release.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.convert import ConvertOptions, convert
from lilicorr_ckpt.errors import ConversionRefused
from lilicorr_ckpt.runtimes import RELEASES, select_profiles

from .support import describe, mark_pending, serve, validate_verdict
from .test_verdicts import PENDING

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "tiny-modelopt-nvfp4"

SOURCES: dict[str, Callable[[Path], Path]] = {
    "example-tiny-modelopt-nvfp4": lambda tmp: EXAMPLE,
    "modelopt-nvfp4": lambda tmp: fixtures.write_checkpoint(tmp, quant="NVFP4", style="modelopt"),
    "modelopt-fp8": lambda tmp: fixtures.write_checkpoint(tmp, quant="FP8", style="modelopt"),
    "modelopt-w4a16": lambda tmp: fixtures.write_checkpoint(tmp, quant="W4A16_NVFP4", style="modelopt"),
    "modelopt-nvfp4-conv-sharded": lambda tmp: fixtures.write_checkpoint(
        tmp, fixtures.draft_config(conv=(4, 16)), quant="NVFP4", style="modelopt", shards=3
    ),
    "bf16-sequential-names": lambda tmp: fixtures.write_checkpoint(tmp, naming="sequential"),
    "bf16-training-prefix": lambda tmp: fixtures.write_checkpoint(tmp, key_prefix="dflash_module."),
}

# each release alone, the newest (`sglang`), and every runtime's newest (`all`)
TARGETS = (*(p.release_id for p in RELEASES["sglang"][:-1]), "sglang", "all")

# (source, target) -> why convert refuses to write it today (an expected failure, strict: it must go once convert
# writes the output)
CONVERT_REFUSES: dict[tuple[str, str], str] = {}


def naming(target: str) -> str:
    """The head naming the target's SGLang releases read (0.5.21's nn.Sequential names, or the named form)."""
    namings = {p.head_mlp_naming for p in select_profiles(target) if p.engine_id == "sglang"}
    return "sequential" if namings == {"sequential"} else "named"


def converted(source: str, target: str) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        src = SOURCES[source](tmp / "src")
        dst = tmp / "out"
        convert(str(src), str(dst), ConvertOptions(runtime=target, naming=naming(target), quiet=True))
        return dst

    return build


def targets_release(target: str, version: str) -> bool:
    return any(p.engine_id == "sglang" and p.version == version for p in select_profiles(target))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_convert_output_is_judged_as_the_release_loads_it(
    release, built, outcomes, request, source: str, target: str
):
    name = f"convert-{source}-{target}"
    refused = CONVERT_REFUSES.get((source, target))
    if refused:
        request.node.add_marker(pytest.mark.xfail(strict=True, raises=ConversionRefused, reason=refused))
    path, outcome = serve(release, built, outcomes, name, converted(source, target))
    accepted, why = validate_verdict(path, release.version)
    mark_pending(request, PENDING, name, release.version)
    if targets_release(target, release.version):
        assert outcome.verdict == "L", f"{source} converted for {target}: " + describe(
            release.version, outcome, accepted, why
        )
    assert accepted == (outcome.verdict == "L"), f"{source} converted for {target}: " + describe(
        release.version, outcome, accepted, why
    )


def test_the_lists_name_real_cases():
    assert {s for s, _ in CONVERT_REFUSES} <= set(SOURCES)
    assert {t for _, t in CONVERT_REFUSES} <= set(TARGETS)
