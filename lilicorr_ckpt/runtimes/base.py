"""The record every engine module fills in: what one release of a serving stack accepts, as data.

An engine module lists every release it supports as a chain: the first release's record in full, then each later
release as a Bump, the fields whose value changed and what changed in the code (release_chain). Rules consult the
records; nothing else in the code branches on a runtime's name or version. Patterns are fnmatch
patterns over canonical module names (checkpoint names without `model.`). The loader audit in
docs/validate.md says which statement of the released code each field comes from.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

import msgspec

from lilicorr_ckpt.families import FAMILIES

QKV = ("layers.*.self_attn.q_proj", "layers.*.self_attn.k_proj", "layers.*.self_attn.v_proj")
HEAD_RAW_LINEARS = ("lilicorr.factor_input_proj", "lilicorr.out_head", "lilicorr.in_head")
FEATURE_MLP = ("lilicorr.feature_mlp.*",)
CONV_KERNEL_PROJECTIONS = ("layers.*.attention_conv.kernel_projection", "layers.*.mlp_conv.kernel_projection")


class RuntimeProfile(msgspec.Struct, frozen=True, kw_only=True):
    # the key findings and verdicts name it by: the engine id ("vllm") when one release of the engine is judged,
    # the release ("vllm==0.33.0") when several are (runtimes/__init__.py select_profiles)
    name: str
    engine_id: str  # the engine's --runtime name: "sglang" | "vllm" | "trtllm"
    engine: str  # the stack's own name, e.g. "SGLang"
    version: str  # the release modelled ("0.5.23"), or the unreleased revision ("main@8d62b3e")
    released: bool  # False: the profile models code no release has yet
    source: str  # where the modelled code comes from: the wheel, or the repository and commits
    # what this release changed from the one before it that decides a verdict, one line each (file:function, what);
    # empty for the first release modelled
    changes: tuple[str, ...] = ()
    # lilicorr_candidate_topk: power of two and <= this, or None for "any K >= 1"
    topk_power_of_two_max: int | None
    hidden_size_zero_ok: bool  # lilicorr_hidden_size 0 means "use the draft width"
    vector_eps_below_half: bool  # vector_eps must lie in (0, 0.5)
    block_size_default: int | None  # used when block_size is absent everywhere; None = refused
    conv_keys_both_or_neither: bool
    conv_kernel_within_block: bool  # refuses conv_kernel_size > block_size
    legacy_mlp_names: str  # "renamed" | "refused" (no parameter for the Sequential names)
    owned_lm_head: str  # "supported" | "dropped" (no lm_head parameter: the target's head is used)
    # linear modules this runtime builds unquantized whatever the quant config says
    float_forced: tuple[str, ...]
    # linear modules that must be float and excluded, because the runtime follows the config for them
    float_required: tuple[str, ...]
    # linear modules whose quantized loading is not confirmed for this runtime
    quant_unconfirmed: tuple[str, ...]
    # matches exclusions against draft layers renumbered after the target's (model.layers.{num_target_layers+i})
    renumbers_draft_layers: bool = False
    nested_quant_method_algos: tuple[str, ...] | None  # algos it derives quant_method for in the nested form
    mask_token_fallback: str  # what it does when mask_token_id is missing
    target_layer_ids_fallback: str
    # flat quantization_config: the only exclusion list it reads (None: `ignore`, else `exclude_modules`)
    flat_exclusions_key: str | None = None
    # flat quantization_config, per quant_algo: the keys it takes exclusions from, the first present wins (an algo
    # not listed reads flat_exclusions_key)
    flat_exclusions_by_algo: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # a nested ({producer, quantization}) quantization_config in config.json is flattened first (quant_algo hoisted
    # to the top), so its exclude_modules and group_size are not read
    flattens_inline_nested: bool = False
    # the head families whose draft class builds its linears through the quant config under their full module
    # names (None: every family). The others build `unquantizable_float` as plain linears and name their decoder
    # layers' linears without the layer path (qkv_proj, o_proj, gate_up_proj, down_proj)
    quantizable_families: tuple[str, ...] | None = None
    unquantizable_float: tuple[str, ...] = ()
    # the quant_algo values it loads (None: every algorithm the manifest knows); others are refused (LC312)
    quant_algos: tuple[str, ...] | None = None
    # NVFP4 / W4A16_NVFP4 must use this group size (None: any the weights were quantized with; LC325)
    nvfp4_group_size: int | None = None
    # the NVFP4 global scale of a fused q/k/v or gate/up linear: "max" (every shard served with the largest
    # weight_scale_2: LC327 with --deep) or "per-shard" (each keeps its own)
    fused_global_scale: str = "per-shard"
    # flat quantization_config: the group size it uses when there is no top-level group_size
    # (None: unconfirmed, config_groups.group_0.weights.group_size taken as a fallback)
    flat_group_size_default: int | None = None
    # the nested NVFP4 form must carry group_size, kv_cache_quant_algo and exclude_modules (null allowed)
    nested_form_keys_required: bool = False
    # flat form: without a top-level group_size, reads the first config group's weights before the default
    flat_group_size_from_config_groups: bool = False
    # with no quantization_config in config.json, derives a quant_method from hf_quant_config.json (and refuses
    # what it cannot derive one for: LC302); which copy a runtime reads at all is quant_config_read
    reads_hf_quant_config: bool = False
    # is_causal / dflash_config.causal true: "refuses" ("requires non-causal"), "honours" (drafts causally as
    # declared) or "ignores" (runs full layers bidirectionally whatever the config says: a silent mis-load)
    causal: str = "refuses"
    # a true top-level is_causal, where the runtime reads it by another statement than dflash_config.causal
    # (None: the same as `causal`)
    causal_top_level: str | None = None
    # reads output_multiplier from dflash_config only and requires it > 0 (None: does not read it)
    output_multiplier_nested_positive: bool = False
    # the head kinds whose first draft step refuses a dflash_config.output_multiplier <= 0 (the candidates' logits
    # scale: vLLM's get_top_k_tokens)
    output_multiplier_step_positive: tuple[str, ...] = ()
    embedding_rows_equal_vocab: bool = False  # the target's input embedding must have exactly V rows
    accepts_fused_qkv: bool = True  # accepts (and splits) a float fused self_attn.qkv_proj.weight
    # DFlashDraftModel (and the backbones in projector_routed_architectures) with dflash_config.projector_type
    # "lilicorr" / lilicorr_enabled true selects LiLiCorr
    projector_type_routes: bool = False
    projector_routed_architectures: tuple[str, ...] = ()
    num_target_layers_positive: bool = False  # refuses num_target_layers < 1
    hidden_act: str = "silu-only"  # "silu-only" (refuses others) | "unconfirmed"
    extra_hidden_acts: tuple[str, ...] = ()  # activations besides silu its DFlash MLP builds
    # a sliding_attention layer takes its window from dflash_config.swa_window_size when sliding_window is absent
    swa_window_size_read: bool = False
    # dflash_config.use_swa (outside layer_types): "applied" (every layer sliding) | "ignored" (full attention)
    use_swa: str = "applied"
    # dflash_config.swa_window_size < 1 with use_swa: "refuses" | "literal" (a window of 0) | "ignored"
    swa_window_zero: str = "refuses"
    # whole-number floats (4.0) where an integer is needed: "casts" (int()), "crashes" (used raw: TypeError),
    # "refuses" (an explicit integer check) or "unconfirmed"
    integral_float_lilicorr: str = "casts"  # lilicorr_* integer geometry
    integral_float_backbone: str = "casts"  # hidden_size, num_hidden_layers, block_size, ...
    # the backbone integers its transformers config class declares int (hidden_size, num_hidden_layers, ...):
    # "config-class" (refused by the config's strict validation), or None: as integral_float_backbone
    integral_float_typed: str | None = None
    integral_float_mask_token: str = "casts"  # mask_token_id
    embed_tokens_copy: str = "dropped"  # a draft embed_tokens.weight: "dropped" | "used" | "replaced"
    # which quantization config it acts on when both exist: "config.json" (the inline quantization_config;
    # hf_quant_config.json only when config.json has none) or "hf_quant_config.json" (the file is authoritative,
    # the inline copy is read only when the file sets no global quant_algo, and a differing inline copy only warns)
    quant_config_read: str = "config.json"
    # config.json's quantization_config an object with no quant_method (and not ModelOpt's nested form):
    # "refused" (an unknown, empty quantization method) | "unquantized" (read as no quantization)
    quant_config_without_method: str = "refused"
    # the draft head's LogitsProcessor is built with the top-level logit_scale (multiplies the draft logits)
    logit_scale_read: bool = False
    # lilicorr.slot_embedding / rank_embedding stored 4-D ([1, S, 1, h] / [1, 1, K, h], without the leading
    # singleton): False = refused (the 5-D parameter's loader checks the shape), True = loaded (its own layout)
    embeddings_4d: bool = False
    # what a sliding_attention layer of window w computes (None: not established)
    sliding_semantics: str | None = None
    # the rope_theta it uses when config.json has none (None: not established)
    rope_theta_default: str | None = None
    # what it does with lilicorr_enabled false on LiLiCorrDraftModel (None: not established)
    lilicorr_disabled: str | None = None
    # older revisions read the top-level block_size only (the newest prefers dflash_config's)
    block_size_top_level_in_older: bool = False
    # DFlash2: reads conv_kernel_size / conv_group_size with a plain index (a KeyError without them)
    dflash2_conv_indexed: bool = False
    # a tensor name it has no parameter for: "dropped" (unresolved names ignored) | "refused" | None (not established)
    unknown_tensors: str | None = None
    # a legacy and a named-MLP name for one head tensor: "overwrites" (the second wins) | "refuses"
    legacy_duplicate: str = "refuses"
    # lm_head tensors without has_own_lm_head: "dropped" (no parameter) | "owned" (any lm_head tensor makes the
    # head the draft's own) | "ignored" (the target's head is swapped in)
    undeclared_lm_head: str = "dropped"
    # refuses layer_types whose length is not num_hidden_layers (transformers' validate_layer_type)
    layer_types_length_exact: bool = False
    # refuses sliding_attention layers of a Qwen2/Qwen3 config without use_sliding_window (its config class then
    # sets sliding_window to None)
    sliding_window_needs_flag: bool = False
    reads_draft_vocab: bool = True  # False: draft_vocab_size / draft_id_to_target_id are never read
    # intermediate_size absent: its config class's default (Qwen3Config: 22016) sizes the MLP. "refused": the
    # trained tensors of another width do not load; "padded": its linear weight loaders zero-pad a narrower
    # trained tensor to the built width, which computes the trained function
    intermediate_size_absent: str = "refused"
    # config.json's draft_id_to_target_id is read (False: only draft_vocab_size against the target's vocabulary
    # decides a reduced vocabulary; the mapping itself comes from the d2t tensor)
    reads_draft_id_map_key: bool = True
    # its target models capture the tapped layers in layer order, whatever the order of target_layer_ids
    captures_in_layer_order: bool = False
    # the target architectures that capture their last layer's output (None: every target does; a tuple: the
    # others never capture it)
    final_layer_capture_architectures: tuple[str, ...] | None = None
    # Sibling heads are routed by each family's ROUTES (lilicorr_ckpt/families), keyed by `name`.
    # DFlash2 selector keys: "pair" (rank and top_k both or neither, >= 0), "range" (rank >= 1, 2 <= top_k <= V),
    # "indexed" (both read with a plain index, no range check: a KeyError without them, a negative size fails to build)
    selector_check: str = ""
    selector_required: bool = False  # DFlash2DraftModel refuses a config without selector_rank
    markov_rank_top_level: bool = False  # DSpark: reads markov_rank from the top level and requires it > 0
    markov_head_types: tuple[str, ...] = ()  # DSpark markov_head_type values it builds; others refused
    domino_checks: bool = (
        False  # shift_label bool, pure_draft_prefix_len 1, emb_dim agreement, block_size > 1
    )
    domino_dims_required: bool = False  # gru_hidden_dim and emb_dim >= 1
    # refuses lilicorr_logit_scale <= 0 (False: serves it as declared, LC170)
    logit_scale_checked: bool = True
    # refuses lilicorr_vector_eps <= 0 (False: loads it and normalises the candidate vectors with F.normalize under
    # that eps, a division with no floor: LC103 says "loads, then serves")
    vector_eps_checked: bool = True
    # tensors it drops that take no part in the drafted function (fnmatch over canonical names): LC225, not LC204
    inert_tensors: tuple[str, ...] = ()
    # a top-level eagle_aux_hidden_state_layer_ids replaces target_layer_ids (+1) as the layers fc reads
    reads_eagle_aux_layer_ids: bool = False
    # tensor-name aliases it renames on load: "midlayer" (midlayer.* -> layers.0.*), "encoder" (encoder.fc.* ->
    # fc.*, encoder.output_norm_enc.* -> hidden_norm.*); LC226 where renamed, LC227 where not
    tensor_aliases: tuple[str, ...] = ()
    sample_from_anchor_refused: bool = False  # refuses dflash_config.sample_from_anchor true
    # use_aux_hidden_state false builds no fc and drops fc.weight (the draft runs without the target's features)
    use_aux_hidden_state_read: bool = False
    # a true dflash_config.attention_sink_bias builds a learnt sink per draft layer, loaded from
    # layers.N.self_attn.attention_sink_bias; attention_sinks_top_level: without that key, a truthy top-level
    # add_swa_attention_sink_bias does too
    attention_sinks_built: bool = False
    attention_sinks_top_level: bool = False
    # how it reads the config.json keys whose JSON type decides a load (LC001 / LC004): (JSON path pattern, the head
    # kinds it applies to: "*", "a,b" or "!a,b" for all but those, reader). Readers: "unread" (not read for that
    # head kind), "truth" (`if value:`, any JSON value loads), "truth?" (the same, null read as
    # absent), "equals" (`value == "name"`:
    # any JSON value loads, none but the name selects anything), "flag" (`if value:` builds something: a true value
    # other than `true` is refused), "count?" (null or an integer >= 1), "float()" / "int()" (cast: a numeric
    # string loads, null, a list or an object does not), "int()?" (the same, null read as absent), "int()-bool"
    # (int() of anything but null or a bool), "int" (a JSON integer, used uncast), "number?" (an int, a float or
    # null), "number>int()" (a number compared as it is, then cast with int() where it builds something), "bool"
    # (true or false, null refused), "str?" (a string or null), "str+" (a non-empty string),
    # "object" (a JSON object), "str()" (any value, read through str(): the value checks say which text builds).
    # "else:READER": a top-level key read with READER only when
    # dflash_config has no value of that name (unread otherwise). First match wins; a key no entry matches must
    # have the type the schema gives it
    config_reads: tuple[tuple[str, str, str], ...] = ()
    # the same as config_reads, matched before it, for the keys of a DSpark head that its DSpark parser reads
    # (SGLang's parse_dspark_draft_config: the dspark_* keys, markov_*, mask_token_id)
    dspark_reads: tuple[tuple[str, str, str], ...] = ()
    # parses config.json with transformers' strict config classes (transformers 5): each typed field refuses
    # another JSON type, null included (LC005); model_type must name a registered type (LC006); a key that
    # shadows the class's own attributes (text_config, get_text_config) breaks the parse (LC007)
    config_class_strict: bool = False
    # the top-level text-config keys (text_config, decoder, ...) it refuses when they hold null: transformers'
    # get_text_config skips a null one (the config is its own text config), a release that reads the key by
    # hasattr refuses it (LC007); a non-null value is refused by every strict release
    text_config_null_refused: tuple[str, ...] = ()
    # head_dim 0 is read as absent (`head_dim or hidden_size // num_heads`); False: it sizes the heads (LC118)
    head_dim_zero_derived: bool = False
    # the head families whose speculator config checks num_speculative_tokens against a top-level n_predict (more
    # than n_predict must be a multiple of it: LC182)
    n_predict_families: tuple[str, ...] = ()
    # reads eagle_config as a dict (`.update`, `.get`): any other JSON value crashes the model's build (LC008)
    eagle_config_object: bool = False
    # what a missing head, convolution, owned lm_head or head quantization-scale tensor does: "refused" (a coverage
    # check at load) or "initialised" (no check: the parameter serves at its initial value, a silent mis-load)
    head_coverage: str = "refused"
    # how the draft's exclusion patterns are turned into the names they match (vLLM): "mapped" (rewritten like
    # the draft's module names: X* split, renames, root layers.N renumbered, model. prefixed) or "aliased" (kept
    # as written, plus a renumbered copy of each unrooted layers.N); "" for engines that match names directly
    draft_exclusion_mapping: str = ""
    # the draft's max_position_embeddings follows the target's context (raised, or the context capped to it);
    # False: positions past the draft's own limit read past its rotary table while serving
    draft_positions_follow_target: bool = True
    # DFlash2: a config key whose presence reroutes DFlash2DraftModel to a model that runs the listed layer
    # indices without RoPE (None: the key is not read, every layer has RoPE)
    dflash2_nope_layers_key: str | None = None
    # DSpark: a vocabulary that differs from the target's must ship embed_tokens / lm_head / d2t, refused
    # otherwise (False: served at their initial values, the mapping as the identity)
    dspark_vocab_tensors_required: bool = True
    # DSpark with enable_confidence_head and no confidence_head tensors: "dropped" (the head is turned off) or
    # "initialised" (served at its initial value), either way read only under an opt-in the drafted tokens do not
    # depend on; "unaudited": what the release does is not established, so a missing head stays an error
    dspark_confidence_head_missing: str = "unaudited"
    # DSpark's confidence head (confidence_head.proj) under the release's default settings: "unbuilt" (no head: its
    # tensors are skipped unread and enable_confidence_head / confidence_head_with_markov are not read; under
    # dspark_confidence_option the head is built whatever enable_confidence_head says, [1, M (+ r when
    # bool(confidence_head_with_markov), markov_rank > 0 when absent)], and every defect of it refuses the load),
    # "flagged" (built and loaded when enable_confidence_head is truthy, [1, M (+ r when confidence_head_with_markov
    # is truthy)], a falsy flag skips its tensors; its values are read only under dspark_confidence_option), or ""
    # (not established: the manifest's head, every defect an error)
    dspark_confidence_head: str = ""
    # the opt-in that makes the release build (unbuilt) or read (flagged) the confidence head, as LC229 names it
    dspark_confidence_option: str = ""
    # a quantization scale stored in another float dtype than its parameter's (a BF16 NVFP4 weight_scale) is copied
    # in with a cast (exact for the values the parameter's dtype holds, rounded otherwise: LC329 / LC304) instead of
    # refused; False: not established (LC304)
    scale_dtype_cast: bool = False
    # NVFP4 weight_scale_encoding values it decodes (CSF-compressed block scales); any other value is refused
    # where this is not empty, ignored where it is
    nvfp4_scale_encodings: tuple[str, ...] = ()
    # the LiLiCorr head's MLP parameter names: "named" (feature_norm, up_proj / down_proj) or "sequential" (the
    # nn.Sequential indices feature_mlp.0/1/3 and layers.N.mlp.0/2: the named form is then the refused one)
    head_mlp_naming: str = "named"
    # use_gemma_norm true builds Gemma's RMSNorm, x * (1 + w), everywhere (False: plain x * w, a silent mis-load of
    # a Gemma-norm draft; None: not established)
    gemma_norm_read: bool | None = None
    # rope_scaling / rope_parameters rope_dim (a rotary narrower than the head) is honoured (False: the rotary
    # spans the whole head; None: not established)
    rope_dim_read: bool | None = None
    # DSpark: the parser accepts markov_head_type given only inside dflash_config (False: refused as absent); for a
    # parser that reads dspark_config (dspark_config_read), dflash_config is merged under dspark_config, so its
    # markov_rank, markov_head_type and mask_token_id are read before the top-level ones
    markov_head_type_nested_read: bool = True
    # DSpark requires markov_head_type somewhere when markov_rank > 0 (refused as absent otherwise)
    markov_head_type_required: bool = False
    # DSpark: which mask_token_id wins when the top level and dflash_config disagree ("dflash_config" |
    # "top-level")
    dspark_mask_token_first: str = "dflash_config"
    # DSpark: the parser reads a dspark_config object before everything else (markov_rank, markov_head_type,
    # mask_token_id), and the prefixed top-level dspark_block_size / dspark_markov_rank / dspark_markov_head_type /
    # dspark_noise_token_id / dspark_target_layer_ids before that (SGLang's parse_dspark_draft_config)
    dspark_config_read: bool = False
    # a drafter in the speculators format (speculators_config, a nested transformer_layer_config):
    # "translated" (read as its own drafter config), "refused" (no reader: the config has no model_type) or
    # "unconfirmed"
    speculators_format: str = "refused"
    # a speculators drafter served alone (the drafter as the model, its verifier as the target): the verifier's
    # name_or_path must be a Hub repo id and no local path, refused otherwise (False: used as written)
    speculators_verifier_repo_only: bool = False
    # head families whose reduced draft vocabulary (an lm_head of draft_vocab_size rows and d2t) it serves,
    # mapping each drafted id through d2t to its target id
    draft_vocab_mapped: tuple[str, ...] = ()
    # head families whose reduced draft vocabulary it loads but never maps: drafted ids are proposed as target ids
    draft_vocab_unmapped: tuple[str, ...] = ()
    # routes of sibling heads that this release decides differently from the family's ROUTES for its engine:
    # (family, architecture or "*", verdict, why), checked first
    routes: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def display(self) -> str:
        """The engine and the version its verdicts are about, as every report names it."""
        return f"{self.engine} {self.version}" + ("" if self.released else " (unreleased)")

    @property
    def release_id(self) -> str:
        """`vllm==0.33.0`: the release, as --runtime names it."""
        return f"{self.engine_id}=={self.version}"

    def sibling_route(self, family: str, architecture: str | None) -> tuple[str, str]:
        """(verdict, why) for a sibling head declared under `architecture`: this release's own routes first, then
        the family's ROUTES for the engine."""
        for fam, arch, verdict, why in self.routes:
            if fam == family and arch in ("*", architecture):
                return verdict, why
        for arch, verdict, why in FAMILIES[family].ROUTES.get(self.engine_id, ()):
            if arch in ("*", architecture):
                return verdict, why
        return "refuses", f"{self.display} does not load a {family} head declared as {architecture}"

    def flat_exclusion_keys(self, quant_algo: str | None) -> tuple[str, ...]:
        """The keys of a flat quantization_config it reads exclusions from, in order (the first present wins)."""
        for algo, keys in self.flat_exclusions_by_algo:
            if algo == quant_algo:
                return keys
        return (self.flat_exclusions_key,) if self.flat_exclusions_key else ("ignore", "exclude_modules")

    def quantizes_family(self, family: str | None) -> bool:
        """The draft class of this head family builds its linears through the quant config, under full names."""
        return self.quantizable_families is None or family is None or family in self.quantizable_families

    def builds_float(self, module: str, family: str | None = None) -> bool:
        """The runtime builds the linear `module` unquantized whatever the quant config says."""
        forced = self.float_forced + (() if self.quantizes_family(family) else self.unquantizable_float)
        return matches_any(module, forced)

    def must_stay_float(self, module: str, family: str | None = None) -> bool:
        """The linear `module` (canonical name) must be stored in float for this runtime."""
        return self.builds_float(module, family) or matches_any(module, self.float_required)

    def may_quantize(self, module: str, family: str | None = None) -> bool:
        """The runtime is known to load `module` quantized (when its config quantizes it)."""
        return not self.must_stay_float(module, family) and not matches_any(module, self.quant_unconfirmed)

    def exclusion_name(self, module: str, family: str | None) -> str:
        """The name its exclusion matching sees for `module`: canonical, or without the decoder-layer path for
        the families it builds with empty layer prefixes."""
        return module if self.quantizes_family(family) else _LAYER_PATH.sub("", module)


