"""Fuzz cases: a valid tiny drafter of one head kind with one thing changed, described by four words so a case is a
corpus row as written (`Case("lilicorr", "dflash", "block_size", "int_string")`).

- `base`: the drafter it starts from (BASES: LiLiCorr, LiLiCorr with convolutions, LiLiCorr NVFP4, DFlash,
  DFlash2, DSpark, Domino);
- `where`: `top` or `dflash` (a config.json key at the top level or inside dflash_config) or `tensor`;
- `key`: the config key, or the tensor it changes;
- `op`: for a key, what it becomes (OPS_KEY: absent, null, the wrong type, an int written as a string, a whole
  float, 0, negative, huge, an empty string, NaN, true, false, the valid value and a half); for a tensor
  (OPS_TENSOR): dropped, an extra one beside it, renamed, reshaped, re-typed, or quantized instead of float and
  back.

Every case is deterministic: it is built from the fixtures' seeded tensors, never from a random stream.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import nvfp4_quantize

OPS_KEY = (
    "absent",
    "null",
    "list",
    "object",
    "int_string",
    "whole_float",
    "zero",
    "negative",
    "huge",
    "empty_string",
    "nan",
    "true",
    "false",
    "fraction",
)
OPS_TENSOR = ("drop", "extra", "rename", "reshape", "retype", "quantize", "dequantize")


def _lilicorr() -> dict[str, Any]:
    return fixtures.draft_config()


BASES: dict[str, tuple[Callable[[], dict[str, Any]], dict[str, Any]]] = {
    # name -> (config factory, write_checkpoint keywords)
    "lilicorr": (_lilicorr, {}),
    "lilicorr-conv": (lambda: fixtures.draft_config(conv=(2, 16)), {}),
    "lilicorr-nvfp4": (_lilicorr, {"quant": "NVFP4"}),
    "dflash": (lambda: fixtures.draft_config(head=False), {}),
    "dflash2": (lambda: fixtures.sibling_config("dflash2"), {}),
    "dspark": (lambda: fixtures.sibling_config("dspark-deepspec"), {}),
    "domino": (lambda: fixtures.sibling_config("domino"), {}),
}


class Case(NamedTuple):
    base: str
    where: str
    key: str
    op: str

    @property
    def name(self) -> str:
        key = "".join(c if c.isalnum() else "_" for c in self.key)
        return f"{self.base}-{self.where}-{key}-{self.op}"

    def __str__(self) -> str:
        return f"Case({self.base!r}, {self.where!r}, {self.key!r}, {self.op!r})"

    def build(self, path: Path) -> Path:
        """The checkpoint directory of this case, written at `path`."""
        factory, kw = BASES[self.base]
        config = factory()
        mutate = _tensor_op(self) if self.where == "tensor" else None
        fixtures.write_checkpoint(path, copy.deepcopy(config), mutate=mutate, **kw)
        if self.where in ("top", "dflash"):
            doc = json.loads((path / "config.json").read_text())
            block = doc if self.where == "top" else doc.setdefault("dflash_config", {})
            if isinstance(block, dict):
                _key_op(block, self.key, self.op)
            (path / "config.json").write_text(json.dumps(doc, indent=1, allow_nan=True))
        return path


def _key_op(block: dict[str, Any], key: str, op: str) -> None:
    old = block.get(key)
    if op == "absent":
        block.pop(key, None)
        return
    number = old if isinstance(old, (int, float)) and not isinstance(old, bool) else 2
    value: Any = {
        "null": None,
        "list": [number],
        "object": {"value": number},
        "int_string": str(int(number)) if not (isinstance(number, float) and math.isnan(number)) else "2",
        "whole_float": float(int(number)) if isinstance(number, int) else number,
        "zero": 0,
        "negative": -int(abs(number)) - 1 if isinstance(number, int) else -abs(float(number)) - 1.0,
        "huge": 2**40,
        "empty_string": "",
        "nan": float("nan"),
        "true": True,
        "false": False,
        # no whole number: the valid value and a half (2.5 for a size of 2), which int() truncates back to it
        "fraction": number + 0.5,
    }[op]
    block[key] = value


def _tensor_op(case: Case) -> Callable[[fixtures.Tensors], None]:
    def apply(tensors: fixtures.Tensors) -> None:
        name = case.key
        if name not in tensors:
            return
        dtype, shape, data = tensors[name]
        if case.op == "drop":
            del tensors[name]
        elif case.op == "extra":
            tensors[_sibling_name(name)] = (dtype, shape, data)
        elif case.op == "rename":
            tensors[_sibling_name(name)] = tensors.pop(name)
        elif case.op == "reshape" and shape:
            grown = (shape[0] + 1, *shape[1:])
            item = len(data) // max(1, int(np.prod(shape)))
            tensors[name] = (dtype, grown, bytes(item * int(np.prod(grown))))
        elif case.op == "retype":
            if dtype == "BF16":  # the same values, wider: bf16 bits are the top half of float32's
                bits = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
                tensors[name] = ("F32", shape, bits.tobytes())
            elif dtype == "F16":
                tensors[name] = (
                    "F32",
                    shape,
                    np.frombuffer(data, dtype=np.float16).astype(np.float32).tobytes(),
                )
            elif dtype == "F32":
                tensors[name] = ("I32", shape, np.zeros(shape, dtype=np.int32).tobytes())
            else:
                tensors[name] = ("BF16", shape, bytes(2 * int(np.prod(shape))))
        elif (
            case.op == "quantize"
            and dtype in ("BF16", "F16", "F32")
            and len(shape) == 2
            and shape[1] % 16 == 0
        ):
            module = name.removesuffix(".weight")
            weight = np.linspace(-1.0, 1.0, int(np.prod(shape)), dtype=np.float32).reshape(shape)
            packed, scales, scale_2 = nvfp4_quantize(weight, 16, None)
            tensors[name] = ("U8", (shape[0], shape[1] // 2), packed.tobytes())
            tensors[f"{module}.weight_scale"] = ("F8_E4M3", (shape[0], shape[1] // 16), scales.tobytes())
            tensors[f"{module}.weight_scale_2"] = ("F32", (), np.float32(scale_2).tobytes())
            tensors[f"{module}.input_scale"] = ("F32", (), np.float32(0.01).tobytes())
        elif case.op == "dequantize" and dtype == "U8" and len(shape) == 2:
            module = name.removesuffix(".weight")
            for leaf in ("weight_scale", "weight_scale_2", "input_scale"):
                tensors.pop(f"{module}.{leaf}", None)
            full = (shape[0], shape[1] * 2)
            tensors[name] = ("BF16", full, bytes(2 * full[0] * full[1]))

    return apply


def _sibling_name(name: str) -> str:
    """Another plausible name: the next layer's, else the same name with `_alt` on its module."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            parts[i] = str(int(part) + 1)
            return ".".join(parts)
    if len(parts) > 1:
        parts[-2] += "_alt"
        return ".".join(parts)
    return name + "_alt"


