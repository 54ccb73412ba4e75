"""The DFlash2, DSpark and Domino heads: their routing per runtime and their config keys (LC014-LC016, LC150-LC159)."""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.config.types import config_read
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.families import dflash2, domino, dspark, sibling_owner
from lilicorr_ckpt.runtimes import RuntimeProfile

# ---------------------------------------------------------------- catalogue
rule(
    "LC014",
    "sibling-route",
    "error",
    CFG,
    "A DFlash2, DSpark or Domino head declared under an architecture the runtime does not load as that head (it "
    "routes it elsewhere, or loads it as plain DFlash and drops the head).",
    "Declare the architecture each runtime loads: Qwen3DSparkModel for a Qwen3 DSpark, DFlashDraftModel with "
    'projector_type "domino" for Domino, DFlash2DraftModel for DFlash2 (`lilicorr-ckpt convert` writes them).',
    doc="For a DFlash2, DSpark or Domino head (the family comes from `architectures[0]`, or from "
    'DFlashDraftModel\'s `dflash_config.projector_type` "dflash2" / "dspark" / "domino"), looks up '
    "how each selected runtime routes that family under that architecture, and fires once per runtime "
    "that refuses the pair or routes it to another model. A pair that no route lists counts as refused.",
    why="The runtimes register each sibling head under one class name. Under another name the checkpoint is "
    "refused, or, worse, loads as something else: SGLang routes a DSpark head declared as "
    "DFlashDraftModel as plain DFlash and drops Model-Optimizer's flat Markov names, serving the Markov "
    "head at its initialisation; SGLang loads Domino only as DFlashDraftModel with projector_type "
    '"domino"; vLLM has no Domino model at all (its DFlash model has no parameter for the '
    "prefix GRU).",
    example='    "architectures": ["DFlashDraftModel"],\n    "dflash_config": {"projector_type": '
    '"dspark", ...}\n\n'
    "with Model-Optimizer's flat Markov names: no serving loader reads them. `lilicorr-ckpt convert` "
    "writes `Qwen3DSparkModel` with the Markov head nested, which SGLang and vLLM both load.",
)
rule(
    "LC015",
    "sibling-unconfirmed",
    "warning",
    CFG,
    "A DFlash2, DSpark or Domino head whose loading by this runtime is UNCONFIRMED (the loader was not read, or "
    "only patch scripts show it).",
    "Test the runtime yourself before publishing for it.",
    doc="The same lookup as LC014; fires once per runtime whose route for the head's family and architecture "
    "is recorded as unconfirmed: the loader was not read, or only registry-verification or patch scripts "
    "show it.",
    why="Whether the checkpoint loads with its head, loads without it, or is refused was not established from "
    "that runtime's code. Examples: every sibling head in TensorRT-LLM (its paths were not read).",
    example='    "architectures": ["DFlash2DraftModel"],\n    "dflash_config": {"projector_type": '
    '"dflash2", "selector_rank": 64, "selector_top_k": 32, ...}\n\n'
    "gives one LC015 warning for vLLM and one for TensorRT-LLM.",
)
rule(
    "LC016",
    "sibling-head-undeclared",
    "error",
    CFG,
    "Sibling head tensors (candidate_selector.*, markov_head.*, prefix_gru.*, ...) under an architecture that "
    "builds no such head: every loader drops or refuses them.",
    "Declare the sibling architecture (or projector_type) the tensors belong to, or remove them.",
    doc="Fires when tensors of a sibling head are present but the config declares no head of that family: "
    "`candidate_selector.*` (DFlash2), `markov_head.*`, `confidence_head.*` or Model-Optimizer's flat "
    "DSpark names (`markov_w1.weight`, `gate_proj.weight`, `confidence_proj.weight`, ...) (DSpark), "
    "`prefix_gru.*` and `embed_proj.*` (Domino), under LiLiCorrDraftModel, plain DFlashDraftModel or "
    "another sibling's architecture.",
    why="A loader builds the head the architecture (and projector_type) declares, and has no parameter for "
    "another head's tensors: loaders that skip unknown names serve the draft without the head, strict "
    "ones refuse the checkpoint. Either way the trained head is not served.",
    example='    "architectures": ["DFlashDraftModel"]\n\n'
    "(no projector_type) with `markov_head.markov_w1.weight` [V, r] and "
    "`markov_head.markov_w2.weight` [V, r] in the files: a DSpark head nobody builds.",
)
rule(
    "LC150",
    "selector-geometry",
    "error",
    CFG,
    "DFlash2 selector keys the runtime refuses: selector_rank / selector_top_k set alone, missing or "
    "negative, or a top_k above vocab_size.",
    "Write the trained selector_rank and selector_top_k.",
    doc="Checks `dflash_config.selector_rank` and `selector_top_k` per runtime: for SGLang, on every "
    "DFlash-family head (its DFlash config parser reads them for each), it fires when only one of them is "
    "non-zero or either is negative, and for a DFlash2 head when neither is set (its DFlash2DraftModel needs "
    "a selector); for vLLM, on a DFlash2 head, when either is missing or negative, or selector_top_k "
    "is larger than vocab_size.",
    why='SGLang\'s DFlash config parser refuses the config ("selector needs rank and top_k together"), and '
    'DFlash2DraftModel.__init__ refuses one without them ("requires dflash_config.selector_rank"). '
    "vLLM reads both with a plain index and checks no range (qwen3_dflash2.py "
    "`DFlash2Qwen3Model.__init__`, spec_decode/dflash2/speculator.py `DFlash2Speculator.__init__`): a "
    "missing key is a KeyError, a negative size fails to build, and a top_k above the vocabulary fails "
    "the top-k at the first draft step. The selector's tensors are sized by these values, so they cannot "
    "be guessed.",
    example='    "dflash_config": {"projector_type": "dflash2", "selector_rank": 64}\n\n'
    "(no selector_top_k): refused by both.",
)
rule(
    "LC151",
    "dflash2-conv-required",
    "error",
    CFG,
    "A DFlash2 head without conv_kernel_size / conv_group_size: DFlash2's grouped convolutions are mandatory.",
    "Write the trained conv_kernel_size and conv_group_size in dflash_config.",
    doc="Fires for a DFlash2 head when `dflash_config.conv_kernel_size` and `conv_group_size` are not both > "
    "0.",
    why="DFlash2's grouped convolutions are part of the head, not an option: vLLM reads both keys with a "
    "plain index (a KeyError without them) and Model-Optimizer refuses to export a DFlash2 head without "
    "them.",
    example='    "architectures": ["DFlash2DraftModel"],\n    "dflash_config": {"selector_rank": 64, '
    '"selector_top_k": 32}',
)
rule(
    "LC152",
    "markov-rank",
    "error",
    CFG,
    "DSpark's markov_rank is missing or <= 0 at the top level of config.json, where the runtime reads it.",
    "Write the trained markov_rank at the top level (DeepSpec's layout).",
    doc="For a DSpark head, fires when the top-level `markov_rank` of config.json is absent or <= 0, for the "
    "runtimes that read it from the top level and require it > 0: SGLang and vLLM. When only "
    "`dflash_config.markov_rank` is present (Model-Optimizer and SpecForge write it there) the message "
    "says so. For SGLang it judges the rank its DSpark parser reads first, through int() (null: 0): "
    "`dspark_markov_rank`, then `dspark_config.markov_rank` (in the releases that merge dflash_config under it, `dflash_config.markov_rank` too), "
    "then the top-level one, which its Markov head builder reads again.",
    why="SGLang's Markov head builder refuses the config (\"DSpark requires markov_rank > 0\"); vLLM's "
    "qwen3_dspark reads config.markov_rank at the top level. A rank only in dflash_config is invisible to "
    "both.",
    example='    "architectures": ["Qwen3DSparkModel"],\n    "dflash_config": {"markov_rank": 256}\n\n'
    "and no top-level markov_rank.",
)
rule(
    "LC153",
    "markov-head-type",
    "error",
    CFG,
    "markov_head_type is not one the runtime builds.",
    "Write vanilla, gated or rnn as trained.",
    doc='For a DSpark head, fires when `markov_head_type` (top level, else dflash_config; "vanilla" when '
    "absent) is not one the runtime builds: SGLang builds vanilla, gated and rnn; vLLM builds vanilla only "
    "(qwen3_dspark.py `DSparkMarkovHead`: it does not read markov_head_type, and has no parameter for the "
    "gated or rnn tensors; an empty type is not vanilla). For SGLang it judges each value its DSpark parser "
    "reads through str().lower(): `dspark_markov_head_type`, dspark_config's (and dflash_config's where merged under it "
    "too), the top-level one, and the top-level one its Markov head builder reads (a JSON true reads as "
    '"true", no type).',
    why="The Markov head's tensors and its computation depend on the type; a runtime that does not build it "
    "refuses the config, so the drafter cannot be served there.",
    example='    "markov_head_type": "lstm"',
)
rule(
    "LC162",
    "markov-head-type-missing",
    "error",
    CFG,
    "DSpark's markov_head_type is absent where the runtime release's parser looks for it.",
    "Write the trained markov_head_type (vanilla, gated or rnn) at the top level of config.json.",
    doc="For a DSpark head with markov_rank > 0, fires for the runtime releases whose DSpark parser requires "
    "markov_head_type when it is absent at the top level and (for the releases that do not read "
    "dflash_config for it) inside dflash_config; and for a type given only in dflash_config other than "
    "vanilla, where the release accepts the nested key but builds the top-level type (vanilla when absent).",
    why='SGLang\'s DSpark parser refuses the config ("DSpark requires markov_head_type when markov_rank > 0"). '
    "A release that reads the nested key in its parser still builds the Markov head from the top-level type, "
    "so a nested gated or rnn head's tensors have no parameter and the load is refused.",
    example='    "markov_rank": 256, "dflash_config": {"markov_head_type": "gated"}',
)
rule(
    "LC163",
    "dspark-mask-token-conflict",
    "error",
    CFG,
    "The mask token a release's DSpark parser reads first (dspark_noise_token_id, dspark_config, or the top-level "
    "mask_token_id before dflash_config's) is not the one the draft was trained with, or is null or negative.",
    "Write one mask_token_id (the trained one, an integer) in dflash_config, and the same or none in the other "
    "places.",
    doc="For a DSpark head, fires when the mask token a release's DSpark parser reads first differs from the one "
    "the draft was trained with (dflash_config's `mask_token_id`, else the top-level one): SGLang reads "
    "`dspark_noise_token_id`, then dspark_config's, then (in the releases that do not merge dflash_config) the top-level `mask_token_id` before "
    'dflash_config\'s, each through int() (a JSON true is token 1, "7" is 7). Also when that value is null '
    "(no mask token: the DSpark worker refuses it) or negative (refused).",
    why="Every mask slot of the draft block embeds the mask token. A release that picks the other id embeds "
    "another row of the table in every slot: the drafter loads and drafts with an input it was never trained "
    "on.",
    example='    "mask_token_id": 7, "dflash_config": {"mask_token_id": 151669}',
)
rule(
    "LC164",
    "nope-layers-rerouted",
    "error",
    CFG,
    "A DFlash2 drafter with no_rope_layers, which the runtime release reroutes to a model that runs those layers "
    "without RoPE.",
    "Remove no_rope_layers unless the drafter was trained with those layers NoPE (then judge only for the "
    "releases that honour it); never write per-layer 0/1 flags there.",
    doc="Fires for a DFlash2DraftModel whose config.json has a non-empty `no_rope_layers`, for the runtime "
    "releases that reroute such a drafter to a NoPE variant (vLLM from the release that added "
    "`hf_config_override`'s rewrite to DFlash2RicursiveDraftModel): the listed layer indices attend without "
    "rotary embedding, for the query block and the context. The message says when the list looks like "
    "per-layer 0/1 flags (transformers' SmolLM3 / Llama4 convention), which the reroute reads as the indices "
    "0 and 1, and when an entry is not a layer index (a crash at the first draft step).",
    why="The same checkpoint serves two functions: the releases that do not read the key apply RoPE on every "
    "layer (LC165), the rerouting ones leave it out on the listed layers. A drafter trained with RoPE on "
    "those layers is served wrong by the rerouting release, silently.",
    example='    "architectures": ["DFlash2DraftModel"], "no_rope_layers": [1, 1, 1, 0]',
)
rule(
    "LC165",
    "nope-layers-ignored",
    "warning",
    CFG,
    "A DFlash2 drafter with no_rope_layers, which the runtime release never reads: every layer gets RoPE.",
    "If the drafter was trained with those layers NoPE, serve it only where no_rope_layers is honoured; "
    "otherwise remove the key.",
    doc="Fires for a DFlash2DraftModel whose config.json has a non-empty `no_rope_layers`, for the runtime "
    "releases that do not read it (they apply RoPE on every layer).",
    why="Right for a drafter trained with RoPE everywhere, wrong for one trained with the listed layers NoPE; "
    "the checkpoint cannot say which, and other releases read the key (LC164).",
    example='    "architectures": ["DFlash2DraftModel"], "no_rope_layers": [3]',
)
rule(
    "LC155",
    "domino-shift-label",
    "error",
    CFG,
    "Domino's dflash_config.shift_label is not a JSON bool.",
    "Write true (the trained setting) or false.",
    doc="For a Domino head, fires when `dflash_config.shift_label` is absent or is not a JSON bool, for the "
    "runtimes that check it: SGLang.",
    why="SGLang's DFlash config parser requires a JSON bool and refuses anything else, including 1 / 0 and "
    'strings such as "true".',
    example='    "dflash_config": {"projector_type": "domino", "shift_label": 1}',
)
rule(
    "LC156",
    "domino-prefix-len",
    "error",
    CFG,
    "Domino's pure_draft_prefix_len is not 1, the only value the runtime serves.",
    "Write pure_draft_prefix_len 1 (and train with it).",
    doc="For a Domino head, fires when `dflash_config.pure_draft_prefix_len` is not 1 (absent included), for "
    "the runtimes that check it: SGLang.",
    why="SGLang serves Domino only with a pure draft prefix of one position and refuses the config otherwise.",
    example='    "dflash_config": {"projector_type": "domino", "pure_draft_prefix_len": 2}',
)
rule(
    "LC157",
    "domino-dims",
    "error",
    CFG,
    "Domino's gru_hidden_dim or emb_dim is missing or < 1.",
    "Write the trained gru_hidden_dim and emb_dim in dflash_config.",
    doc="For a Domino head, fires when `gru_hidden_dim` or `emb_dim` (dflash_config's, else the top-level "
    "one) is missing or < 1, for the runtimes that require them: SGLang.",
    why="They size the prefix GRU and the embedding projection; SGLang refuses the config without them.",
    example='    "dflash_config": {"projector_type": "domino", "emb_dim": 512}\n\n(no gru_hidden_dim).',
)
rule(
    "LC158",
    "domino-emb-dim-conflict",
    "error",
    CFG,
    "dflash_config.emb_dim and the top-level emb_dim differ, which the runtime refuses.",
    "Make both hold the trained emb_dim.",
    doc="For a Domino head, fires when `dflash_config.emb_dim` and the top-level `emb_dim` are both present "
    "and differ, for the runtimes that compare them: SGLang.",
    why='SGLang refuses the config ("emb_dim differs"). The reference Domino checkpoint writes emb_dim at '
    "both levels, so readers take it from either; two values make the embedding projection's width "
    "ambiguous.",
    example='    "emb_dim": 512,\n    "dflash_config": {"projector_type": "domino", "emb_dim": 256}',
)
rule(
    "LC159",
    "domino-block-size",
    "error",
    CFG,
    "A Domino draft with block_size <= 1, which the runtime refuses.",
    "Write the trained block size (16 for the reference checkpoint).",
    doc="For a Domino head, fires when the block size (dflash_config's, else the top-level one) is <= 1, for "
    "the runtimes that check it: SGLang.",
    why="SGLang refuses a Domino draft whose block size is 1 or less, so the checkpoint cannot be served "
    "there.",
    example='    "dflash_config": {"projector_type": "domino", "block_size": 1}',
)


