"""A Llama / Qwen2 / Qwen3 target built without transformers: its config, weights, stop ids and tokenizer read
directly, for the fast path (target/fast.py) to run.

The config is config.json of a model directory (or an offline Hugging Face cache snapshot) or a GGUF's metadata
(target/gguf_direct.py's config dict); the weights are the directory's safetensors shards or gguf_direct's
dequantized tensors, cast to the dtype asked for as transformers casts them; the stop ids are
generation_config.json's eos_token_id, else the config's (with the family's default where the config names none,
as transformers' config classes give it); the tokenizer is target/tokenizer.py's. The rotary inverse frequencies
and attention scaling (rope types default, linear, llama3 and yarn) are computed here from their definitions
(tests compare them bit for bit with transformers').

`NativeCausalLM` holds the weights under transformers' parameter names, in modules of transformers' layout (the
fast path reads `model.model.layers[i].self_attn.q_proj.weight` and so on, fuses q/k/v and gate/up and reads the
rotary frequencies off `model.model.rotary_emb`, whichever built the model); it has no forward of its own, so a
target built here runs on the fast path only.

A source this does not map exactly returns a reason (a str) and the loader builds the target through
transformers as before: another architecture, a config key whose effect transformers' generic code applies
(quantization_config, auto_map, partial_rotary_factor, per-layer rope parameters, ...), a rope type or a rope
parameter outside the four, a config the fast path refuses (fast_path_problem), weights in another format than
safetensors, or a tensor missing or of another shape (transformers' error then names it, as it does today)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from lilicorr_ckpt.checkpoint.config import load_json_object
from lilicorr_ckpt.checkpoint.source import read_small

from . import gguf_direct
from .tokenizer import directory_tokenizer, gguf_tokenizer

FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
DEFAULT_THETA = 10_000.0
# transformers' config-class defaults for the keys a config may leave out (the geometry itself is required here)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen2": {"max_position_embeddings": 32768, "bos_token_id": None, "eos_token_id": None},
    "qwen3": {
        "max_position_embeddings": 32768,
        "bos_token_id": None,
        "eos_token_id": None,
        "attention_bias": False,
        "head_dim": 128,
    },
}
_COMMON = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": None,
    "use_sliding_window": False,
}
_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# config keys whose effect transformers applies in code shared by every model, which this route does not follow
_NOT_MAPPED = (
    "quantization_config",
    "auto_map",
    "partial_rotary_factor",
    "original_max_position_embeddings",
    "text_config",
    "pruned_heads",
    "dflash_config",
)


class NotMapped(Exception):
    """The source is not one this route maps exactly; the message says why (the loader notes it)."""


def _int(doc: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NotMapped(f"config {key} {value!r} is not a count")
    return value


def _float(doc: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise NotMapped(f"config {key} {value!r} is not a finite number")
    return float(value)


def _flag(doc: Mapping[str, Any], key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise NotMapped(f"config {key} {value!r} is not true or false")
    return value


def _ids(value: Any, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise NotMapped(f"{key} {value!r} is neither a token id nor a list of them")


class NativeConfig:
    """The config as attributes, with transformers' names (fast_path_problem, the fast path, smoke and the training
    recipe read it as they read a transformers config)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(
        self, name: str
    ) -> Any:  # a key the config does not hold (attributes are the config's keys)
        raise AttributeError(f"the config has no {name!r}")

    def get_text_config(self, *args: Any, **kwargs: Any) -> NativeConfig:
        return self

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"NativeConfig({self.__dict__!r})"


@dataclass(frozen=True)
class Rope:
    """The rotary embedding's parameters: its type and the standardized parameter dict (rope_theta and the type's
    own keys)."""

    rope_type: str
    parameters: dict[str, Any]


