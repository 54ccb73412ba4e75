"""Owned lm_head rules (LC4xx)."""

from __future__ import annotations

from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
HEAD = "lm_head"
rule(
    "LC401",
    "own-head-missing",
    "error",
    HEAD,
    "has_own_lm_head is true but lm_head.weight is absent.",
    "Export lm_head.weight [vocab, hidden], or drop has_own_lm_head to borrow the target's head.",
    doc="Fires when `has_own_lm_head` is true (with hidden_size and vocab_size known) but `lm_head.weight` is "
    "absent, for the runtimes that load an owned head: vLLM and TensorRT-LLM.",
    why='TensorRT-LLM "requires checkpoint lm_head weights"; vLLM refuses without the tensor where it '
    "checks head coverage, and serves the head at its initial values where it does not. SGLang does not read "
    "the flag and loads the checkpoint with the target's head.",
    example='    "has_own_lm_head": true\n\nand no `lm_head.weight` in the files.',
)
rule(
    "LC402",
    "own-head-undeclared",
    "error",
    HEAD,
    "lm_head tensors are present but has_own_lm_head is not true, and the runtime drops or ignores them (the target's head is used).",
    'Set "has_own_lm_head": true, or remove lm_head.*.',
    doc="Fires when lm_head tensors are present but `has_own_lm_head` is not true, for drafters other than "
    "DSpark (a DSpark drafter's copy is LC405), for the runtimes that ignore the tensor and use the "
    "target's head: TensorRT-LLM. vLLM, which serves the shipped head, reports LC406; SGLang, which has no "
    "lm_head parameter and drops it, LC407.",
    why="The runtimes read the same files differently: SGLang drops the tensor, TensorRT-LLM ignores it and "
    "uses the target's head, vLLM treats any lm_head tensor as the draft's own. The candidates are then "
    "scored with a different head depending on where the drafter is served.",
    example='    lm_head.weight   BF16 [151936, 2048]\n\nwith no "has_own_lm_head" in config.json.',
)
rule(
    "LC406",
    "own-head-undeclared-owned",
    "warning",
    HEAD,
    "lm_head tensors are present but has_own_lm_head is not true, and the runtime serves them as the draft's own "
    "head.",
    'Set "has_own_lm_head": true if the head was trained, or remove lm_head.* to borrow the target\'s.',
    doc="Fires when lm_head tensors are present but `has_own_lm_head` is not true (drafters other than DSpark), "
    "for the runtimes that make any lm_head tensor the draft's own head: vLLM. TensorRT-LLM, which "
    "ignores it, reports LC402; SGLang, which drops it, LC407.",
    why="vLLM marks the draft as owning its head as soon as it loads an lm_head tensor (models/utils.py "
    "`process_eagle_weight`) and keeps it unless it equals the target's (spec_decode/dflash/utils.py "
    "`load_dflash_model`): the checkpoint loads and scores candidates with the head it ships. That is the "
    "trained function if the head was trained (or is the target's copy); the missing flag makes the other "
    "runtimes use the target's head instead.",
    example="    lm_head.weight   BF16 [151936, 2048]\n\n"
    'with no "has_own_lm_head" in config.json, validated with --runtime vllm.',
)
rule(
    "LC404",
    "own-head-dropped",
    "error",
    HEAD,
    "The checkpoint owns its lm_head but the runtime's DFlash draft has no lm_head parameter: the head is dropped "
    "and the target's is used, so the draft serves a different function than the one trained.",
    "Serve an owned-head drafter with a runtime that loads it, or retrain with the target's head.",
    doc="Fires when the checkpoint owns its head (`has_own_lm_head` true and `lm_head.weight` present), for "
    "the runtimes whose DFlash draft has no lm_head parameter: SGLang.",
    why="SGLang's DFlash draft model has no lm_head parameter: its weight loader drops lm_head.weight and "
    "scores candidates with the target's head. The drafter loads cleanly and serves a different function "
    "than the one trained. vLLM and TensorRT-LLM load the owned head.",
    example='    "has_own_lm_head": true\n\nwith `lm_head.weight` BF16 [151936, 2048].',
)
rule(
    "LC407",
    "lm-head-copy-dropped",
    "warning",
    HEAD,
    "lm_head tensors without has_own_lm_head, which the runtime drops: candidates are scored with the target's "
    "head, as the config declares.",
    "Drop the copy, or set has_own_lm_head if the head was trained.",
    doc="Fires when lm_head tensors are present but `has_own_lm_head` is not true (a drafter other than "
    "DSpark), for the runtimes whose draft has no lm_head parameter: SGLang (LC406 for vLLM, LC402 for TensorRT-LLM).",
    why="SGLang's DFlash draft model has no lm_head parameter; load_weights drops the tensors and the worker "
    "points the draft at the target's head, which is what a config without has_own_lm_head asks for. "
    "The tensors are then dead weight, or a trained head the config forgot to declare (LC404 if it is "
    "declared: SGLang drops that too).",
    example='    lm_head.weight   BF16 [151936, 2048]\n\nwith no "has_own_lm_head" in config.json.',
)
rule(
    "LC405",
    "lm-head-copy",
    "warning",
    HEAD,
    "A DSpark drafter ships lm_head tensors without has_own_lm_head (DeepSpec's frozen copy of the target's head): "
    "the runtimes disagree on using it.",
    "Drop the copy, or set has_own_lm_head if the head was trained.",
    doc="Fires for a DSpark drafter that ships lm_head tensors without `has_own_lm_head`, as DeepSpec exports "
    "a frozen copy of the target's head.",
    why="TensorRT-LLM skips the copy and uses the target's head; vLLM keeps it as the draft's own. Both serve "
    "the same function only if the copy is the target's head unchanged, which nothing in the checkpoint "
    "proves.",
    example='    "architectures": ["Qwen3DSparkModel"]\n\n'
    "with `lm_head.weight` [V, M] and no has_own_lm_head.",
)


# ---------------------------------------------------------------- checks


@check
def owned_head(ctx: Context) -> None:
    if ctx.geometry.has_own_lm_head and "lm_head.weight" in ctx.names.by_canonical:
        dropping = [p for p in ctx.profiles if p.owned_lm_head == "dropped"]
        ctx.emit_for(
            "LC404",
            dropping,
            "the checkpoint owns its lm_head (has_own_lm_head true), but "
            + " and ".join(p.display for p in dropping)
            + " builds no lm_head parameter for the draft, "
            "drops lm_head.weight and scores candidates with the target's head",
            pointer="lm_head.weight",
            subjects=["lm_head.weight"],
        )
