"""Owned lm_head rules (LC4xx)."""

from __future__ import annotations

from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
HEAD = "lm_head"
rule("LC401", "own-head-missing", "error", HEAD, "has_own_lm_head is true but lm_head.weight is absent.",
     "Export lm_head.weight [vocab, hidden], or drop has_own_lm_head to borrow the target's head.")
rule("LC402", "own-head-undeclared", "error", HEAD, "lm_head tensors are present but has_own_lm_head is not true: TRT ignores them, vLLM uses them.",
     'Set "has_own_lm_head": true, or remove lm_head.*.')
rule("LC403", "own-head-unconfirmed", "warning", HEAD, "The runtime's support for a drafter-owned lm_head is not confirmed.",
     "Test the runtime, or borrow the target's head.")



# ---------------------------------------------------------------- checks


@check
def owned_head(ctx: Context) -> None:
    if ctx.geometry.has_own_lm_head and "lm_head.weight" in ctx.names.by_canonical:
        ctx.emit_for("LC403", [p for p in ctx.profiles if p.owned_lm_head != "supported"],
                     "the checkpoint owns its lm_head; SGLang's LiLiCorr candidate path resolves the target's head "
                     "(owned-head support unconfirmed)", pointer="lm_head.weight")
