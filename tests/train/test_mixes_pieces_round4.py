"""`python -m lilicorr_train.mixes` and `lilicorr_train.pieces` against hostile files, as `python -m lilicorr_train`
already is: `build --train` onto one of its own shards destroyed it (exit 0), --train == --val kept one set, a
symlink planted at the predictable `TRAIN.tmp` was written through, a deflate-bomb shard took 30 s and 2 GB, a shard
that lies about its offsets asked numpy for 909 TiB, and every bad shard, missing directory or option ended in a
traceback or argparse's exit 2 (a usage error is 4 here); --budget nan never ran out."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from lilicorr_ckpt.outfile import atomic_writer
from lilicorr_train import mixes, pieces
from lilicorr_train.mixes import Shard, shard_name, write_npz

from helpers import REPO


def _shard(n: int = 20, seed: int = 0, **override: np.ndarray) -> dict[str, np.ndarray]:
    lens = np.full(n, 10)
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum(lens)
    arrays = {
        "tokens": np.random.default_rng(seed).integers(0, 500, int(offsets[-1])).astype(np.uint16),
        "offsets": offsets,
        "prompt_lengths": np.full(n, 4, np.int32),
        "category": np.zeros(n, np.uint8),
        "source": np.zeros(n, np.uint8),
    }
    return {**arrays, **override}


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    directory = tmp_path / "shards"
    directory.mkdir()
    for i in range(2):
        write_npz(directory / f"{shard_name(i)}.npz", _shard(seed=i))
        (directory / f"{shard_name(i)}.json").write_text("{}")
    return directory


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(capsys, shards: Path, train: Path, val: Path) -> tuple[int, str]:
    code = mixes.main(["build", "--dir", str(shards), "--train", str(train), "--val", str(val)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Error:" not in err, err
    return code, err


def test_build_never_writes_over_its_shards(shards, tmp_path, capsys):
    first = shards / "shard-0000.npz"
    before = _digest(first)
    code, err = _build(capsys, shards, first, tmp_path / "val.npz")
    assert code == 4 and "--train" in err and "a shard of --dir" in err
    (tmp_path / "link.npz").symlink_to(shards / "shard-0001.npz")
    code, err = _build(capsys, shards, tmp_path / "train.npz", tmp_path / "link.npz")
    assert code == 4 and "resolves to a shard of --dir" in err
    code, err = _build(capsys, shards, tmp_path / "same.npz", tmp_path / "same.npz")
    assert code == 4 and "--train and --val are the same file" in err
    assert _digest(first) == before and not (tmp_path / "val.npz").exists()


def test_build_writes_through_the_atomic_writer_never_a_planted_symlink(shards, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "train.npz.tmp").symlink_to(victim)  # the temporary's old, predictable name
    code, _ = _build(capsys, shards, tmp_path / "train.npz", tmp_path / "val.npz")
    assert code == 0 and victim.read_bytes() == b"precious"
    assert len(Shard.load(tmp_path / "train.npz")) + len(Shard.load(tmp_path / "val.npz")) == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shards",
        "train.npz",
        "train.npz.tmp",
        "val.npz",
        "victim",
    ]


def _bomb(path: Path) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("tokens.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.zeros(12 << 20, np.uint16))  # 24 MB of zeros: 24 kB deflated
        for name in ("offsets", "prompt_lengths", "category", "source"):
            with zf.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, np.zeros(2, np.int64))


@pytest.mark.parametrize(
    "hostile, message",
    [
        (_bomb, "a deflate bomb"),
        (lambda p: p.write_bytes(b"garbage"), "it is not an .npz archive"),
        (
            lambda p: write_npz(
                p,
                _shard(
                    offsets=np.array([0, 10**15]),
                    prompt_lengths=np.array([4], np.int32),
                    category=np.zeros(1, np.uint8),
                    source=np.zeros(1, np.uint8),
                ),
            ),
            "its offsets do not index its 200 tokens",
        ),
        (
            lambda p: write_npz(p, _shard(category=np.full(20, 200, np.uint8))),
            "its category array is not one of",
        ),
        (lambda p: write_npz(p, _shard(tokens=np.zeros((2, 100), np.uint16))), "not 1-D integers"),
    ],
    ids=["deflate bomb", "garbage", "offsets past the tokens", "category out of range", "2-D tokens"],
)
def test_a_hostile_shard_is_exit_2_naming_it(shards, tmp_path, capsys, hostile, message):
    hostile(shards / "shard-0001.npz")
    code, err = _build(capsys, shards, tmp_path / "train.npz", tmp_path / "val.npz")
    assert code == 2 and "shard-0001.npz" in err and message in err, err
    assert not (tmp_path / "train.npz").exists() and not (tmp_path / "val.npz").exists()


def test_usage_errors_are_exit_4_and_a_missing_directory_exit_2(tmp_path, capsys):
    for main, argv in (
        (mixes.main, ["build", "--bogus"]),
        (mixes.main, ["generate", "--target", "t", "--dir", str(tmp_path), "--budget", "nan"]),
        (pieces.main, ["fit", "run", "--target", "t", "--data", "d", "--val", "v", "--budget", "-1"]),
        (pieces.main, []),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 4 and "usage error" in err and "Traceback" not in err, (argv, err)
    code, err = _build(capsys, tmp_path / "nope", tmp_path / "t.npz", tmp_path / "v.npz")
    assert code == 2 and "nope does not exist" in err


def test_a_pieces_run_never_writes_its_state_or_log_over_an_input(shards, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    val = shards / "shard-0000.npz"
    before = _digest(val)
    (run / "log.jsonl").symlink_to(val)
    code = pieces.main(
        ["fit", str(run), "--target", str(tmp_path / "none"), "--data", str(val), "--val", str(val)]
    )
    err = capsys.readouterr().err
    assert code == 4 and "RUN's" in err and "log.jsonl" in err and _digest(val) == before


def test_a_directory_where_generate_writes_a_file_is_named_not_its_temporary(tmp_path, capsys, monkeypatch):
    """A directory named as the plan's pool file in --dir: the error names that path, where it named the atomic
    writer's random temporary beside it (`.pool-v3.json.x1y2.tmp`), which the user never made and cannot find."""
    monkeypatch.setattr(mixes, "training_prompts", lambda *args, **kwargs: [])  # a tiny pool, in no time
    monkeypatch.setattr(mixes, "stdlib_pool", lambda: [])
    directory = tmp_path / "shards"
    pool = directory / f"pool-{mixes.PLAN.name}.json"
    pool.mkdir(parents=True)
    target = str(REPO / "examples" / "tiny-target")
    code = mixes.main(["generate", "--target", target, "--dir", str(directory), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and f"{pool}\n" in err and ".tmp" not in err and "Traceback" not in err, err
    assert sorted(p.name for p in directory.iterdir()) == [pool.name]  # no temporary left
    with pytest.raises(IsADirectoryError) as raised, atomic_writer(pool) as f:
        f.write(b"{}")
    assert raised.value.filename == str(pool)


def test_an_internal_error_of_mixes_names_the_command_and_its_inputs(shards, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(mixes, "build", broken)
    monkeypatch.delenv("LILICORR_DEBUG", raising=False)
    code = mixes.main(["build", "--dir", str(shards), "--train", str(tmp_path / "t.npz"), "--val", "v.npz"])
    err = capsys.readouterr().err
    assert code == 2 and f"internal error in build, reading --dir {shards}: ValueError: boom" in err, err


def test_generate_refuses_a_bundle_that_is_no_directory_before_the_target_loads(
    tmp_path, capsys, monkeypatch
):
    """`generate --bundle FILE` ran the whole budget, then failed on mkdir with `error: File exists` (exit 2)."""

    def no_target(*args, **kwargs):
        raise AssertionError("the target loaded")

    monkeypatch.setattr(mixes, "load_target_or_say", no_target)
    bundle = tmp_path / "bundle"
    bundle.write_text("precious")
    argv = ["generate", "--target", "t", "--dir", str(tmp_path / "shards"), "--bundle", str(bundle)]
    code = mixes.main(argv)
    err = capsys.readouterr().err
    assert code == 4 and f"usage error: --bundle {bundle} is not a directory" in err, err
    assert bundle.read_text() == "precious"


def test_a_bundle_interrupted_while_written_leaves_no_half_tar(shards, tmp_path, monkeypatch):
    """The bundles were tarred in place: an interrupt (or a full disk) left half a tar under the bundle's name,
    which the next machine took for a whole one."""
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "shards-0000.tar").write_bytes(b"an earlier bundle")
    real = mixes.tarfile.TarFile.add

    def interrupted(self, name, *args, **kwargs):
        if str(name).endswith(".json"):
            raise KeyboardInterrupt
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(mixes.tarfile.TarFile, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mixes._bundle(shards, [0, 1], out)
    assert sorted(p.name for p in out.iterdir()) == ["shards-0000.tar"]
    assert (out / "shards-0000.tar").read_bytes() == b"an earlier bundle"
    monkeypatch.setattr(mixes.tarfile.TarFile, "add", real)
    assert mixes._bundle(shards, [0, 1], out) == [out / "shards-0000.tar"]
    with mixes.tarfile.open(out / "shards-0000.tar") as tar:
        assert sorted(tar.getnames()) == [f"{shard_name(i)}.{s}" for i in (0, 1) for s in ("json", "npz")]