def _rope(doc: Mapping[str, Any], max_positions: int) -> Rope:
    """The rope parameters a config states, standardized as transformers reads them: `rope_scaling` (the older
    key) over `rope_parameters`, `type` as `rope_type`, the top-level rope_theta (10000 when absent) as the base,
    and the pretraining length of llama3 / yarn defaulting to max_position_embeddings."""
    scaling = doc.get("rope_scaling") or doc.get("rope_parameters") or {}
    if not isinstance(scaling, dict):
        raise NotMapped("rope parameters that are not a mapping")
    parameters = dict(scaling)
    if any(isinstance(v, dict) for v in parameters.values()):
        raise NotMapped("rope parameters per layer type")
    parameters.setdefault("rope_theta", _float(doc, "rope_theta", DEFAULT_THETA))
    kind = parameters.setdefault("rope_type", parameters.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise NotMapped(f"rope type {kind!r}")
    allowed = {
        "default": set(),
        "linear": {"factor"},
        "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
        "yarn": {
            "factor",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
            "beta_fast",
            "beta_slow",
            "original_max_position_embeddings",
            "truncate",
        },
    }[kind] | {"rope_type", "type", "rope_theta"}
    extra = sorted(set(parameters) - allowed)
    if extra:
        raise NotMapped(f"rope parameter {extra[0]!r} for rope type {kind!r}")
    if kind in ("llama3", "yarn"):
        parameters.setdefault("original_max_position_embeddings", max_positions)
    required = {
        "default": (),
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
        "yarn": ("factor",),
    }[kind]
    for key in parameters:
        if key in ("rope_type", "type", "truncate"):
            continue
        _float(parameters, key)
    if kind == "yarn" and not isinstance(parameters.get("truncate", True), bool):
        raise NotMapped("yarn truncate is not true or false")
    for key in required:
        if parameters.get(key) is None:
            raise NotMapped(f"rope type {kind!r} without {key}")
    if _float(parameters, "rope_theta") <= 0:
        raise NotMapped("rope_theta is not positive")
    return Rope(kind, parameters)


def read_config(doc: Mapping[str, Any]) -> NativeConfig:
    """The config of a Llama / Qwen2 / Qwen3 config.json (or a GGUF's config dict), or NotMapped."""
    kind = doc.get("model_type")
    if kind not in FAMILIES:
        raise NotMapped(f"model_type {kind!r}")
    for key in _NOT_MAPPED:
        if doc.get(key) not in (None, {}, []):
            raise NotMapped(f"config key {key!r}")
    defaults = {**_COMMON, **_DEFAULTS[kind]}
    values: dict[str, Any] = {"model_type": kind}
    for key in _REQUIRED:
        value = _int(doc, key)
        if not value:
            raise NotMapped(f"config without {key}")
        values[key] = value
    heads = values["num_attention_heads"]
    values["num_key_value_heads"] = _int(doc, "num_key_value_heads") or heads
    head_dim = _int(doc, "head_dim", defaults.get("head_dim"))
    values["head_dim"] = head_dim or values["hidden_size"] // heads
    if heads % values["num_key_value_heads"] or not values["head_dim"] or values["head_dim"] % 2:
        raise NotMapped("heads that do not group, or an odd head width")
    values["max_position_embeddings"] = _int(
        doc, "max_position_embeddings", defaults["max_position_embeddings"]
    )
    values["rms_norm_eps"] = _float(doc, "rms_norm_eps", defaults["rms_norm_eps"])
    hidden_act = doc.get("hidden_act", defaults["hidden_act"])
    values["hidden_act"] = hidden_act
    for key in ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias"):
        if key in defaults or key in doc:
            values[key] = _flag(doc, key, bool(defaults.get(key, False)))
    if kind == "qwen2" and "attention_bias" in doc:
        values.pop("attention_bias")  # Qwen2's q/k/v always have biases, its o never: the key is not read
    layer_types = doc.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != values["num_hidden_layers"]:
            raise NotMapped("layer_types that do not list every layer")
        values["layer_types"] = list(layer_types)
    elif kind != "llama":
        values["layer_types"] = ["full_attention"] * values["num_hidden_layers"]
    if values.get("use_sliding_window"):
        raise NotMapped("sliding-window attention")
    rope = _rope(doc, values["max_position_embeddings"])
    values["rope_parameters"] = rope.parameters
    values["rope_theta"] = rope.parameters["rope_theta"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = doc[key] if key in doc else defaults.get(key)
        _ids(value, key)
        values[key] = value
    architectures = doc.get("architectures")
    values["architectures"] = (
        list(architectures)
        if isinstance(architectures, list) and architectures
        else [f"{FAMILIES[kind]}ForCausalLM"]
    )
    return NativeConfig(values)


# rotary frequencies --------------------------------------------------------------------------------------------------


def _mscale(factor: float, scale: float = 1.0) -> float:
    """YaRN's attention temperature factor: 0.1·scale·ln(factor) + 1, and 1 where the context is not stretched."""
    return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0


def rope_frequencies(config: NativeConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] in float32, the cos/sin scaling) of the config's rotary embedding.

    default: θ_i = base^(-2i/d). linear: θ_i / factor. llama3: wavelengths 2π/θ_i shorter than
    L / high_freq_factor keep θ_i, longer than L / low_freq_factor take θ_i / factor, and those between blend the
    two with s = (L / wavelength - low) / (high - low): (1 - s)·θ_i / factor + s·θ_i. yarn: the interpolated
    θ_i / factor and the extrapolated θ_i mixed by a ramp over the dimensions whose rotation count over the
    pretraining length L lies between beta_fast and beta_slow (dimension of r rotations:
    d·ln(L / (2πr)) / (2 ln base), floored / ceiled unless truncate is false), and cos/sin scaled by
    attention_factor (else 0.1·ln(factor) + 1, or the ratio of the mscale and mscale_all_dim terms)."""
    parameters: dict[str, Any] = config.rope_parameters
    kind = parameters["rope_type"]
    base = float(parameters["rope_theta"])
    dim = int(config.head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    powers = base**exponents  # base^(2i/d)
    if kind == "default":
        return 1.0 / powers, 1.0
    factor = float(parameters["factor"])
    if kind == "linear":
        freq = 1.0 / powers
        return freq / factor, 1.0
    if kind == "llama3":
        freq = 1.0 / powers
        length = float(parameters["original_max_position_embeddings"])
        low, high = float(parameters["low_freq_factor"]), float(parameters["high_freq_factor"])
        wavelength = 2 * math.pi / freq
        long_waves = wavelength > length / low
        short_waves = wavelength < length / high
        scaled = torch.where(long_waves, freq / factor, freq)
        blend = (length / wavelength - low) / (high - low)
        blended = (1 - blend) * scaled / factor + blend * scaled
        return torch.where(~short_waves & ~long_waves, blended, scaled), 1.0
    # yarn
    length = float(parameters["original_max_position_embeddings"])
    attention = parameters.get("attention_factor")
    if attention is None:
        mscale, mscale_all = parameters.get("mscale"), parameters.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = float(_mscale(factor, float(mscale)) / _mscale(factor, float(mscale_all)))
        else:
            attention = _mscale(factor)
    fast = parameters.get("beta_fast") or 32
    slow = parameters.get("beta_slow") or 1

    def dimension_of(rotations: float) -> float:
        return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(base))

    first, last = dimension_of(fast), dimension_of(slow)
    if parameters.get("truncate", True):
        first, last = math.floor(first), math.ceil(last)
    first, last = max(first, 0), min(last, dim - 1)
    if first == last:
        last += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - first) / (last - first), 0, 1)
    keep = 1 - ramp  # the share of the extrapolated (unscaled) frequency
    extrapolated, interpolated = 1.0 / powers, 1.0 / (factor * powers)
    return interpolated * (1 - keep) + extrapolated * keep, float(attention)


# the model -----------------------------------------------------------------------------------------------------------


class _Weight(torch.nn.Module):
    """A module holding one `weight` (an RMSNorm's gain: the fast path reads only the weight)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(size))


class _Linear(torch.nn.Linear):
    """A Linear whose weights the checkpoint fills: no initialization. Built on the meta device, torch's own
    initialization runs through its Python references, whose first call imports torch._dynamo (about a second of a
    cold start, sympy included), for values that are thrown away."""

    def reset_parameters(self) -> None:
        pass


class _Embedding(torch.nn.Embedding):
    """An Embedding whose table the checkpoint fills: no initialization (as _Linear)."""

    def reset_parameters(self) -> None:
        pass


class _Attention(torch.nn.Module):
    def __init__(self, config: NativeConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        qkv_bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        o_bias = config.model_type != "qwen2" and bool(getattr(config, "attention_bias", False))
        self.q_proj = _Linear(hidden, q, bias=qkv_bias)
        self.k_proj = _Linear(hidden, kv, bias=qkv_bias)
        self.v_proj = _Linear(hidden, kv, bias=qkv_bias)
        self.o_proj = _Linear(q, hidden, bias=o_bias)
        if config.model_type == "qwen3":
            self.q_norm = _Weight(head_dim)
            self.k_norm = _Weight(head_dim)


class _MLP(torch.nn.Module):
    def __init__(self, config: NativeConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = _Linear(hidden, inner, bias=False)
        self.up_proj = _Linear(hidden, inner, bias=False)
        self.down_proj = _Linear(inner, hidden, bias=False)


class _Layer(torch.nn.Module):
    def __init__(self, config: NativeConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.input_layernorm = _Weight(config.hidden_size)
        self.post_attention_layernorm = _Weight(config.hidden_size)


class RotaryFrequencies(torch.nn.Module):
    """The rotary embedding's inverse frequencies (a float32 buffer, not saved), its type and its cos/sin scaling."""

    def __init__(self, config: NativeConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(config)
        self.rope_type: str = config.rope_parameters["rope_type"]
        self.register_buffer("inv_freq", inv_freq, persistent=False)


class _Decoder(torch.nn.Module):
    def __init__(self, config: NativeConfig) -> None:
        super().__init__()
        self.embed_tokens = _Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = _Weight(config.hidden_size)


class NativeCausalLM(torch.nn.Module):
    """A Llama / Qwen2 / Qwen3 causal LM's weights under transformers' names and module layout, without a forward:
    target/fast.py's StaticDecoder runs it."""

    def __init__(self, config: NativeConfig) -> None:
        super().__init__()
        self.config = config
        with torch.device("meta"):
            self.model = _Decoder(config)
            self.lm_head = _Linear(config.hidden_size, config.vocab_size, bias=False)
        self.model.rotary_emb = RotaryFrequencies(config)  # on the CPU, for real

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "a target built without transformers runs on the fast path only (target.forward); load it with "
            "native=False for transformers' own model"
        )

    def expected(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the checkpoint must hold, by name, with its shape (lm_head's not when tied)."""
        shapes = {name: tuple(p.shape) for name, p in self.named_parameters()}
        if self.config.tie_word_embeddings:
            shapes.pop("lm_head.weight")
        return shapes

    def assign(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take the weights (already checked against `expected` and cast): every parameter is replaced by the
        tensor given; a tied lm_head shares the embedding's."""
        wanted = self.expected()
        self.load_state_dict({n: state[n] for n in wanted}, strict=False, assign=True)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.eval()


def _check(model: NativeCausalLM, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """NotMapped naming the first tensor missing or of another shape (transformers then reports them all)."""
    for name, shape in model.expected().items():
        if name not in shapes:
            raise NotMapped(f"no tensor {name}")
        if tuple(shapes[name]) != shape:
            raise NotMapped(f"{name} has shape {list(shapes[name])}, the config needs {list(shape)}")


# sources -------------------------------------------------------------------------------------------------------------


@dataclass
class Built:
    """A target read without transformers: the model (on the CPU), where generation stops, the tokenizer (None
    when not asked for or the source has none) and a note on how the tokenizer was built."""

    model: NativeCausalLM
    eos_token_ids: tuple[int, ...]
    tokenizer: Any
    tokenizer_note: str


def _json(path: Path, what: str) -> dict[str, Any]:
    doc, _ = load_json_object(read_small(path, what), what)
    return doc


def _prepare(doc: Mapping[str, Any]) -> NativeCausalLM:
    """The model skeleton of a config, refused here when the fast path would refuse it (fast_path_problem)."""
    from .fast import fast_path_problem

    config = read_config(doc)
    if not isinstance(config.hidden_act, str):
        raise NotMapped(f"hidden_act {config.hidden_act!r}")
    model = NativeCausalLM(config)
    problem = fast_path_problem(model)  # reads the config and the rotary module
    if problem is not None:
        raise NotMapped(problem)
    return model


def _safetensors_files(root: Path) -> list[Path]:
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        raise NotMapped("no model.safetensors or model.safetensors.index.json")
    weight_map = _json(index, f"{root.name}/{index.name}").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise NotMapped(f"{index.name} has no weight_map of file names")
    files = []
    for name in dict.fromkeys(weight_map.values()):
        path = root / name
        if Path(name).name != name or not path.is_file():
            raise NotMapped(f"{index.name} names a shard {name!r} that is not a file beside it")
        files.append(path)
    return files


def _eos(config: NativeConfig, generation: Mapping[str, Any] | None) -> tuple[int, ...]:
    """generation_config.json's eos_token_id, else the config's: the order transformers builds the model's generation
    config in, which load_target stops by."""
    for source in (generation, config.__dict__):
        if source is not None:
            found = _ids(source.get("eos_token_id"), "eos_token_id")
            if found is not None:
                return found
    return ()


def build_from_directory(root: Path, dtype: torch.dtype, want_tokenizer: bool) -> Built:
    """A model directory's target (config.json, safetensors, generation_config.json, tokenizer.json), or
    NotMapped."""
    model = _prepare(_json(root / "config.json", f"{root.name}/config.json"))
    files = _safetensors_files(root)
    wanted = model.expected()
    shapes: dict[str, tuple[int, ...]] = {}
    where: dict[str, Path] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                if name in wanted and name not in where:
                    shapes[name] = tuple(f.get_slice(name).get_shape())
                    where[name] = path
    _check(model, shapes)
    state: dict[str, torch.Tensor] = {}
    for path in files:
        names = [n for n, p in where.items() if p == path]
        if names:
            with safe_open(str(path), framework="pt") as f:
                for name in names:
                    state[name] = f.get_tensor(name).to(dtype)
    model.assign(state)
    generation_file = root / "generation_config.json"
    generation = (
        _json(generation_file, f"{root.name}/generation_config.json") if generation_file.is_file() else None
    )
    eos = _eos(model.config, generation)
    tokenizer, note = None, ""
    if want_tokenizer:
        found = directory_tokenizer(root)
        if isinstance(found, str):
            note = found
        else:
            tokenizer = found
    return Built(model, eos, tokenizer, note)


def build_from_gguf(path: Path, dtype: torch.dtype, want_tokenizer: bool) -> Built:
    """A GGUF's target (gguf_direct's config, weights and its header's tokenizer), or NotMapped (gguf_direct's
    Unsupported); a malformed file raises GGUFError as gguf_direct raises it."""
    try:
        config_doc, state, tokenizer = gguf_direct.read_target(
            path, dtype, with_tokenizer=want_tokenizer, tokenizer_builder=gguf_tokenizer
        )
    except gguf_direct.Unsupported as why:
        raise NotMapped(str(why)) from None
    model = _prepare(config_doc)
    _check(model, {name: tuple(t.shape) for name, t in state.items()})
    model.assign(state)
    return Built(model, _eos(model.config, None), tokenizer, "")