# ---------------------------------------------------------------- checks


def foreign_sibling_tensors(ctx: Context, arch: str | None, sibling: str | None) -> None:
    """LC016: tensors of a sibling head other than the one the config declares (`sibling`, None for none)."""
    # sibling-head tensors by their first name segment ("markov_head.", or a flat "markov_w1."), and their family
    owner = {
        n.split(".", 1)[0] + ".": family
        for n in ctx.names.by_canonical
        if (family := sibling_owner(n)) is not None
    }
    foreign = [s for s in sorted(owner) if owner[s] != sibling]
    if foreign:
        ctx.emit(
            "LC016",
            f"tensors under {', '.join(f'`{s}*`' for s in foreign)} belong to a "
            f"{'/'.join(sorted({owner[s] for s in foreign}))} head, but the config declares "
            f"{arch}{' (' + sibling + ')' if sibling else ''}: no loader builds that head here, so they are "
            "dropped or refused",
            file="config.json",
            pointer="$.architectures[0]",
            subjects=[n for n in ctx.names.by_canonical if any(n.startswith(s) for s in foreign)],
        )


def sibling_route(ctx: Context, family: str, arch: str | None) -> None:
    """Which runtimes load this sibling head under this architecture (RuntimeProfile.sibling_routes)."""
    by: dict[str, list[tuple[RuntimeProfile, str]]] = {"refuses": [], "unconfirmed": []}
    for p in ctx.profiles:
        verdict, why = p.sibling_route(family, arch)
        if verdict == "sliding-only":
            # a model that asserts every layer is non-causal sliding-window attention while it is built
            types = ctx.config.layer_types or []
            other = sorted({t for t in types if t != "sliding_attention"})
            causal = ctx.parsed.raw.get("is_causal") is True
            if not types or other or causal:
                found = (
                    "no layer_types"
                    if not types
                    else f"layer_types {', '.join(other)}"
                    if other
                    else "is_causal true"
                )
                verdict, why = "refuses", f"{why}; this config has {found}, so the build fails"
            else:
                verdict = "unconfirmed"
        if verdict in by:
            by[verdict].append((p, why))
    for verdict, rule_id in (("refuses", "LC014"), ("unconfirmed", "LC015")):
        for p, why in by[verdict]:
            ctx.emit(
                rule_id,
                f"{family} head declared as {arch}: {why}",
                runtimes=[p.name],
                file="config.json",
                pointer="$.architectures[0]",
                actual=arch,
            )


