"""Engine releases as data: the chains in lilicorr_ckpt/runtimes, the runtime selection every surface takes, and
the rule that no engine version is written outside that package."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import lilicorr_ckpt
from lilicorr_ckpt import fixtures
from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.runtimes import (
    EVERY_RELEASE,
    PROFILES,
    RELEASES,
    Bump,
    release_of,
    runtime_matches,
    select_profiles,
)
from lilicorr_ckpt.runtimes.base import release_chain, version_key

REPO = Path(__file__).resolve().parents[1]


def _names(spec: str) -> list[str]:
    return [p.name for p in select_profiles(spec)]


def test_every_engine_lists_its_releases_oldest_first_and_names_each_source():
    for engine, chain in RELEASES.items():
        released = [p for p in chain if p.released]
        assert [version_key(p.version) for p in released] == sorted(version_key(p.version) for p in released)
        for p in chain:
            assert p.engine_id == engine and p.name == engine
            assert p.version in p.source or (not p.released and p.version.split("@")[-1] in p.source)
        # every release after the first says what changed (or that nothing decisive did)
        assert all(p.changes for p in chain[1:]) and not chain[0].changes


def test_the_supported_releases_are_the_ones_with_a_lilicorr_loader():
    assert [p.version for p in RELEASES["vllm"]][:4] == ["0.31.0", "0.32.0", "0.33.0", "0.34.0"]
    assert [p.version for p in RELEASES["sglang"]][:3] == ["0.5.21", "0.5.22", "0.5.23"]


def test_plain_engines_and_all_take_the_newest_release():
    assert [p.version for p in select_profiles("all")] == [c[-1].version for c in RELEASES.values()]
    assert select_profiles("vllm") == [RELEASES["vllm"][-1]]
    assert PROFILES["sglang"] is RELEASES["sglang"][-1]


def test_one_release_a_range_and_several_engines():
    assert [p.version for p in select_profiles("vllm==0.33.0")] == ["0.33.0"]
    assert _names("vllm==0.33.0") == ["vllm"]  # one release of an engine keeps the engine's name
    assert [p.version for p in select_profiles("vllm==0.33")] == ["0.33.0"]  # pip's padding
    assert [p.version for p in select_profiles("vllm==0.33.*")] == ["0.33.0"]
    assert _names("vllm>=0.32,<0.34") == ["vllm==0.32.0", "vllm==0.33.0"]
    assert [p.version for p in select_profiles("vllm>0.32, !=0.34.0")] == ["0.33.0"]
    assert _names("sglang,vllm==0.31.0") == ["sglang", "vllm"]
    every = _names("every")
    assert len(every) == len(EVERY_RELEASE) and "vllm==0.31.0" in every and "sglang==0.5.21" in every
    # an engine named twice is judged once per release
    assert _names("vllm==0.33.0,vllm>=0.33") == ["vllm==0.33.0", "vllm==0.34.0"]


def test_an_unreleased_revision_is_named_exactly_never_by_a_range():
    trt = RELEASES["trtllm"][-1]
    assert select_profiles(f"trtllm=={trt.version}") == [trt]
    with pytest.raises(UsageError):
        select_profiles("trtllm>=0.1")


@pytest.mark.parametrize(
    "spec, says",
    [
        ("vllm==0.30.0", "no supported vLLM release is ==0.30.0"),
        ("vllm>=9", "no supported vLLM release is >=9"),
        ("tensorrt", "'tensorrt' is not an engine"),
        ("vllm==", "the version must be numbers"),
        ("vllm==latest", "the version must be numbers"),
        ("", "no runtime named"),
        ("sglang,,vllm", "an empty entry"),
        ("<0.34", "names no engine"),
    ],
)
def test_a_release_not_supported_is_a_usage_error_listing_the_supported(spec, says):
    with pytest.raises(UsageError) as err:
        select_profiles(spec)
    text = str(err.value)
    assert says in text and "Supported: sglang 0.5.21, 0.5.22, 0.5.23; vllm 0.31.0" in text


def test_release_keys_and_waiver_matching():
    assert release_of("vllm") is RELEASES["vllm"][-1]
    assert release_of("vllm==0.31.0") is RELEASES["vllm"][0]
    with pytest.raises(KeyError):
        release_of("vllm==0.1.0")
    assert runtime_matches("vllm==0.33.0", "vllm") and runtime_matches("vllm", "vllm==0.33.0")
    assert runtime_matches("vllm==0.33.0", "vllm==0.33.0")
    assert not runtime_matches("vllm==0.33.0", "vllm==0.34.0") and not runtime_matches("sglang", "vllm")


def test_a_bump_holds_only_differences():
    first = RELEASES["vllm"][0]
    with pytest.raises(ValueError, match="already"):
        release_chain(
            first, (Bump(version="9.0.0", fields={"causal": first.causal}, notes=("x",)),), "{version}"
        )
    with pytest.raises(ValueError, match="not a release field"):
        release_chain(first, (Bump(version="9.0.0", fields={"no_such": 1}, notes=("x",)),), "{version}")
    with pytest.raises(ValueError, match="does not follow"):
        release_chain(first, (Bump(version="0.0.1", fields={}, notes=("x",)),), "{version}")
    with pytest.raises(ValueError, match="say what changed"):
        release_chain(first, (Bump(version="9.0.0", fields={}, notes=()),), "{version}")
    chain = release_chain(
        first, (Bump(version="9.0.0", fields={"causal": "refuses"}, notes=("x",)),), "w {version}"
    )
    assert chain[-1].causal == "refuses" and chain[-1].source == "w 9.0.0" and chain[-1].changes == ("x",)
    assert msgspec.structs.replace(
        chain[-1], causal=first.causal, version=first.version, source="", changes=()
    ) == (msgspec.structs.replace(first, source=""))


def test_a_range_gives_a_verdict_per_release_in_every_report(tmp_path):
    path = fixtures.write_checkpoint(tmp_path / "d", fixtures.draft_config())
    report = lilicorr_ckpt.validate(str(path), runtime="vllm>=0.33")
    assert [(v.runtime, v.display, v.engine) for v in report.runtimes] == [
        ("vllm==0.33.0", "vLLM 0.33.0", "vllm"),
        ("vllm==0.34.0", "vLLM 0.34.0", "vllm"),
    ]
    from lilicorr_ckpt.report import formats

    for fmt in ("text", "markdown", "junit", "sarif", "json"):
        out = formats.render_validate(report, fmt)
        assert "vLLM 0.33.0" in out and "vLLM 0.34.0" in out, fmt
    outputs = formats.render_validate(report, "github-output")
    assert "verdict-vllm-0_33_0" in outputs and "verdict-vllm-0_34_0" in outputs


def test_the_python_api_raises_usage_error_for_an_unknown_release(tmp_path):
    path = fixtures.write_checkpoint(tmp_path / "d", fixtures.draft_config())
    with pytest.raises(UsageError, match="Supported: "):
        lilicorr_ckpt.validate(str(path), runtime="vllm==0.1.0")


def test_the_command_line_takes_a_release_and_refuses_an_unknown_one(tmp_path):
    path = fixtures.write_checkpoint(tmp_path / "d", fixtures.draft_config())
    cmd = [sys.executable, "-m", "lilicorr_ckpt", "validate", str(path), "-q"]
    ok = subprocess.run([*cmd, "--runtime", "vllm==0.33.0"], capture_output=True, text=True)
    assert ok.returncode == 0 and "vLLM 0.33.0" in ok.stdout, ok.stderr
    bad = subprocess.run([*cmd, "--runtime", "vllm==0.1.0"], capture_output=True, text=True)
    assert bad.returncode == 4 and "Supported: sglang" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- no version literal outside runtimes/

_CODE = ("lilicorr_ckpt", "lilicorr_runtime", "lilicorr_train")


def _literal() -> re.Pattern[str]:
    versions = sorted({p.version for p in EVERY_RELEASE if p.released}, key=len, reverse=True)
    # a release, or its major.minor (0.33, 0.5.2x), as a whole token
    short = {".".join(v.split(".")[:2]) for v in versions if v.count(".") == 2 and not v.startswith("0.5.")}
    full = "|".join(re.escape(v) for v in versions)
    # a short form only where it reads as an engine's (`vllm>=0.33`, `vLLM 0.33`), so a plain 0.32 weight is not one
    brief = "|".join(re.escape(s) for s in sorted(short))
    return re.compile(
        r"(?<![\w.])(" + full + r")(?![\w]|\.\d)"
        r"|(?i:vllm|sglang)\s*(?:[<>=!~]=?|\s)\s*(" + brief + r")(?![\w]|\.\d)"
    )


def test_no_engine_version_is_written_outside_the_runtimes_package():
    pattern = _literal()
    found = []
    for root in _CODE:
        for path in sorted((REPO / root).rglob("*.py")):
            if "runtimes" in path.relative_to(REPO).parts:
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert found == [], "engine versions belong in lilicorr_ckpt/runtimes:\n" + "\n".join(found)


def test_the_literal_check_would_catch_one():
    assert _literal().search('why="vLLM 0.33.0 refuses it"')
    assert _literal().search("SGLang 0.5.23's loader")
    assert not _literal().search("torch 2.13.0, pip 0.330")
    assert _literal().search("lilicorr-ckpt runtimes 'vllm>=0.33'")
    assert not _literal().search("self_chat: float = 0.32")
