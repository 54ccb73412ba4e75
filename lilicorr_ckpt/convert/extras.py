"""The files of SRC that are not part of the checkpoint being converted: copied unchanged, or left out.

Model cards, licences, tokenizer files, chat templates, generation_config.json and other metadata travel
with the drafter, so they are copied byte for byte. Weights in another format (pickles, GGUF, NumPy, HDF5,
Flax) and safetensors files or indexes that are not part of the source checkpoint would be stale duplicates
of the converted weights, so they are left out; so are subdirectories. Both lists are recorded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lilicorr_ckpt.errors import InputError

PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
OTHER_WEIGHTS = (".gguf", ".npz", ".npy", ".h5", ".hdf5", ".msgpack", ".onnx", ".tflite")
RECORD_NAME = "conversion.json"


def drop_reason(name: str, written: set[str]) -> str | None:
    """Why a top-level file of SRC that the conversion does not read is left out (None: copy it)."""
    lower = name.lower()
    if name == RECORD_NAME:
        return "the record of an earlier conversion; DST/conversion.json records this one"
    if name in written:
        return "the conversion writes its own file of this name"
    if lower.endswith(PICKLE_WEIGHTS):
        return "weights in a pickle format (never opened): a stale duplicate of the converted safetensors"
    if lower.endswith(OTHER_WEIGHTS):
        return (
            f"weights in another format ({lower.rsplit('.', 1)[1]}): a stale duplicate of the converted "
            "safetensors"
        )
    if lower.endswith(".safetensors"):
        return "safetensors file that is not part of the source checkpoint"
    if lower.endswith(".index.json"):
        return "weight index that is not part of the source checkpoint"
    return None


def classify(root: Path, read: set[str], written: set[str]) -> tuple[list[str], list[dict[str, str]]]:
    """(files to copy unchanged, [{file, reason}] left out) for every entry of `root` not in `read`.

    `read` are the source files the conversion reads and rewrites, `written` the names it writes."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"cannot list {root}: {exc.strerror or exc}") from None
    copied: list[str] = []
    dropped: list[dict[str, str]] = []
    for entry in entries:
        if entry.name in read:
            continue
        try:
            is_dir, is_file = entry.is_dir(), entry.is_file()  # through symlinks (HF cache snapshots)
        except OSError as exc:
            raise InputError(f"cannot read {root / entry.name}: {exc.strerror or exc}") from None
        if is_dir:
            dropped.append(
                {
                    "file": entry.name + "/",
                    "reason": "subdirectory: convert copies only the files at the top level of SRC",
                }
            )
        elif not is_file:
            dropped.append({"file": entry.name, "reason": "not a regular file"})
        elif (why := drop_reason(entry.name, written)) is not None:
            dropped.append({"file": entry.name, "reason": why})
        else:
            copied.append(entry.name)
    return copied, dropped


def record(copied: list[str], dropped: list[dict[str, str]]) -> dict[str, Any]:
    return {"copied": list(copied), "dropped": [dict(d) for d in dropped]}
