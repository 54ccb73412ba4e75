"""The speculators format (vllm-project/speculators): a drafter config read as the z-lab config it stands for.

A speculators config.json has `speculators_config` and `speculators_model_type` and no `model_type`; the draft's
geometry is a nested transformers config (`transformer_layer_config`), its taps are `aux_hidden_state_layer_ids`
(the z-lab `target_layer_ids` plus one) and its block is the proposal's `speculative_tokens`. The tensors use the
z-lab names.

`translate` rewrites it exactly as vLLM's reader does (transformers_utils/configs/speculators/algos.py
update_dflash / update_dflash2 / update_dspark over base.py extract_transformers_pre_trained_config): the nested
config is the base, then each kind's keys. That is the config vLLM serves, and the one every check judges; what
vLLM takes from elsewhere is added the way a z-lab config states it (the block from the proposal, the top-level
dtype and quantization_config, has_own_lm_head for the lm_head a reduced draft vocabulary saves). Everything the
checks need about the original layout (what speculators trained with, what vLLM's translation could not read)
is kept in `SpeculatorsOrigin`. Reading never raises for the content: what cannot be read is recorded.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

import msgspec

# speculators_model_type -> the architecture vLLM's translation declares (the DFlash family kinds)
KINDS: dict[str, str] = {
    "dflash": "DFlashDraftModel",
    "dflash2": "DFlash2DraftModel",
    "dspark": "Qwen3DSparkModel",
}
# the other kinds speculators writes: no DFlash-family drafter
OTHER_KINDS = ("xpress", "eagle3", "mtp", "peagle")
# update_dflash2 copies these into dflash_config when not null
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# update_dspark copies these to the top level when not null
DSPARK_KEYS = (
    "draft_vocab_size",
    "target_hidden_size",
    "mask_token_id",
    "markov_rank",
    "markov_head_type",
    "block_size",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "use_aux_hidden_state",
)
# the DSpark architectures update_dspark keeps when declared (otherwise Qwen3DSparkModel)
DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")
# speculators' class defaults (models/<kind>/config.py): what speculators itself reads when a key is absent
SAMPLE_FROM_ANCHOR_DEFAULT = {"dflash": False, "dflash2": False, "dspark": True}
SLIDING_WINDOW_NON_CAUSAL_DEFAULT = {
    "dflash": False,
    "dflash2": True,
    "dspark": False,
}  # DFlash2SpeculatorConfig: true
# the speculators release whose layout `lilicorr-ckpt convert --to speculators` writes (speculators_version)
FORMAT_VERSION = "0.9.0"

_ABSENT = object()

# how reports name a config.json's layout: "z-lab" (dflash_config; z-lab, SGLang and ModelOpt write it) or
# "speculators" (what vllm-project/speculators writes)
ZLAB_LAYOUT, SPECULATORS_LAYOUT = "z-lab", "speculators"


def layout_name(origin: SpeculatorsOrigin | None) -> str:
    """The layout of a config.json parse_config read: the speculators layout when it was translated."""
    return SPECULATORS_LAYOUT if origin is not None else ZLAB_LAYOUT


def is_speculators(raw: Mapping[str, Any]) -> bool:
    """A config vLLM reads as a speculators config: `speculators_config` (not null) and no `model_type`
    (transformers_utils/config.py HfConfigParser.parse)."""
    return raw.get("model_type") is None and raw.get("speculators_config") is not None


def kind_of(raw: Mapping[str, Any]) -> str | None:
    kind = raw.get("speculators_model_type")
    return kind if isinstance(kind, str) else None


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class SpeculatorsOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """A config read from the speculators layout: what was written, and what vLLM's translation made of it."""

    kind: str  # speculators_model_type: dflash | dflash2 | dspark
    version: Any = None  # speculators_version as written
    architectures: Any = None  # architectures as written (vLLM replaces them)
    verifier: Any = None  # speculators_config.verifier.name_or_path (None when absent)
    verifier_architectures: Any = None
    speculative_tokens: int | None = None  # speculators_config.proposal_methods[0].speculative_tokens
    block_size: int | None = None  # the top-level block_size as written
    aux_hidden_state_layer_ids: list[int] | None = None
    draft_vocab_size: Any = None
    # as written; None when absent (absent_keys says which were)
    sample_from_anchor: Any = None
    sliding_window_non_causal: Any = None
    absent_keys: tuple[str, ...] = ()
    layer_types: tuple[str, ...] = ()  # the nested config's, one per draft layer (full_attention when absent)
    # why vLLM's translation fails on this config (KeyError, TypeError ...): it reads nothing then
    unread: tuple[str, ...] = ()
    # what base.py validate_speculators_config requires when the speculator is served alone, missing
    serve_alone_missing: tuple[str, ...] = ()
    # the translated config's JSON paths -> the paths in the file as written (for pointers)
    paths: dict[str, str] = {}
    document: dict[str, Any] = {}  # config.json as written

    def written(self, key: str) -> bool:
        return key not in self.absent_keys

    @property
    def trained_sample_from_anchor(self) -> bool | None:
        """Whether the drafter was trained anchor-first: the key as speculators writes it, or (absent) the layout
        the proposal implies (speculative_tokens = block_size anchor-first, block_size - 1 fill-in;
        models/dflash/core.py `_build_base_config_kwargs`); None when neither says."""
        if self.written("sample_from_anchor") and isinstance(self.sample_from_anchor, bool):
            return self.sample_from_anchor
        n, b = self.speculative_tokens, self.block_size
        if n is not None and b is not None:
            if n == b:
                return True
            if n == b - 1:
                return False
        return None

    @property
    def served_sample_from_anchor(self) -> bool:
        """What vLLM's translation sets: the key as written, false when absent (algos.py update_dspark)."""
        return bool(self.sample_from_anchor) if self.written("sample_from_anchor") else False

    @property
    def trained_non_causal_sliding(self) -> bool:
        """speculators' mask for sliding layers (models/dflash/attention.py: full layers are always bidirectional)."""
        if self.written("sliding_window_non_causal"):
            return bool(self.sliding_window_non_causal)
        return SLIDING_WINDOW_NON_CAUSAL_DEFAULT.get(self.kind, False)

    def trained_causal(self, layer: int) -> bool:
        sliding = layer < len(self.layer_types) and self.layer_types[layer] == "sliding_attention"
        return sliding and not self.trained_non_causal_sliding

    def original_path(self, path: str) -> str:
        """The JSON path in config.json as written for a path of the translated config (itself when unmapped)."""
        if path in self.paths:
            return self.paths[path]
        for prefix, original in self.paths.items():
            if path.startswith(prefix + "[") or path.startswith(prefix + "."):
                return original + path[len(prefix) :]
        return path


