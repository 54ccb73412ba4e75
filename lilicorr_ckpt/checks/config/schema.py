"""The config.json document itself (LC001-LC003: field types, repeated and unknown keys; LC139-LC141: integral floats in integer fields)."""

from __future__ import annotations

import math
from typing import Any

from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.config.types import config_read, field_types
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.runtimes import RuntimeProfile
from lilicorr_ckpt.runtimes.reads import CASTS, present

# ---------------------------------------------------------------- catalogue
rule(
    "LC001",
    "config-field-type",
    "error",
    CFG,
    "A config.json field has the wrong JSON type.",
    "Write the value with the type the loaders cast to (integers for sizes and ids, numbers for eps/scale).",
    doc="Parses config.json into the typed draft config and fires once for every field whose JSON type is not "
    'the one the loaders read: a string where an integer is expected (`"block_size": "16"`), a number '
    "where a list is (`target_layer_ids`), a string where a bool is (`attention_sink_bias`), an integer "
    "beyond the int64 range. A whole-number float such as `4.0` is not a type error here (it is read as "
    "4; LC139-LC141 say what each runtime does with it). The field is then treated as absent, so the "
    "other checks still run, and the rules that need it stay silent about it.",
    why="The loaders read these keys with plain casts and type checks. SGLang's DFlash config parser refuses "
    "a `target_layer_ids` that is not a list of integers and an `attention_sink_bias` that is not a bool; "
    'vLLM uses `attention_sink_bias` as a flag, so a string such as "false" counts as true there. '
    "Elsewhere a string reaches arithmetic and the load stops with an untyped error far from the key that "
    "caused it.",
    example='    "dflash_config": {"block_size": "16", "target_layer_ids": 1}\n\n'
    'reports `$.dflash_config.block_size: expected an integer, found "16" (string)` and the same '
    "for `target_layer_ids` (expected an array).",
)
rule(
    "LC002",
    "config-duplicate-key",
    "warning",
    CFG,
    "config.json repeats a key; readers keep only the last one.",
    "Remove the duplicate so every reader sees the same value.",
    doc="Fires for every key written twice in the same JSON object of config.json, at any depth (two "
    "`vocab_size` entries at the top level, two `block_size` entries inside dflash_config). The checks "
    "use the last value, as Python's json module does.",
    why="JSON leaves duplicate keys undefined. Python's json module keeps the last value without a word; "
    "other parsers, editors and the person reviewing the file may see the first. The checkpoint then has "
    "two geometries, and which one a reader gets depends on its parser, with no error anywhere.",
    example='    {"vocab_size": 151936, "hidden_size": 2048, "vocab_size": 151669}',
)
rule(
    "LC003",
    "config-unknown-key",
    "info",
    CFG,
    "A key no loader reads (kept, not an error).",
    "Nothing to do unless it is a misspelling of a key the loaders read.",
    doc="Fires for a config.json key that no field of the draft config reads, at the top level or inside "
    "dflash_config, when its name contains `lilicorr`, `conv`, `block`, `target` or `mask`: the words of "
    "the keys the loaders do read, so the key is probably a misspelling of one. Other unknown keys "
    "(training metadata, transformers' own fields) are passed over.",
    why="No loader refuses an unknown key: it is ignored, and the key it was meant to be is absent. The "
    "loader then falls back where it has a fallback (SGLang assumes a block size of 16, resolves the mask "
    "token through the tokenizer, guesses the target layers) or refuses with a message about the missing "
    "key rather than the misspelt one.",
    example='    "dflash_config": {"lilicorr_topk": 8}\n\n'
    "where `lilicorr_candidate_topk` was meant (LC101 then reports the real key as missing).",
)
rule(
    "LC139",
    "integral-float",
    "error",
    CFG,
    "An integer setting is written as a whole-number float (4.0), which the runtime does not cast: it refuses it "
    "or fails with a TypeError.",
    "Write the value as a JSON integer (4, not 4.0).",
    doc="Fires when an integer setting is written as a whole-number float (`4.0`), for each runtime that does "
    "not cast it. Three groups of keys, each judged by how the runtime's code reads it: the LiLiCorr "
    "integers in dflash_config (lilicorr_candidate_topk, lilicorr_hidden_size, lilicorr_num_layers, "
    "lilicorr_num_heads, lilicorr_factor_dim) used uncast by vLLM and TensorRT-LLM; the backbone integers "
    "(top-level hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, "
    "intermediate_size, vocab_size, block_size, num_target_layers; dflash_config's block_size, "
    "num_target_layers, conv_kernel_size, conv_group_size) used uncast by vLLM (but the conv keys, which it "
    "int()s where it builds the convolution), and the ones the "
    "transformers config class declares int (hidden_size, num_hidden_layers, num_attention_heads, "
    "num_key_value_heads, head_dim, intermediate_size, vocab_size) refused by SGLang and vLLM; "
    "mask_token_id, which SGLang checks to be an integer; any other key a runtime uses uncast as a size "
    "(vLLM: a DSpark head's top-level markov_rank, the Markov head's width). A top-level block_size, mask_token_id or "
    "num_target_layers beside a dflash_config value is read by no runtime (the dflash_config one wins), nor is a "
    "key a runtime reads nowhere (vLLM: num_target_layers).",
    why="A float where Python needs an int fails at build: SGLang and vLLM read config.json "
    "through transformers' config class, which refuses a float in its integer fields (\"expected int, got "
    "float\"); vLLM computes `candidate_topk & (candidate_topk - 1)` and the block's slot count with the "
    "raw values (a TypeError); TensorRT-LLM's LiLiCorr head uses the raw values for tensor sizes and "
    "ranges (a TypeError). SGLang refuses a float mask_token_id "
    '("must be an integer").',
    example='    "num_hidden_layers": 2.0,\n    "dflash_config": {"lilicorr_candidate_topk": 8.0}',
)
rule(
    "LC140",
    "integral-float-unconfirmed",
    "warning",
    CFG,
    "An integer setting is written as a whole-number float (4.0); whether the runtime casts it is not confirmed.",
    "Write the value as a JSON integer (4, not 4.0).",
    doc="The same keys as LC139; fires for each runtime for which it is not confirmed whether it casts them: "
    "TensorRT-LLM for the backbone integers.",
    why="TensorRT-LLM's draft builder would fail on a float layer count in `range(num_draft_layers)` if it "
    "used the value uncast; that path was not traced, so the load may work or fail with a TypeError.",
    example='    "num_hidden_layers": 2.0',
)
rule(
    "LC141",
    "integral-float-cast",
    "info",
    CFG,
    "An integer setting is written as a whole-number float (4.0), which the runtime casts with int().",
    "Write the value as a JSON integer for the runtimes that do not cast.",
    doc="The same keys as LC139; fires for each runtime that casts them with int(): SGLang for the LiLiCorr "
    "integers and the ones its DFlash parser reads (block_size, num_target_layers, the conv keys), vLLM "
    "for the conv keys (LiLiCorr and DFlash2), vLLM and TensorRT-LLM for mask_token_id.",
    why="Nothing breaks on these runtimes. It is reported because the same file fails on the runtimes that do "
    "not cast (LC139), so the value should still be written as an integer.",
    example='    "dflash_config": {"lilicorr_num_layers": 2.0}',
)


