"""A drafter in the speculators layout (checkpoint/speculators.py), judged as each release reads it (LC017-LC019,
LC176-LC179), and the draft vocabulary each release serves (LC178, any layout).

The reader hands every check the z-lab config vLLM's translation makes of a speculators config, so the other rules
judge what vLLM serves. A release that does not read the layout (RuntimeProfile.speculators_format "refused" or
"unconfirmed", or a translating one whose translation fails on this config) sees none of that: `scope`, the last
check, keeps for it only what it does say (LC017 / LC018) and what is true of the bytes whatever reads them (the
file and tensor-data rules). The rules here compare what speculators trained (its own classes' reading of the
config) with what the translation serves.
"""

from __future__ import annotations

import json

import msgspec

from lilicorr_ckpt.checkpoint.speculators import SpeculatorsOrigin, hub_repo_id_problem
from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.context import Context, check, names
from lilicorr_ckpt.checks.findings import RULES, rule
from lilicorr_ckpt.families import FAMILIES
from lilicorr_ckpt.runtimes import RuntimeProfile

CONVERT = "`lilicorr-ckpt convert --to zlab`"

# ---------------------------------------------------------------- catalogue
rule(
    "LC017",
    "speculators-format-not-read",
    "error",
    CFG,
    "config.json is in the speculators layout, which the runtime does not read.",
    f"Run {CONVERT} to write the z-lab layout every runtime reads (or serve it with a release that translates "
    "the speculators layout, with the keys its translation needs).",
    doc="Fires for a config.json in the layout vllm-project/speculators writes (`speculators_config` and "
    "`speculators_model_type` dflash, dflash2 or dspark, no `model_type`; the geometry nested in "
    "`transformer_layer_config`), for each release that cannot read it: SGLang, which has no reader for the "
    "layout, and vLLM when its translation fails on this config (`aux_hidden_state_layer_ids` or, for "
    "dflash and dflash2, `mask_token_id` absent; the taps not a list of integers; `transformer_layer_config` "
    "not an object). For such a release nothing else is reported but the file and tensor-data rules.",
    why="SGLang reads config.json through transformers' AutoConfig, which refuses a config without "
    "`model_type` before any drafter class is chosen; its wheels have no `speculators_config` handling. "
    "vLLM translates the layout (transformers_utils/configs/speculators/algos.py), indexing "
    '`config_dict["aux_hidden_state_layer_ids"]` and, for DFlash, `config_dict["mask_token_id"]`: '
    "without them the load stops with a KeyError.",
    example='    {"speculators_model_type": "dflash", "speculators_config": {...},\n'
    '     "transformer_layer_config": {"hidden_size": 4096, ...}, "aux_hidden_state_layer_ids": [2, 18, 33]}\n\n'
    "validated with --runtime sglang.",
)
rule(
    "LC018",
    "speculators-format-unconfirmed",
    "warning",
    CFG,
    "config.json is in the speculators layout; whether the runtime reads it was not established.",
    f"Test the runtime yourself, or run {CONVERT} to write the z-lab layout.",
    doc="Fires for a speculators-layout config (see LC017) for each release whose reading of the layout was not "
    "established: TensorRT-LLM. Nothing else is reported for it but the file and tensor-data rules: the other "
    "findings judge vLLM's translation, which it may not share.",
    why="The speculators layout puts the draft's geometry in a nested config and its taps off by one from the "
    "z-lab `target_layer_ids`. A reader that does not translate it either refuses it or reads another "
    "geometry and other taps, and which one TensorRT-LLM does was not read from its source.",
    example='    {"speculators_model_type": "dspark", "speculators_config": {...}, '
    '"transformer_layer_config": {...}}',
)
rule(
    "LC019",
    "speculators-format-translated",
    "info",
    CFG,
    "config.json is in the speculators layout, which the runtime translates into its own drafter config.",
    "Nothing to do; the other findings judge the translated config.",
    doc="Fires for a speculators-layout config (see LC017) for each release that translates it: vLLM. The "
    "message says what the translation made of it; every other finding for that release judges the "
    "translated config, as the z-lab config it stands for: the geometry from `transformer_layer_config`, "
    "`target_layer_ids` = `aux_hidden_state_layer_ids` - 1, `dflash_config.causal` = not "
    "`sliding_window_non_causal` (DFlash, DFlash2), DFlash2's convolution and selector keys in dflash_config, "
    "DSpark as Qwen3DSparkModel with its Markov keys and `sample_from_anchor` at the top level, the block "
    "from the proposal's `speculative_tokens`, and an owned lm_head with `d2t` for a reduced "
    "`draft_vocab_size`.",
    why="vLLM reads a config with `speculators_config` and no `model_type` as a speculators config "
    "(transformers_utils/config.py) and rewrites it (configs/speculators/algos.py update_dflash, "
    "update_dflash2, update_dspark). The translation is what it serves, so it is what is judged; where it "
    "differs from what speculators trained, LC176 and LC177 say so.",
    example='    "aux_hidden_state_layer_ids": [2, 4, 5]   (served as target_layer_ids [1, 3, 4])',
)
rule(
    "LC176",
    "speculators-causal-override",
    "error",
    CFG,
    "The runtime serves some draft layers with another attention mask than speculators trained them with.",
    f"Run {CONVERT}: the z-lab config states no global causal, and vLLM then serves sliding layers causally and "
    "full-attention layers bidirectionally, as speculators trains them. A drafter with full-attention layers "
    "only is also served as trained with `sliding_window_non_causal: true`.",
    doc="Fires for a speculators-layout config when, for a release that translates it, the mask of some draft "
    "layer differs from the one speculators trained it with. speculators trains full-attention layers "
    "bidirectionally always, and sliding layers causally unless `sliding_window_non_causal` is true "
    "(models/dflash/attention.py `create_anchor_block_mask_mod`). vLLM's DFlash and DFlash2 translation sets "
    "one `dflash_config.causal` = not `sliding_window_non_causal` for every layer (true when the key is "
    "false, false when it is absent); its DSpark translation writes none, so every layer follows its type.",
    why="The default speculators writes, `sliding_window_non_causal: false`, becomes `causal: true` for every "
    "layer: full-attention layers trained bidirectionally are served causally. Nothing fails: the drafter loads and drafts another function, and acceptance drops.",
    example='    "sliding_window_non_causal": false,\n'
    '    "transformer_layer_config": {"layer_types": ["full_attention", "full_attention"], ...}',
)
rule(
    "LC177",
    "dspark-anchor-layout",
    "error",
    CFG,
    "A DSpark drafter is served in another block layout than it was trained in (anchor-first against fill-in).",
    "Write the layout it was trained in: `sample_from_anchor: true` for anchor-first (speculative_tokens = "
    "block_size), false for fill-in (speculative_tokens = block_size - 1).",
    doc="Fires for a speculators-layout DSpark config without `sample_from_anchor` whose proposal states the "
    "anchor-first layout (`speculative_tokens` equal to `block_size`), for the releases that translate it. "
    "speculators' DSpark trains anchor-first by default (the anchor is the first predicted token, "
    "block_size tokens drafted) and writes speculative_tokens = block_size; the fill-in layout (DFlash's "
    "1 + N: the anchor is the bonus token) writes block_size - 1 (models/dflash/core.py). vLLM's translation "
    "reads an absent key as false (algos.py update_dspark) and serves the fill-in layout.",
    why="Every drafted position then reads its logits one slot off and the Markov head conditions on the wrong "
    "token: the drafter loads and its acceptance collapses. The reverse mismatch (a fill-in drafter served "
    "anchor-first, measured at about 1% acceptance) happens to DSpark configs read outside the speculators "
    "layout, where vLLM's DSparkSpeculator defaults to anchor-first; their configs carry nothing that tells "
    "the trained layout, so it is not judged.",
    example='    {"speculators_model_type": "dspark", "block_size": 8,\n'
    '     "speculators_config": {"proposal_methods": [{"speculative_tokens": 8, ...}], ...}}\n\n'
    "with no sample_from_anchor.",
)
rule(
    "LC178",
    "draft-vocabulary-unmapped",
    "error",
    CFG,
    "A reduced draft vocabulary whose drafted ids the runtime does not map to target ids.",
    "Ship d2t (the draft-to-target id offsets) with the reduced lm_head, or train the drafter over the "
    "target's vocabulary.",
    doc="Fires for a drafter with a reduced draft vocabulary (`draft_vocab_size` below `vocab_size`), for the "
    "releases that load it without mapping its drafted ids to the target's: vLLM for DFlash2 (its candidates "
    "are the top rows of the draft lm_head, never mapped), and vLLM for DFlash and DSpark when the checkpoint "
    "has no `d2t` (the map then stays at its zero initialisation, or, for DSpark on the releases that require the "
    "map, the load is refused: `lilicorr-ckpt runtimes` says which).",
    why="vLLM's DFlash loader reads `d2t` into draft_id_to_target_id and scatters the draft head's logits to "
    "their target ids (qwen3_dflash.py compute_logits); its DSpark speculator maps sampled ids the same way. "
    "Without the map, or in DFlash2's candidate selection, which never applies it, draft id i is proposed as "
    "target token i: the drafter loads and proposes the wrong tokens.",
    example='    "draft_vocab_size": 256, "vocab_size": 512\n\nwith `lm_head.weight` [256, 64] and no `d2t`.',
)
rule(
    "LC179",
    "speculators-serve-alone-refused",
    "warning",
    CFG,
    "Served alone (the speculator as the model, its verifier as the target), the runtime refuses this "
    "speculators config.",
    "Write the verifier's Hub repo id in speculators_config.verifier.name_or_path (and the proposal's "
    "speculative_tokens), or serve the target as the model and the drafter through the speculative config.",
    doc="Fires for a speculators-layout config that the releases translating it refuse when the speculator is "
    "served alone (`vllm serve DRAFTER`): `speculators_config.proposal_methods[0].speculative_tokens` or "
    "`speculators_config.verifier.name_or_path` absent (base.py validate_speculators_config, every release), "
    "or a verifier that is not a Hub repo id, such as a local path (the vLLM releases that check the "
    "verifier: `lilicorr-ckpt runtimes` says from which).",
    why="Served alone, vLLM takes the target from the verifier and the draft length from the proposal "
    "(transformers_utils/config.py maybe_override_with_speculators). Its later releases refuse a verifier "
    'that is not a Hub repo id, or that names an existing local path ("Speculators verifier must name a '
    'remote model repository"): a drafter trained against a local copy of its target and saved with that '
    "path does not start. Served through --speculative-config with the target as --model, none of this "
    "is read.",
    example='    "speculators_config": {"verifier": {"name_or_path": "/data/models/Qwen3-8B", ...}, ...}',
)


