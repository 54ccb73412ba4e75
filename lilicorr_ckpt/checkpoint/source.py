"""Which files a checkpoint has: a local directory or a repo id in the local Hugging Face cache."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import msgspec

from lilicorr_ckpt.checkpoint.pathhint import file_not_a_directory, looks_like_path, no_such_directory
from lilicorr_ckpt.checkpoint.readfile import file_kind, read_regular_file, regular_size
from lilicorr_ckpt.errors import InputError, UsageError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
INDEX_NAME = "model.safetensors.index.json"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class Source(msgspec.Struct, frozen=True):
    root: Path  # the checkpoint directory
    # symlinks may point below root, or below this: the cache repo's blobs/ for a Hugging Face cache snapshot
    # (whose files are all links into it), root itself for any other directory
    link_root: Path
    label: str  # how the user named it
    config: Path | None
    safetensors: tuple[Path, ...]
    index: Path | None
    hf_quant_config: Path | None
    pickles: tuple[Path, ...]

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


def resolve_path(spec: str, what: str = "checkpoint") -> tuple[Path, Path]:
    """(directory, link root) for a local directory or an offline HF cache repo id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        root = path.resolve()
        return root, hf_cache_blobs(root) or root
    if path.exists():
        raise InputError(file_not_a_directory(spec, what))
    if looks_like_path(spec):  # `./x`, `examples/x`: a typo, not a repo id
        raise InputError(no_such_directory(spec, what))
    if _REPO_ID.match(spec) and not spec.startswith((".", "/")):
        return _from_hf_cache(spec, what)
    raise InputError(
        f"{what} {spec!r} does not exist (expected a directory, or a repo id such as "
        f"org/name that is already in the local Hugging Face cache)"
    )


def _not_in_cache(repo_id: str, what: str) -> str:
    """Why an offline lookup failed: the repo is absent, or present without a `main` ref to resolve."""
    from huggingface_hub import constants

    repo_dir = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    snapshots = (
        sorted(p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()) if repo_dir.is_dir() else []
    )
    if snapshots:
        shown = ", ".join(str(p) for p in snapshots[:3]) + (" ..." if len(snapshots) > 3 else "")
        return (
            f"{what} {repo_id!r} is in the Hugging Face cache ({repo_dir}) but has no refs/main to say which "
            f"snapshot is current; pass a snapshot directory instead: {shown}"
        )
    return (
        f"{what} {repo_id!r} is not a local directory and is not in the Hugging Face cache "
        f"(offline lookup; fetch it first with `hf download {repo_id}`)"
    )


def _from_hf_cache(repo_id: str, what: str) -> tuple[Path, Path]:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface-hub is a base dependency
        raise InputError(f"{what} {repo_id!r}: huggingface-hub is not installed") from None
    except ValueError as exc:  # it parses its HF_* variables when imported
        raise UsageError(
            f"{what} {repo_id!r}: huggingface_hub cannot start: {exc}; check the HF_* environment "
            f"variables (HF_HUB_DOWNLOAD_TIMEOUT and HF_HUB_ETAG_TIMEOUT take whole seconds)"
        ) from None
    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        raise InputError(_not_in_cache(repo_id, what)) from None
    except Exception as exc:  # the hub raises many types for bad ids
        raise InputError(f"{what} {repo_id!r}: cannot resolve in the Hugging Face cache: {exc}") from None
    root = snapshot.resolve()
    return root, hf_cache_blobs(root) or root


_CACHE_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def hf_cache_blobs(directory: Path) -> Path | None:
    """The blobs/ folder of the Hugging Face cache repo that `directory` (resolved) is a snapshot of, or lies in.

    huggingface_hub lays a cached repo out as models--org--name/{blobs,refs,snapshots/<commit>}, and every file
    of a snapshot is a symlink into ../../blobs/<hash>: those links are the cache working as designed, so they
    are followed, whether the snapshot was named by repo id or passed as a directory. Links anywhere else (a
    user's checkpoint directory pointing at /etc, or a snapshot pointing at another repo's blobs) are not."""
    for snapshot in (directory, *directory.parents):
        snapshots = snapshot.parent
        repo = snapshots.parent
        if (
            snapshots.name == "snapshots"
            and snapshot != snapshots
            and repo.name.startswith(_CACHE_REPO_PREFIXES)
        ):
            blobs = repo / "blobs"
            return blobs.resolve() if blobs.is_dir() else None
    return None


