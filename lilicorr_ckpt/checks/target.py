"""Target compatibility rules (LC5xx): the drafter against the target's config or GGUF metadata."""

from __future__ import annotations

import math

from lilicorr_ckpt.checkpoint.target import TargetInfo
from lilicorr_ckpt.checks.context import Context, check, names
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
TGT = "target"
rule(
    "LC501",
    "target-hidden-size",
    "error",
    TGT,
    "The draft and target hidden sizes differ.",
    "Validate against the target the drafter was trained for.",
    doc="With `--target`, fires when the draft's hidden_size differs from the target's (its config.json, or "
    "the GGUF metadata), and when the target's input embedding table (its header) is neither as wide as "
    "the draft nor as wide as the target's own hidden_size says.",
    why="The draft reads the target's hidden states (fc takes T x hidden_size columns of them) and borrows "
    "its embeddings; with another width the target's hidden states do not fit fc's input. A different "
    "width means the drafter was trained for another target.",
    example='    drafter config.json  "hidden_size": 2048\n    target config.json   "hidden_size": 4096',
)
rule(
    "LC502",
    "target-layer-range",
    "error",
    TGT,
    "A target_layer_id is not a layer of the target.",
    "Ids use the HF convention: id i reads the output of target layer i (hidden_states[i+1]); valid ids are 0..L-1.",
    doc="With `--target`, fires when a target_layer_id is >= the target's layer count (num_hidden_layers, or "
    "the GGUF block_count). When the largest id equals the layer count, the message says the ids look "
    "shifted by one.",
    why="There is no such layer to read. Either the drafter was trained for a deeper target, or the ids "
    'follow a "before layer i" convention: id i reads the output of layer i (Hugging Face\'s '
    "hidden_states[i+1]), so valid ids are 0..L-1. Depending on where the runtime takes the layer count "
    "from, the load is refused or the draft fails when it gathers the hidden states.",
    example='    target  "num_hidden_layers": 28\n    drafter "dflash_config": {"target_layer_ids": [1, '
    "7, 14, 21, 28]}",
)
rule(
    "LC503",
    "target-vocab",
    "error",
    TGT,
    "The draft and target vocabularies differ.",
    "LiLiCorr scores candidates with the target's embeddings; the vocabularies must be identical.",
    doc="With `--target`, fires when the draft's vocab_size differs from the target's, and, for the runtimes "
    "that require it (TensorRT-LLM), when the target's input embedding has another number of rows than "
    "the draft's vocab_size.",
    why="LiLiCorr scores candidates with the target's embeddings and the target verifies them, so a token id "
    "must mean the same token in both. TensorRT-LLM refuses an embedding whose num_embeddings is not V.",
    example='    drafter "vocab_size": 128256\n    target  "vocab_size": 151936',
)
rule(
    "LC504",
    "target-mask-token",
    "error",
    TGT,
    "mask_token_id is outside the target's embedding table or is a special token.",
    "Use a dedicated mask token that exists in the target embedding and is not eos/bos/pad.",
    doc="With `--target`, fires when mask_token_id is not below the target's embedding rows (or its "
    "vocab_size when the embedding header was not read), and when it equals the target's bos, eos or pad "
    "token id.",
    why="The mask token's embedding fills every draft position. An id outside the table cannot be looked up; "
    "a special token the target also uses (eos, bos, pad) is not a dedicated mask, and its embedding "
    "carries that token's meaning.",
    example='    target generation_config.json  "eos_token_id": 151645\n    drafter  "dflash_config": '
    '{"mask_token_id": 151645}',
)
rule(
    "LC505",
    "target-layer-count",
    "warning",
    TGT,
    "num_target_layers differs from the target's layer count.",
    "Write the target's num_hidden_layers.",
    doc="With `--target`, fires when the draft's num_target_layers differs from the target's layer count.",
    why="Runtimes that size or check the tapped layers with num_target_layers (SGLang's draft checks "
    "target_layer_ids against it, while its target captures by its own layer count) work with a wrong depth; often the value was copied from another target. The ids "
    "themselves are judged by LC502.",
    example='    target  "num_hidden_layers": 36\n    drafter "num_target_layers": 28',
)
rule(
    "LC506",
    "target-rope",
    "warning",
    TGT,
    "rope_theta differs from the target's (the exporter copies it).",
    "Check that this is the right target.",
    doc="With `--target`, fires when the draft's rope_theta differs from the target's (relative tolerance "
    "1e-6).",
    why="The exporter copies rope_theta from the target, and the draft attends over positions encoded like "
    "the target's. A different value loads everywhere and shifts the draft's position encoding, or means "
    "this is not the drafter's target.",
    example='    target  "rope_theta": 1000000.0\n    drafter "rope_theta": 10000.0',
)
rule(
    "LC507",
    "target-unchecked",
    "warning",
    TGT,
    "A target compatibility check did not run: the target's config lacks the value it needs, or gives it with the "
    "wrong type.",
    "Point --target at the target's own Hugging Face directory (or GGUF file), with integer geometry.",
    doc="With `--target`, fires when the target's config or GGUF metadata lacks a value a compatibility check "
    "needs (hidden_size / embedding_length, num_hidden_layers / block_count, vocab_size) or gives it with "
    "the wrong type, and names the checks that did not run (hidden size, layer ids and count, vocabulary, "
    "mask token range).",
    why="The drafter was not compared with the target on those points, so a mismatch there (LC501-LC504) "
    "would go unreported. Often --target points at something other than the target's own directory or "
    "file.",
    example='    target config.json  "hidden_size": "4096"\n\n(a string): the hidden-size check is skipped.',
)
rule(
    "LC508",
    "draft-context-shorter",
    "error",
    TGT,
    "The draft's max_position_embeddings is below the target's context, and the runtime release neither raises "
    "it nor caps the context to it.",
    "Write the target's max_position_embeddings in the drafter's config.json (the rotary table is recomputed, "
    "not trained), or serve a release whose draft positions follow the target.",
    doc="With --target, fires when the draft's max_position_embeddings (its config class's default, 32768 for "
    "Qwen3, when absent) is smaller than the target's (a GGUF's context_length), for the runtime releases "
    "that keep the draft's own value while drafting up to the target's context.",
    why="Those releases build the draft's rotary cache for its own max_position_embeddings, but the speculator "
    "drafts at the target's positions: past the draft's limit every rotary lookup reads outside its table, "
    "garbage rotations or an illegal memory access. The later releases raise the draft's limit to the "
    "target's context, or cap the context to the draft's.",
    example='    draft config.json: "max_position_embeddings": 2048; target: 32768',
)


