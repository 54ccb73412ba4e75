"""The draft block size (LC110-LC112, LC125, LC126) and the n_predict a release checks against it (LC182)."""

from __future__ import annotations

from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.config.types import config_read
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
rule(
    "LC110",
    "block-size-missing",
    "error",
    CFG,
    "block_size is absent and the runtime refuses the config (see LC125 for those that assume a default).",
    "Write dflash_config.block_size (and the top-level block_size for older readers).",
    doc="Fires when neither `dflash_config.block_size` nor the top-level `block_size` is present (and neither "
    "has the wrong type, which is LC001's), once for each selected runtime without a default: vLLM and "
    "TensorRT-LLM. SGLang's default is LC125.",
    why="The block size is the number of positions drafted per step, fixed at training. vLLM refuses the "
    'config ("requires 1 <= num_speculative_tokens < trained block_size"), TensorRT-LLM too ("requires '
    'dflash_config.block_size or block_size").',
    example='    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}\n\n'
    "and no `block_size` anywhere in config.json.",
)
rule(
    "LC111",
    "block-size-conflict",
    "warning",
    CFG,
    "dflash_config.block_size and the top-level block_size disagree (the nested one wins).",
    "Make both keys hold the trained block size.",
    doc="Fires when `dflash_config.block_size` and the top-level `block_size` are both present and differ.",
    why="SGLang, vLLM and TensorRT-LLM use the nested value; older TensorRT-LLM revisions read the top-level "
    "one. The block size served then depends on the reader's version, and one of the two values is not "
    "the trained one.",
    example='    "block_size": 8,\n    "dflash_config": {"block_size": 16}',
)
rule(
    "LC112",
    "block-size-range",
    "error",
    CFG,
    "block_size must be an integer >= 2 for a LiLiCorr drafter.",
    "Write the trained block size (16 for the published recipes).",
    doc="Fires when the block size (dflash_config's, else the top-level one) is below 2 for a LiLiCorr "
    "drafter, or below 1 for any other drafter.",
    why="A LiLiCorr head scores candidates across the positions of a block; a block of one position leaves "
    'nothing to draft. Every runtime refuses it (TensorRT-LLM: "Invalid LiLiCorr attention, block").',
    example='    "dflash_config": {"block_size": 1}',
)
rule(
    "LC125",
    "block-size-defaulted",
    "warning",
    CFG,
    "block_size is absent and the runtime silently assumes its default.",
    "Write dflash_config.block_size (and the top-level block_size for older readers).",
    doc="Fires when block_size is absent from dflash_config and the top level (and neither has the wrong "
    "type), once for each selected runtime that assumes a default instead of refusing: SGLang, which uses "
    "16. vLLM and TensorRT-LLM refuse (LC110).",
    why="SGLang loads the config without a word and drafts 16 positions per step. A drafter trained with "
    "another block size then serves with a block it never saw: it loads cleanly and acceptance drops.",
    example='    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}\n\n'
    "for a drafter trained with block_size 8: SGLang serves it with 16.",
)
rule(
    "LC126",
    "block-size-top-level-only",
    "info",
    CFG,
    "block_size is only at the top level of config.json.",
    "Write it in dflash_config too.",
    doc="Fires when the block size is only at the top level of config.json (no `dflash_config.block_size`) "
    "and its value is valid. Not for a speculators-format config, which has no dflash_config (LC019).",
    why="Where both keys are present the audited loaders use dflash_config's (LC111); a top-level key alone "
    "relies on each reader falling back to it. Writing it in dflash_config as well keeps readers that "
    "look only in dflash_config (as SGLang does for output_multiplier) in agreement.",
    example='    "block_size": 16,\n    "dflash_config": {"mask_token_id": 151669, '
    '"target_layer_ids": [1, 9, 17, 25, 33]}',
)
rule(
    "LC182",
    "n-predict",
    "error",
    CFG,
    "A top-level n_predict that the runtime checks num_speculative_tokens against, and the drafter's block does "
    "not pass the check.",
    "Remove n_predict (a DFlash-family drafter drafts block_size - 1 tokens), or write a count that divides "
    "block_size - 1.",
    doc="Fires for each runtime release that reads a top-level `n_predict` as the count num_speculative_tokens "
    "must divide when it is larger (vLLM: config/speculative.py `SpeculativeConfig.__post_init__` in 0.31-0.33, "
    "v1/worker/gpu/spec_decode/speculator_config.py `resolve_num_speculative_tokens` in 0.34; for every head "
    "but DSpark, whose own code reads block_size instead) when the drafter served with num_speculative_tokens "
    "= block_size - 1 fails it: a count below that which does not divide it (0 and negatives included), or a "
    "value that is no number.",
    why='The server stops at start-up: "num_speculative_tokens:7 must be divisible by n_predict=2", a '
    "ZeroDivisionError for 0, a TypeError for a string or a list. n_predict is the multi-token-prediction "
    "layer count of MTP drafters; a DFlash-family config has no use for it.",
    example='    "n_predict": 2,\n    "dflash_config": {"block_size": 8}',
)


