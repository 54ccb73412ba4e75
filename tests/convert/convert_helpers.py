"""Helpers for the convert tests (import as `from convert_helpers import ...`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-modelopt-nvfp4"


def tensors_of(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw bytes) over every safetensors file of a checkpoint (or one file)."""
    out = {}
    path = Path(path)
    for file in [path] if path.is_file() else sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            names = list(f.keys())
        header_len = int.from_bytes(file.read_bytes()[:8], "little")
        header = json.loads(file.read_bytes()[8 : 8 + header_len])
        data = file.read_bytes()[8 + header_len :]
        for name in names:
            h = header[name]
            a, b = h["data_offsets"]
            out[name] = (h["dtype"], tuple(h["shape"]), data[a:b])
    return out


def metadata_of(file: Path) -> dict[str, str]:
    with safe_open(str(file), framework="numpy") as f:
        return f.metadata() or {}


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(path).rglob("*"))
        if p.is_file()
    }


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def bf16_to_f32(raw: bytes) -> np.ndarray:
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
