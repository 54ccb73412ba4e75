"""The draft config.json as typed msgspec Structs.

Parsing never raises for a field of the wrong type: the field is recorded as a `ConfigIssue`
(JSON path, value found, type expected), treated as absent, and the rest of the document is
still read, so one bad key does not hide every other finding. Only input that is not a JSON
object at all (or not UTF-8) raises `InputError`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec
import numpy as np

from lilicorr_ckpt.checkpoint.speculators import KINDS, SpeculatorsOrigin, is_speculators, kind_of, translate
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.families import ARCHITECTURES, is_drafter, lilicorr

LILICORR_KEYS = lilicorr.CONFIG_KEYS


class DFlashConfig(msgspec.Struct, kw_only=True, frozen=True):
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    block_size: int | None = None
    num_target_layers: int | None = None
    causal: bool | None = None
    use_swa: bool | None = None
    swa_window_size: int | None = None
    attention_sink_bias: bool | None = None
    sample_from_anchor: bool | None = None
    use_aux_hidden_state: bool | None = None
    projector_type: str | None = None
    lilicorr_enabled: bool | None = None
    lilicorr_candidate_topk: int | None = None
    lilicorr_hidden_size: int | None = None
    lilicorr_num_layers: int | None = None
    lilicorr_num_heads: int | None = None
    lilicorr_mlp_ratio: float | None = None
    lilicorr_factor_dim: int | None = None
    lilicorr_vector_eps: float | None = None
    lilicorr_logit_scale: float | None = None
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    # DSpark (Model-Optimizer and SpecForge write these here; SGLang and vLLM read the top-level copies)
    markov_rank: int | None = None
    markov_head_type: str | None = None
    use_confidence_head: bool | None = None
    # Domino
    gru_hidden_dim: int | None = None
    emb_dim: int | None = None
    shift_label: Any = None  # SGLang requires a JSON bool: judged by the Domino rules, not the schema
    pure_draft_prefix_len: int | None = None


class DraftConfig(msgspec.Struct, kw_only=True, frozen=True):
    architectures: list[str] | None = None
    model_type: str | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    hidden_act: str | None = None
    rms_norm_eps: float | None = None
    attention_bias: bool | None = None
    attention_dropout: float | None = None
    rope_theta: float | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None
    initializer_range: float | None = None
    attention_sink_bias: bool | None = None
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    tie_word_embeddings: bool | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    num_target_layers: int | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    use_sliding_window: bool | None = None
    use_aux_hidden_state: bool | None = None
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    block_size: int | None = None
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    is_causal: bool | None = None
    has_own_lm_head: bool | None = None
    draft_vocab_size: int | None = None
    draft_id_to_target_id: Any = None
    target_hidden_size: int | None = None  # the target's width, when fc reads features of another width
    # DSpark: the anchor is the first prediction (true) or the bonus token (false); vLLM's translation of a
    # speculators DSpark writes both
    sample_from_anchor: bool | None = None
    dspark_bonus_anchor: bool | None = None
    # DSpark (DeepSpec writes them at the top level)
    markov_rank: int | None = None
    markov_head_type: str | None = None
    enable_confidence_head: bool | None = None
    confidence_head_with_markov: bool | None = None
    # Domino (the reference checkpoint also writes emb_dim here)
    gru_hidden_dim: int | None = None
    emb_dim: int | None = None
    quantization_config: dict[str, Any] | None = None
    dflash_config: DFlashConfig | None = None

    @property
    def dflash(self) -> DFlashConfig:
        return self.dflash_config if self.dflash_config is not None else _EMPTY_DFLASH

    @property
    def family(self) -> str | None:
        """Architecture family from `architectures[0]`, or None when absent/unknown."""
        if not self.architectures:
            return None
        return ARCHITECTURES.get(self.architectures[0])

    @property
    def architecture(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    @property
    def model_dtype(self) -> str | None:
        return self.torch_dtype or self.dtype


_EMPTY_DFLASH = DFlashConfig()

_MODEL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model")


def target_model_architecture(raw: dict[str, Any]) -> str | None:
    """architectures[0] when a config.json describes a plain model rather than a drafter: no drafter by
    `families.is_drafter`, and an architecture that reads like a transformers model class (LlamaForCausalLM).
    None for anything drafter-like, however broken (the checks explain those)."""
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None or is_drafter(raw) or "Draft" in arch:
        return None
    return arch if arch.endswith(_MODEL_SUFFIXES) else None


class ConfigIssue(msgspec.Struct, frozen=True):
    path: str  # JSON path, e.g. "$.dflash_config.block_size"
    found: Any
    expected: str

    def describe(self) -> str:
        return f"{self.path}: expected {self.expected}, found {_show(self.found)}"


class ParsedConfig(msgspec.Struct, frozen=True):
    config: DraftConfig
    raw: dict[str, Any]
    issues: list[ConfigIssue]
    unknown_keys: list[str]  # JSON paths of keys no model field reads (kept in `raw`)
    duplicate_keys: dict[
        str, int
    ]  # key -> how many times it appears (2 or more), in the order first repeated
    # set when config.json is in the speculators layout: `config` and `raw` are then the z-lab config it stands
    # for, as vLLM translates it (checkpoint/speculators.py), and this records the layout as written
    speculators: SpeculatorsOrigin | None = None
    # JSON paths whose value as written is kept in `issues` but read cast with int() in `config` (recast: the
    # config as one release reads it); they are not invalid
    cast: tuple[str, ...] = ()

    def invalid(self, path: str) -> bool:
        return any(
            (i.path == path or i.path.startswith(path + "[")) and i.path not in self.cast for i in self.issues
        )


def _show(value: Any) -> str:
    text = json.dumps(value, allow_nan=True) if _jsonable(value) else repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({_json_type(value)})"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
        return True
    except (TypeError, ValueError):
        return False


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number" if math.isfinite(value) else "non-finite number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


_MSGSPEC_PATH = re.compile(r"- at `(\$[^`]*)`")
_MSGSPEC_EXPECTED = re.compile(r"Expected `([^`]*)`")
_PATH_TOKEN = re.compile(r"\.([A-Za-z_0-9\-]+)|\[(\d+)\]")


def _path_tokens(path: str) -> list[str | int]:
    return [
        name if name is not None and name != "" else int(index)
        for name, index in _PATH_TOKEN.findall(path[1:])
    ]


def _lookup(doc: Any, tokens: list[str | int]) -> Any:
    for token in tokens:
        doc = doc[token]
    return doc


def _drop(doc: dict[str, Any], tokens: list[str | int]) -> None:
    """Delete the object member that holds the bad value, so the rest can still be parsed."""
    last_key = max(i for i, t in enumerate(tokens) if isinstance(t, str))
    parent = _lookup(doc, tokens[:last_key])
    del parent[tokens[last_key]]


def _expected_from(message: str) -> str:
    match = _MSGSPEC_EXPECTED.search(message)
    if not match:
        return message.split(" - at")[0]
    text = match.group(1).replace(" | null", "")
    return {
        "int": "an integer",
        "float": "a number",
        "bool": "a boolean",
        "str": "a string",
        "array": "an array",
        "object": "an object",
    }.get(text, text)


MAX_JSON_DEPTH = 64  # far below Python's recursion limit: every reader of the document may recurse
MAX_NUMBER_DIGITS = 100  # no config value needs more; Python refuses int() beyond 4,300 digits
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_LONG_NUMBER = re.compile(rb"[0-9]{%d,}" % (MAX_NUMBER_DIGITS + 1))
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_json_shape(data: bytes, what: str) -> None:
    """Refuse (InputError) a JSON text nested deeper than MAX_JSON_DEPTH or holding a number longer than
    MAX_NUMBER_DIGITS digits, before any parser recurses or converts: linear in the bytes, whatever they say."""
    bare = _JSON_STRING.sub(b'""', data)  # brackets and digits inside strings do not count
    codes = np.frombuffer(bare, dtype=np.uint8)
    steps = np.zeros(codes.shape, dtype=np.int32)
    steps[(codes == ord("[")) | (codes == ord("{"))] = 1
    steps[(codes == ord("]")) | (codes == ord("}"))] = -1
    depth = int(np.cumsum(steps).max()) if len(steps) else 0
    if depth > MAX_JSON_DEPTH:
        raise InputError(f"{what} is nested {depth} levels deep; the limit is {MAX_JSON_DEPTH}")
    long_number = _LONG_NUMBER.search(bare)
    if long_number:
        run = len(long_number.group(0))
        raise InputError(f"{what} holds a number of {run} digits; the limit is {MAX_NUMBER_DIGITS}")


def _lone_surrogate(doc: Any) -> str | None:
    """The first string (key or value) holding an unpaired UTF-16 surrogate such as \\ud800, which no UTF-8
    writer can encode."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                stack.append(key)
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:60]
    return None


