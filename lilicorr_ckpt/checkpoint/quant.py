"""Quantization metadata: ModelOpt's two config forms, and exclusion patterns that hold under every runtime.

How each runtime matches an exclusion name is its engine module's `match_exclusion` (lilicorr_ckpt/runtimes/).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.manifest import Manifest, QuantScheme, quant_scheme
from lilicorr_ckpt.checkpoint.names import TRAINING_PREFIXES, strip_prefixes
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.runtimes import MATCHERS, RuntimeProfile, excluded_by


class QuantConfig(msgspec.Struct, frozen=True, kw_only=True):
    source: str  # "config.json" or "hf_quant_config.json"
    form: str  # "nested" ({producer, quantization}) or "flat" ({quant_algo, ignore, quant_method})
    quant_algo: str | None
    group_size: int | None
    kv_cache_quant_algo: str | None
    exclude: tuple[str, ...]
    quant_method: str | None
    producer: str | None
    quantized_layers: dict[str, Any] | None  # MIXED_PRECISION per-layer algos
    missing_keys: tuple[str, ...]  # keys vLLM's nested-form parser requires but the document lacks
    # flat form only: where the exclusions and the group size were found
    exclude_key: str | None = None  # "ignore", "exclude_modules" (no `ignore`), or None (neither)
    top_group_size: int | None = None  # the top-level group_size (None: absent or invalid)
    nested_group_size: int | None = None  # config_groups.group_0.weights.group_size
    # flat form only: each exclusion list present, in FLAT_EXCLUSION_KEYS order (a runtime reads the first of
    # the keys it knows that is present, empty or not)
    flat_lists: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # weight_scale_encoding (NVFP4 block scales stored compressed, e.g. "csf"); None when absent
    scale_encoding: str | None = None

    def flat_exclusions_for(self, profile: RuntimeProfile) -> tuple[str | None, tuple[str, ...]]:
        """(the key `profile`'s runtime takes the flat form's exclusions from, or None: none it reads; them)."""
        lists = dict(self.flat_lists)
        key = next((k for k in profile.flat_exclusion_keys(self.quant_algo) if k in lists), None)
        return key, lists.get(key, ()) if key else ()

    def read_by(self, profile: RuntimeProfile) -> QuantConfig:
        """This config as `profile`'s runtime reads it (the flat form's exclusions and group size; a nested form
        inside config.json that the runtime flattens first)."""
        if self.form == "nested" and self.source == "config.json" and profile.flattens_inline_nested:
            # the nested block's quant_algo is hoisted to the top level and the flat reader finds no exclusion
            # key and no group size there
            nvfp4 = self.quant_algo is not None and "NVFP4" in self.quant_algo
            group = profile.flat_group_size_default if nvfp4 else self.group_size
            return msgspec.structs.replace(self, exclude=(), group_size=group)
        if self.form != "flat":
            return self
        qc = msgspec.structs.replace(self, exclude=self.flat_exclusions_for(profile)[1])
        if profile.flat_group_size_default is not None:
            group = self.top_group_size
            if group is None and profile.flat_group_size_from_config_groups:
                group = self.nested_group_size
            qc = msgspec.structs.replace(
                qc, group_size=group if group is not None else profile.flat_group_size_default
            )
        return qc

    def scheme_for(self, module: str) -> QuantScheme | None:
        """The scheme a module is quantized with if it is not excluded (None: not quantized / unknown)."""
        if self.quant_algo == "MIXED_PRECISION":
            entry = (self.quantized_layers or {}).get(module) or (self.quantized_layers or {}).get(
                "model." + module
            )
            if not isinstance(entry, dict) or not isinstance(entry.get("quant_algo"), str):
                return None
            group = entry.get("group_size")
            return quant_scheme(entry["quant_algo"], group if isinstance(group, int) else None)
        if self.quant_algo is None:
            return None
        return quant_scheme(self.quant_algo, self.group_size)

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "form": self.form,
            "quant_algo": self.quant_algo,
            "group_size": self.group_size,
            "quant_method": self.quant_method,
            "exclude": list(self.exclude),
        }


# the keys a flat quantization_config may list exclusions under
FLAT_EXCLUSION_KEYS = ("ignore", "modules_to_not_convert", "exclude_modules")


# distinct exclusion patterns in one list: every module is matched against every pattern for every release (20,000
# patterns in a 200 kB config took 134 s); real exports list a few hundred at most
MAX_EXCLUSIONS = 1024


def _strings(value: Any, what: str = "") -> tuple[str, ...] | None:
    """A list of strings, each once (a pattern listed twice excludes nothing more), in their first order; None when
    it is not a list of strings. InputError past MAX_EXCLUSIONS distinct patterns."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        patterns = tuple(dict.fromkeys(value))
        if len(patterns) > MAX_EXCLUSIONS:
            raise InputError(
                f"{what} lists {len(patterns)} distinct exclusion patterns; the limit is {MAX_EXCLUSIONS} (a "
                "drafter's export names a few: list the modules kept in float, or one wildcard for a family)"
            )
        return patterns
    return None


