"""How each release reads a config.json value's JSON type (LC001, LC004-LC009): the keys it reads per head kind and
with which operation (RuntimeProfile.config_reads), transformers' strict config class (config_class_strict), the
eagle_config dict, and sizes no server can allocate.

The differential fuzzer (tests/conformance/fuzz) found each of these against the executed released loaders."""

from __future__ import annotations

import math
import re
from typing import Any

from lilicorr_ckpt.checkpoint.config import ConfigIssue
from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.runtimes import RuntimeProfile
from lilicorr_ckpt.runtimes.reads import _key_path, config_read, present, reader_refuses, resolve_read

rule(
    "LC004",
    "config-field-type-not-read",
    "warning",
    CFG,
    "A config.json field has the wrong JSON type, but the runtime does not read it for this head kind, or reads "
    "it only as a truth value.",
    "Write the value with its documented type, or remove the key.",
    doc="The same type errors as LC001, reported as a warning for each runtime whose loader does not refuse "
    "them: it does not read the key for this head kind (another head's keys, a top-level copy the "
    "dflash_config value overrides), or it reads it as a truth value (`if value:`), so any JSON value loads. "
    "LC001 still reports it for the runtimes that refuse it.",
    why='A flag read as a truth value turns the string "false" into true: the load succeeds and the drafter '
    "runs with the opposite of what was written. A key the runtime does not read is harmless there, but "
    "another runtime may read it.",
    example='    "dflash_config": {"causal": "false"}\n\nvLLM reads causal as `bool(value)`: the string is true.',
)
rule(
    "LC005",
    "config-class-field-type",
    "error",
    CFG,
    "A field transformers' config class types (Qwen3Config) has another JSON type, or null where the field is "
    "not optional: the strict config class refuses it.",
    "Write the field with the class's type: integers for sizes, floats for eps and ranges (1e-06, 0.02), "
    "booleans for flags, a torch dtype name for torch_dtype.",
    doc="For a `qwen3` model_type, SGLang and vLLM parse config.json with transformers' Qwen3Config (transformers "
    "5), a strict dataclass: every typed field is validated when the config is built. An int field refuses a "
    "float, a bool or null; a float field (rms_norm_eps, initializer_range) refuses an integer such as 0 or 1; "
    "a bool field refuses 0/1 and null; hidden_act refuses null; rope_scaling must be an object or null; "
    "mtp_layer_types must be a list; a torch_dtype string must name a torch dtype. Whole-number floats in the "
    "backbone sizes are LC139's.",
    why='The config never gets built: the server stops at start-up with "Validation error for field ..." (or '
    "an AttributeError for a dtype name torch does not have).",
    example='    "rms_norm_eps": 0, "attention_bias": null',
)
rule(
    "LC006",
    "model-type",
    "error",
    CFG,
    "model_type is missing or names no model type: transformers' AutoConfig cannot build the config.",
    'Set model_type to the backbone\'s type ("qwen3" for the DFlash-family drafters).',
    doc="Fires for SGLang and vLLM when model_type is absent, not a string, or not a model type's name (they "
    "are lowercase identifiers: `qwen3`, `llama`). Without one, AutoConfig guesses the type from the served "
    "path's name and refuses a path that names none.",
    why='The server stops at start-up: "Unrecognized model ... Should have a `model_type` key in its '
    'config.json", or "has model type `2` but Transformers does not recognize this architecture".',
    example='    "model_type": ""',
)
rule(
    "LC007",
    "config-key-reserved",
    "error",
    CFG,
    "A top-level key that transformers' config class reads as its own (a nested text config, a method name).",
    "Remove the key: it is not a drafter setting.",
    doc="Fires for SGLang and vLLM on a top-level `text_config`, `decoder`, `generator` or `text_encoder` (the "
    "config class's get_text_config returns it as the model's text config, which then has no geometry) and on "
    "a key named like one of the class's methods (`get_text_config`, `to_dict`), which replaces the method. "
    "A null text config is passed over by get_text_config (the config is its own text config): it fires only "
    "for SGLang's `text_config`, which its get_hf_text_config reads by hasattr and asserts on.",
    why='The config\'s geometry is read from the wrong object ("does not have `num_attention_heads`", "DFLASH '
    'requires draft num_hidden_layers") or a method call fails ("object is not callable").',
    example='    "text_config": 0',
)
rule(
    "LC008",
    "eagle-config-type",
    "error",
    CFG,
    "eagle_config is present but not a JSON object: the runtime reads it as a dict and crashes.",
    "Write eagle_config as an object, or remove it.",
    doc="Fires for each runtime that reads eagle_config as a dict (vLLM: qwen3_dflash.py DFlashQwen3Model.__init__ "
    "calls `.update` on it and the eagle helpers `.get`), when the key holds anything else, null included.",
    why="The model's build fails with an AttributeError (\"'int' object has no attribute 'update'\").",
    example='    "eagle_config": 0',
)
rule(
    "LC009",
    "size-unservable",
    "error",
    CFG,
    "A geometry size of 2**31 or more: the buffers built from it need more memory than any accelerator holds.",
    "Write the real size.",
    doc="Fires when vocab_size, draft_vocab_size, hidden_size, target_hidden_size, intermediate_size or a "
    "block_size is 2**31 or more, for each runtime that reads that key: the top-level sizes, and "
    "dflash_config.block_size (a top-level block_size only when dflash_config has none). No runtime reads "
    "another size inside dflash_config, nor a key its profile lists as unread for the head kind. The loaders "
    "allocate the embedding, fc and the block's buffers from these sizes before reading any weight.",
    why="The server fails at start-up with an out-of-memory error (\"can't allocate memory: you tried to "
    'allocate 140737488355328 bytes").',
    example='    "vocab_size": 1099511627776',
)

