"""The manifest: every tensor a drafter geometry implies, computed in exactly one place.

`validate` diffs a checkpoint against it, `convert` writes against it, the runtime loads
through it and the fixture factory generates checkpoints from it. Names are the checkpoint's
(no `model.` prefix). Shapes are the ones the loaders check.
"""

from __future__ import annotations

import re

import msgspec

from lilicorr_ckpt.checkpoint.geometry import BackboneDims, Geometry
from lilicorr_ckpt.families import FAMILIES, SIBLING_HEAD_NAMES, SIBLING_HEAD_PREFIXES, SIBLINGS, lilicorr

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
INDEX_DTYPES = frozenset({"I64"})  # d2t: torch.long, as speculators saves it and vLLM's parameter is
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}

COMPONENTS = ("backbone", "conv", "head", "lm_head", "vocab")
# `Manifest.incomplete` keys are components, plus "fc" when only fc cannot be built

# Modules whose linear weights the stacks consume; "role" is the component they belong to.
LEGACY_HEAD_MODULES = {
    # Sequential (training-module) name -> named-MLP name, under `lilicorr.`
    "feature_mlp.0": "feature_norm",
    "feature_mlp.1": "feature_mlp.up_proj",
    "feature_mlp.3": "feature_mlp.down_proj",
}
_LEGACY_LAYER_MLP = re.compile(r"^lilicorr\.layers\.(\d+)\.mlp\.(0|2)\.")
_LEGACY_LAYER_NAMES = {"0": "up_proj", "2": "down_proj"}


def family_prefixes(family: str | None) -> tuple[str, ...]:
    """The names (prefixes and exact names) of a sibling family's head tensors; () for LiLiCorr and DFlash (the
    reference runtime refuses to build a sibling head)."""
    if family not in SIBLINGS:
        return ()
    f = FAMILIES[family]
    return (*f.HEAD_PREFIXES, *f.HEAD_NAMES)


class ExpectedTensor(msgspec.Struct, frozen=True):
    name: str
    shape: tuple[int, ...]
    dtypes: frozenset[str]
    component: str  # backbone | conv | head | lm_head | vocab (d2t, the draft-to-target id map)
    module: str | None = None  # the linear module this is the weight/bias of
    scalar: bool = False  # a 0-d scale; a [1] tensor is accepted too

    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return shape == self.shape or (self.scalar and shape in ((), (1,)))


class LinearModule(msgspec.Struct, frozen=True):
    name: str
    out_features: int
    in_features: int
    component: str
    bias: bool


class QuantScheme(msgspec.Struct, frozen=True):
    algo: str  # ModelOpt quant_algo
    weight_dtype: str  # U8 (packed E2M1 pairs) or F8_E4M3
    weight_scale: str  # block_e4m3 | scalar | per_channel | block128
    weight_scale_2: bool
    input_scale: bool  # activations quantized (W4A4 / static FP8)
    group_size: int = 16

    @property
    def packed(self) -> bool:
        return self.weight_dtype == "U8"

    @property
    def nvfp4(self) -> bool:
        return self.weight_scale == "block_e4m3"


def quant_scheme(algo: str, group_size: int | None = None) -> QuantScheme | None:
    """The tensor layout ModelOpt writes for `algo`, or None for algorithms we do not model."""
    g = group_size or 16
    if algo == "NVFP4":
        return QuantScheme(algo, "U8", "block_e4m3", True, True, g)
    if algo == "W4A16_NVFP4":
        return QuantScheme(algo, "U8", "block_e4m3", True, False, g)
    if algo == "FP8":
        return QuantScheme(algo, "F8_E4M3", "scalar", False, True, g)
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
        return QuantScheme(algo, "F8_E4M3", "per_channel", False, False, g)
    if algo == "FP8_PB_WO":
        return QuantScheme(algo, "F8_E4M3", "block128", False, False, 128)
    return None