def checked_file(root: Path, link_root: Path, rel: str, what: str) -> Path:
    """A file named relative to the checkpoint, refused if it escapes the checkpoint: a symlink must resolve
    below root, or below link_root (the cache's blobs/ for a Hugging Face cache snapshot)."""
    if os.path.isabs(rel) or ".." in Path(rel).parts:
        raise InputError(f"{what} names {rel!r}, which is outside the checkpoint directory")
    path = root / rel
    if path.is_symlink() or path.exists():
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError) as exc:  # RuntimeError: pathlib's symlink loop
            why = (
                "a symlink loop"
                if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == 40
                else "a dangling symlink"
                if isinstance(exc, FileNotFoundError)
                else (exc.strerror or str(exc))
            )
            raise InputError(f"{rel} is {why}; cannot read it") from None
        if not (target.is_relative_to(root) or target.is_relative_to(link_root)):
            raise InputError(
                f"{rel} is a symlink to {target}, outside the checkpoint directory; copy the file in instead"
            )
    return path


def _read_by_name(name: str) -> bool:
    """The entries a checkpoint's readers open because of their name."""
    return name in ("config.json", "hf_quant_config.json", INDEX_NAME) or name.endswith(".safetensors")


def open_source(spec: str) -> Source:
    root, link_root = resolve_path(spec)
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise InputError(f"cannot list {spec}: {exc.strerror}") from None
    if not entries:
        raise InputError(f"{spec} is an empty directory; expected config.json and *.safetensors")
    files: list[Path] = []
    for entry in entries:
        if entry.is_symlink():
            checked_file(root, link_root, entry.name, "directory listing")
            if not entry.exists():
                raise InputError(f"{entry.name} is a dangling symlink")
        try:
            mode = entry.stat().st_mode
        except OSError as exc:  # a symlink loop, or a file that vanished
            raise InputError(f"cannot read {entry.name}: {exc.strerror or exc}") from None
        if stat.S_ISREG(mode):
            files.append(entry)
        elif _read_by_name(entry.name) and not stat.S_ISDIR(mode):
            raise InputError(f"{entry.name} is {file_kind(mode)}, not a regular file; refusing to open it")
    names = {p.name: p for p in files}
    config = names.get("config.json")
    if config is None and (root / "config.json").exists():
        raise InputError(f"{spec}/config.json is not a regular file; expected the drafter's JSON config")
    if config is None:
        shown = ", ".join(p.name for p in entries[:6]) + (" ..." if len(entries) > 6 else "")
        raise InputError(
            f"{spec} has no config.json (found: {shown}); expected a drafter checkpoint directory"
        )
    return Source(
        root=root,
        link_root=link_root,
        label=spec,
        config=config,
        safetensors=tuple(p for p in files if p.name.endswith(".safetensors")),
        index=names.get(INDEX_NAME),
        hf_quant_config=names.get("hf_quant_config.json"),
        pickles=tuple(p for p in files if p.name.endswith(PICKLE_SUFFIXES)),
    )


JSON_LIMIT = 4 << 20  # config.json, hf_quant_config.json, probe and baseline files
INDEX_LIMIT = 32 << 20  # model.safetensors.index.json: a weight_map line per tensor


def require_regular(path: Path, what: str) -> int:
    """The size of `path`, refused unless it is a regular file (readfile.regular_size)."""
    return regular_size(path, what=what)


def read_small(path: Path, what: str, limit: int = JSON_LIMIT) -> bytes:
    """A small file read whole with a cap (readfile.read_regular_file)."""
    return read_regular_file(path, what=what, max_bytes=limit)
