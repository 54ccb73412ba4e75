"""The manifest: every tensor a drafter geometry implies, computed in exactly one place.

`validate` diffs a checkpoint against it, `convert` writes against it, the runtime loads
through it and the fixture factory generates checkpoints from it. Names are the checkpoint's
(no `model.` prefix). Shapes are the ones the loaders check.
"""

from __future__ import annotations

import re

import msgspec

from lilicorr_ckpt.checkpoint.geometry import Geometry

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

COMPONENTS = ("backbone", "conv", "head", "lm_head")
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

# Name prefixes of the sibling heads' tensors (DFlash2 selector, DSpark served layout, Domino): judged as the
# family's head (coverage, surplus, shape, dtype) when the checkpoint declares that family.
SIBLING_HEAD_PREFIXES = ("candidate_selector.", "markov_head.", "confidence_head.", "prefix_gru.", "embed_proj.")
# Model-Optimizer's flat DSpark names (top level, beside the backbone)
DSPARK_FLAT_NAMES = ("markov_w1.weight", "markov_w2.weight", "gate_proj.weight", "gate_proj.bias",
                     "joint_proj.weight", "joint_proj.bias", "confidence_proj.weight", "confidence_proj.bias")
# per family, the prefixes of its head's tensors (the reference runtime refuses to build a sibling head)
FAMILY_HEAD_PREFIXES: dict[str, tuple[str, ...]] = {
    "dflash2": ("candidate_selector.",),
    "dspark": ("markov_head.", "confidence_head.", *DSPARK_FLAT_NAMES),
    "domino": ("prefix_gru.", "embed_proj."),
}


class ExpectedTensor(msgspec.Struct, frozen=True):
    name: str
    shape: tuple[int, ...]
    dtypes: frozenset[str]
    component: str  # backbone | conv | head | lm_head
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
            out[f"{module}.{suffix}"] = ExpectedTensor(f"{module}.{suffix}", shape, frozenset({dtype}),
                                                       m.component, module, scalar)

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


_BACKBONE_NAME = re.compile(r"^(layers\.\d+\.(self_attn|mlp|input_layernorm|post_attention_layernorm)\.|"
                            r"(hidden_norm|norm)\.)")


def component_of_name(name: str) -> str | None:
    """The component a (canonical) tensor name belongs to by its name alone; None when unknown."""
    if name.startswith("lilicorr.") or name.startswith(SIBLING_HEAD_PREFIXES) or name in DSPARK_FLAT_NAMES:
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
        rest = name[len("lilicorr."):]
        for old, new in LEGACY_HEAD_MODULES.items():
            if rest.startswith(old + "."):
                return "lilicorr." + new + rest[len(old):]
        m = _LEGACY_LAYER_MLP.match(name)
        if m:
            return f"lilicorr.layers.{m.group(1)}.mlp.{_LEGACY_LAYER_NAMES[m.group(2)]}." + name[m.end():]
    return name


def legacy_name(name: str) -> str:
    """The Sequential-MLP name of a canonical head tensor (identity when it has none)."""
    if name.startswith("lilicorr."):
        rest = name[len("lilicorr."):]
        for old, new in LEGACY_HEAD_MODULES.items():
            if rest.startswith(new + "."):
                return "lilicorr." + old + rest[len(new):]
        m = re.match(r"^lilicorr\.layers\.(\d+)\.mlp\.(up_proj|down_proj)\.", name)
        if m:
            index = "0" if m.group(2) == "up_proj" else "2"
            return f"lilicorr.layers.{m.group(1)}.mlp.{index}." + name[m.end():]
    return name


class _Builder:
    def __init__(self) -> None:
        self.tensors: dict[str, ExpectedTensor] = {}
        self.modules: dict[str, LinearModule] = {}

    def param(self, name: str, shape: tuple[int, ...], component: str) -> None:
        self.tensors[name] = ExpectedTensor(name, shape, FLOAT_DTYPES, component)

    def linear(self, name: str, out_features: int, in_features: int, component: str, bias: bool) -> None:
        self.modules[name] = LinearModule(name, out_features, in_features, component, bias)
        self.tensors[f"{name}.weight"] = ExpectedTensor(f"{name}.weight", (out_features, in_features),
                                                        FLOAT_DTYPES, component, name)
        if bias:
            self.tensors[f"{name}.bias"] = ExpectedTensor(f"{name}.bias", (out_features,), FLOAT_DTYPES,
                                                          component, name)