def sibling_config(ctx: Context) -> None:
    """The config keys of the sibling head the config declares (its family's own rules)."""
    family = ctx.geometry.family
    paired = _selector_pair(ctx)
    if family == dflash2.NAME:
        _selector(ctx, paired)
        _dflash2_conv(ctx)
        _nope_layers(ctx)
    if family == dspark.NAME:
        _markov(ctx)
    if family == domino.NAME:
        _domino(ctx)


def _selector_pair(ctx: Context) -> bool:
    """LC150 for the runtimes that check the selector keys as a pair (SGLang's parse_dflash_draft_config, run for
    every DFlash-family head, not DFlash2's alone: each key int() cast, absent or null as 0, >= 0, and both zero or
    both not). Whether they were refused."""
    pair = [p for p in ctx.profiles if p.selector_check == "pair"]
    keys = ("$.dflash_config.selector_rank", "$.dflash_config.selector_top_k")
    if not pair or any(ctx.parsed.invalid(k) for k in keys):
        return False  # LC001 reports a wrong type
    d = ctx.config.dflash
    rank, top_k = d.selector_rank or 0, d.selector_top_k or 0
    if rank >= 0 and top_k >= 0 and bool(rank) == bool(top_k):
        return False
    ctx.emit_for(
        "LC150",
        pair,
        f"selector_rank is {d.selector_rank} and selector_top_k is {d.selector_top_k}: "
        f"{names(pair, 'needs|need')} both (>= 0) or neither, for every DFlash-family head",
        file="config.json",
        pointer="$.dflash_config.selector_rank",
    )
    return True


