"""Owned lm_head rules (LC4xx)."""

from __future__ import annotations

from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
HEAD = "lm_head"
rule("LC401", "own-head-missing", "error", HEAD, "has_own_lm_head is true but lm_head.weight is absent.",
     "Export lm_head.weight [vocab, hidden], or drop has_own_lm_head to borrow the target's head.")
rule("LC402", "own-head-undeclared", "error", HEAD, "lm_head tensors are present but has_own_lm_head is not true: runtimes disagree (some ignore or drop them, others use them as the draft's head).",
     'Set "has_own_lm_head": true, or remove lm_head.*.')
rule("LC404", "own-head-dropped", "error", HEAD,
     "The checkpoint owns its lm_head but the runtime's DFlash draft has no lm_head parameter: the head is dropped "
     "and the target's is used, so the draft serves a different function than the one trained.",
     "Serve an owned-head drafter with a runtime that loads it, or retrain with the target's head.")

rule("LC405", "lm-head-copy", "warning", HEAD,
     "A DSpark drafter ships lm_head tensors without has_own_lm_head (DeepSpec's frozen copy of the target's head): "
     "the runtimes disagree on using it.", "Drop the copy, or set has_own_lm_head if the head was trained.")


# ---------------------------------------------------------------- checks


@check
def owned_head(ctx: Context) -> None:
    if ctx.geometry.has_own_lm_head and "lm_head.weight" in ctx.names.by_canonical:
        dropping = [p for p in ctx.profiles if p.owned_lm_head == "dropped"]
        ctx.emit_for("LC404", dropping, "the checkpoint owns its lm_head (has_own_lm_head true), but "
                     + " and ".join(p.display for p in dropping) + " builds no lm_head parameter for the draft, "
                     "drops lm_head.weight and scores candidates with the target's head", pointer="lm_head.weight",
                     subjects=["lm_head.weight"])