def matches_any(module: str, patterns: tuple[str, ...]) -> bool:
    """`module` (a canonical name) matches one of these fnmatch patterns."""
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)


class Exclusion(msgspec.Struct, frozen=True):
    """Whether one runtime treats a module as excluded from quantization, and why."""

    excluded: bool
    prefix: str  # the module name as that runtime matches it
    pattern: str | None = None  # the exclusion entry that matched
    conflict: str | None = None  # e.g. vLLM: fused shards disagree


_LAYER_PATH = re.compile(r"^layers\.\d+\.(self_attn|mlp)\.")
_QKV = re.compile(r"^(layers\.\d+\.self_attn\.)([qkv])_proj$")
_GATE_UP = re.compile(r"^(layers\.\d+\.mlp\.)(gate|up)_proj$")


def fused_name(module: str) -> tuple[str, tuple[str, ...]] | None:
    """(fused module, its shards) for q/k/v and gate/up, as the runtimes build them; None for unfused modules."""
    m = _QKV.match(module)
    if m:
        return m.group(1) + "qkv_proj", tuple(m.group(1) + f"{x}_proj" for x in "qkv")
    m = _GATE_UP.match(module)
    if m:
        return m.group(1) + "gate_up_proj", (m.group(1) + "gate_proj", m.group(1) + "up_proj")
    return None