# ---------------------------------------------------------------- readers


_HOW = {
    "unread": "does not read it for this head kind|do not read it for this head kind",
    "truth": "reads it only as a truth value|read it only as a truth value",
    "schema|falsy": "reads a falsy value as absent|read a falsy value as absent",
    "truth?": "reads it only as a truth value (null: absent)|read it only as a truth value (null: absent)",
    "equals": "only compares it with a name (any other value is not that name)|only compare it with a name (any "
    "other value is not that name)",
    "flag": "reads it as a flag (a true value builds the feature)|read it as a flag (a true value builds the feature)",
    "count?": "requires null or an integer >= 1|require null or an integer >= 1",
    "str()": "reads it through str() (any value is text; only the names it builds load)|read it through str() "
    "(any value is text; only the names it builds load)",
    "float()": "reads it with float()|read it with float()",
    "float()|falsy": "reads it with float()|read it with float()",
    "int|falsy": "uses a truthy value uncast as a size (an integer only)|use a truthy value uncast as a size (an "
    "integer only)",
    "int()": "reads it with int()|read it with int()",
    "int()?": "reads it with int() (null: absent)|read it with int() (null: absent)",
    "int()-bool": "reads it with int() and needs a size (not null, not a bool)|read it with int() and need a "
    "size (not null, not a bool)",
    "float()-bool": "reads it with float() and needs a number (not a bool)|read it with float() and need a "
    "number (not a bool)",
    "int": "uses it uncast as a size (an integer only)|use it uncast as a size (an integer only)",
    "truth==": "reads it as a truth value, hashed and compared between layers (a list, an object or NaN fails)|"
    "read it as a truth value, hashed and compared between layers (a list, an object or NaN fails)",
    "number": "uses it as a number (not a bool, a string or null)|use it as a number (not a bool, a string or "
    "null)",
    "number>int()": "compares it with 0 as it is, then builds from int() of it (a number or a bool: false is 0, "
    "2.5 is 2; not a string or null)|compare it with 0 as it is, then build from int() of it (a number or a bool: "
    "false is 0, 2.5 is 2; not a string or null)",
    "number?": "requires a number or null|require a number or null",
    "bool": "requires true or false|require true or false",
    "str?": "requires a string or null|require a string or null",
    "str+": "requires a non-empty string|require a non-empty string",
    "object": "requires an object|require an object",
}