def load_json_object(data: bytes, what: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Decode a JSON object; returns (document, {repeated key: how many times it appears}, in the order first
    repeated, keys of nested objects included). NaN/Infinity are accepted; nesting, number length and unpaired
    surrogates are refused with a message (InputError)."""
    check_json_shape(data, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{what} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    duplicates: dict[
        str, int
    ] = {}  # one entry per key, however often it repeats: a 4 MB config can repeat 690k

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates[key] = duplicates.get(key, 1) + 1
            out[key] = value
        return out

    try:
        doc = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to be a config") from None
    if not isinstance(doc, dict):
        raise InputError(f"{what} must hold a JSON object, found {_json_type(doc)}")
    # a surrogate reaches a str only through a \uD800-\uDFFF escape (UTF-8 cannot encode one): without such an
    # escape in the text, the walk over every string of the document (1 s for a 4 MB config) is skipped
    lone = _lone_surrogate(doc) if _SURROGATE_ESCAPE.search(text) else None
    if lone is not None:
        raise InputError(
            f"{what} holds a string with an unpaired UTF-16 surrogate ({lone!r}); it is not valid Unicode"
        )
    return doc, duplicates


def _integral_floats_to_int(doc: Any) -> Any:
    # a whole float past int64 stays a float: 1e308 is not an integer a loader's int64 holds
    if isinstance(doc, float) and math.isfinite(doc) and doc.is_integer() and abs(doc) < INT_LIMIT:
        return int(doc)
    if isinstance(doc, list):
        return [_integral_floats_to_int(v) for v in doc]
    if isinstance(doc, dict):
        return {k: _integral_floats_to_int(v) for k, v in doc.items()}
    return doc


INT_LIMIT = 2**63  # what every loader's int64 holds; a config integer beyond it is a wrong type, not a size


def _out_of_range(value: Any) -> bool:
    if isinstance(value, list):
        return any(_out_of_range(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT <= value < INT_LIMIT


def _drop_out_of_range_ints(work: dict[str, Any], issues: list[ConfigIssue]) -> None:
    """Integers of the typed fields beyond int64 are recorded as issues and treated as absent, so no size the
    config states is larger than a loader could hold."""
    scopes: list[tuple[str, dict[str, Any], Any]] = [("$", work, DraftConfig.__struct_fields__)]
    if isinstance(work.get("dflash_config"), dict):
        scopes.append(("$.dflash_config", work["dflash_config"], DFlashConfig.__struct_fields__))
    for prefix, doc, fields in scopes:
        for key in [k for k in fields if k in doc and _out_of_range(doc[k])]:
            issues.append(
                ConfigIssue(
                    path=f"{prefix}.{key}",
                    found=doc.pop(key),
                    expected="an integer in the int64 range (|n| < 2**63)",
                )
            )


def parse_config(data: bytes, what: str = "config.json") -> ParsedConfig:
    raw, duplicates = load_json_object(data, what)
    origin = None
    if is_speculators(raw) and kind_of(raw) in KINDS:  # read as the z-lab config vLLM translates it to
        translation = translate(raw)
        raw, origin = translation.config, translation.origin
    # Loaders cast with int(), so an integral 2.0 is an integer; a string "2" is not accepted.
    work = _integral_floats_to_int(json.loads(json.dumps(raw, allow_nan=True)))
    config, issues = _typed(work, what)
    unknown = [f"$.{k}" for k in raw if k not in DraftConfig.__struct_fields__]
    nested = raw.get("dflash_config")
    if isinstance(nested, dict):
        unknown += [f"$.dflash_config.{k}" for k in nested if k not in DFlashConfig.__struct_fields__]
    return ParsedConfig(
        config=config,
        raw=raw,
        issues=issues,
        unknown_keys=unknown,
        duplicate_keys=duplicates,
        speculators=origin,
    )


def recast(parsed: ParsedConfig, casts: dict[str, int | float]) -> ParsedConfig:
    """`parsed` as a release that casts some values with int() or float() reads it: each JSON path of `casts`
    ("$.dflash_config.conv_kernel_size") holds the cast number in the typed config, and is no longer invalid
    there (`issues` keeps the value as written, for the type rules)."""
    work = _integral_floats_to_int(json.loads(json.dumps(parsed.raw, allow_nan=True)))
    for path, value in casts.items():
        tokens = _path_tokens(path)
        parent = _lookup(work, tokens[:-1]) if len(tokens) > 1 else work
        if isinstance(parent, dict):
            parent[tokens[-1]] = value
    config, _ = _typed(work, "config.json")
    return msgspec.structs.replace(parsed, config=config, cast=tuple(sorted(casts)))


def _typed(work: dict[str, Any], what: str) -> tuple[DraftConfig, list[ConfigIssue]]:
    """The typed config of a JSON document, each value of the wrong type dropped and recorded."""
    issues: list[ConfigIssue] = []
    _drop_out_of_range_ints(work, issues)
    for _ in range(256):
        try:
            config = msgspec.convert(work, DraftConfig)
            break
        except msgspec.ValidationError as exc:
            message = str(exc)
            match = _MSGSPEC_PATH.search(message)
            if not match:
                raise InputError(f"{what}: {message}") from None
            tokens = _path_tokens(match.group(1))
            found = _lookup(work, tokens)
            if not any(isinstance(t, str) for t in tokens):
                raise InputError(f"{what}: {message}") from None
            _drop(work, tokens)
            issues.append(ConfigIssue(path=match.group(1), found=found, expected=_expected_from(message)))
    else:  # pragma: no cover - 256 distinct bad keys
        raise InputError(f"{what}: too many invalid fields")
    return config, issues