def tensors_of(base: str) -> list[str]:
    factory, kw = BASES[base]
    return sorted(
        fixtures.checkpoint_tensors(factory(), quant=kw.get("quant"), unify_fused=True)
        if kw.get("quant")
        else fixtures.checkpoint_tensors(factory())
    )


def config_keys(base: str) -> tuple[list[str], list[str]]:
    """(top-level keys, dflash_config keys) of the base drafter's config."""
    config = BASES[base][0]()
    nested = config.get("dflash_config")
    return sorted(config), sorted(nested) if isinstance(nested, dict) else []


def generate(seed: int, read_keys: frozenset[str]) -> Callable[[], Case]:
    """A deterministic stream of cases: each draw picks a base, then a config key (one the base has, or one a
    release reads) and an op, or a tensor and an op."""
    rng = random.Random(seed)
    bases = sorted(BASES)
    keys = {b: config_keys(b) for b in bases}
    tensors = {b: tensors_of(b) for b in bases}
    extra = sorted(read_keys)

    def draw() -> Case:
        base = rng.choice(bases)
        kind = rng.random()
        if kind < 0.35:
            top, nested = keys[base]
            key = rng.choice(top + extra) if rng.random() < 0.7 else rng.choice(extra)
            return Case(base, "top", key, rng.choice(OPS_KEY))
        if kind < 0.7:
            top, nested = keys[base]
            key = rng.choice(nested + extra) if nested and rng.random() < 0.7 else rng.choice(extra)
            return Case(base, "dflash", key, rng.choice(OPS_KEY))
        return Case(base, "tensor", rng.choice(tensors[base]), rng.choice(OPS_TENSOR))

    return draw