# ---------------------------------------------------------------- checks


def block_size(ctx: Context) -> None:
    n_predict(ctx)
    cfg = ctx.config
    nested, top = cfg.dflash.block_size, cfg.block_size
    if nested is None and top is None:
        if ctx.parsed.invalid("$.block_size") or ctx.parsed.invalid("$.dflash_config.block_size"):
            return
        for p in ctx.profiles:
            if p.block_size_default is None:
                ctx.emit(
                    "LC110",
                    f"block_size is absent: {p.display} refuses the config",
                    runtimes=[p.name],
                    file="config.json",
                    pointer="$.dflash_config.block_size",
                    expected="present",
                    actual="absent",
                )
            else:
                ctx.emit(
                    "LC125",
                    f"block_size is absent: {p.display} silently assumes {p.block_size_default}",
                    runtimes=[p.name],
                    file="config.json",
                    pointer="$.dflash_config.block_size",
                    expected="present",
                    actual="absent",
                )
        return
    if nested is not None and top is not None and nested != top:
        older = [p for p in ctx.profiles if p.block_size_top_level_in_older]
        ctx.emit(
            "LC111",
            f"dflash_config.block_size is {nested} but the top-level block_size is {top}; "
            f"{names(ctx.profiles, 'uses|use')} {nested}"
            + (f" (older {names(older)} revisions read the top-level {top})" if older else "")
            + f"; a reader of the top level only would use {top}",
            file="config.json",
            pointer="$.block_size",
            expected=nested,
            actual=top,
        )
    value = nested if nested is not None else top
    assert value is not None  # both absent returned above
    minimum = 2 if ctx.geometry.lilicorr_enabled else 1
    # a dflash_config value the release does not read for this head kind (vLLM: DFlash, DFlash2, DSpark) is not its
    # concern
    path = "$.dflash_config.block_size"
    readers = [
        p for p in ctx.profiles if nested is None or config_read(p, ctx.geometry.family, path) != "unread"
    ]
    if value < minimum and readers:
        ctx.emit(
            "LC112",
            f"block_size is {value}",
            runtimes=() if len(readers) == len(ctx.profiles) else [p.name for p in readers],
            file="config.json",
            pointer="$.dflash_config.block_size" if nested is not None else "$.block_size",
            expected=f">= {minimum}",
            actual=value,
        )
    elif nested is None and ctx.parsed.speculators is None:  # the speculators layout has no dflash_config
        ctx.emit(
            "LC126",
            "block_size is only at the top level; write it in dflash_config too",
            file="config.json",
            pointer="$.dflash_config.block_size",
        )


def n_predict(ctx: Context) -> None:
    """LC182: the top-level n_predict against num_speculative_tokens = block_size - 1."""
    raw = ctx.parsed.raw
    value = raw.get("n_predict")
    readers = [p for p in ctx.profiles if ctx.geometry.family in p.n_predict_families]
    block = ctx.config.dflash.block_size or ctx.config.block_size
    if value is None or not readers or block is None or block < 2:
        return
    tokens = block - 1
    try:  # the release's own comparison: `tokens > n_predict and tokens % n_predict != 0` refuses
        refused = bool(tokens > value and tokens % value != 0)
    except (TypeError, ZeroDivisionError):
        refused = True
    if refused:
        ctx.emit_for(
            "LC182",
            readers,
            f"n_predict is {value!r}: {names(readers, 'requires|require')} num_speculative_tokens (block_size - 1 "
            f"= {tokens}) to be at most n_predict or a multiple of it, and {names(readers, 'refuses|refuse')} "
            "the draft",
            file="config.json",
            pointer="$.n_predict",
            actual=value,
        )