# ---------------------------------------------------------------- checks

LISTED_DUPLICATE_KEYS = 20  # LC002 findings of their own; the rest are one finding


def config_schema(ctx: Context) -> None:
    field_types(ctx)  # LC001 / LC004, per release: how each reads the key (types.py)
    repeated = list(ctx.parsed.duplicate_keys.items())  # one entry per key, with its count
    for key, count in repeated[:LISTED_DUPLICATE_KEYS]:
        ctx.emit(
            "LC002",
            f"config.json repeats the key `{key}` ({count} times); JSON readers keep the last value",
            file="config.json",
            subjects=[key],
        )
    rest = repeated[LISTED_DUPLICATE_KEYS:]
    if rest:  # a config repeating 690k keys is one more finding, not 690k of them
        ctx.emit(
            "LC002",
            f"config.json repeats {len(rest)} more keys ({sum(c for _, c in rest)} occurrences): "
            f"{shorten(k for k, _ in rest)}; JSON readers keep the last value of each",
            file="config.json",
            subjects=[k for k, _ in rest],
        )
    interesting = [
        k
        for k in ctx.parsed.unknown_keys
        if "lilicorr" in k or "conv" in k or "block" in k or "target" in k or "mask" in k
    ]
    for key in interesting:
        ctx.emit(
            "LC003",
            f"config.json key {key} is not read by any loader (misspelt?)",
            file="config.json",
            pointer=key,
        )


# integer settings by the class of code that reads them, and the profile field saying what that code does
_INTEGRAL_FLOAT = {
    "lilicorr": lambda p: p.integral_float_lilicorr,
    "backbone": lambda p: p.integral_float_backbone,
    "typed": lambda p: p.integral_float_typed or p.integral_float_backbone,
    "mask_token": lambda p: p.integral_float_mask_token,
}


# the backbone integers the transformers config class declares as int fields (the rest are extra keys it keeps as
# written)
_INT_TYPED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)


_INT_LILICORR = (
    "lilicorr_candidate_topk",
    "lilicorr_hidden_size",
    "lilicorr_num_layers",
    "lilicorr_num_heads",
    "lilicorr_factor_dim",
)


_INT_BACKBONE_TOP = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "block_size",
    "num_target_layers",
    "target_hidden_size",
)
# the int() readers, and vLLM LiLiCorr's conv keys: compared with 0 as they are, then int() where a convolution is
# built (lilicorr.py LiLiCorr.__init__, qwen3_dflash2.py DFlash2Qwen3DecoderLayer): 2.0 builds the 2-tap one
_CASTS = tuple(reader for reader, kind in CASTS.items() if kind is int)
# top-level keys with no dflash_config counterpart: "unread" (RuntimeProfile.config_reads) means not read at all
_TOP_ONLY = ("target_hidden_size",)