class Translation(msgspec.Struct, frozen=True):
    config: dict[str, Any]  # the config vLLM serves, in the z-lab form
    origin: SpeculatorsOrigin


def translate(raw: dict[str, Any]) -> Translation:
    """The z-lab config a speculators config stands for, as vLLM's reader builds it (see the module docstring)."""
    kind = kind_of(raw) or ""
    unread: list[str] = []
    paths: dict[str, str] = {}
    nested = raw.get("transformer_layer_config", {})
    if not isinstance(nested, dict):
        unread.append("transformer_layer_config is not an object (algos.py indexes it as a dict)")
        nested = {}
    out: dict[str, Any] = copy.deepcopy(nested)
    for key in nested:
        paths[f"$.{key}"] = f"$.transformer_layer_config.{key}"

    def top(key: str, value: Any, source: str | None = None) -> None:
        out[key] = value
        paths[f"$.{key}"] = f"$.{source or key}"

    aux = raw.get("aux_hidden_state_layer_ids", _ABSENT)
    aux_ok = isinstance(aux, list) and all(_int(i) for i in aux)
    if aux is _ABSENT:
        unread.append("aux_hidden_state_layer_ids is absent (a KeyError in algos.py)")
    elif not aux_ok:
        unread.append("aux_hidden_state_layer_ids is not a list of integers (`i - 1` fails in algos.py)")
    taps = [i - 1 for i in aux] if aux_ok else None
    if kind in ("dflash", "dflash2"):
        top("architectures", [KINDS[kind]], "architectures")
        top("draft_vocab_size", raw.get("draft_vocab_size"))
        if raw.get("target_hidden_size") is not None:
            top("target_hidden_size", raw["target_hidden_size"])
        if aux is not _ABSENT:
            top("eagle_aux_hidden_state_layer_ids", aux, "aux_hidden_state_layer_ids")
        d: dict[str, Any] = {}
        if "mask_token_id" in raw:
            d["mask_token_id"] = raw["mask_token_id"]
        else:
            unread.append("mask_token_id is absent (a KeyError in algos.py update_dflash)")
        if taps is not None:
            d["target_layer_ids"] = taps
        d["sample_from_anchor"] = raw.get("sample_from_anchor", False)
        d["causal"] = not raw.get("sliding_window_non_causal", True)
        if kind == "dflash2":
            for key in DFLASH2_KEYS:
                if raw.get(key) is not None:
                    d[key] = raw[key]
        out["dflash_config"] = d
        for key in d:
            paths[f"$.dflash_config.{key}"] = f"$.{key}"
        paths["$.dflash_config.target_layer_ids"] = "$.aux_hidden_state_layer_ids"
        paths["$.dflash_config.causal"] = "$.sliding_window_non_causal"
    elif kind == "dspark":
        declared = raw.get("architectures")
        kept = [a for a in declared if a in DSPARK_ARCHITECTURES] if isinstance(declared, list) else []
        top("architectures", kept or ["Qwen3DSparkModel"])
        anchor = raw.get("sample_from_anchor", False)
        top("sample_from_anchor", anchor)
        top("dspark_bonus_anchor", not anchor, "sample_from_anchor")
        if aux is not _ABSENT:
            top("eagle_aux_hidden_state_layer_ids", aux, "aux_hidden_state_layer_ids")
        if taps is not None:
            top("target_layer_ids", taps, "aux_hidden_state_layer_ids")
        for key in DSPARK_KEYS:
            if raw.get(key) is not None:
                top(key, raw[key])
    # what vLLM takes from elsewhere, written as the z-lab form states it
    spec = raw.get("speculators_config")
    spec = spec if isinstance(spec, dict) else {}
    methods = spec.get("proposal_methods")
    first = methods[0] if isinstance(methods, list) and methods and isinstance(methods[0], dict) else {}
    tokens = first.get("speculative_tokens")
    tokens = tokens if _int(tokens) else None
    written_block = raw.get("block_size")
    written_block = written_block if _int(written_block) else None
    if kind in ("dflash", "dflash2"):  # the query block: the anchor and speculative_tokens masks
        if tokens is not None:
            top("block_size", tokens + 1, "speculators_config.proposal_methods[0].speculative_tokens")
        elif "block_size" in raw:
            top("block_size", raw["block_size"])
    for key in ("dtype", "torch_dtype"):
        if key in raw and key not in out:
            top(key, raw[key])
    if "quantization_config" in raw:  # transformers_utils/config.py get_config reads it from the file
        top("quantization_config", raw["quantization_config"])
    vocab, draft_vocab = out.get("vocab_size"), out.get("draft_vocab_size")
    if _int(vocab) and _int(draft_vocab) and 0 < draft_vocab < vocab:
        # the reduced-vocabulary head speculators saves (lm_head + d2t); vLLM owns any lm_head it loads
        top("has_own_lm_head", True, "draft_vocab_size")
    verifier = spec.get("verifier")
    verifier = verifier if isinstance(verifier, dict) else {}
    missing = []
    if tokens is None:
        missing.append("speculators_config.proposal_methods[0].speculative_tokens")
    if "name_or_path" not in verifier:
        missing.append("speculators_config.verifier.name_or_path")
    if not isinstance(raw.get("transformer_layer_config"), dict):
        missing.append("transformer_layer_config")
    n_layers = nested.get("num_hidden_layers")
    layer_types = nested.get("layer_types")
    if isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types):
        types = tuple(layer_types)
    else:
        types = ("full_attention",) * (n_layers if _int(n_layers) and 0 < n_layers <= 4096 else 0)
    watched = (
        "sample_from_anchor",
        "sliding_window_non_causal",
        "mask_token_id",
        "aux_hidden_state_layer_ids",
    )
    origin = SpeculatorsOrigin(
        kind=kind,
        version=raw.get("speculators_version"),
        architectures=raw.get("architectures"),
        verifier=verifier.get("name_or_path"),
        verifier_architectures=verifier.get("architectures"),
        speculative_tokens=tokens,
        block_size=written_block,
        aux_hidden_state_layer_ids=list(aux) if aux_ok else None,
        draft_vocab_size=raw.get("draft_vocab_size"),
        sample_from_anchor=raw.get("sample_from_anchor"),
        sliding_window_non_causal=raw.get("sliding_window_non_causal"),
        absent_keys=tuple(k for k in watched if k not in raw),
        layer_types=types,
        unread=tuple(unread),
        serve_alone_missing=tuple(missing),
        paths=paths,
        document=raw,
    )
    return Translation(out, origin)


# huggingface_hub's validate_repo_id (utils/_validators.py), which vLLM applies to the verifier
_REPO_ID = re.compile(
    r"""
    (\b[\w\-.]{1,96}\b/)?
    \b
    [\w\-.]{1,96}
    \b
    """,
    flags=re.VERBOSE,
)


def hub_repo_id_problem(value: Any) -> str | None:
    """Why `value` is not a Hub repo id as huggingface_hub's validate_repo_id judges it; None when it is one."""
    if not isinstance(value, str):
        return f"it is not a string ({type(value).__name__})"
    if value.count("/") > 1:
        return "it has more than one `/` (a path)"
    if not _REPO_ID.fullmatch(value):
        return "it is not `name` or `namespace/name` of letters, digits, `-`, `_` and `.`"
    if "--" in value or ".." in value:
        return "it holds `--` or `..`"
    if value.endswith(".git"):
        return "it ends with `.git`"
    return None
