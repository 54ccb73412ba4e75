"""config.json normalization: every key the loaders read, where they read it, each change recorded.

Only values the checkpoint itself determines are synthesized (architecture from the head tensors,
shape-determined geometry, block size from the head's bias table). Values no tensor determines
(lilicorr_vector_eps, lilicorr_logit_scale, mask_token_id, target_layer_ids) are never guessed:
validate then refuses the output and the user supplies them with --set.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from typing import Any

from lilicorr_ckpt.checkpoint.config import LILICORR_KEYS
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.errors import UsageError

MOVED_TO_DFLASH = (
    *LILICORR_KEYS,
    "lilicorr_enabled",
    "projector_type",
    "conv_kernel_size",
    "conv_group_size",
)
COPIED_TO_DFLASH = ("mask_token_id", "target_layer_ids")
DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
MODEL_DTYPES = {
    "bfloat16": "BF16",
    "bf16": "BF16",
    "float16": "F16",
    "fp16": "F16",
    "half": "F16",
    "float32": "F32",
    "fp32": "F32",
    "float": "F32",
}
_ABSENT = object()
_HEAD_LAYER = re.compile(r"^lilicorr\.layers\.(\d+)\.")


class ConfigEditor:
    """A deep copy of config.json plus the list of changes made to it (for conversion.json)."""

    def __init__(self, raw: dict[str, Any], pinned: set[str]):
        self.doc = copy.deepcopy(raw)
        self.changes: list[dict[str, Any]] = []
        self.pinned = pinned  # dotted paths set by --set: normalization leaves them alone

    def get(self, path: str) -> Any:
        node: Any = self.doc
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    def has(self, path: str) -> bool:
        return self.get(path) is not _ABSENT

    def value(self, path: str, default: Any = None) -> Any:
        v = self.get(path)
        return default if v is _ABSENT else v

    def set(self, path: str, value: Any, reason: str, *, force: bool = False) -> None:
        if path in self.pinned and not force:
            return
        before = self.get(path)
        if before is not _ABSENT and before == value and type(before) is type(value):
            return
        parts = path.split(".")
        node = self.doc
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
        change: dict[str, Any] = {"key": path, "action": "set" if before is _ABSENT else "changed"}
        if before is not _ABSENT:
            change["before"] = before
        change["after"] = value
        change["reason"] = reason
        self.changes.append(change)

    def remove(self, path: str, reason: str) -> None:
        if path in self.pinned:
            return
        before = self.get(path)
        if before is _ABSENT:
            return
        parts = path.split(".")
        node = self.doc
        for part in parts[:-1]:
            node = node[part]
        del node[parts[-1]]
        self.changes.append({"key": path, "action": "removed", "before": before, "reason": reason})


JSON_KINDS = (
    (bool, "a boolean"),
    (int, "a number"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for t, name in JSON_KINDS if isinstance(value, t)), type(value).__name__)


def apply_overrides(editor: ConfigEditor, overrides: tuple[tuple[str, Any], ...]) -> None:
    """--set, in order. A key under a value that is not an object is a usage error (never replaced by one)."""
    for path, value in overrides:
        parts = path.split(".")
        node: Any = editor.doc
        for depth, part in enumerate(parts[:-1]):
            if part not in node:
                break  # the rest of the path is created
            node = node[part]
            if not isinstance(node, dict):
                parent = ".".join(parts[: depth + 1])
                shown = json.dumps(node, allow_nan=True)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise UsageError(
                    f"--set {path}={json.dumps(value, allow_nan=True)}: {parent} is {shown} ({_kind(node)}), not an object, so it has no "
                    f"key {parts[depth + 1]!r}; set {parent} itself, e.g. --set {parent}=VALUE"
                )
        editor.set(path, value, "--set on the command line", force=True)


# Model-Optimizer's flat DSpark names -> the served layout (DeepSpec's nesting), which SGLang and vLLM load
DSPARK_FLAT_TO_SERVED = {
    "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight",
    "gate_proj.weight": "markov_head.gate_proj.weight",
    "gate_proj.bias": "markov_head.gate_proj.bias",
    "joint_proj.weight": "markov_head.joint_proj.weight",
    "joint_proj.bias": "markov_head.joint_proj.bias",
    "confidence_proj.weight": "confidence_head.proj.weight",
    "confidence_proj.bias": "confidence_head.proj.bias",
}


def architecture_for(tensors: dict[str, TensorInfo]) -> str:
    """The architecture the runtimes load for the head the tensors carry: DFlash2DraftModel; Qwen3DSparkModel
    for DSpark (vLLM routes DSparkDraftModel to DeepSeek-V4; SGLang's entry class is Qwen3DSparkModel);
    DFlashDraftModel with projector_type "domino" for Domino (what SGLang loads)."""
    names = tensors.keys()
    if any(n.startswith("lilicorr.") for n in names):
        return "LiLiCorrDraftModel"
    if any(n.startswith("candidate_selector.") for n in names):
        return "DFlash2DraftModel"
    if any(n.startswith(("markov_head.", "confidence_head.")) or n in DSPARK_FLAT_TO_SERVED for n in names):
        return "Qwen3DSparkModel"
    return "DFlashDraftModel"


def sibling_of(tensors: dict[str, TensorInfo]) -> str | None:
    names = tensors.keys()
    if any(n.startswith(("prefix_gru.", "embed_proj.")) for n in names):
        return "domino"
    if architecture_for(tensors) == "Qwen3DSparkModel":
        return "dspark"
    if architecture_for(tensors) == "DFlash2DraftModel":
        return "dflash2"
    return None


def _sibling_config(editor: ConfigEditor, family: str) -> None:
    """The config keys where the loaders that serve each sibling read them (docs/validate.md, sibling heads)."""
    if family == "dflash2":
        editor.set("dflash_config.projector_type", "dflash2", "DFlash2 head present")
    elif family == "domino":
        editor.set(
            "dflash_config.projector_type",
            "domino",
            "SGLang loads Domino as DFlashDraftModel with projector_type domino",
        )
        nested, top = editor.get("dflash_config.emb_dim"), editor.get("emb_dim")
        if nested is _ABSENT and top is not _ABSENT:
            editor.set("dflash_config.emb_dim", top, "Domino readers take emb_dim from dflash_config")
        elif top is _ABSENT and nested is not _ABSENT:
            editor.set("emb_dim", nested, "the reference checkpoint writes emb_dim at both levels")
    elif family == "dspark":
        for key in ("markov_rank", "markov_head_type"):
            nested = editor.get(f"dflash_config.{key}")
            if nested is not _ABSENT and not editor.has(key):
                editor.set(key, nested, "SGLang and vLLM read it from the top level")
        conf = editor.get("dflash_config.use_confidence_head")
        if conf is not _ABSENT and not editor.has("enable_confidence_head"):
            editor.set("enable_confidence_head", conf, "the served layout's confidence switch")
            editor.set(
                "confidence_head_with_markov", True, "Model-Optimizer's confidence head reads [h ; W1[x]]"
            )


def _dim(tensors: dict[str, TensorInfo], name: str, axis: int, ndim: int) -> int | None:
    info = tensors.get(name)
    if info is None or len(info.shape) != ndim:
        return None
    return info.shape[axis]


# (config key, tensor, axis, rank): the head tensor dimension each lilicorr_* key is read from
_HEAD_DIMS = (
    ("lilicorr_hidden_size", "lilicorr.pass_hidden_proj.weight", 0, 2),  # [h, M]
    ("lilicorr_candidate_topk", "lilicorr.rank_embedding", 3, 5),  # [1, 1, 1, K, h]
    ("lilicorr_num_heads", "lilicorr.relative_slot_bias", 0, 2),  # [N, 2B-1]
    ("lilicorr_factor_dim", "lilicorr.out_head.weight", 0, 2),  # [F, h]
)


def head_geometry_from_tensors(tensors: dict[str, TensorInfo]) -> dict[str, Any]:
    """The lilicorr_* keys the head's tensor shapes determine (canonical names)."""
    out: dict[str, Any] = {}
    for key, name, axis, rank in _HEAD_DIMS:
        size = _dim(tensors, name, axis, rank)
        if size is not None:
            out[key] = size
    h = out.get("lilicorr_hidden_size")
    layers = {int(m.group(1)) for name in tensors if (m := _HEAD_LAYER.match(name))}
    if layers:
        out["lilicorr_num_layers"] = max(layers) + 1
    r = _dim(tensors, "lilicorr.layers.0.mlp.up_proj.weight", 0, 2)
    if r is not None and h:
        out["lilicorr_mlp_ratio"] = r / h
    return out


def block_size_from_tensors(tensors: dict[str, TensorInfo]) -> int | None:
    cols = _dim(tensors, "lilicorr.relative_slot_bias", 1, 2)
    if cols is not None and cols % 2 == 1:
        return (cols + 1) // 2
    slots = _dim(tensors, "lilicorr.slot_embedding", 2, 5)
    return slots + 1 if slots is not None else None


def conv_geometry_from_tensors(tensors: dict[str, TensorInfo], hidden: Any) -> tuple[int, int] | None:
    base = next(
        (
            t
            for n, t in sorted(tensors.items())
            if n.endswith((".attention_conv.base_kernel", ".mlp_conv.base_kernel"))
        ),
        None,
    )
    if base is None or len(base.shape) != 3:
        return None
    taps = base.shape[1]
    proj = next((t for n, t in sorted(tensors.items()) if n.endswith("_conv.kernel_projection.weight")), None)
    if proj is None or len(proj.shape) != 2 or not isinstance(hidden, int) or taps <= 0:
        return None
    groups, rem = divmod(proj.shape[0], 2 * taps)
    if rem or groups <= 0 or hidden % groups:
        return None
    return taps, hidden // groups


def model_dtype(editor: ConfigEditor, tensors: dict[str, TensorInfo]) -> str:
    """The float dtype repaired modules are written in: torch_dtype (or dtype), else the majority float dtype."""
    for key in ("torch_dtype", "dtype"):
        name = editor.value(key)
        if isinstance(name, str) and name.lower() in MODEL_DTYPES:
            return MODEL_DTYPES[name.lower()]
    counts = Counter(t.dtype for t in tensors.values() if t.dtype in DTYPE_NAMES)
    dtype = max(sorted(counts), key=lambda d: counts[d]) if counts else "BF16"
    editor.set(
        "torch_dtype",
        DTYPE_NAMES[dtype],
        "the repaired modules' dtype: torch_dtype was absent, so the checkpoint's most common float dtype",
    )
    return dtype


def normalize_config(editor: ConfigEditor, tensors: dict[str, TensorInfo]) -> None:
    """Rewrite `editor.doc` in place for the canonical `tensors` (quantization metadata excepted)."""
    arch = architecture_for(tensors)
    declared = editor.value("architectures")
    if declared != [arch]:
        editor.set("architectures", [arch], "set from the head the checkpoint carries")
    if not isinstance(editor.value("dflash_config"), dict):
        editor.set("dflash_config", {}, "every DFlash-family loader reads its keys from dflash_config")

    for key in MOVED_TO_DFLASH:
        top = editor.get(key)
        if top is _ABSENT:
            continue
        if not editor.has(f"dflash_config.{key}"):
            editor.set(f"dflash_config.{key}", top, "the loaders read it only from dflash_config")
        editor.remove(key, "moved into dflash_config")
    for key in COPIED_TO_DFLASH:
        top = editor.get(key)
        if top is not _ABSENT and not editor.has(f"dflash_config.{key}"):
            editor.set(f"dflash_config.{key}", top, "MLX-style readers require it in dflash_config")

    family = sibling_of(tensors)
    if family:
        _sibling_config(editor, family)
    if arch == "LiLiCorrDraftModel":
        editor.set("dflash_config.projector_type", "lilicorr", "LiLiCorr head present")
        editor.set("dflash_config.lilicorr_enabled", True, "LiLiCorr head present")
        for key, value in head_geometry_from_tensors(tensors).items():
            if not editor.has(f"dflash_config.{key}"):
                editor.set(f"dflash_config.{key}", value, "determined by the head tensors' shapes")

    conv_present = any(".attention_conv." in n or ".mlp_conv." in n for n in tensors)
    taps, group = (
        editor.value("dflash_config.conv_kernel_size"),
        editor.value("dflash_config.conv_group_size"),
    )
    if conv_present and not (isinstance(taps, int) and taps > 0 and isinstance(group, int) and group > 0):
        derived = conv_geometry_from_tensors(tensors, editor.value("hidden_size"))
        if derived is not None:
            editor.set(
                "dflash_config.conv_kernel_size", derived[0], "determined by the convolution tensors' shapes"
            )
            editor.set(
                "dflash_config.conv_group_size", derived[1], "determined by the convolution tensors' shapes"
            )

    _block_size(editor, tensors)

    if "lm_head.weight" in tensors and editor.value("has_own_lm_head") is not True:
        editor.set(
            "has_own_lm_head",
            True,
            "the checkpoint carries lm_head.weight (vLLM treats any lm_head "
            "tensor as owned; TensorRT-LLM reads this flag)",
        )


def _block_size(editor: ConfigEditor, tensors: dict[str, TensorInfo]) -> None:
    nested, top = editor.get("dflash_config.block_size"), editor.get("block_size")
    if "block_size" in editor.pinned and top is not _ABSENT:
        value, why = top, "--set block_size"
    elif nested is not _ABSENT:
        value, why = nested, "dflash_config.block_size wins in SGLang, vLLM and TRT"
    elif top is not _ABSENT:
        value, why = top, "copied from the top level"
    else:
        value = block_size_from_tensors(tensors)
        why = "determined by lilicorr.relative_slot_bias [heads, 2*block_size-1]"
        if value is None:
            return  # validate refuses it; the user supplies it with --set
    editor.set("dflash_config.block_size", value, why, force="block_size" in editor.pinned)
    editor.set(
        "block_size",
        value,
        "kept at the top level for older readers",
        force="dflash_config.block_size" in editor.pinned,
    )