_INT_BACKBONE_NESTED = ("block_size", "num_target_layers", "conv_kernel_size", "conv_group_size")
# read as `dflash_config.get(key, top-level value)` by every release that reads them (SGLang dflash_utils.py
# parse_dflash_draft_config, vLLM lilicorr.py LiLiCorr.__init__): a dflash_config value leaves the top-level one
# unread
_NESTED_FIRST = ("block_size", "mask_token_id", "num_target_layers")


def _top_unread(profile: RuntimeProfile, family: str | None, key: str, nested: dict[str, Any]) -> bool:
    """Whether `profile` never reads the top-level `key`: dflash_config's value overrides it, or the release
    reads it nowhere (config_reads: unread at the top level and, but for a top-level-only key, in dflash_config
    too)."""
    if key in _NESTED_FIRST and nested.get(key) is not None:
        return True
    if config_read(profile, family, f"$.{key}") != "unread":
        return False
    return key in _TOP_ONLY or config_read(profile, family, f"$.dflash_config.{key}") == "unread"


def integral_floats(ctx: Context) -> None:
    """Whole-number floats where the runtimes need integers: config.py reads 4.0 as 4 for every other check;
    each runtime casts, crashes or refuses (the audit in docs/validate.md)."""
    raw = ctx.parsed.raw
    declared = raw.get("dflash_config")
    nested: dict[str, Any] = declared if isinstance(declared, dict) else {}
    found: dict[str, list[str]] = {"lilicorr": [], "backbone": [], "typed": [], "mask_token": []}

    def floaty(v: Any) -> bool:
        return isinstance(v, float) and math.isfinite(v) and v.is_integer()

    found["lilicorr"] = [f"dflash_config.{k}" for k in _INT_LILICORR if floaty(nested.get(k))]
    found["backbone"] = [k for k in _INT_BACKBONE_TOP if floaty(raw.get(k)) and k not in _INT_TYPED] + [
        f"dflash_config.{k}" for k in _INT_BACKBONE_NESTED if floaty(nested.get(k))
    ]
    found["typed"] = [k for k in _INT_TYPED if floaty(raw.get(k))]
    found["mask_token"] = [k for k in ("mask_token_id",) if floaty(raw.get(k))] + [
        f"dflash_config.{k}" for k in ("mask_token_id",) if floaty(nested.get(k))
    ]
    verbs = {
        "crashes": ("LC139", "uses|use", "it uncast (a TypeError at build)"),
        "refuses": ("LC139", "refuses|refuse", "it (an explicit integer check)"),
        "config-class": (
            "LC139",
            "refuses|refuse",
            "it: transformers' config class declares these fields int "
            'and its strict validation rejects a float ("expected int, got float")',
        ),
        "unconfirmed": ("LC140", "is|are", "not confirmed to cast it"),
        "casts": ("LC141", "casts|cast", "it with int()"),
    }
    family = ctx.geometry.family
    for kind, found_keys in found.items():
        for mode, (rule_id, verb, rest) in verbs.items():
            # a dflash_config key the release does not read for this head kind (RuntimeProfile.config_reads) is
            # not its concern (a top-level "unread" key is still read where dflash_config has no value)
            read = {
                p.name: [
                    k
                    for k in found_keys
                    if not (
                        config_read(p, family, f"$.{k}") == "unread"
                        if k.startswith("dflash_config.")
                        else _top_unread(p, family, k, nested)
                    )
                    # a release that reads the key with int() casts the float (RuntimeProfile.config_reads),
                    # whatever its profile says of the kind
                    and (
                        mode == "casts"
                        if config_read(p, family, f"$.{k}") in _CASTS
                        else _INTEGRAL_FLOAT[kind](p) == mode
                    )
                ]
                for p in ctx.profiles
            }
            mine = [p for p in ctx.profiles if read.get(p.name)]
            keys = [k for k in found_keys if any(k in read[p.name] for p in mine)]
            if not keys:
                continue
            ctx.emit_for(
                rule_id,
                mine,
                f"{', '.join(keys)} written as a whole-number float: {names(mine, verb)} {rest}",
                file="config.json",
                pointer=f"$.{keys[0]}",
                subjects=keys,
            )
    # any other key a release uses uncast as a size (RuntimeProfile.config_reads "int": vLLM's DSpark markov_rank)
    grouped = {k for keys in found.values() for k in keys}
    for path, value in present(raw).items():
        key = path.removeprefix("$.")
        if key in grouped or not floaty(value):
            continue
        uncast = [p for p in ctx.profiles if config_read(p, family, path) == "int"]
        if uncast:
            ctx.emit_for(
                "LC139",
                uncast,
                f"{key} written as a whole-number float: {names(uncast, 'uses|use')} it uncast as a size "
                "(a TypeError at build)",
                file="config.json",
                pointer=path,
                subjects=[key],
            )