def _selector(ctx: Context, paired: bool) -> None:
    """LC150: DFlash2's selector_rank / selector_top_k as each runtime reads them (the pair check is
    _selector_pair's)."""
    g, d = ctx.geometry, ctx.config.dflash
    rank, top_k = d.selector_rank, d.selector_top_k
    ranged = [p for p in ctx.profiles if p.selector_check == "range"]
    indexed = [p for p in ctx.profiles if p.selector_check == "indexed"]
    problems = [f"selector_{k} is absent" for k, v in (("rank", rank), ("top_k", top_k)) if v is None]
    problems += [
        f"selector_{k} is {v}" for k, v in (("rank", rank), ("top_k", top_k)) if v is not None and v < 0
    ]
    if top_k is not None and g.vocab_size is not None and top_k > g.vocab_size:
        problems.append(f"selector_top_k {top_k} exceeds vocab_size {g.vocab_size}")
    if rank == 0 and any(n.startswith("candidate_selector.") for n in ctx.names.by_canonical):
        # a rank-0 selector's parameters cannot take the trained ones (vLLM linear.py weight_loader asserts)
        problems.append("selector_rank is 0 beside the checkpoint's selector tensors")
    if problems:
        ctx.emit_for(
            "LC150",
            indexed,
            f"{'; '.join(problems)}: {names(indexed, 'reads|read')} both keys with a "
            "plain index (a KeyError without them), builds the selector's sizes from them and takes the "
            "top selector_top_k of the vocabulary at every step",
            file="config.json",
            pointer="$.dflash_config.selector_top_k",
        )
    if not paired and not rank:
        required = [p for p in ctx.profiles if p.selector_required]
        ctx.emit_for(
            "LC150",
            required,
            f"selector_rank is {rank}: {names(required, 'refuses|refuse')} a "
            'DFlash2 draft without a candidate selector ("DFlash selector draft requires '
            'dflash_config.selector_rank")',
            file="config.json",
            pointer="$.dflash_config.selector_rank",
            expected=">= 1",
            actual=rank,
        )
    bad = []
    if rank is None or rank < 1:
        bad.append(f"selector_rank {rank} < 1")
    if top_k is None or top_k < 2 or (g.vocab_size is not None and top_k > g.vocab_size):
        bad.append(f"selector_top_k {top_k} outside [2, {g.vocab_size}]")
    if bad:
        ctx.emit_for(
            "LC150",
            ranged,
            f"{'; '.join(bad)}: {names(ranged, 'refuses|refuse')} it",
            file="config.json",
            pointer="$.dflash_config.selector_top_k",
        )