# ---------------------------------------------------------------- checks


def _by_format(ctx: Context, origin: SpeculatorsOrigin) -> dict[str, list[RuntimeProfile]]:
    """The selected releases by how they read this config: "translated", "unread" (a translating release whose
    translation fails on it), "refused", "unconfirmed"."""
    out: dict[str, list[RuntimeProfile]] = {"translated": [], "unread": [], "refused": [], "unconfirmed": []}
    for p in ctx.profiles:
        mode = p.speculators_format
        if mode == "translated" and origin.unread:
            mode = "unread"
        out.setdefault(mode, []).append(p)
    return out


def _what(origin: SpeculatorsOrigin) -> str:
    version = origin.version if isinstance(origin.version, str) else "?"
    return f"config.json is in the speculators layout ({origin.kind}, speculators {version})"


@check
def speculators_layout(ctx: Context) -> None:
    """LC017-LC019, LC176, LC177, LC179 for a speculators-layout config."""
    origin = ctx.parsed.speculators
    if origin is None:
        return
    by = _by_format(ctx, origin)
    ctx.emit_for(
        "LC017",
        by["refused"],
        f"{_what(origin)}: {names(by['refused'], 'has|have')} no reader for it (the config has no model_type, "
        f"which its config reader requires); {CONVERT} writes the z-lab layout",
        file="config.json",
        pointer="$.speculators_config",
    )
    ctx.emit_for(
        "LC017",
        by["unread"],
        f"{_what(origin)}: {names(by['unread'], 'translates|translate')} the layout but not this config: "
        + "; ".join(origin.unread),
        file="config.json",
        pointer="$.speculators_model_type",
    )
    ctx.emit_for(
        "LC018",
        by["unconfirmed"],
        f"{_what(origin)}: whether {names(by['unconfirmed'], 'reads|read')} it was not established; nothing "
        "else is judged for it but the files",
        file="config.json",
        pointer="$.speculators_config",
    )
    readers = by["translated"]
    if not readers:
        return
    ctx.emit_for(
        "LC019",
        readers,
        f"{_what(origin)}: {names(readers, 'translates|translate')} it into the config judged here: "
        + _translation(ctx, origin),
        file="config.json",
        pointer="$.speculators_model_type",
    )
    _causal_override(ctx, origin, readers)
    _anchor_layout(ctx, origin, readers)
    _serve_alone(ctx, origin, readers)