QUANT_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale")
KV_SCALE_SUFFIXES = ("k_scale", "v_scale")  # FP8 KV-cache scales on k_proj / v_proj


class Manifest(msgspec.Struct, frozen=True):
    geometry: Geometry
    tensors: dict[str, ExpectedTensor]  # canonical float form
    modules: dict[str, LinearModule]
    # component -> why it could not be built (missing geometry); absent when complete
    incomplete: dict[str, str]
    family_prefixes: tuple[str, ...]
    # config key -> why its count was not expanded: it names more layers than the files hold tensors
    implausible: dict[str, str] = {}

    def names(self, component: str) -> list[str]:
        return [n for n, t in self.tensors.items() if t.component == component]

    def quantized_form(self, module: str, scheme: QuantScheme) -> dict[str, ExpectedTensor]:
        """The tensors a quantized `module` carries in place of its float weight (bias unchanged)."""
        m = self.modules[module]
        o, i = m.out_features, m.in_features
        out: dict[str, ExpectedTensor] = {}

        def add(suffix: str, shape: tuple[int, ...], dtype: str, scalar: bool = False) -> None:
            out[f"{module}.{suffix}"] = ExpectedTensor(
                f"{module}.{suffix}", shape, frozenset({dtype}), m.component, module, scalar
            )

        add("weight", (o, i // 2) if scheme.packed else (o, i), scheme.weight_dtype)
        if scheme.weight_scale == "block_e4m3":
            add("weight_scale", (o, i // scheme.group_size), "F8_E4M3")
        elif scheme.weight_scale == "scalar":
            add("weight_scale", (), "F32", scalar=True)
        elif scheme.weight_scale == "per_channel":
            add("weight_scale", (o,), "F32")
        else:
            add("weight_scale", (o // 128, 1, i // 128, 1), "F32")
        if scheme.weight_scale_2:
            add("weight_scale_2", (), "F32", scalar=True)
        if scheme.input_scale:
            add("input_scale", (), "F32", scalar=True)
        return out

    def module_of(self, name: str) -> str | None:
        """The linear module a (canonical) tensor name belongs to, scale tensors included."""
        tensor = self.tensors.get(name)
        if tensor is not None:
            return tensor.module
        base, _, suffix = name.rpartition(".")
        known = QUANT_SUFFIXES + KV_SCALE_SUFFIXES
        return base if suffix in known and base in self.modules else None

    def parameter_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(COMPONENTS, 0)
        for tensor in self.tensors.values():
            n = 1
            for dim in tensor.shape:
                n *= dim
            counts[tensor.component] += n
        return counts


_BACKBONE_NAME = re.compile(
    r"^(layers\.\d+\.(self_attn|mlp|input_layernorm|post_attention_layernorm)\.|"
    r"(hidden_norm|norm)\.)"
)


def component_of_name(name: str) -> str | None:
    """The component a (canonical) tensor name belongs to by its name alone; None when unknown."""
    if name.startswith("lilicorr.") or name.startswith(SIBLING_HEAD_PREFIXES) or name in SIBLING_HEAD_NAMES:
        return "head"
    if ".attention_conv." in name or ".mlp_conv." in name:
        return "conv"
    if name.startswith("lm_head."):
        return "lm_head"
    if name.startswith("fc."):
        return "fc"
    if _BACKBONE_NAME.match(name):
        return "backbone"
    return None


def canonical_name(name: str) -> str:
    """Map a legacy Sequential LiLiCorr name to its named-MLP form; others unchanged."""
    if name.startswith("lilicorr."):
        rest = name[len("lilicorr.") :]
        for old, new in LEGACY_HEAD_MODULES.items():
            if rest.startswith(old + "."):
                return "lilicorr." + new + rest[len(old) :]
        m = _LEGACY_LAYER_MLP.match(name)
        if m:
            return f"lilicorr.layers.{m.group(1)}.mlp.{_LEGACY_LAYER_NAMES[m.group(2)]}." + name[m.end() :]
    return name


def legacy_name(name: str) -> str:
    """The Sequential-MLP name of a canonical head tensor (identity when it has none)."""
    if name.startswith("lilicorr."):
        rest = name[len("lilicorr.") :]
        for old, new in LEGACY_HEAD_MODULES.items():
            if rest.startswith(new + "."):
                return "lilicorr." + old + rest[len(new) :]
        m = re.match(r"^lilicorr\.layers\.(\d+)\.mlp\.(up_proj|down_proj)\.", name)
        if m:
            index = "0" if m.group(2) == "up_proj" else "2"
            return f"lilicorr.layers.{m.group(1)}.mlp.{index}." + name[m.end() :]
    return name


class _Builder:
    def __init__(self) -> None:
        self.tensors: dict[str, ExpectedTensor] = {}
        self.modules: dict[str, LinearModule] = {}

    def param(self, name: str, shape: tuple[int, ...], component: str) -> None:
        self.tensors[name] = ExpectedTensor(name, shape, FLOAT_DTYPES, component)

    def index(self, name: str, shape: tuple[int, ...], component: str) -> None:
        """An integer table (not a weight: never quantized, never a float)."""
        self.tensors[name] = ExpectedTensor(name, shape, INDEX_DTYPES, component)

    def linear(self, name: str, out_features: int, in_features: int, component: str, bias: bool) -> None:
        self.modules[name] = LinearModule(name, out_features, in_features, component, bias)
        self.tensors[f"{name}.weight"] = ExpectedTensor(
            f"{name}.weight", (out_features, in_features), FLOAT_DTYPES, component, name
        )
        if bias:
            self.tensors[f"{name}.bias"] = ExpectedTensor(
                f"{name}.bias", (out_features,), FLOAT_DTYPES, component, name
            )


LAYER_SLACK = (
    64  # layers a config may state beyond the tensors present (each is reported missing, one by one)
)


def layer_budget(tensors_present: int | None) -> int | None:
    """The most layers a manifest expands for a checkpoint holding `tensors_present` tensors: every layer needs
    at least one tensor, so a count beyond it (plus slack) cannot be satisfied, and is reported rather than built."""
    return None if tensors_present is None else tensors_present + LAYER_SLACK


def build_manifest(g: Geometry, tensors_present: int | None = None) -> Manifest:
    """The expected tensors of `g`. With `tensors_present` (what the files hold), a layer count beyond
    `layer_budget` is recorded in `implausible` instead of expanded: work follows the bytes, not the config."""
    b = _Builder()
    incomplete: dict[str, str] = {}
    implausible: dict[str, str] = {}
    budget = layer_budget(tensors_present)
    M = g.hidden_size

    def too_many(key: str, count: int | None, component: str) -> bool:
        if budget is None or count is None or count <= budget:
            return False
        shown = str(count) if count < 10**12 else f"a {len(str(count))}-digit number"
        implausible[key] = (
            f"{key} is {shown}, but the files hold {tensors_present} tensors in all: "
            f"at most {budget} layers can be checked"
        )
        incomplete[component] = f"{key} {shown} exceeds the tensors present"
        return True

    backbone = g.backbone_dims()
    if backbone is None:
        backbone_missing = [
            k
            for k, v in (
                ("hidden_size", M),
                ("num_hidden_layers", g.num_layers),
                ("num_attention_heads", g.num_heads),
                ("head_dim", g.head_dim),
                ("num_key_value_heads", g.num_kv_heads),
                ("intermediate_size", g.intermediate_size),
            )
            if v is None
        ]
        incomplete["backbone"] = "needs " + ", ".join(backbone_missing)
    elif not too_many("num_hidden_layers", g.num_layers, "backbone"):
        _backbone(b, backbone, g.attention_bias, g.num_taps)
        if g.num_taps is None:
            incomplete["fc"] = "fc needs target_layer_ids"

    if g.has_conv:
        reason = _conv(b, g, budget)
        if reason:
            incomplete["conv"] = reason

    # the heads: LiLiCorr's when enabled, a sibling family's when declared (each family lists its own tensors);
    # a LiLiCorr head of more layers than the files could hold is reported, not expanded
    for family in FAMILIES.values():
        if not family.carried(g) or (
            family is lilicorr
            and g.head_complete()
            and too_many("dflash_config.lilicorr_num_layers", g.head_num_layers, "head")
        ):
            continue
        reason = family.head_tensors(b, g)
        if reason:
            incomplete["head"] = reason

    if g.has_own_lm_head:
        if M is None or g.vocab_size is None:
            incomplete["lm_head"] = "needs hidden_size and vocab_size"
        else:
            # a reduced draft vocabulary: the head's rows, and d2t mapping each to its target id (speculators
            # saves both; vLLM's DFlash and DSpark loaders read d2t as draft_id_to_target_id)
            b.linear("lm_head", g.draft_vocab_size or g.vocab_size, M, "lm_head", False)
            if g.draft_vocab_size is not None:
                b.index("d2t", (g.draft_vocab_size,), "vocab")

    return Manifest(
        geometry=g,
        tensors=b.tensors,
        modules=b.modules,
        incomplete=incomplete,
        family_prefixes=family_prefixes(g.family),
        implausible=implausible,
    )


def _backbone(b: _Builder, d: BackboneDims, bias: bool, taps: int | None) -> None:
    """Every draft layer, then fc (when the taps are known: it projects their concatenation) and the norms."""
    M, inter = d.hidden_size, d.intermediate_size
    q_out, kv_out = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    for i in range(d.num_layers):
        p = f"layers.{i}"
        b.param(f"{p}.input_layernorm.weight", (M,), "backbone")
        b.linear(f"{p}.self_attn.q_proj", q_out, M, "backbone", bias)
        b.linear(f"{p}.self_attn.k_proj", kv_out, M, "backbone", bias)
        b.linear(f"{p}.self_attn.v_proj", kv_out, M, "backbone", bias)
        b.linear(f"{p}.self_attn.o_proj", M, q_out, "backbone", bias)
        b.param(f"{p}.self_attn.q_norm.weight", (d.head_dim,), "backbone")
        b.param(f"{p}.self_attn.k_norm.weight", (d.head_dim,), "backbone")
        b.param(f"{p}.post_attention_layernorm.weight", (M,), "backbone")
        b.linear(f"{p}.mlp.gate_proj", inter, M, "backbone", False)
        b.linear(f"{p}.mlp.up_proj", inter, M, "backbone", False)
        b.linear(f"{p}.mlp.down_proj", M, inter, "backbone", False)
    if taps is not None:
        b.linear("fc", M, taps * M, "backbone", False)
    b.param("hidden_norm.weight", (M,), "backbone")
    b.param("norm.weight", (M,), "backbone")


def _conv(b: _Builder, g: Geometry, budget: int | None) -> str | None:
    """The grouped convolutions of every draft layer; a reason instead when the geometry does not determine them."""
    M, layers = g.hidden_size, g.num_layers
    if M is None or layers is None:
        return "needs hidden_size and num_hidden_layers"
    if budget is not None and layers > budget:
        return "num_hidden_layers exceeds the tensors present"
    if M % g.conv_group_size:
        return f"hidden_size {M} is not divisible by conv_group_size {g.conv_group_size}"
    taps, groups = g.conv_kernel_size, M // g.conv_group_size
    for i in range(layers):
        for c in ("attention_conv", "mlp_conv"):
            b.param(f"layers.{i}.{c}.base_kernel", (2, taps, M), "conv")
            b.linear(f"layers.{i}.{c}.kernel_projection", 2 * taps * groups, M, "conv", False)
    return None