LAYER_SLACK = 64  # layers a config may state beyond the tensors present (each is reported missing, one by one)


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
        implausible[key] = (f"{key} is {shown}, but the files hold {tensors_present} tensors in all: "
                            f"at most {budget} layers can be checked")
        incomplete[component] = f"{key} {shown} exceeds the tensors present"
        return True

    backbone_missing = [k for k, v in (("hidden_size", M), ("num_hidden_layers", g.num_layers),
                                       ("num_attention_heads", g.num_heads), ("head_dim", g.head_dim),
                                       ("num_key_value_heads", g.num_kv_heads),
                                       ("intermediate_size", g.intermediate_size)) if v is None]
    if backbone_missing:
        incomplete["backbone"] = "needs " + ", ".join(backbone_missing)
    elif too_many("num_hidden_layers", g.num_layers, "backbone"):
        pass
    else:
        assert M and g.num_layers and g.num_heads and g.head_dim and g.num_kv_heads and g.intermediate_size
        q_out, kv_out, inter = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim, g.intermediate_size
        for i in range(g.num_layers):
            p = f"layers.{i}"
            b.param(f"{p}.input_layernorm.weight", (M,), "backbone")
            b.linear(f"{p}.self_attn.q_proj", q_out, M, "backbone", g.attention_bias)
            b.linear(f"{p}.self_attn.k_proj", kv_out, M, "backbone", g.attention_bias)
            b.linear(f"{p}.self_attn.v_proj", kv_out, M, "backbone", g.attention_bias)
            b.linear(f"{p}.self_attn.o_proj", M, q_out, "backbone", g.attention_bias)
            b.param(f"{p}.self_attn.q_norm.weight", (g.head_dim,), "backbone")
            b.param(f"{p}.self_attn.k_norm.weight", (g.head_dim,), "backbone")
            b.param(f"{p}.post_attention_layernorm.weight", (M,), "backbone")
            b.linear(f"{p}.mlp.gate_proj", inter, M, "backbone", False)
            b.linear(f"{p}.mlp.up_proj", inter, M, "backbone", False)
            b.linear(f"{p}.mlp.down_proj", M, inter, "backbone", False)
        if g.target_layer_ids is None:
            incomplete["fc"] = "fc needs target_layer_ids"
        else:
            b.linear("fc", M, len(g.target_layer_ids) * M, "backbone", False)
        b.param("hidden_norm.weight", (M,), "backbone")
        b.param("norm.weight", (M,), "backbone")

    if g.has_conv:
        if M is None or g.num_layers is None:
            incomplete["conv"] = "needs hidden_size and num_hidden_layers"
        elif budget is not None and g.num_layers > budget:
            incomplete["conv"] = "num_hidden_layers exceeds the tensors present"
        elif M % g.conv_group_size:
            incomplete["conv"] = f"hidden_size {M} is not divisible by conv_group_size {g.conv_group_size}"
        else:
            taps, groups = g.conv_kernel_size, M // g.conv_group_size
            for i in range(g.num_layers):
                for c in ("attention_conv", "mlp_conv"):
                    b.param(f"layers.{i}.{c}.base_kernel", (2, taps, M), "conv")
                    b.linear(f"layers.{i}.{c}.kernel_projection", 2 * taps * groups, M, "conv", False)

    if g.lilicorr_enabled:
        if not g.head_complete():
            incomplete["head"] = "LiLiCorr geometry is incomplete"
        elif too_many("dflash_config.lilicorr_num_layers", g.head_num_layers, "head"):
            pass
        else:
            _head(b, g)

    if g.family in ("dflash2", "dspark", "domino"):
        reason = _sibling_head(b, g)
        if reason:
            incomplete["head"] = reason

    if g.has_own_lm_head:
        if M is None or g.vocab_size is None:
            incomplete["lm_head"] = "needs hidden_size and vocab_size"
        else:
            b.linear("lm_head", g.vocab_size, M, "lm_head", False)

    return Manifest(geometry=g, tensors=b.tensors, modules=b.modules, incomplete=incomplete,
                    family_prefixes=FAMILY_HEAD_PREFIXES.get(g.family or "", ()), implausible=implausible)


