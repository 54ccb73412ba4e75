"""Repack the v3 training shards so that a GPU session's first three calls carry them beside the target: the
shards then need no call of their own (examples/train_smollm2/v3.sh; docs/training.md, "Next GPU session").

    python scripts/v3_carry.py [--margin-kb 512]

A call carries at most 64 MiB, the working tree included. The first two calls carry the target's halves
(.cache/dev/g/p00 and p01, scripts/v3_pack.sh) beside the tree without the bundled drafter's weights
(scripts/light_tree.sh hide), and the first also the wheels, the second the kept held-out set
(.cache/v3/f/val.npz); the third carries the whole tree for the fit. This fills the room each leaves, less a margin,
with whole shards (each shard's .npz before its .json: a .json marks a shard done), from the shard tars `ship`
brought back (.cache/v3/shards-*.tar), into .cache/v3/carry/a.tar, b.tar and c.tar, and says what each call
carries. It fails, changing nothing, if the shards do not fit the three calls.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 64 << 20
MODEL = REPO / "examples" / "smollm2-lilicorr" / "model.safetensors"
HIDDEN = REPO / ".cache" / "hide" / "model.safetensors"


def tree_bytes() -> int:
    """What a call carries of the working tree: the files git tracks and the untracked ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (REPO / name.decode()).stat().st_size for name in listed if name and (REPO / name.decode()).is_file()
    )


def size(path: Path) -> int:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )


def shards(sources: list[Path]) -> list[tuple[str, bytes, bytes]]:
    """(name, npz bytes, json bytes) of every complete shard in the tars, each once, in name order."""
    found: dict[str, dict[str, bytes]] = {}
    for source in sources:
        with tarfile.open(source) as tar:
            for member in tar.getmembers():
                stem, _, kind = member.name.rpartition(".")
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None and kind in ("npz", "json") and "/" not in member.name:
                    found.setdefault(stem, {}).setdefault(kind, handle.read())
    return [(stem, parts["npz"], parts["json"]) for stem, parts in sorted(found.items()) if len(parts) == 2]


def tar_size(members: list[tuple[str, bytes, bytes]]) -> int:
    """The bytes of a plain tar of these shards: a 512-byte header and the data padded to 512 per file, then the
    end blocks, padded to tarfile's 10 kB record."""
    body = sum(512 + -(-len(data) // 512) * 512 for _, npz, meta in members for data in (npz, meta))
    return -(-(body + 1024) // 10240) * 10240


def pack(items: list[tuple[str, bytes, bytes]], rooms: list[int]) -> list[list[tuple[str, bytes, bytes]]]:
    """The shards in order, each into the first call whose tar still fits its room with it; ValueError where a
    shard fits none."""
    packed: list[list[tuple[str, bytes, bytes]]] = [[] for _ in rooms]
    for shard in items:
        call = next((i for i, room in enumerate(rooms) if tar_size([*packed[i], shard]) <= room), None)
        if call is None:
            raise ValueError(f"{shard[0]} does not fit any call (rooms {rooms})")
        packed[call].append(shard)
    return packed


def write_tar(path: Path, members: list[tuple[str, bytes, bytes]]) -> None:
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for stem, npz, meta in members:
            for name, data in ((f"{stem}.npz", npz), (f"{stem}.json", meta)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--margin-kb", type=int, default=512, help="room left in each call (default 512 kB)")
    args = parser.parse_args()
    cache = REPO / ".cache"
    whl, p00, p01, val = (
        cache / "dev" / "whl",
        cache / "dev" / "g" / "p00",
        cache / "dev" / "g" / "p01",
        cache / "v3" / "f" / "val.npz",
    )
    missing = [str(p) for p in (whl, p00, p01, val) if not p.exists()]
    sources = sorted((cache / "v3").glob("shards-*.tar"))
    if missing or not sources:
        sys.exit(
            f"scripts/v3_carry.py: missing {', '.join(missing) or '.cache/v3/shards-*.tar'} (scripts/v3_pack.sh)"
        )
    model = MODEL.stat().st_size if MODEL.is_file() else HIDDEN.stat().st_size
    tree = tree_bytes() + (0 if MODEL.is_file() else model)  # the whole tree, whether hidden now or not
    margin = args.margin_kb << 10
    rooms = [
        LIMIT - (tree - model) - size(whl) - size(p00) - margin,  # call 1: hidden tree, wheels, p00
        LIMIT - (tree - model) - size(p01) - size(val) - margin,  # call 2: hidden tree, p01, the held-out set
        LIMIT - tree - margin,  # call 3: the whole tree, for the fit
    ]
    try:
        packed = pack(shards(sources), rooms)
    except ValueError as exc:
        sys.exit(f"scripts/v3_carry.py: {exc}")
    out = cache / "v3" / "carry"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.tar"):
        old.unlink()
    for name, members in zip("abc", packed, strict=True):
        if members:
            write_tar(out / f"{name}.tar", members)
    for i, (name, members) in enumerate(zip("abc", packed, strict=True)):
        path = out / f"{name}.tar"
        carried = path.stat().st_size if members else 0
        print(
            f"call {i + 1}: {len(members)} shards, {carried:,} bytes in {path.relative_to(REPO) if members else '-'}; "
            f"{rooms[i] + margin - carried:,} bytes left of the call's 64 MiB"
        )


if __name__ == "__main__":
    main()