def field_types(ctx: Context) -> None:
    """LC001 for each release that refuses a value's JSON type (the schema's type, or the release's own reader);
    LC004 for each that reads the key only as a truth value or not at all."""
    raw = ctx.parsed.raw
    family = ctx.geometry.family
    origin = ctx.parsed.speculators
    issues: dict[str, ConfigIssue] = {}
    for each in ctx.parsed.issues:
        issues.setdefault(_key_path(each.path), each)
    values = present(raw)
    for path in sorted(set(values) | set(issues)):
        issue = issues.get(path)
        value = values.get(path, issue.found if issue else None)
        refusing: list[RuntimeProfile] = []
        tolerating: dict[str, list[RuntimeProfile]] = {}
        reasons: dict[str, list[RuntimeProfile]] = {}
        for p in ctx.profiles:
            reader = resolve_read(config_read(p, family, path), path, raw)
            if reader == "schema|falsy" and value:
                reader = None  # a truthy value is read as the schema types it
            if reader is None:
                if issue is not None:
                    refusing.append(p)
            elif reader_refuses(reader, value):
                refusing.append(p)
                reasons.setdefault(reader, []).append(p)
            elif issue is not None:
                tolerating.setdefault(reader, []).append(p)
        shown = origin.original_path(issue.path) if origin and issue else (issue.path if issue else path)
        if refusing:
            if issue is not None:
                message = f"config.json {_describe(issue, shown)}"
            else:
                reader, who = next(iter(reasons.items()))
                message = f"config.json {path}: {names(who, _HOW[reader])}, found {_show(value)}"
            every = len(refusing) == len(ctx.profiles)  # one finding for all, as the schema's own
            ctx.emit(
                "LC001",
                message,
                runtimes=() if every else [p.name for p in refusing],
                file="config.json",
                pointer=shown,
                expected=issue.expected if issue else None,
                actual=issue.found if issue else value,
            )
        for reader, who in tolerating.items():
            assert issue is not None
            ctx.emit_for(
                "LC004",
                who,
                f"config.json {_describe(issue, shown)}; {names(who, _HOW[reader])}"
                + (' (a string such as "false" counts as true)' if reader == "truth" else ""),
                file="config.json",
                pointer=shown,
                expected=issue.expected,
                actual=issue.found,
            )


def _describe(issue: ConfigIssue, path: str) -> str:
    return ConfigIssue(path=path, found=issue.found, expected=issue.expected).describe()


def _show(value: Any) -> str:
    return ConfigIssue(path="", found=value, expected="").describe().split("found ", 1)[1]


# ---------------------------------------------------------------- transformers' strict config class

