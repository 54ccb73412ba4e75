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

from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.checks.run import validate, validate_spec
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.report.inspect import inspect_checkpoint

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


@pytest.fixture
def offline_here(cache, monkeypatch):
    """In this process: offline mode on, and huggingface_hub's cache pointed at the fixture's."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache["tmp"] / "hf-cache"))
    return cache


def test_the_cache_is_the_real_layout(cache):
    snapshot = cache["snapshot"]
    assert snapshot.parent.name == "snapshots" and snapshot.name == cache["main"]
    config = snapshot / "config.json"
    assert config.is_symlink() and os.readlink(config).startswith("../../blobs/")
    assert (snapshot / "model.safetensors").is_symlink()


def test_the_commands_a_newcomer_types_work_offline(cache):
    # the fake Hub is closed by now: a run that asked it would fail to connect
    by_id = offline("validate", "acme/drafter", "-f", "json", cache=cache)
    assert by_id.returncode == 0, by_id.stderr
    report = json.loads(by_id.stdout)
    assert report["hub"] == {
        "repo_id": "acme/drafter",
        "revision": "main",
        "commit": cache["main"],
        "read_from": "hf_cache",
        "endpoint": None,
        "header_bytes": 0,
        "scale_bytes": 0,
        "scales_read": True,
    }
    assert report["findings"] == validate(str(TINY)).findings == []
    ins = offline("inspect", "acme/drafter", "-f", "json", cache=cache)
    assert ins.returncode == 0, ins.stderr
    assert json.loads(ins.stdout)["runtimes"] == {"sglang": True, "vllm": True, "trtllm": True}


def test_offline_validate_reads_the_cache_by_revision_directory_and_with_deep(offline_here):
    cache = offline_here
    local = validate(str(NVFP4))
    at_tag = validate_spec("acme/drafter@v1")
    assert at_tag.hub.commit == cache["v1"] and at_tag.hub.read_from == "hf_cache"
    assert at_tag.findings == local.findings and at_tag.exit_code == 1  # read, and judged as the local copy
    assert validate_spec("acme/drafter", revision="v1").hub.commit == cache["v1"]
    assert validate_spec(f"acme/drafter@{cache['main']}").exit_code == 0
    at_pr = validate_spec("acme/drafter@refs/pr/1")
    assert at_pr.hub.revision == "refs/pr/1" and at_pr.exit_code == 0
    # --deep reads tensor data through the links into blobs/, by repo id and from the snapshot directory
    assert validate_spec("acme/drafter", deep=True).exit_code == 0
    direct = validate_spec(str(cache["snapshot"]), deep=True)
    assert (
        direct.hub is None
        and direct.exit_code == 0
        and direct.findings == validate(str(TINY), deep=True).findings
    )


def test_a_cached_target_and_inspect_of_a_snapshot_read_the_same_cache(offline_here):
    cache = offline_here
    with_target = validate_spec("acme/drafter", target="acme/target")
    assert with_target.findings == validate(str(TINY), target=str(TARGET)).findings
    assert read_target("acme/target").hidden_size == read_target(str(TARGET)).hidden_size
    assert inspect_checkpoint(str(cache["snapshot"])).runtimes == {
        "sglang": True,
        "vllm": True,
        "trtllm": True,
    }


def test_links_out_of_a_snapshot_or_a_checkpoint_directory_stay_refused(tmp_path, monkeypatch):
    from huggingface_hub import constants

    with FakeHub() as hub:
        hub.add("acme/drafter", TINY)
        hub.add("acme/other", NVFP4)
        snapshot = fill_cache(hub, tmp_path / "hf-cache", "acme/drafter")
        other = fill_cache(hub, tmp_path / "hf-cache", "acme/other")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    outside = tmp_path / "planted.json"
    outside.write_text((TINY / "config.json").read_text())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    with pytest.raises(
        InputError, match=f"config.json is a symlink to {outside}, outside the checkpoint directory"
    ):
        validate_spec("acme/drafter")
    # another cache repo's blob is not this repo's: refused too
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to((other / "config.json").resolve())
    with pytest.raises(InputError, match="outside the checkpoint directory"):
        validate_spec(str(snapshot))
    # a user's directory: a link to a file beside it is refused, as before
    user = tmp_path / "drafter"
    user.mkdir()
    (user / "model.safetensors").symlink_to(TINY / "model.safetensors")
    (user / "config.json").write_text((TINY / "config.json").read_text())
    with pytest.raises(
        InputError, match="model.safetensors is a symlink to .*, outside the checkpoint directory"
    ):
        validate_spec(str(user))
