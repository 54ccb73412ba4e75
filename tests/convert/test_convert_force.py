"""`convert --force` over an earlier output: it replaces only what convert wrote (conversion.json's `written`) and
keeps everything else of DST, also when it is killed, interrupted or loses a race midway."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from convert_helpers import EXAMPLE, REPO, load_json, tensors_of, tree_digest

from lilicorr_ckpt.convert import destination
from lilicorr_ckpt.convert.options import ConvertOptions
from lilicorr_ckpt.convert.pipeline import convert

TARGET = REPO / "examples" / "tiny-target"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _user_files(dst: Path) -> dict[str, str]:
    """What a user adds to a convert output: a Hub clone's .git/ and .gitattributes, a notes file."""
    (dst / ".git" / "objects").mkdir(parents=True)
    (dst / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dst / ".git" / "objects" / "ab").write_bytes(os.urandom(64))
    (dst / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (dst / "notes.txt").write_text("the user's own notes")
    return {k: v for k, v in tree_digest(dst).items() if k.startswith((".git", "notes"))}


def _siblings(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}."))


def test_force_keeps_the_card_a_hub_clone_and_the_users_files_and_replaces_the_rest(cli, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst, "--naming", "sequential", "--runtime", "trtllm").code == 0
    assert cli("card", dst, "--target", TARGET).code == 0  # the documented next step writes DST/README.md
    card = (dst / "README.md").read_text()
    assert "LiLiCorr" in card or "lilicorr" in card
    users = _user_files(dst)
    dst.chmod(0o750)
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 0, run
    assert (dst / "README.md").read_text() == card
    assert {k: v for k, v in tree_digest(dst).items() if k in users} == users
    assert "lilicorr.feature_mlp.up_proj.weight" in tensors_of(dst)  # the new output (named), not the old one
    assert "kept      .git, .gitattributes, README.md, notes.txt in" in run.out
    assert stat.S_IMODE(dst.stat().st_mode) == 0o750  # DST keeps its permissions
    assert _siblings(dst) == []
    # the new record lists exactly what convert wrote, with the bytes' sha256; the kept entries are not in it
    written = load_json(dst / "conversion.json")["written"]
    assert sorted(written) == ["config.json", "hf_quant_config.json", "model.safetensors"]
    assert all(_sha(dst / name) == digest for name, digest in written.items())
    # and again: the kept files stay kept on every later --force
    assert cli("convert", EXAMPLE, dst, "--force").code == 0
    assert (dst / "README.md").read_text() == card and (dst / ".git" / "HEAD").exists()


@pytest.mark.parametrize("shards", [1, 3])
def test_the_record_lists_every_file_convert_writes(cli, export, tmp_path, shards):
    src = export(quant="NVFP4", shards=shards)
    for name in ("README.md", "tokenizer.json", "generation_config.json"):
        (src / name).write_text(f"{name} of the source")
    dst = tmp_path / "out"
    sharding = ["--max-shard-size", "40KB"] if shards > 1 else []
    assert cli("convert", src, dst, *sharding).code == 0
    written = load_json(dst / "conversion.json")["written"]
    assert set(written) | {"conversion.json"} == {p.name for p in dst.iterdir()}
    assert all(_sha(dst / name) == digest for name, digest in written.items())
    assert (len([n for n in written if n.endswith(".safetensors")]) > 1) == (shards > 1)
    dry = json.loads(cli("convert", src, tmp_path / "dry", *sharding, "--dry-run", "-f", "json").out)
    assert dry["written"] == dict.fromkeys(written)  # the dry run names the same files, without hashes


def test_a_copy_changed_since_is_kept_and_an_unchanged_one_is_replaced(cli, export, tmp_path):
    src = export(quant="NVFP4")
    (src / "README.md").write_text("the exporter's card")
    (src / "tokenizer_config.json").write_text('{"v": 1}')
    dst = tmp_path / "out"
    assert cli("convert", src, dst).code == 0
    (dst / "README.md").write_text("the card I edited")  # changed since convert copied it
    (src / "README.md").write_text("the exporter's new card")
    (src / "tokenizer_config.json").write_text('{"v": 2}')  # unchanged in DST: convert's to replace
    run = cli("convert", src, dst, "--force")
    assert run.code == 0, run
    assert (dst / "README.md").read_text() == "the card I edited"
    assert (dst / "tokenizer_config.json").read_text() == '{"v": 2}'
    record = load_json(dst / "conversion.json")
    assert record["other_files"]["copied"] == ["tokenizer_config.json"]
    assert {
        "file": "README.md",
        "reason": "DST has its own README.md (changed since the earlier convert copied it); it is kept",
    } in record["other_files"]["dropped"]
    assert "README.md" not in record["written"]
    assert "left out  README.md: DST has its own README.md" in run.out


def test_a_file_of_srcs_that_the_user_put_in_dst_first_is_kept_too(cli, export, tmp_path):
    src = export()
    dst = tmp_path / "out"
    assert cli("convert", src, dst).code == 0
    (dst / "README.md").write_text("my card")
    (src / "README.md").write_text("the exporter's card, added later")
    assert cli("convert", src, dst, "--force").code == 0
    assert (dst / "README.md").read_text() == "my card"


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_weight_or_config_file_changed_since_is_refused_by_name(cli, tmp_path, name):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst).code == 0
    with (dst / name).open("r+b") as f:  # a hand edit (same size, so only the checksum tells)
        f.seek(-2, os.SEEK_END)
        f.write(b"  ")
    before = tree_digest(dst)
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 4, run
    assert f"{name} was changed since convert wrote it" in run.err and "would lose the change" in run.err
    assert "Traceback" not in run.err and tree_digest(dst) == before and _siblings(dst) == []