def _dflash2_conv(ctx: Context) -> None:
    """LC151: a DFlash2 head without its mandatory convolutions."""
    g = ctx.geometry
    if not g.has_conv and not ctx.parsed.invalid("$.dflash_config.conv_kernel_size"):
        indexed = [p for p in ctx.profiles if p.dflash2_conv_indexed]
        ctx.emit(
            "LC151",
            "a DFlash2 head without conv_kernel_size / conv_group_size: its convolutions are "
            "mandatory ("
            + (f"{names(indexed, 'reads|read')} both with a plain index; " if indexed else "")
            + "Model-Optimizer refuses the export)",
            file="config.json",
            pointer="$.dflash_config.conv_kernel_size",
            expected="both > 0",
        )


def _nope_layers(ctx: Context) -> None:
    """LC164 / LC165: DFlash2DraftModel with no_rope_layers, rerouted to a NoPE variant by some releases
    (RuntimeProfile.dflash2_nope_layers_key) and ignored by the others."""
    if ctx.config.architecture != "DFlash2DraftModel":
        return
    for key in sorted(
        {p.dflash2_nope_layers_key for p in ctx.profiles if p.dflash2_nope_layers_key} | {"no_rope_layers"}
    ):
        value = ctx.parsed.raw.get(key)
        if not value:
            continue
        layers = ctx.geometry.num_layers
        entries = value if isinstance(value, list) else [value]
        indices = [v for v in entries if isinstance(v, int) and not isinstance(v, bool)]
        bad = [v for v in entries if v not in indices or (layers is not None and not 0 <= v < layers)]
        flags = bool(entries) and set(entries) <= {0, 1} and len(entries) == layers and layers > 2
        shown = json.dumps(value)[:120]
        rerouting = [p for p in ctx.profiles if p.dflash2_nope_layers_key == key]
        ignoring = [p for p in ctx.profiles if p.dflash2_nope_layers_key != key]
        note = (
            "; the list looks like per-layer 0/1 flags, which the reroute reads as the layer indices 0 and 1"
            if flags
            else (
                f"; {shorten([json.dumps(v) for v in bad])} is not a layer index below {layers}, a crash at the "
                "first draft step"
                if bad
                else ""
            )
        )
        ctx.emit_for(
            "LC164",
            rerouting,
            f"{key} is {shown}: {names(rerouting, 'serves|serve')} this DFlash2DraftModel as "
            "DFlash2RicursiveDraftModel, whose listed layers attend without RoPE" + note,
            file="config.json",
            pointer=f"$.{key}",
            actual=shown,
        )
        ctx.emit_for(
            "LC165",
            ignoring,
            f"{key} is {shown}: {names(ignoring, 'does not read|do not read')} it, so every layer gets RoPE",
            file="config.json",
            pointer=f"$.{key}",
            actual=shown,
        )


def _markov(ctx: Context) -> None:
    """LC152 / LC153: DSpark's markov_rank where the runtime reads it, and a head type it builds; for the releases
    with SGLang's DSpark parser, _dspark_parsed (LC152, LC153, LC162, LC163 as that parser reads the config)."""
    g, cfg = ctx.geometry, ctx.config
    d = cfg.dflash
    parsing = [p for p in ctx.profiles if p.dspark_config_read]
    readers = [p for p in ctx.profiles if p.markov_rank_top_level and p not in parsing]
    top = cfg.markov_rank
    if top is None or top <= 0:
        where = (
            (
                f" (dflash_config.markov_rank is {d.markov_rank}, but {names(readers, 'reads|read')} the top "
                "level only)"
            )
            if d.markov_rank is not None and top is None
            else ""
        )
        ctx.emit_for(
            "LC152",
            readers,
            f"markov_rank is {top if top is not None else 'absent'} at the top "
            f"level{where}: {names(readers, 'requires|require')} markov_rank > 0",
            file="config.json",
            pointer="$.markov_rank",
            expected="> 0",
            actual=top if top is not None else "absent",
        )
    _dspark_parsed(ctx, parsing)
    _draft_topk(ctx)
    kind = g.markov_head_type
    if kind is not None:
        refuse = [
            p
            for p in ctx.profiles
            if p.markov_head_types and kind not in p.markov_head_types and p not in parsing
        ]
        ctx.emit_for(
            "LC153",
            refuse,
            f"markov_head_type {kind!r}: {names(refuse, 'builds|build')} only "
            + " / ".join(sorted({t for p in refuse for t in p.markov_head_types})),
            file="config.json",
            pointer="$.markov_head_type",
            actual=kind,
        )