def _sibling_head(b: _Builder, g: Geometry) -> str | None:
    """The DFlash2 / DSpark / Domino head tensors; a reason when the geometry does not determine them.
    Every one is a plain float parameter in every loader read (the selector projection, the Markov tables and the
    Domino GRU/projections are never quantized there), so they are registered as float-only parameters."""
    M, V = g.hidden_size, g.vocab_size
    if M is None or V is None:
        return "needs hidden_size and vocab_size"
    if g.family == "dflash2":
        r = g.selector_rank
        if r is None:
            return "DFlash2 needs dflash_config.selector_rank"
        b.param("candidate_selector.hidden_projection.weight", (r, M), "head")
        b.param("candidate_selector.predecessor_codebook", (V, r), "head")  # bare parameters: no .weight
        b.param("candidate_selector.successor_codebook", (V, r), "head")
    elif g.family == "dspark":
        r = g.markov_rank
        if r is None:
            return "DSpark needs markov_rank > 0"
        flat = g.dspark_layout == "modelopt"
        mk = "" if flat else "markov_head."
        b.param(f"{mk}markov_w1.weight", (V, r), "head")
        b.param(f"{mk}markov_w2.weight", (V, r), "head")
        if g.markov_head_type == "gated":
            b.param(f"{mk}gate_proj.weight", (r, M + r), "head")
            b.param(f"{mk}gate_proj.bias", (r,), "head")
        elif g.markov_head_type == "rnn":
            b.param(f"{mk}joint_proj.weight", (3 * r, 2 * r + M), "head")
            b.param(f"{mk}joint_proj.bias", (3 * r,), "head")
        if g.confidence_head:
            width = M + r if (g.confidence_with_markov or flat) else M
            conf = "confidence_proj" if flat else "confidence_head.proj"
            b.param(f"{conf}.weight", (1, width), "head")
            b.param(f"{conf}.bias", (1,), "head")
    elif g.family == "domino":
        gh, e = g.gru_hidden_dim, g.emb_dim
        if gh is None or e is None:
            return "Domino needs gru_hidden_dim and emb_dim"
        b.param("prefix_gru.weight_ih_l0", (3 * gh, M), "head")
        b.param("prefix_gru.weight_hh_l0", (3 * gh, gh), "head")
        b.param("embed_proj.0.weight", (e, M + gh), "head")
        b.param("embed_proj.2.weight", (V, e), "head")
    return None


def _head(b: _Builder, g: Geometry) -> None:
    M, h, K, B = g.hidden_size, g.head_hidden_size, g.candidate_topk, g.block_size
    L, N, F, R = g.head_num_layers, g.head_num_heads, g.head_factor_dim, g.head_mlp_width
    assert M and h and K and B and L and N and F and R is not None
    S = B - 1
    p = "lilicorr."
    if h != M:
        b.linear(p + "token_proj", h, M, "head", True)
    b.linear(p + "pass_hidden_proj", h, M, "head", True)
    b.param(p + "feature_norm.weight", (5,), "head")
    b.param(p + "feature_norm.bias", (5,), "head")
    b.linear(p + "feature_mlp.up_proj", h, 5, "head", True)
    b.linear(p + "feature_mlp.down_proj", h, h, "head", True)
    b.param(p + "slot_embedding", (1, 1, S, 1, h), "head")
    b.param(p + "rank_embedding", (1, 1, 1, K, h), "head")
    b.param(p + "relative_slot_bias", (N, 2 * B - 1), "head")
    b.param(p + "same_slot_bias", (N,), "head")
    b.linear(p + "context_proj", h, M, "head", True)
    for layer in range(L):
        q = f"{p}layers.{layer}."
        b.param(q + "attn_norm.weight", (h,), "head")
        b.param(q + "attn.in_proj_weight", (3 * h, h), "head")
        b.param(q + "attn.in_proj_bias", (3 * h,), "head")
        b.linear(q + "attn.out_proj", h, h, "head", True)
        b.param(q + "mlp_norm.weight", (h,), "head")
        b.linear(q + "mlp.up_proj", R, h, "head", True)
        b.linear(q + "mlp.down_proj", h, R, "head", True)
    b.param(p + "output_norm.weight", (h,), "head")
    b.param(p + "anchor_norm.weight", (h,), "head")
    b.linear(p + "factor_input_proj", h, 3 * h, "head", True)
    b.linear(p + "out_head", F, h, "head", True)
    b.linear(p + "in_head", F, h, "head", True)
    b.linear(p + "anchor_out_head", F, h, "head", True)