def test_a_fifo_in_place_of_a_written_file_is_named_and_never_opened(cli, export, tmp_path):
    src = export()
    (src / "README.md").write_text("card")
    dst = tmp_path / "out"
    assert cli("convert", src, dst).code == 0
    (dst / "README.md").unlink()
    os.mkfifo(dst / "README.md")  # a copy swapped for a FIFO: the user's now, kept (and never read)
    assert cli("convert", src, dst, "--force").code == 0
    assert stat.S_ISFIFO((dst / "README.md").lstat().st_mode)
    (dst / "config.json").unlink()
    os.mkfifo(dst / "config.json")
    run = cli("convert", src, dst, "--force")
    assert run.code == 4 and "config.json was changed since convert wrote it" in run.err, run


def test_a_users_file_with_a_name_this_conversion_writes_is_refused(cli, export, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", export("plain"), dst).code == 0  # unquantized: no hf_quant_config.json
    assert "hf_quant_config.json" not in load_json(dst / "conversion.json")["written"]
    (dst / "hf_quant_config.json").write_text('{"mine": true}')
    run = cli("convert", export("quant", quant="NVFP4"), dst, "--force")
    assert run.code == 4, run
    assert (
        "hf_quant_config.json is not from the earlier convert, and this one writes a file of that name"
        in run.err
    )
    assert (dst / "hf_quant_config.json").read_text() == '{"mine": true}'


def _as_older_record(dst: Path) -> None:
    """conversion.json as lilicorr-ckpt 0.1.0 wrote it: no `written` list."""
    record = load_json(dst / "conversion.json")
    del record["written"]
    record["version"] = "0.1.0"
    (dst / "conversion.json").write_text(json.dumps(record))


def test_an_older_record_keeps_unlisted_entries_and_refuses_copies_it_cannot_verify(cli, export, tmp_path):
    src = export(quant="NVFP4")
    dst = tmp_path / "out"
    assert cli("convert", src, dst).code == 0
    _as_older_record(dst)
    users = _user_files(dst)
    run = cli("convert", src, dst, "--force")  # only generated files and unlisted entries: replaced and kept
    assert run.code == 0, run
    assert {k: v for k, v in tree_digest(dst).items() if k in users} == users
    (src / "README.md").write_text("the exporter's card")
    assert cli("convert", src, dst, "--force").code == 0
    _as_older_record(dst)
    (dst / "README.md").write_text("edited by card, or not: an older record cannot tell")
    before = tree_digest(dst)
    run = cli("convert", src, dst, "--force")
    assert run.code == 4, run
    assert "comes from lilicorr-ckpt 0.1.0, which recorded no checksums" in run.err
    assert "whether README.md, copied by that convert, were changed since" in run.err
    assert tree_digest(dst) == before


def test_a_dry_run_says_what_force_would_keep(cli, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst).code == 0
    _user_files(dst)
    before = tree_digest(dst)
    run = cli("convert", EXAMPLE, dst, "--force", "--dry-run")
    assert run.code == 0 and "would keep .git, .gitattributes, notes.txt in" in run.out, run
    doc = json.loads(cli("convert", EXAMPLE, dst, "--force", "--dry-run", "-f", "json").out)
    assert doc["status"] == "dry-run" and doc["kept"] == [".git", ".gitattributes", "notes.txt"]
    assert tree_digest(dst) == before


def test_a_failure_while_moving_the_users_files_puts_them_back(cli, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst).code == 0
    _user_files(dst)
    before = tree_digest(dst)
    real_rename = os.rename
    moves = []

    def rename(src, target):
        if Path(src).parent == dst:  # an entry of DST moved into the new output
            moves.append(Path(src).name)
            if len(moves) == 2:
                raise OSError(28, os.strerror(28), str(target))
        return real_rename(src, target)

    monkeypatch.setattr(destination.os, "rename", rename)
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 2 and "(the previous DST is unchanged)" in run.err, run
    assert len(moves) == 2 and tree_digest(dst) == before and _siblings(dst) == []


# kill -9 during the swap: a child converts with os.rename patched to end the process (os._exit, no cleanup) right
# after its Nth rename. The renames of a --force with 3 kept entries: 1-3 move them into the new output, 4 moves
# DST aside, 5 moves the new output in.
KILLED_AFTER = """
import os, sys
from lilicorr_ckpt.cli import main
after, real, calls = int(sys.argv[1]), os.rename, [0]
def rename(src, dst):
    real(src, dst)
    calls[0] += 1
    if calls[0] == after:
        os._exit(137)
os.rename = rename
main(["convert", *sys.argv[2:]])
"""


@pytest.mark.parametrize("after", [2, 4])
def test_kill_9_midway_through_the_swap_loses_nothing_of_the_users(cli, tmp_path, after):
    # after 2: two of DST's entries are in the new output, one still in DST; after 4: DST is aside, and the new
    # output (holding all three) not yet in place
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst, "--naming", "sequential", "--runtime", "trtllm").code == 0
    users = _user_files(dst)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER, str(after), str(EXAMPLE), str(dst), "--force", "--quiet"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == 137, killed.stderr
    assert _siblings(dst), "the kill left nothing to recover"
    run = cli("convert", EXAMPLE, dst)  # without --force: refused, but what the kill left is put back first
    assert run.code == 4 and "already exists" in run.err, run
    assert "back into" in run.err and (after == 2 or "restored the previous output" in run.err), run
    assert {k: v for k, v in tree_digest(dst).items() if k in users} == users
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 0, run
    assert {k: v for k, v in tree_digest(dst).items() if k in users} == users
    assert "lilicorr.feature_mlp.up_proj.weight" in tensors_of(dst) and _siblings(dst) == []
    assert {p.name for p in dst.iterdir()} == set(load_json(dst / "conversion.json")["written"]) | {
        "conversion.json",
        ".git",
        ".gitattributes",
        "notes.txt",
    }