# Qwen3Config's typed fields (transformers 5), with the base class's: the JSON types each accepts
_INT, _FLOAT, _BOOL, _STR, _NULL, _LIST, _OBJECT = "int", "float", "bool", "str", "null", "list", "object"
QWEN3_FIELDS: dict[str, tuple[str, ...]] = {
    **{
        k: (_INT,)
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "max_position_embeddings",
            "max_window_layers",
            "chunk_size_feed_forward",
        )
    },
    **{k: (_INT, _NULL) for k in ("num_key_value_heads", "sliding_window", "pad_token_id", "bos_token_id")},
    "eos_token_id": (_INT, _LIST, _NULL),
    "hidden_act": (_STR,),
    "initializer_range": (_FLOAT,),
    "rms_norm_eps": (_FLOAT,),
    "attention_dropout": (_FLOAT, _INT),
    **{
        k: (_BOOL,)
        for k in (
            "use_cache",
            "tie_word_embeddings",
            "attention_bias",
            "use_sliding_window",
            "is_encoder_decoder",
        )
    },
    **{k: (_BOOL, _NULL) for k in ("output_hidden_states", "return_dict")},
    "layer_types": (_LIST, _NULL),
    "architectures": (_LIST, _NULL),
    "rope_parameters": (_OBJECT, _NULL),
    "rope_scaling": (_OBJECT, _NULL),  # read as rope_parameters
    "transformers_version": (_STR, _NULL),
    # the base class's legacy remap iterates it (remap_legacy_layer_types: `if ... is not None`)
    "mtp_layer_types": (_LIST, _OBJECT, _STR, _NULL),
}
# integer sizes LC139 reports as whole-number floats (not repeated here)
_LC139_TYPED = frozenset(
    (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
    )
)
TORCH_DTYPES = frozenset(
    (
        "float32",
        "float",
        "float64",
        "double",
        "float16",
        "half",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "bool",
        "auto",
    )
)
# top-level keys the config class treats as its own
TEXT_CONFIG_KEYS = ("text_config", "decoder", "generator", "text_encoder")
METHOD_KEYS = ("get_text_config", "to_dict", "to_diff_dict", "to_json_string", "update", "save_pretrained")
_MODEL_TYPE = re.compile(r"[a-z][a-z0-9_\-]*")


def _json_kind(value: Any) -> str:
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return _INT
    if isinstance(value, float):
        return _FLOAT
    if isinstance(value, str):
        return _STR
    if isinstance(value, list):
        return _LIST
    return _OBJECT


def config_class(ctx: Context) -> None:
    """LC005-LC009."""
    raw = ctx.parsed.raw
    strict = [p for p in ctx.profiles if p.config_class_strict]
    model_type = raw.get("model_type")
    if strict and (not isinstance(model_type, str) or not _MODEL_TYPE.fullmatch(model_type)):
        found = "absent" if "model_type" not in raw else _show(model_type)
        ctx.emit_for(
            "LC006",
            strict,
            f"model_type is {found}: {names(strict, 'parses|parse')} config.json with transformers' AutoConfig, "
            "which needs a registered model type",
            file="config.json",
            pointer="$.model_type",
            expected="a model type such as qwen3",
            actual=found,
        )
    if strict and model_type == "qwen3":
        for key, allowed in QWEN3_FIELDS.items():
            if key not in raw:
                continue
            value = raw[key]
            kind = _json_kind(value)
            if kind in allowed or ctx.parsed.invalid(f"$.{key}"):
                continue  # LC001 reports a value the schema refuses
            if kind == _FLOAT and _INT in allowed and key in _LC139_TYPED and float(value).is_integer():
                continue  # LC139's
            ctx.emit_for(
                "LC005",
                strict,
                f"config.json $.{key} is {_show(value)}: transformers' Qwen3Config declares it "
                f"{' | '.join(allowed)} and {names(strict, 'refuses|refuse')} the config",
                file="config.json",
                pointer=f"$.{key}",
                expected=" | ".join(allowed),
                actual=kind,
            )
        for key in ("torch_dtype", "dtype"):
            value = raw.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") not in TORCH_DTYPES:
                ctx.emit_for(
                    "LC005",
                    strict,
                    f"config.json $.{key} is {_show(value)}, which names no torch dtype: transformers' config "
                    f"class resolves it as torch.{value} and {names(strict, 'fails|fail')} at start-up",
                    file="config.json",
                    pointer=f"$.{key}",
                    expected="a torch dtype name",
                    actual=value,
                )
    # PretrainedConfig.__init__ keeps dtype, else torch_dtype, as the config's dtype; dict_dtype_to_str (run
    # whenever the config is turned into a dict) writes any value but a string, an int or an object as
    # str(value).split(".")[1], an IndexError for a list of ints or NaN
    key = "dtype" if raw.get("dtype") is not None else "torch_dtype"
    dtype = raw.get(key)
    if strict and dtype is not None and not isinstance(dtype, (str, int, dict)) and "." not in str(dtype):
        ctx.emit_for(
            "LC005",
            strict,
            f"config.json $.{key} is {_show(dtype)}: transformers' config class writes a dtype that is not a "
            f"string as the text after its first dot, and {names(strict, 'fails|fail')} at start-up "
            "(IndexError)",
            file="config.json",
            pointer=f"$.{key}",
            expected="a torch dtype name",
            actual=_json_kind(dtype),
        )
    if strict:
        for key in (*TEXT_CONFIG_KEYS, *METHOD_KEYS):
            if key not in raw:
                continue
            # transformers' get_text_config passes over a null text config (the config is its own); a release that
            # reads the key by hasattr refuses it all the same (RuntimeProfile.text_config_null_refused)
            who = (
                [p for p in strict if key in p.text_config_null_refused]
                if raw[key] is None and key in TEXT_CONFIG_KEYS
                else strict
            )
            if who:
                if key not in TEXT_CONFIG_KEYS:
                    what = "it replaces the config class's method of that name"
                elif raw[key] is None:
                    what = "it is read as the text config, which null is not"
                else:
                    what = "get_text_config returns it as the text config, which has no geometry"
                ctx.emit_for(
                    "LC007",
                    who,
                    f"config.json has a top-level `{key}`: {what} ({names(who, 'fails|fail')} at start-up)",
                    file="config.json",
                    pointer=f"$.{key}",
                )
    readers = [p for p in ctx.profiles if p.eagle_config_object]
    if "eagle_config" in raw and not isinstance(raw["eagle_config"], dict):
        ctx.emit_for(
            "LC008",
            readers,
            f"eagle_config is {_show(raw['eagle_config'])}: {names(readers, 'reads|read')} it as a dict and the "
            "model's build fails",
            file="config.json",
            pointer="$.eagle_config",
            expected="an object",
        )
    _sizes(ctx)


