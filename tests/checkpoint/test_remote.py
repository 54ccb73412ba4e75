"""validate on a Hub repo id: headers read by range requests from a loopback fake Hub, never the weights."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeHub

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.pathhint import looks_like_path, no_such_directory
from lilicorr_ckpt.checkpoint.remote import scale_spans

from helpers import REPO

TINY = REPO / "examples" / "tiny-lilicorr"
NVFP4 = REPO / "examples" / "tiny-modelopt-nvfp4"


def cli(
    *args: str,
    hub: FakeHub | None = None,
    tmp: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter, pointed at the fake Hub, with an empty HF cache and no token."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    base.update(
        {
            "NO_COLOR": "1",
            "HF_HOME": str(tmp / "hf-home"),
            "HF_HUB_CACHE": str(tmp / "hf-cache"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "HF_ENDPOINT": hub.url if hub else "http://127.0.0.1:9",
        }
    )
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "lilicorr_ckpt.cli", *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=cwd,
        timeout=120,
    )


def header_len(path: Path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def comparable(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("path", "hub")}


def local_report(path: Path, tmp: Path, *extra: str) -> dict:
    return json.loads(cli("validate", str(path), "-f", "json", *extra, tmp=tmp).stdout)


def test_a_hub_repo_is_validated_from_its_headers_and_records_the_commit(tmp_path):
    with FakeHub() as hub:
        sha = hub.add("acme/drafter", TINY)
        result = cli("validate", "acme/drafter", "-f", "json", hub=hub, tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["path"] == f"acme/drafter@{sha}"
    assert report["hub"] == {
        "repo_id": "acme/drafter",
        "revision": "main",
        "commit": sha,
        "read_from": "hub",
        "endpoint": hub.url,
        "header_bytes": header_len(TINY / "model.safetensors"),
        "scale_bytes": 0,  # a bf16 drafter has no NVFP4 global scales to read
        "scales_read": True,
    }
    assert comparable(report) == comparable(local_report(TINY, tmp_path))
    # the length prefix and the header, by two range reads: not one byte of tensor data
    shard = TINY / "model.safetensors"
    assert hub.bytes_sent("model.safetensors") == header_len(shard) < shard.stat().st_size
    ranges = [h.range for h in hub.hits if h.path.endswith("model.safetensors")]
    assert ranges == ["bytes=0-7", f"bytes=8-{header_len(shard) - 1}"]
    # every file read at the resolved commit, not at a moving branch
    assert all(f"/resolve/{sha}/" in h.path for h in hub.hits if "/resolve/" in h.path)
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").rglob("*.safetensors"))


def test_the_text_report_names_the_commit_and_findings_match_a_local_run(tmp_path):
    with FakeHub() as hub:
        sha = hub.add("acme/nvfp4", NVFP4)
        result = cli(
            "validate",
            "acme/nvfp4",
            "--target",
            str(REPO / "examples" / "tiny-target"),
            hub=hub,
            tmp=tmp_path,
        )
    assert result.returncode == 1
    assert result.stdout.startswith(f"lilicorr-ckpt validate acme/nvfp4@{sha} --target")
    local = cli("validate", str(NVFP4), "--target", str(REPO / "examples" / "tiny-target"), tmp=tmp_path)
    assert result.stdout.splitlines()[1:] == local.stdout.splitlines()[1:]


def test_revisions_inline_or_as_an_option(tmp_path):
    with FakeHub() as hub:
        main = hub.add("acme/drafter", TINY)
        v1 = hub.add("acme/drafter", NVFP4, ref="v1")
        at = cli("validate", "acme/drafter@v1", "-f", "json", hub=hub, tmp=tmp_path)
        opt = cli("validate", "acme/drafter", "--revision", "v1", "-f", "json", hub=hub, tmp=tmp_path)
        by_sha = cli("validate", f"acme/drafter@{main}", "-f", "json", hub=hub, tmp=tmp_path)
        unknown = cli("validate", "acme/drafter@nope", hub=hub, tmp=tmp_path)
        both = cli("validate", "acme/drafter@v1", "--revision", "v2", hub=hub, tmp=tmp_path)
    assert at.returncode == opt.returncode == 1
    assert json.loads(at.stdout)["hub"]["commit"] == json.loads(opt.stdout)["hub"]["commit"] == v1
    assert json.loads(at.stdout)["hub"]["revision"] == "v1"
    assert by_sha.returncode == 0 and json.loads(by_sha.stdout)["hub"]["commit"] == main
    assert unknown.returncode == 2 and "has no revision 'nope'" in unknown.stderr
    assert both.returncode == 4 and "two revisions" in both.stderr
    for r in (unknown, both):
        assert "Traceback" not in r.stderr


def test_a_pull_request_revision_is_a_hub_revision_and_a_missing_default_branch_is_named(tmp_path):
    with FakeHub() as hub:
        pr = hub.add("acme/drafter", TINY, ref="refs/pr/1")
        inline = cli("validate", "acme/drafter@refs/pr/1", "-f", "json", hub=hub, tmp=tmp_path)
        option = cli(
            "validate", "acme/drafter", "--revision", "refs/pr/1", "-f", "json", hub=hub, tmp=tmp_path
        )
        no_main = cli("validate", "acme/drafter", hub=hub, tmp=tmp_path)  # only refs/pr/1 exists
    for result in (inline, option):
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["hub"]["revision"] == "refs/pr/1"
        assert json.loads(result.stdout)["hub"]["commit"] == pr
    assert "/api/models/acme/drafter/revision/refs%2Fpr%2F1" in [h.path for h in hub.hits]
    assert no_main.returncode == 2 and "None" not in no_main.stderr
    assert (
        "acme/drafter has no branch 'main' (no revision was given, so the default branch was asked for; name "
        "one with @REV)"
    ) in no_main.stderr


def test_a_sharded_quantized_repo_reads_index_quant_config_and_every_shard_header(tmp_path):
    ckpt = fixtures.write_checkpoint(tmp_path / "sharded", quant="NVFP4", shards=3)
    shards = sorted(ckpt.glob("*.safetensors"))
    assert len(shards) == 3 and (ckpt / "hf_quant_config.json").exists()
    (ckpt / "README.md").write_text("# not read\n")
    with FakeHub(redirect_lfs=True) as hub:  # LFS files redirect to a CDN; Range must survive the redirect
        hub.add("acme/sharded", ckpt)
        result = cli("validate", "acme/sharded", "-f", "json", hub=hub, tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    assert comparable(json.loads(result.stdout)) == comparable(local_report(ckpt, tmp_path))
    # each shard's header, and its NVFP4 global scales (4 bytes each, neighbours in one range): nothing else
    report = json.loads(result.stdout)
    scales = 0
    for shard in shards:
        raw = shard.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        spans = scale_spans(raw[8 : 8 + n], 8 + n, len(raw))
        assert spans, shard.name  # every shard of this drafter holds NVFP4 linears
        scales += sum(length for _, length in spans)
        assert hub.bytes_sent(shard.name) == header_len(shard) + sum(length for _, length in spans)
        assert hub.bytes_sent(shard.name) < shard.stat().st_size
    assert report["hub"]["scale_bytes"] == scales and report["hub"]["scales_read"] is True
    assert hub.bytes_sent("README.md") == 0
    for name in ("config.json", "hf_quant_config.json", "model.safetensors.index.json"):
        assert hub.bytes_sent(name) == (ckpt / name).stat().st_size


def test_a_hub_finding_in_an_index_matches_the_local_one(tmp_path):
    ckpt = fixtures.write_checkpoint(tmp_path / "sharded", shards=2)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["metadata"]["total_size"] += 1
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with FakeHub() as hub:
        hub.add("acme/sharded", ckpt)
        remote = cli("validate", "acme/sharded", "-f", "json", "--strict", hub=hub, tmp=tmp_path)
    assert remote.returncode == 1
    rules = [f["rule"] for f in json.loads(remote.stdout)["findings"]]
    assert "LC606" in rules
    assert comparable(json.loads(remote.stdout)) == comparable(local_report(ckpt, tmp_path, "--strict"))


def test_sizes_from_content_range_when_the_listing_has_none_and_a_server_ignoring_range(tmp_path):
    shard = TINY / "model.safetensors"
    with FakeHub(list_sizes=False) as hub:
        hub.add("acme/drafter", TINY)
        no_sizes = cli("validate", "acme/drafter", "-f", "json", hub=hub, tmp=tmp_path)
    assert no_sizes.returncode == 0, no_sizes.stderr
    with FakeHub(ignore_range=True) as hub:  # answers 200 with the whole file: read the header, hang up
        hub.add("acme/drafter", TINY)
        ignored = cli("validate", "acme/drafter", "-f", "json", hub=hub, tmp=tmp_path)
    assert ignored.returncode == 0, ignored.stderr
    report = json.loads(ignored.stdout)
    assert report["hub"]["header_bytes"] == header_len(shard)
    assert comparable(report) == comparable(json.loads(no_sizes.stdout))


def test_private_repos_need_hf_token(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/private", TINY, token="s3cret")
        denied = cli("validate", "acme/private", hub=hub, tmp=tmp_path)
        wrong = cli("validate", "acme/private", hub=hub, tmp=tmp_path, env={"HF_TOKEN": "nope"})
        allowed = cli("validate", "acme/private", hub=hub, tmp=tmp_path, env={"HF_TOKEN": "s3cret"})
    assert (
        denied.returncode == 2
        and "was not found on" in denied.stderr
        and "HF_TOKEN is not set" in denied.stderr
    )
    assert wrong.returncode == 2 and "HF_TOKEN is set but has no access" in wrong.stderr
    assert allowed.returncode == 0, allowed.stderr
    assert "Bearer s3cret" in hub.auth_seen


def test_gated_and_missing_repos_and_a_repo_without_config(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/gated", TINY, gated=True)
        hub.add("acme/weights-only", {"model.safetensors": (TINY / "model.safetensors").read_bytes()})
        gated = cli("validate", "acme/gated", hub=hub, tmp=tmp_path)
        missing = cli("validate", "acme/nothing-here", hub=hub, tmp=tmp_path)
        no_config = cli("validate", "acme/weights-only", hub=hub, tmp=tmp_path)
    assert gated.returncode == 2 and "gated" in gated.stderr and "HF_TOKEN" in gated.stderr
    assert missing.returncode == 2 and "acme/nothing-here was not found on " + hub.url in missing.stderr
    assert no_config.returncode == 2 and "has no config.json (found: model.safetensors)" in no_config.stderr
    for r in (gated, missing, no_config):
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_corrupt_remote_header_is_named_by_file_not_by_the_stand_in_directory(tmp_path):
    data = bytearray((TINY / "model.safetensors").read_bytes())
    data[:8] = struct.pack("<Q", len(data) + 10)  # header length past the end of the file
    with FakeHub() as hub:
        hub.add(
            "acme/broken",
            {"config.json": (TINY / "config.json").read_bytes(), "model.safetensors": bytes(data)},
        )
        result = cli("validate", "acme/broken", hub=hub, tmp=tmp_path)
    assert result.returncode == 2
    assert "model.safetensors: header length" in result.stderr and "runs past the end" in result.stderr
    assert "lilicorr-hub-" not in result.stderr
    assert hub.bytes_sent("model.safetensors") == 8  # the length alone: nothing past an impossible header


def test_pickle_files_on_the_hub_are_listed_never_fetched(tmp_path):
    files = {p.name: p.read_bytes() for p in TINY.iterdir()}
    files["pytorch_model.bin"] = b"\x80\x04" + b"\0" * 4096
    with FakeHub() as hub:
        hub.add("acme/drafter", files)
        result = cli("validate", "acme/drafter", "-f", "json", hub=hub, tmp=tmp_path)
    assert [f["rule"] for f in json.loads(result.stdout)["findings"]] == ["LC601"]
    assert hub.bytes_sent("pytorch_model.bin") == 0


def test_offline_mode_never_asks_the_hub_and_says_so(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/drafter", TINY)
        result = cli("validate", "acme/drafter", hub=hub, tmp=tmp_path, env={"HF_HUB_OFFLINE": "1"})
        at_rev = cli("validate", "acme/drafter@v1", hub=hub, tmp=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2 and "offline mode" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert "not in the Hugging Face cache" in result.stderr
    assert at_rev.returncode == 2 and "offline mode" in at_rev.stderr and "--revision v1" in at_rev.stderr
    assert hub.hits == []


def test_deep_refuses_a_hub_repo_with_the_way_out(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/drafter", TINY)
        result = cli("validate", "acme/drafter@v1", "--deep", hub=hub, tmp=tmp_path)
    assert result.returncode == 4
    assert (
        "--deep reads tensor data" in result.stderr
        and "hf download acme/drafter --revision v1" in result.stderr
    )
    assert hub.hits == []


def test_an_unreachable_hub_is_an_input_error_naming_the_endpoint(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli("validate", "acme/drafter", tmp=tmp_path, env={"HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert result.returncode == 2
    assert (
        f"cannot reach the Hub at http://127.0.0.1:{port}" in result.stderr
        and "HF_HUB_OFFLINE=1" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_mistyped_local_path_is_no_such_directory_with_a_suggestion(tmp_path):
    with FakeHub() as hub:
        typo = cli("validate", "examples/tiny-lilicorrr", hub=hub, tmp=tmp_path, cwd=REPO)
        dotted = cli("validate", "./tiny-lilicor", hub=hub, tmp=tmp_path, cwd=REPO / "examples")
        nowhere = cli("validate", "./nothing/at/all", hub=hub, tmp=tmp_path, cwd=tmp_path)
        rev_on_dir = cli("validate", str(TINY), "--revision", "v1", hub=hub, tmp=tmp_path)
    assert typo.returncode == 2
    assert (
        "'examples/tiny-lilicorrr' does not exist: no such directory; did you mean 'examples/tiny-lilicorr'"
        in typo.stderr
    )
    assert "hf download" not in typo.stderr
    assert dotted.returncode == 2 and "did you mean './tiny-lilicorr'?" in dotted.stderr
    assert (
        nowhere.returncode == 2
        and "no such directory" in nowhere.stderr
        and "does not exist either" in nowhere.stderr
    )
    assert rev_on_dir.returncode == 4 and "--revision applies to a Hub repo id" in rev_on_dir.stderr
    assert hub.hits == []


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("acme/drafter", False),
        ("acme/drafter@v1", False),
        ("./x", True),
        ("../x", True),
        ("/abs/x", True),
        ("~/x", True),
        (".", True),
        ("a/b/c", True),
        ("a/b/", True),
        ("C:\\models\\x", True),
        ("tests/nope", True),
        ("drafter", True),
    ],
)
def test_looks_like_path(spec, expected, monkeypatch):
    monkeypatch.chdir(REPO)  # `tests` is a directory here
    assert looks_like_path(spec) is expected


def test_no_such_directory_suggests_siblings(tmp_path, monkeypatch):
    (tmp_path / "drafter-v2").mkdir()
    (tmp_path / "unrelated").mkdir()
    monkeypatch.chdir(tmp_path)
    assert no_such_directory("drafter-v3").endswith("did you mean 'drafter-v2'?")
    assert no_such_directory(str(tmp_path / "drafter_v2")).endswith(f"did you mean '{tmp_path}/drafter-v2'?")
    assert no_such_directory("zzz/qqq").endswith("its parent 'zzz/' does not exist either")


def test_scale_spans_coalesce_neighbours_and_skip_what_is_no_global_scale():
    def header(entries):
        return json.dumps(entries).encode()

    f32 = {"dtype": "F32", "shape": []}
    entries = {
        "a.weight_scale_2": {**f32, "data_offsets": [0, 4]},
        "b.weight_scale_2": {**f32, "data_offsets": [100, 104]},  # 96 bytes on: one range with a
        "c.weight_scale_2": {**f32, "data_offsets": [90_000, 90_004]},  # far: a range of its own
        "d.weight_scale": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [8, 12]},  # a block scale
        "e.input_scale": {**f32, "data_offsets": [16, 20]},  # not a weight's global scale
        "f.weight_scale_2": {"dtype": "BF16", "shape": [], "data_offsets": [24, 26]},  # not F32
        "g.weight_scale_2": {**f32, "data_offsets": [200_000, 200_004]},  # past the file's end
        "__metadata__": {"format": "pt"},
    }
    assert scale_spans(header(entries), 1000, 100_000) == [(1000, 104), (91_000, 4)]
    assert scale_spans(b"not json", 8, 100) is None
    assert scale_spans(header({}), 8, 100) == []


def test_an_nvfp4_repo_whose_fused_shards_disagree_is_judged_on_the_hub_as_at_home(tmp_path):
    # ModelOpt's own exports keep one global scale per shard: LC327 needs the 4-byte values, read by range
    ckpt = fixtures.write_checkpoint(tmp_path / "raw", quant="NVFP4", style="modelopt")
    local = local_report(ckpt, tmp_path)
    assert "LC327" in {f["rule"] for f in local["findings"]}
    with FakeHub() as hub:
        hub.add("acme/raw", ckpt)
        remote = cli("validate", "acme/raw", "-f", "json", hub=hub, tmp=tmp_path)
    assert remote.returncode == 1
    assert comparable(json.loads(remote.stdout)) == comparable(local)


def test_a_server_that_ignores_range_is_never_asked_for_the_scales(tmp_path):
    ckpt = fixtures.write_checkpoint(tmp_path / "raw", quant="NVFP4", style="modelopt")
    with FakeHub(ignore_range=True) as hub:
        hub.add("acme/raw", ckpt)
        remote = cli("validate", "acme/raw", "-f", "json", hub=hub, tmp=tmp_path)
    report = json.loads(remote.stdout)
    assert report["hub"]["scales_read"] is False and report["hub"]["scale_bytes"] == 0
    assert "LC327" not in {f["rule"] for f in report["findings"]}  # not judged: no tensor data was streamed
    reads = [h.range for h in hub.hits if h.path.endswith("model.safetensors") and h.method == "GET"]
    assert len(reads) == 2  # the length prefix and the header, as ever: no third read for the scales
