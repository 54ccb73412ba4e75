"""The mask token (LC115, LC127)."""

from __future__ import annotations

from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.context import Context
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
rule(
    "LC115",
    "mask-token",
    "error",
    CFG,
    "mask_token_id is missing or outside the vocabulary.",
    "Write dflash_config.mask_token_id: the id the drafter was trained with, < vocab_size.",
    doc="Looks at `mask_token_id` (dflash_config's, else the top-level one) and fires when it is absent, "
    "negative, or not below vocab_size.",
    why="The mask token fills the draft positions of every block, so a wrong one serves a different function. "
    "Without it the runtimes fall back differently: SGLang resolves the `<|MASK|>` token through the "
    "tokenizer, TensorRT-LLM falls back to vocab_size, an id outside the embedding, vLLM has no fallback. "
    'SGLang refuses a negative id ("must be non-negative"); an id >= vocab_size is outside the '
    "embedding table.",
    example='    "vocab_size": 151936,\n    "dflash_config": {"mask_token_id": 151936}',
)
rule(
    "LC127",
    "mask-token-top-level-only",
    "info",
    CFG,
    "mask_token_id is only at the top level; MLX-style readers require it in dflash_config.",
    "Write dflash_config.mask_token_id too.",
    doc="Fires when mask_token_id is only at the top level of config.json (a valid id, but no "
    "`dflash_config.mask_token_id`). Not for a speculators-format config, which has no dflash_config (LC019).",
    why="MLX-style readers take the mask token from dflash_config only and refuse the config without it. The "
    "runtimes judged here accept the top-level key, so this is informational.",
    example='    "mask_token_id": 151669,\n    "dflash_config": {"block_size": 16}',
)


# ---------------------------------------------------------------- checks


def mask_token(ctx: Context) -> None:
    cfg = ctx.config
    mask = cfg.dflash.mask_token_id if cfg.dflash.mask_token_id is not None else cfg.mask_token_id
    if mask is None:
        if ctx.parsed.invalid("$.dflash_config.mask_token_id") or ctx.parsed.invalid("$.mask_token_id"):
            return
        what = "; ".join(f"{p.display} {p.mask_token_fallback}" for p in ctx.profiles)
        ctx.emit(
            "LC115",
            f"mask_token_id is missing ({what})",
            file="config.json",
            pointer="$.dflash_config.mask_token_id",
            expected="the trained mask id",
            actual="absent",
        )
        return
    if mask < 0:
        ctx.emit(
            "LC115",
            f"mask_token_id is {mask}",
            file="config.json",
            pointer="$.dflash_config.mask_token_id",
            expected=">= 0",
            actual=mask,
        )
    elif cfg.vocab_size is not None and mask >= cfg.vocab_size:
        ctx.emit(
            "LC115",
            f"mask_token_id {mask} is not below vocab_size {cfg.vocab_size}",
            file="config.json",
            pointer="$.dflash_config.mask_token_id",
            expected=f"< {cfg.vocab_size}",
            actual=mask,
        )
    elif cfg.dflash.mask_token_id is None and ctx.parsed.speculators is None:  # no dflash_config to write to
        ctx.emit(
            "LC127",
            "mask_token_id is only at the top level; MLX-style readers require it in dflash_config",
            file="config.json",
            pointer="$.dflash_config.mask_token_id",
        )