def _translation(ctx: Context, origin: SpeculatorsOrigin) -> str:
    g, cfg = ctx.geometry, ctx.config
    parts = [f"architectures [{cfg.architecture}]"]
    if g.target_layer_ids is not None:
        parts.append(
            f"target_layer_ids {list(g.target_layer_ids)} (aux_hidden_state_layer_ids "
            f"{origin.aux_hidden_state_layer_ids} - 1)"
        )
    if cfg.dflash.causal is not None:
        swnc = (
            json.dumps(origin.sliding_window_non_causal)
            if origin.written("sliding_window_non_causal")
            else "absent"
        )
        parts.append(f"causal {json.dumps(cfg.dflash.causal)} (sliding_window_non_causal {swnc})")
    if cfg.sample_from_anchor is not None:
        parts.append(f"sample_from_anchor {json.dumps(bool(cfg.sample_from_anchor))}")
    if g.block_size is not None:
        tokens = origin.speculative_tokens
        parts.append(
            f"block {g.block_size}" + (f" ({tokens} speculative tokens)" if tokens is not None else "")
        )
    if g.draft_vocab_size is not None:
        parts.append(f"a draft vocabulary of {g.draft_vocab_size} (lm_head and d2t)")
    return ", ".join(parts)


def _served_causal(ctx: Context, layer: int) -> bool:
    """What a release that honours causality serves for `layer` of the translated config (qwen3_dflash.py
    `_dflash_layer_causal`: is_causal, then dflash_config.causal, then sliding layers causal)."""
    cfg = ctx.config
    if cfg.is_causal is not None:
        return bool(cfg.is_causal)
    if cfg.dflash.causal is not None:
        return bool(cfg.dflash.causal)
    types = cfg.layer_types or []
    return layer < len(types) and types[layer] == "sliding_attention"