# ---------------------------------------------------------------- checks


@check
def target_compat(ctx: Context) -> None:
    t, g = ctx.target, ctx.geometry
    if t is None:
        return
    where = f"target {t.label}"
    if t.unreadable:
        what = "; ".join(f"{key} {found}" for key, found in t.unreadable.items())
        skipped = [
            check
            for keys, check in (
                (("hidden_size", "embedding_length"), "hidden size"),
                (("num_hidden_layers", "block_count"), "layer ids and count"),
                (("vocab_size",), "vocabulary"),
            )
            if any(k.rsplit(".", 1)[-1] in keys for k in t.unreadable)
        ]
        if t.vocab_size is None and t.embedding_rows is None:
            skipped.append("mask token range")
        ctx.emit(
            "LC507",
            f"{where}: {what}; not checked against the drafter: {', '.join(skipped)}",
            subjects=sorted(t.unreadable),
        )
    if t.hidden_size is not None and g.hidden_size is not None and t.hidden_size != g.hidden_size:
        ctx.emit(
            "LC501",
            f"draft hidden_size {g.hidden_size} != {where} hidden_size {t.hidden_size}",
            file="config.json",
            pointer="$.hidden_size",
            expected=t.hidden_size,
            actual=g.hidden_size,
        )
    if (
        t.embedding_width is not None
        and g.hidden_size is not None
        and t.embedding_width != g.hidden_size
        and t.embedding_width != t.hidden_size
    ):
        ctx.emit(
            "LC501",
            f"{where} embedding width {t.embedding_width} != draft hidden_size {g.hidden_size}",
            expected=g.hidden_size,
            actual=t.embedding_width,
        )
    if t.num_layers is not None and g.target_layer_ids:
        out = [i for i in g.target_layer_ids if i >= t.num_layers]
        if out:
            shifted = (
                (
                    " — the ids look shifted by +1 (a 'before layer i' convention); id i reads the output of "
                    "target layer i, i.e. HF hidden_states[i+1]"
                )
                if max(g.target_layer_ids) == t.num_layers
                else ""
            )
            ctx.emit(
                "LC502",
                f"target_layer_ids {out} are not layers of {where}, which has {t.num_layers} layers "
                f"(valid ids 0..{t.num_layers - 1}; id i reads the output of target layer i){shifted}",
                file="config.json",
                pointer="$.dflash_config.target_layer_ids",
                expected=f"ids < {t.num_layers}",
                actual=list(g.target_layer_ids),
            )
    if t.num_layers is not None and g.num_target_layers is not None and t.num_layers != g.num_target_layers:
        ctx.emit(
            "LC505",
            f"num_target_layers is {g.num_target_layers} but {where} has {t.num_layers} layers",
            file="config.json",
            pointer="$.num_target_layers",
            expected=t.num_layers,
            actual=g.num_target_layers,
        )
    if t.vocab_size is not None and g.vocab_size is not None and t.vocab_size != g.vocab_size:
        ctx.emit(
            "LC503",
            f"draft vocab_size {g.vocab_size} != {where} vocab_size {t.vocab_size}",
            file="config.json",
            pointer="$.vocab_size",
            expected=t.vocab_size,
            actual=g.vocab_size,
        )
    if t.embedding_rows is not None and g.vocab_size is not None and t.embedding_rows != g.vocab_size:
        strict = [p for p in ctx.profiles if p.embedding_rows_equal_vocab]
        ctx.emit_for(
            "LC503",
            strict,
            f"{where}'s input embedding has {t.embedding_rows} rows but the draft "
            f"vocab_size is {g.vocab_size}: {' and '.join(p.display for p in strict)} requires "
            "num_embeddings == V",
            pointer="embed_tokens.weight",
            expected=g.vocab_size,
            actual=t.embedding_rows,
        )
    rows = t.embedding_rows if t.embedding_rows is not None else t.vocab_size
    mask = g.mask_token_id
    if mask is not None and rows is not None and mask >= rows:
        ctx.emit(
            "LC504",
            f"mask_token_id {mask} is outside {where}'s embedding table ({rows} rows)",
            file="config.json",
            pointer="$.dflash_config.mask_token_id",
            expected=f"< {rows}",
            actual=mask,
        )
    if mask is not None:
        hits = sorted(k for k, v in t.special_ids.items() if v == mask)
        if hits:
            ctx.emit(
                "LC504",
                f"mask_token_id {mask} is {where}'s {'/'.join(hits)} token; the mask must be a "
                "dedicated token",
                file="config.json",
                pointer="$.dflash_config.mask_token_id",
                actual=mask,
            )
    _draft_context(ctx, t, where)
    theta = ctx.config.rope_theta
    if t.rope_theta is not None and theta is not None and not math.isclose(t.rope_theta, theta, rel_tol=1e-6):
        ctx.emit(
            "LC506",
            f"rope_theta {theta:g} differs from {where}'s {t.rope_theta:g}",
            file="config.json",
            pointer="$.rope_theta",
            expected=t.rope_theta,
            actual=theta,
        )


# transformers' Qwen3Config default, which the engines' config classes fill in when the key is absent
DEFAULT_DRAFT_POSITIONS = 32768


def _draft_context(ctx: Context, t: TargetInfo, where: str) -> None:
    """LC508: the draft's positions end before the target's, for releases that do not reconcile them."""
    declared = ctx.config.max_position_embeddings
    mine = (
        declared if isinstance(declared, int) and not isinstance(declared, bool) else DEFAULT_DRAFT_POSITIONS
    )
    if t.max_positions is None or mine >= t.max_positions:
        return
    fixed = [p for p in ctx.profiles if not p.draft_positions_follow_target]
    ctx.emit_for(
        "LC508",
        fixed,
        f"the draft's max_position_embeddings is {mine}{'' if declared == mine else ' (absent: the default)'} "
        f"but {where}'s context is {t.max_positions}: {names(fixed, 'drafts|draft')} past position {mine} with "
        "a rotary table that ends there",
        file="config.json",
        pointer="$.max_position_embeddings",
        expected=f">= {t.max_positions}",
        actual=mine,
    )