def _encoding(value: Any) -> str | None:
    """weight_scale_encoding as written (a non-string shown as JSON, so a rule can name it)."""
    if value is None:
        return None
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()[:60]


def parse_quant_config(doc: Any, source: str) -> tuple[QuantConfig | None, list[str]]:
    """(config, problems). Problems are human-readable; a None config means it cannot be used."""
    if not isinstance(doc, dict):
        return None, [f"{source}: quantization config must be a JSON object"]
    problems: list[str] = []
    if isinstance(doc.get("quantization"), dict):
        q = doc["quantization"]
        producer = doc.get("producer")
        missing = tuple(k for k in ("group_size", "kv_cache_quant_algo", "exclude_modules") if k not in q)
        exclude = _strings(q.get("exclude_modules") or [], f"{source}: quantization.exclude_modules")
        if exclude is None:
            problems.append(f"{source}: quantization.exclude_modules must be a list of strings")
            exclude = ()
        group = q.get("group_size")
        return QuantConfig(
            source=source,
            form="nested",
            quant_algo=q.get("quant_algo") if isinstance(q.get("quant_algo"), str) else None,
            group_size=group if isinstance(group, int) and group > 0 else None,
            kv_cache_quant_algo=q.get("kv_cache_quant_algo")
            if isinstance(q.get("kv_cache_quant_algo"), str)
            else None,
            exclude=exclude,
            quant_method=doc.get("quant_method") if isinstance(doc.get("quant_method"), str) else None,
            producer=producer.get("name") if isinstance(producer, dict) else None,
            quantized_layers=q.get("quantized_layers")
            if isinstance(q.get("quantized_layers"), dict)
            else None,
            missing_keys=missing,
            scale_encoding=_encoding(q.get("weight_scale_encoding", doc.get("weight_scale_encoding"))),
        ), problems
    if "quant_algo" in doc or "ignore" in doc or "quant_method" in doc:
        key = "ignore" if "ignore" in doc else "exclude_modules"
        exclude = _strings(doc.get("ignore") if "ignore" in doc else doc.get(key) or [], f"{source}: `{key}`")
        if exclude is None:
            problems.append(f"{source}: `ignore` must be a list of strings")
            exclude = ()
        top = doc.get("group_size")
        top = top if isinstance(top, int) and not isinstance(top, bool) and top > 0 else None
        groups = doc.get("config_groups")
        group_0 = groups.get("group_0") if isinstance(groups, dict) else None
        weights = group_0.get("weights") if isinstance(group_0, dict) else None
        inner = weights.get("group_size") if isinstance(weights, dict) else None
        inner = inner if isinstance(inner, int) and not isinstance(inner, bool) and inner > 0 else None
        group = top if top is not None else inner
        exclude_key = "ignore" if "ignore" in doc else "exclude_modules" if "exclude_modules" in doc else None
        lists = []
        for key in FLAT_EXCLUSION_KEYS:
            if key in doc:
                patterns = _strings(doc[key] or [], f"{source}: `{key}`")
                if patterns is None and key != "ignore":  # `ignore` is reported above
                    problems.append(f"{source}: `{key}` must be a list of strings")
                lists.append((key, patterns or ()))
        kv = doc.get("kv_cache_quant_algo")
        producer = doc.get("producer")
        return QuantConfig(
            source=source,
            form="flat",
            quant_algo=doc.get("quant_algo") if isinstance(doc.get("quant_algo"), str) else None,
            group_size=group if isinstance(group, int) and group > 0 else None,
            kv_cache_quant_algo=kv if isinstance(kv, str) else None,
            exclude=exclude,
            quant_method=doc.get("quant_method") if isinstance(doc.get("quant_method"), str) else None,
            producer=producer.get("name") if isinstance(producer, dict) else None,
            quantized_layers=doc.get("quantized_layers")
            if isinstance(doc.get("quantized_layers"), dict)
            else None,
            missing_keys=(),
            exclude_key=exclude_key,
            top_group_size=top,
            nested_group_size=inner,
            flat_lists=tuple(lists),
            scale_encoding=_encoding(doc.get("weight_scale_encoding")),
        ), problems
    return None, [
        f"{source}: neither the nested ModelOpt form ({{producer, quantization}}) nor the flat form "
        f"({{quant_algo, ignore, quant_method}})"
    ]