def test_a_stale_temporary_holding_the_users_files_is_never_removed(tmp_path):
    dst = tmp_path / "out"
    (dst / "notes.txt").mkdir(parents=True)  # the name is taken in DST: the file cannot go back
    stale = destination.sibling(dst, destination.TMP_TAG, pid=999999999)
    stale.mkdir()
    (stale / "conversion.json").write_text(
        json.dumps({"tool": "lilicorr-ckpt", "output": {}, "written": {"config.json": None}})
    )
    (stale / "config.json").write_text("{}")
    (stale / "notes.txt").write_text("the user's")
    notes = destination.restore_interrupted_replacement(dst)
    assert any("left .out.convert-tmp.999999999 in place" in n and "notes.txt" in n for n in notes), notes
    assert (
        destination.remove_stale_temporaries(dst) == [] and (stale / "notes.txt").read_text() == "the user's"
    )


def test_a_force_that_loses_the_race_moves_the_users_files_into_the_winners_dst(cli, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst).code == 0
    users = _user_files(dst)
    real_rename = os.rename
    winner: dict[str, str] = {}

    def racing_rename(src, target):
        if Path(target) == dst and not winner:  # another convert puts its output at DST first
            monkeypatch.setattr(destination.os, "rename", real_rename)
            with monkeypatch.context() as m:
                m.setattr(destination.os, "getpid", lambda: 1)
                convert(str(EXAMPLE), str(dst), ConvertOptions(quiet=True))
            winner.update(tree_digest(dst))
        return real_rename(src, target)

    monkeypatch.setattr(destination.os, "rename", racing_rename)
    run = cli("convert", EXAMPLE, dst, "--force")
    assert winner and run.code == 4, run
    assert ".git, .gitattributes, notes.txt (DST's own files) were moved into it" in run.err
    assert tree_digest(dst) == {**winner, **users}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_destination_that_is_not_a_convert_output_is_still_refused_whole(cli, tmp_path):
    dst = tmp_path / "mine"
    dst.mkdir()
    (dst / "config.json").write_text("{}")
    (dst / "conversion.json").write_text(json.dumps({"tool": "other"}))
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 4 and "was not written by lilicorr-ckpt convert" in run.err, run
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "conversion.json"]
