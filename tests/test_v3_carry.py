"""scripts/v3_carry.py: the v3 shards repacked to ride with a GPU session's first calls (each under 64 MiB)."""

from __future__ import annotations

import tarfile

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def carry():
    return load_script("scripts/v3_carry.py", "v3_carry")


def _shard(i: int, size: int) -> tuple[str, bytes, bytes]:
    return f"shard-{i:04d}", bytes([i % 251]) * size, b'{"shard": %d}' % i


@pytest.mark.parametrize("sizes", [[1], [511, 512, 513], [100_000, 3, 70_000], [10_240 * 3]])
def test_the_tar_size_it_plans_with_is_the_size_it_writes(carry, tmp_path, sizes):
    members = [_shard(i, n) for i, n in enumerate(sizes)]
    path = tmp_path / "x.tar"
    carry.write_tar(path, members)
    assert carry.tar_size(members) == path.stat().st_size
    with tarfile.open(path) as tar:  # each shard's .npz before its .json: a .json marks a shard done
        assert tar.getnames() == [f"{s}.{kind}" for s, _, _ in members for kind in ("npz", "json")]
        assert tar.extractfile(f"{members[1 % len(members)][0]}.npz").read() == members[1 % len(members)][1]
    assert not (tmp_path / "x.tmp").exists()


def test_shards_fill_the_first_call_with_room_in_order_and_never_overflow_one(carry):
    items = [_shard(i, 10_000) for i in range(10)]  # sizes whose tars differ by a whole record
    rooms = [carry.tar_size(items[:3]), carry.tar_size(items[:2]), 10**9]
    packed = carry.pack(items, rooms)
    assert [[s[0] for s in call] for call in packed] == [
        [f"shard-{i:04d}" for i in range(3)],
        [f"shard-{i:04d}" for i in range(3, 5)],
        [f"shard-{i:04d}" for i in range(5, 10)],
    ]
    assert all(carry.tar_size(call) <= room for call, room in zip(packed, rooms, strict=True))
    with pytest.raises(ValueError, match="shard-0000 does not fit any call"):
        carry.pack(items, [10_000, 10_000])


def test_a_shard_is_taken_once_and_only_with_both_its_files(carry, tmp_path):
    def tar(name, files):
        path = tmp_path / name
        with tarfile.open(path, "w") as t:
            for member, data in files:
                src = tmp_path / member
                src.write_bytes(data)
                t.add(src, arcname=member)
        return path

    a = tar("a.tar", [("shard-0001.npz", b"one"), ("shard-0001.json", b"{}"), ("shard-0002.npz", b"half")])
    b = tar("b.tar", [("shard-0001.npz", b"again"), ("shard-0001.json", b"{}"), ("shard-0003.json", b"{}")])
    assert carry.shards([a, b]) == [("shard-0001", b"one", b"{}")]