def _spans(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _causal_override(ctx: Context, origin: SpeculatorsOrigin, readers: list[RuntimeProfile]) -> None:
    """LC176: layers whose served mask is not the trained one."""
    honouring = [p for p in readers if p.causal == "honours"]
    layers = ctx.geometry.num_layers or 0
    if not honouring or not layers:
        return
    # the layers past every layer_types list are full attention alike: one stands for all (a hostile count
    # of layers is never walked)
    listed = min(layers, max(len(origin.layer_types), len(ctx.config.layer_types or [])))
    walked = range(listed + 1 if layers > listed else listed)
    wrong = [i for i in walked if _served_causal(ctx, i) != origin.trained_causal(i)]
    if not wrong:
        return
    types = list(origin.layer_types)

    def mask(causal: bool) -> str:
        return "causally" if causal else "bidirectionally"

    groups: dict[tuple[str, bool], list[int]] = {}
    for i in wrong:
        kind = types[i] if i < len(types) else "full_attention"
        groups.setdefault((kind, origin.trained_causal(i)), []).append(i)

    def label(idx: list[int]) -> str:  # the representative past the lists stands for the rest
        text = _spans([i for i in idx if i < listed])
        if layers > listed and listed in idx:
            tail = str(listed) if layers - 1 == listed else f"{listed}-{layers - 1}"
            text = f"{text}, {tail}" if text else tail
        return text

    said = "; ".join(
        f"{kind} layers {label(idx)} were trained {mask(trained)} and are served {mask(not trained)}"
        for (kind, trained), idx in groups.items()
    )
    count = sum(i < listed for i in wrong) + (layers - listed if layers > listed and listed in wrong else 0)
    swnc = (
        f"sliding_window_non_causal {json.dumps(origin.sliding_window_non_causal)}"
        if origin.written("sliding_window_non_causal")
        else "no sliding_window_non_causal"
    )
    how = (
        f"{swnc} becomes dflash_config.causal {json.dumps(ctx.config.dflash.causal)} for every layer"
        if ctx.config.dflash.causal is not None
        else f"{swnc}, which the translation does not carry: every layer follows its type"
    )
    ctx.emit_for(
        "LC176",
        honouring,
        f"{names(honouring, 'serves|serve')} a mask speculators did not train: {said} ({how}); the drafter "
        "loads and drafts another function",
        file="config.json",
        pointer="$.sliding_window_non_causal",
        silent_for=[p.name for p in honouring],
        expected="the trained mask per layer (speculators: full attention bidirectional, sliding causal unless "
        "sliding_window_non_causal)",
        actual=f"{count} of {layers} layers served otherwise",
    )


def _anchor_layout(ctx: Context, origin: SpeculatorsOrigin, readers: list[RuntimeProfile]) -> None:
    """LC177: a speculators DSpark served in another layout than trained."""
    if origin.kind != "dspark":
        return
    trained, served = origin.trained_sample_from_anchor, origin.served_sample_from_anchor
    if trained is None or trained == served:
        return

    def layout(anchor: bool) -> str:
        return (
            "anchor-first (the anchor predicts the first token)"
            if anchor
            else "fill-in (1 + N, the anchor is the bonus token)"
        )

    basis = (
        f"sample_from_anchor {json.dumps(origin.sample_from_anchor)}"
        if origin.written("sample_from_anchor")
        else f"no sample_from_anchor, and speculative_tokens {origin.speculative_tokens} with block_size "
        f"{origin.block_size}"
    )
    ctx.emit_for(
        "LC177",
        readers,
        f"the DSpark drafter was trained {layout(trained)} ({basis}), but "
        f"{names(readers, 'serves|serve')} it {layout(served)}"
        + ("" if origin.written("sample_from_anchor") else ": the translation reads the absent key as false"),
        file="config.json",
        pointer="$.sample_from_anchor",
        silent_for=[p.name for p in readers],
        expected=f"sample_from_anchor {json.dumps(trained)}",
        actual="absent"
        if not origin.written("sample_from_anchor")
        else json.dumps(origin.sample_from_anchor),
    )


def _serve_alone(ctx: Context, origin: SpeculatorsOrigin, readers: list[RuntimeProfile]) -> None:
    """LC179: what `vllm serve DRAFTER` refuses."""
    if origin.serve_alone_missing:
        ctx.emit_for(
            "LC179",
            readers,
            f"served alone, {names(readers, 'refuses|refuse')} it: {', '.join(origin.serve_alone_missing)} "
            '(absent; "Invalid speculators config structure")',
            file="config.json",
            pointer="$.speculators_config",
            subjects=origin.serve_alone_missing,
        )
    strict = [p for p in readers if p.speculators_verifier_repo_only]
    if "speculators_config.verifier.name_or_path" in origin.serve_alone_missing:
        return
    why = hub_repo_id_problem(origin.verifier)
    if strict and why:
        shown = json.dumps(origin.verifier) if isinstance(origin.verifier, str) else repr(origin.verifier)
        ctx.emit_for(
            "LC179",
            strict,
            f"served alone, {names(strict, 'refuses|refuse')} it: the verifier {shown} is not a Hub repo id "
            f'({why}): "Speculators verifier must name a remote model repository"',
            file="config.json",
            pointer="$.speculators_config.verifier.name_or_path",
            expected="a Hub repo id (namespace/name)",
            actual=shown,
        )


@check
def draft_vocabulary(ctx: Context) -> None:
    """LC178: a reduced draft vocabulary the release loads without mapping its ids (any layout)."""
    g = ctx.geometry
    family = g.family
    if g.draft_vocab_size is None or family == "lilicorr" or family not in FAMILIES:
        return
    has_map = "d2t" in ctx.names.by_canonical
    title = FAMILIES[family].TITLE
    unmapped = [p for p in ctx.profiles if family in p.draft_vocab_unmapped]
    ctx.emit_for(
        "LC178",
        unmapped,
        f"a draft vocabulary of {g.draft_vocab_size} (of {g.vocab_size}): {names(unmapped, 'takes|take')} "
        f"{title}'s candidates from the draft lm_head's rows and never {'applies d2t' if has_map else 'maps them'}, "
        "so draft id i is proposed as target token i",
        file="config.json",
        pointer="$.draft_vocab_size",
        silent_for=[p.name for p in unmapped],
        expected="candidate ids mapped to the target vocabulary",
        actual="draft ids",
    )
    if has_map:
        return
    mapping = [p for p in ctx.profiles if family in p.draft_vocab_mapped]
    refusing = [p for p in mapping if family == "dspark" and p.dspark_vocab_tensors_required]
    serving = [p for p in mapping if p not in refusing]
    effects = (
        [f'{names(refusing, "refuses|refuse")} the load ("must include a d2t mapping")'] if refusing else []
    ) + (
        [f"{names(serving, 'keeps|keep')} the map at zero, so draft id i is proposed as target token i"]
        if serving
        else []
    )
    ctx.emit_for(
        "LC178",
        mapping,
        f"a draft vocabulary of {g.draft_vocab_size} (of {g.vocab_size}) without d2t, the map from draft ids to "
        "target ids: " + "; ".join(effects),
        file="config.json",
        pointer="$.draft_vocab_size",
        silent_for=[p.name for p in serving],
        expected="d2t",
        actual="absent",
        subjects=["d2t"],
    )


_BYTES = ("files", "deep")  # rule areas true of the bytes whatever reads the config


@check
def scope(ctx: Context) -> None:
    """For a speculators-layout config, the findings of the other rules are kept only for the releases that read
    it as it was judged (the translating ones whose translation succeeds): the rest say LC017 / LC018."""
    origin = ctx.parsed.speculators
    if origin is None:
        return
    readers = (
        set() if origin.unread else {p.name for p in ctx.profiles if p.speculators_format == "translated"}
    )
    everyone = set(ctx.runtime_names)
    if readers == everyone:
        return
    kept = []
    for f in ctx.findings:
        if f.rule in ("LC017", "LC018") or RULES[f.rule].area in _BYTES:
            kept.append(f)
            continue
        scoped = (set(f.runtimes) if f.runtimes else everyone) & readers
        if scoped == everyone:
            kept.append(f)
        elif scoped:
            kept.append(msgspec.structs.replace(f, runtimes=sorted(scoped)))
    ctx.findings[:] = kept