# ---------------------------------------------------------------- pattern hygiene


_BACKBONE_LAYER_INDEX = re.compile(r"(^|\.)layers\.\d")
_HEAD_LAYER_INDEX = re.compile(r"lilicorr\.layers\.\d")
_DIGIT_GLOB = re.compile(r"\d\*")


def pattern_problems(pattern: str) -> list[str]:
    problems = []
    body = pattern.lstrip("*")
    if any(body.startswith(p) or ("." + p) in pattern for p in TRAINING_PREFIXES):
        problems.append("training_prefix")
    # vLLM renumbers draft backbone layers (head layers keep their index); `N*` also hits N0..N9
    backbone_index = _BACKBONE_LAYER_INDEX.search(body) and not _HEAD_LAYER_INDEX.search(body)
    if backbone_index or _DIGIT_GLOB.search(body):
        problems.append("layer_index")
    return problems


def strip_training_prefix(pattern: str) -> str:
    star = "*" if pattern.startswith("*") else ""
    body = pattern.lstrip("*")
    bare, stripped = strip_prefixes(body, TRAINING_PREFIXES)
    return star + bare if stripped else pattern


def summarize_exclusions(manifest: Manifest, excluded: set[str], quantized: set[str]) -> list[str]:
    """Exclusion patterns covering `excluded` and no module of `quantized`, under every runtime's matcher.

    Each excluded module gets the shortest index-free `*suffix` that is safe; when none is (a backbone
    `layers.N.mlp.up_proj` float while the head's `lilicorr.layers.N.mlp.up_proj` is quantized), its name
    with `*` for the layer index, anchored at the start, plus the `model.` form vLLM's prefixes need.
    Fused aliases `*qkv_proj` / `*gate_up_proj` are added when every part is excluded.
    """
    n_target = manifest.geometry.num_target_layers

    def safe(pattern: str) -> bool:
        return not any(excluded_by(m, q, (pattern,), n_target).excluded for q in quantized for m in MATCHERS)

    def covered(module: str, patterns: list[str]) -> bool:
        return all(excluded_by(m, module, tuple(patterns), n_target).excluded for m in MATCHERS)

    patterns: list[str] = []
    layers = {m.split(".")[1] for m in manifest.modules if m.startswith("layers.") and ".self_attn." in m}
    for alias, sub, parts in (
        ("*qkv_proj", "self_attn", ("q_proj", "k_proj", "v_proj")),
        ("*gate_up_proj", "mlp", ("gate_proj", "up_proj")),
    ):
        if layers and all(f"layers.{i}.{sub}.{p}" in excluded for i in layers for p in parts):
            patterns.append(alias)
    for module in sorted(excluded):
        segments = module.split(".")
        candidates = [
            ["*" + ".".join(segments[-k:])]
            for k in range(1, len(segments) + 1)
            if not any(p.isdigit() for p in segments[-k:])
        ]
        anchored = ".".join("*" if part.isdigit() else part for part in segments)
        candidates += [[anchored], [anchored, "model." + anchored], [module]]
        for candidate in candidates:
            if all(safe(p) for p in candidate) and covered(module, patterns + candidate):
                patterns += [p for p in candidate if p not in patterns]
                break
    return sorted(set(patterns))