def _draft_topk(ctx: Context) -> None:
    """LC001: dspark_draft_topk above the draft vocabulary, for the releases that check it against the vocabulary
    (vLLM config/speculative.py: "dspark_draft_topk must be between 1 and the draft vocabulary size", the draft
    vocabulary being draft_vocab_size or vocab_size); a value of another type is the reader's (LC001)."""
    raw = ctx.parsed.raw
    topk = _int(raw.get("dspark_draft_topk"))
    vocab = _int(raw.get("draft_vocab_size")) or _int(raw.get("vocab_size"))
    if topk is None or vocab is None or topk <= vocab:
        return
    checking = [p for p in ctx.profiles if config_read(p, dspark.NAME, "$.dspark_draft_topk") == "count?"]
    ctx.emit_for(
        "LC001",
        checking,
        f"config.json $.dspark_draft_topk is {topk}: {names(checking, 'requires|require')} it between 1 and the "
        f"draft vocabulary size ({vocab})",
        file="config.json",
        pointer="$.dspark_draft_topk",
        expected=f"1..{vocab}",
        actual=topk,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cast_int(value: Any) -> tuple[bool, int | None]:
    """Python's int() of a JSON value: (whether it succeeds, the result); null stays None."""
    if value is None:
        return True, None
    if isinstance(value, (bool, int)):
        return True, int(value)
    if isinstance(value, float):
        return (True, int(value)) if math.isfinite(value) else (False, None)
    if isinstance(value, str):
        try:
            return True, int(value)
        except ValueError:
            return False, None
    return False, None


class _Finding(NamedTuple):
    rule: str
    message: str  # "{who}" stands for the releases' names with the verb after it
    verb: str
    pointer: str
    expected: Any = None
    actual: Any = None


def _dspark_parsed(ctx: Context, parsing: list[RuntimeProfile]) -> None:
    """LC152 / LC153 / LC162 / LC163 as each release with SGLang's DSpark parser reads the config
    (speculative/dspark_components/dspark_config.py parse_dspark_draft_config, then models/dspark.py
    build_markov_head): the prefixed dspark_* keys first, then dspark_config (with dflash_config merged under it
    where RuntimeProfile markov_head_type_nested_read), then the top level. Releases that read alike share one
    finding."""
    found: dict[tuple[str, str, str, str], tuple[_Finding, list[RuntimeProfile]]] = {}
    for p in parsing:
        for f in _dspark_parse(ctx, p):
            found.setdefault((f.rule, f.message, f.verb, f.pointer), (f, []))[1].append(p)
    for f, profiles in found.values():
        ctx.emit_for(
            f.rule,
            profiles,
            f.message.replace("{who}", names(profiles, f.verb)),
            file="config.json",
            pointer=f.pointer,
            expected=f.expected,
            actual=f.actual,
        )


def _where(path: str) -> str:
    """`dspark_config.markov_rank`, or `the top level` for a key of the DSpark parser's own name there."""
    return "the top level" if path.count(".") == 1 and not path.startswith("$.dspark_") else path[2:]


def _shown(value: Any) -> str:
    return (
        shorten([json.dumps(value)]) if not isinstance(value, float) or math.isfinite(value) else str(value)
    )


def _dspark_parse(ctx: Context, p: RuntimeProfile) -> list[_Finding]:
    """One release's findings (_dspark_parsed), "{who}" standing for its name."""
    raw = ctx.parsed.raw
    merged: dict[str, tuple[Any, str]] = {}
    for block in (("dflash_config",) if p.markov_head_type_nested_read else ()) + ("dspark_config",):
        values = raw.get(block)
        if isinstance(values, dict):
            merged.update({k: (v, f"$.{block}.{k}") for k, v in values.items()})

    def pick(key: str, default: Any, alias: str = "") -> tuple[Any, str]:
        """The value the parser reads for `key` (the prefixed key `alias`, dspark_KEY by default, first) and where."""
        alias = alias or f"dspark_{key}"
        if raw.get(alias) is not None:
            return raw[alias], f"$.{alias}"
        if key in merged:
            return merged[key]
        return raw.get(key, default), f"$.{key}"

    prefixed = any(
        raw.get(f"dspark_{k}") is not None
        for k in ("block_size", "markov_rank", "noise_token_id", "target_layer_ids")
    )
    out: list[_Finding] = []
    # markov_rank: int() (null: 0), >= 0, then > 0 (Qwen3DSparkModel: "DSpark draft requires markov_rank > 0");
    # build_markov_head then casts the top-level one again and sizes the head by it
    value, path = pick("markov_rank", 0)
    ok, rank = _cast_int(value)
    if not ok:
        if path.startswith("$.dspark_config."):  # the others are typed by RuntimeProfile.dspark_reads (LC001)
            out.append(
                _Finding(
                    "LC152", f"{path[2:]} is {_shown(value)}: {{who}} it with int()", "fails on|fail on", path
                )
            )
        rank = None
    elif (rank or 0) <= 0:
        out.append(
            _Finding(
                "LC152",
                f"markov_rank is {_shown(value)} ({_where(path)}, where {{who}} it first): the DSpark parser refuses "
                + (
                    'it ("DSpark markov_rank must be >= 0")'
                    if (rank or 0) < 0
                    else 'it ("requires markov_rank > 0")'
                ),
                "reads|read",
                path,
                expected="> 0",
                actual=value,
            )
        )
    elif path != "$.markov_rank":
        top = raw.get("markov_rank", 0)
        top_ok, top_rank = _cast_int(top)
        if top is None or (top_ok and (top_rank or 0) <= 0):
            out.append(
                _Finding(
                    "LC152",
                    f"markov_rank is {_shown(top) if 'markov_rank' in raw else 'absent'} at the top level: {{who}} "
                    f"the Markov head from it (build_markov_head, int()), not from {path[2:]}",
                    "builds|build",
                    "$.markov_rank",
                    expected="> 0",
                    actual=top if "markov_rank" in raw else "absent",
                )
            )
    # markov_head_type: required when markov_rank > 0 unless a prefixed key is given; str().lower() one of the
    # types built; build_markov_head builds the top-level type (vanilla when absent)
    kind, kind_path = pick("markov_head_type", None)
    types = " / ".join(p.markov_head_types)
    if kind is None and (rank or 0) > 0 and not prefixed:
        nested = ctx.config.dflash.markov_head_type
        where = (
            f" ({kind_path[2:]} is null)"
            if kind_path != "$.markov_head_type" or "markov_head_type" in raw
            else f" (dflash_config.markov_head_type is {nested!r}, not read there)"
            if nested is not None
            else ""
        )
        out.append(
            _Finding(
                "LC162",
                f"markov_head_type is absent at the top level{where}: {{who}} the config "
                '("DSpark requires markov_head_type when markov_rank > 0")',
                "refuses|refuse",
                "$.markov_head_type",
                expected="vanilla, gated or rnn at the top level",
                actual="absent",
            )
        )
    elif kind is not None and str(kind).lower() not in p.markov_head_types:
        out.append(
            _Finding(
                "LC153",
                f"markov_head_type is {_shown(kind)} ({_where(kind_path)}): {{who}} it through str().lower(), "
                f"{str(kind).lower()!r}, and builds only {types}",
                "reads|read",
                kind_path,
                expected=types,
                actual=kind,
            )
        )
    built = str(raw.get("markov_head_type", "vanilla")).lower()
    trained = ctx.geometry.markov_head_type
    if built not in p.markov_head_types and kind_path != "$.markov_head_type":
        out.append(
            _Finding(
                "LC153",
                f"markov_head_type is {_shown(raw.get('markov_head_type'))} at the top level: {{who}} the Markov "
                f"head from it (build_markov_head, str().lower(): {built!r}), and builds only {types}",
                "builds|build",
                "$.markov_head_type",
                expected=types,
                actual=raw.get("markov_head_type"),
            )
        )
    elif (
        built in p.markov_head_types
        and trained is not None
        and built != trained
        and "markov_head_type" not in raw
        and kind is not None
    ):
        out.append(
            _Finding(
                "LC162",
                f"markov_head_type {trained!r} is given only in {kind_path[2:].split('.')[0]}: {{who}} it there "
                "but builds the top-level type (vanilla when absent), which has no parameter for the "
                f"{trained} head's tensors",
                "reads|read",
                kind_path,
                expected="the type at the top level",
                actual=f"{kind_path[2:].split('.')[0]} only: {trained}",
            )
        )
    out += _dspark_mask(ctx, pick)
    layers = raw.get("dspark_target_layer_ids")
    if layers is not None and (
        not isinstance(layers, list)
        or not layers
        or not all(_cast_int(v)[0] and v is not None for v in layers)
    ):
        out.append(
            _Finding(
                "LC001",
                f"config.json $.dspark_target_layer_ids is {_shown(layers)}: {{who}} a non-empty list of ints",
                "requires|require",
                "$.dspark_target_layer_ids",
                expected="a non-empty list of layer indices",
                actual=layers,
            )
        )
    return out


def _dspark_mask(ctx: Context, pick: Any) -> list[_Finding]:
    """LC163: the mask token the DSpark parser embeds (dspark_noise_token_id, dspark_config's, dflash_config's where
    merged, the top level's, else parse_dflash_draft_config's), through int(), against the one the draft was trained
    with (dflash_config's, else the top level's)."""
    raw = ctx.parsed.raw
    nested_block = raw.get("dflash_config")
    nested = _int(nested_block.get("mask_token_id")) if isinstance(nested_block, dict) else None
    top = _int(raw.get("mask_token_id"))
    trained = nested if nested is not None else top
    base = (
        nested_block.get("mask_token_id", raw.get("mask_token_id")) if isinstance(nested_block, dict) else top
    )
    value, path = pick("mask_token_id", base, "dspark_noise_token_id")
    if path == "$.mask_token_id" and "mask_token_id" not in raw and isinstance(nested_block, dict):
        path = "$.dflash_config.mask_token_id"
    ok, served = _cast_int(value)
    if trained is None:
        return []
    if not ok:
        if not path.startswith("$.dspark_config."):
            return []  # typed by RuntimeProfile.dspark_reads (LC001)
        return [
            _Finding(
                "LC163", f"{path[2:]} is {_shown(value)}: {{who}} it with int()", "fails on|fail on", path
            )
        ]
    if served is None:
        return [
            _Finding(
                "LC163",
                f"mask_token_id is null in {path[2:]}, where {{who}} it first: no mask token (the DSpark worker "
                'refuses it: "DSpark requires mask_token_id"), where the draft was trained with '
                f"{trained}",
                "reads|read",
                path,
                expected=trained,
                actual=None,
            )
        ]
    if served < 0:
        return [
            _Finding(
                "LC163",
                f'the mask token is {served} ({path[2:]}): {{who}} it ("DSpark mask_token_id must be non-negative")',
                "refuses|refuse",
                path,
                expected=trained,
                actual=value,
            )
        ]
    if served == trained:
        return []
    return [
        _Finding(
            "LC163",
            f"the mask token is {_shown(value)} in {path[2:]} and {trained} in "
            f"{'dflash_config' if nested is not None else 'the top level'}: {{who}} token {served} in every mask "
            f"slot, where the draft was trained with {trained}",
            "embeds|embed",
            path,
            expected=trained,
            actual=value,
        )
    ]


def _domino(ctx: Context) -> None:
    """LC155-LC159: the Domino keys SGLang checks."""
    cfg = ctx.config
    d = cfg.dflash
    checkers = [p for p in ctx.profiles if p.domino_checks]
    if d.shift_label is not None and not isinstance(d.shift_label, bool) or d.shift_label is None:
        raw = (
            ctx.parsed.raw.get("dflash_config", {})
            if isinstance(ctx.parsed.raw.get("dflash_config"), dict)
            else {}
        )
        shown = json.dumps(raw.get("shift_label")) if "shift_label" in raw else "absent"
        ctx.emit_for(
            "LC155",
            checkers,
            f"dflash_config.shift_label is {shown}: {names(checkers, 'requires|require')} a JSON bool",
            file="config.json",
            pointer="$.dflash_config.shift_label",
            expected="true | false",
            actual=shown,
        )
    # parse_dflash_draft_config reads each through _parse_optional_int (int(), null absent), dflash_config's value
    # else the top-level one; emb_dim from both, which must agree (a value int() fails on is LC001's)
    prefix_ok, prefix = _domino_int(ctx, "pure_draft_prefix_len")
    if prefix_ok and prefix != 1:
        shown = _domino_raw(ctx, "pure_draft_prefix_len")
        ctx.emit_for(
            "LC156",
            checkers,
            f"dflash_config.pure_draft_prefix_len is {shown}"
            + (f" (int(): {prefix})" if prefix is not None and shown != str(prefix) else "")
            + f": {names(checkers, 'serves|serve')} only 1",
            file="config.json",
            pointer="$.dflash_config.pure_draft_prefix_len",
            expected=1,
            actual=shown,
        )
    dims = [p for p in ctx.profiles if p.domino_dims_required]
    nested_ok, nested_emb = _domino_int(ctx, "emb_dim", top=False)
    top_ok, top_emb = _domino_int(ctx, "emb_dim", nested=False)
    gru_ok, gru = _domino_int(ctx, "gru_hidden_dim")
    emb = nested_emb if nested_emb is not None else top_emb
    for key, ok, value in (("gru_hidden_dim", gru_ok, gru), ("emb_dim", nested_ok and top_ok, emb)):
        if ok and (value is None or value < 1):
            ctx.emit_for(
                "LC157",
                dims,
                f"{key} is missing or < 1: {names(dims, 'requires|require')} it",
                file="config.json",
                pointer=f"$.dflash_config.{key}",
                expected=">= 1",
            )
    if nested_emb is not None and top_emb is not None and nested_emb != top_emb:
        ctx.emit_for(
            "LC158",
            checkers,
            f"dflash_config.emb_dim {_domino_raw(ctx, 'emb_dim', top=False)} and the top-level emb_dim "
            f"{_domino_raw(ctx, 'emb_dim', nested=False)} differ (int(): {nested_emb} and {top_emb}): "
            f'{names(checkers, "refuses|refuse")} it ("emb_dim differs")',
            file="config.json",
            pointer="$.emb_dim",
            expected=nested_emb,
            actual=top_emb,
        )
    # _parse_optional_int(dflash_config's block_size, else the top-level one): int(true) == 1 is refused too
    block_ok, block = _domino_int(ctx, "block_size")
    if block_ok and block is not None and block <= 1:
        shown = _domino_raw(ctx, "block_size")
        ctx.emit_for(
            "LC159",
            checkers,
            f"block_size is {shown}" + (f" (int(): {block})" if shown != str(block) else "") + f": "
            f"{names(checkers, 'refuses|refuse')} a Domino draft with block_size <= 1",
            file="config.json",
            pointer="$.block_size",
            expected="> 1",
            actual=block,
        )


def _domino_value(ctx: Context, key: str, *, nested: bool = True, top: bool = True) -> tuple[bool, Any]:
    """(whether given, the value) of a Domino key as parse_dflash_draft_config reads it: dflash_config's when it
    has the key, else the top level's."""
    raw = ctx.parsed.raw
    block = raw.get("dflash_config")
    if nested and isinstance(block, dict) and key in block:
        return True, block[key]
    if top and key in raw:
        return True, raw[key]
    return False, None


def _domino_raw(ctx: Context, key: str, *, nested: bool = True, top: bool = True) -> str:
    given, value = _domino_value(ctx, key, nested=nested, top=top)
    return _shown(value) if given else "absent"


def _domino_int(ctx: Context, key: str, *, nested: bool = True, top: bool = True) -> tuple[bool, int | None]:
    """_parse_optional_int of the key: (whether int() succeeds, the integer or None for null / absent)."""
    return _cast_int(_domino_value(ctx, key, nested=nested, top=top)[1])
