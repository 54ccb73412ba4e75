"""Offline validation of a Hugging Face cache that huggingface_hub itself filled (snapshot_download from the
loopback fake Hub): every file of a snapshot is a symlink into the cache repo's blobs/, and those links are
followed; links anywhere else stay refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fakehub import FakeHub
from test_remote import TINY, cli

from helpers import REPO

TARGET = REPO / "examples" / "tiny-target"
NVFP4 = REPO / "examples" / "tiny-modelopt-nvfp4"
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def fill_cache(hub: FakeHub, cache: Path, repo_id: str, revision: str | None = None) -> Path:
    """What `hf download repo_id [--revision R]` does: huggingface_hub's own snapshot_download into `cache`."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, endpoint=hub.url, token=False))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache with acme/drafter (main, and tag v1 = the NVFP4 example), acme/target, filled by huggingface_hub."""
    tmp = tmp_path_factory.mktemp("hfcache")
    with FakeHub() as hub:
        main = hub.add("acme/drafter", TINY)
        v1 = hub.add("acme/drafter", NVFP4, ref="v1")
        hub.add("acme/target", TARGET)
        snapshot = fill_cache(hub, tmp / "hf-cache", "acme/drafter")
        fill_cache(hub, tmp / "hf-cache", "acme/drafter", "v1")
        hub.add("acme/drafter", TINY, ref="refs/pr/1")
        fill_cache(hub, tmp / "hf-cache", "acme/drafter", "refs/pr/1")
        fill_cache(hub, tmp / "hf-cache", "acme/target")
        downloads = len(hub.hits)
    return {"tmp": tmp, "snapshot": snapshot, "main": main, "v1": v1, "downloads": downloads}


def offline(*args: str, cache: dict) -> object:
    return cli(*args, tmp=cache["tmp"], env=OFFLINE)


def test_the_cache_is_the_real_layout(cache):
    snapshot = cache["snapshot"]
    assert snapshot.parent.name == "snapshots" and snapshot.name == cache["main"]
    config = snapshot / "config.json"
    assert config.is_symlink() and os.readlink(config).startswith("../../blobs/")
    assert (snapshot / "model.safetensors").is_symlink()


def test_offline_validate_reads_the_cache_by_repo_id_revision_and_directory(cache):
    # the fake Hub is closed by now: a run that asked it would fail to connect
    local = json.loads(cli("validate", str(TINY), "-f", "json", tmp=cache["tmp"]).stdout)
    by_id = offline("validate", "acme/drafter", "-f", "json", cache=cache)
    assert by_id.returncode == 0, by_id.stderr
    report = json.loads(by_id.stdout)
    assert report["hub"] == {"repo_id": "acme/drafter", "revision": "main", "commit": cache["main"],
                             "read_from": "hf_cache", "endpoint": None, "header_bytes": 0}
    assert report["findings"] == local["findings"] and report["geometry"] == local["geometry"]

    at_tag = offline("validate", "acme/drafter@v1", "-f", "json", cache=cache)
    assert at_tag.returncode == 1, at_tag.stderr  # the NVFP4 example has findings: it was read, and judged
    assert json.loads(at_tag.stdout)["hub"]["commit"] == cache["v1"]
    at_sha = offline("validate", f"acme/drafter@{cache['main']}", cache=cache)
    assert at_sha.returncode == 0, at_sha.stderr
    at_pr = offline("validate", "acme/drafter@refs/pr/1", "-f", "json", cache=cache)
    assert at_pr.returncode == 0, at_pr.stderr
    assert json.loads(at_pr.stdout)["hub"]["revision"] == "refs/pr/1"
    deep = offline("validate", "acme/drafter", "--deep", cache=cache)
    assert deep.returncode == 0, deep.stderr  # --deep reads tensor data through the links into blobs/
    direct = cli("validate", str(cache["snapshot"]), "--deep", "-f", "json", tmp=cache["tmp"])
    assert direct.returncode == 0, direct.stderr
    assert json.loads(direct.stdout)["findings"] == local["findings"]


def test_a_cached_target_and_inspect_read_the_same_cache(cache):
    with_target = offline("validate", "acme/drafter", "--target", "acme/target", cache=cache)
    local = cli("validate", str(TINY), "--target", str(TARGET), tmp=cache["tmp"])
    assert with_target.returncode == local.returncode, with_target.stderr
    assert with_target.stdout.splitlines()[2:] == local.stdout.splitlines()[2:]
    for spec in ("acme/drafter", str(cache["snapshot"])):
        ins = offline("inspect", spec, "-f", "json", cache=cache)
        assert ins.returncode == 0, ins.stderr
        assert json.loads(ins.stdout)["runtimes"] == {"sglang": True, "vllm": True, "trtllm": True}


def test_links_out_of_a_snapshot_or_a_checkpoint_directory_stay_refused(tmp_path):
    with FakeHub() as hub:
        hub.add("acme/drafter", TINY)
        hub.add("acme/other", NVFP4)
        snapshot = fill_cache(hub, tmp_path / "hf-cache", "acme/drafter")
        other = fill_cache(hub, tmp_path / "hf-cache", "acme/other")
    outside = tmp_path / "planted.json"
    outside.write_text((TINY / "config.json").read_text())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    planted = cli("validate", "acme/drafter", tmp=tmp_path, env=OFFLINE)
    assert planted.returncode == 2
    assert f"config.json is a symlink to {outside}, outside the checkpoint directory" in planted.stderr
    # another cache repo's blob is not this repo's: refused too
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to((other / "config.json").resolve())
    foreign = cli("validate", str(snapshot), tmp=tmp_path)
    assert foreign.returncode == 2 and "outside the checkpoint directory" in foreign.stderr
    # a user's directory: a link to a file beside it is refused, as before
    user = tmp_path / "drafter"
    user.mkdir()
    (user / "model.safetensors").symlink_to(TINY / "model.safetensors")
    (user / "config.json").write_text((TINY / "config.json").read_text())
    linked = cli("validate", str(user), tmp=tmp_path)
    assert linked.returncode == 2 and "model.safetensors is a symlink to" in linked.stderr
    for r in (planted, foreign, linked):
        assert "Traceback" not in r.stderr