def version_key(version: str) -> tuple[int, ...]:
    """`0.5.23` -> (0, 5, 23): releases ordered as numbers, not as text (0.5.9 < 0.5.23)."""
    return tuple(int(part) for part in version.split("."))


class Bump(msgspec.Struct, frozen=True, kw_only=True):
    """One release as the differences from the release before it: the fields whose value changed, and what
    changed in the release's code, one line each (file:function, what it now does)."""

    version: str
    fields: dict[str, Any]
    notes: tuple[str, ...]


def release_chain(first: RuntimeProfile, bumps: tuple[Bump, ...], source: str) -> tuple[RuntimeProfile, ...]:
    """Every release of one engine, oldest first: `first` in full, then each Bump applied to the one before it.

    `source` is a format string of `version` (where that release's code comes from). A Bump naming a field that
    does not exist, or setting one to the value it already had, is a mistake in the data: it raises at import,
    so a bump stays exactly the release's differences."""
    out = [msgspec.structs.replace(first, source=source.format(version=first.version), changes=())]
    known = {f.name for f in msgspec.structs.fields(RuntimeProfile)}
    for bump in bumps:
        prev = out[-1]
        if version_key(bump.version) <= version_key(prev.version):
            raise ValueError(f"{first.engine} {bump.version} does not follow {prev.version}")
        for key, value in bump.fields.items():
            if key not in known or key in ("name", "engine_id", "engine", "version", "source", "changes"):
                raise ValueError(f"{first.engine} {bump.version}: {key!r} is not a release field")
            if getattr(prev, key) == value:
                raise ValueError(
                    f"{first.engine} {bump.version}: {key} is already {value!r} in {prev.version}"
                )
        if not bump.notes:
            raise ValueError(f"{first.engine} {bump.version}: say what changed (or that nothing did)")
        out.append(
            msgspec.structs.replace(
                prev,
                **bump.fields,
                version=bump.version,
                source=source.format(version=bump.version),
                changes=bump.notes,
            )
        )
    return tuple(out)