SIZE_LIMIT = 2**31
_SIZES = (
    "vocab_size",
    "draft_vocab_size",
    "hidden_size",
    "target_hidden_size",
    "intermediate_size",
    "block_size",
)


def _size_read(profile: RuntimeProfile, family: str | None, path: str, raw: dict[str, Any]) -> bool:
    """Whether `profile` reads the size at `path` (and so allocates from it): the top-level keys transformers'
    config class holds, but one the release does not read for this head kind (config_reads); the block size,
    dflash_config's, else the top-level one (SGLang parse_dflash_draft_config and vLLM lilicorr.py read
    `dflash_config.get("block_size", top-level)`; a release that reads neither runs the block the checkpoint
    states as its num_speculative_tokens + 1); no release reads another dflash_config size."""
    nested = raw.get("dflash_config")
    if path == "$.dflash_config.block_size":
        return True
    if path.startswith("$.dflash_config."):
        return False
    if path == "$.block_size":
        return not (isinstance(nested, dict) and nested.get("block_size") is not None)
    return config_read(profile, family, path) != "unread"


def _sizes(ctx: Context) -> None:
    raw = ctx.parsed.raw
    for path, value in present(raw).items():
        key = path.rsplit(".", 1)[1]
        if key not in _SIZES or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not (math.isfinite(value) and value >= SIZE_LIMIT):
            continue
        reading = [p for p in ctx.profiles if _size_read(p, ctx.geometry.family, path, raw)]
        ctx.emit_for(
            "LC009",
            reading,
            f"config.json {path} is {value:g}: buffers of this size need more memory than any accelerator holds "
            f"({names(reading, 'fails|fail')} at start-up, out of memory)",
            file="config.json",
            pointer=path,
        )
