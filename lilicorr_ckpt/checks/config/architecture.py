"""The declared architecture against the head the tensors carry (LC010, LC011, LC013, LC108)."""

from __future__ import annotations

import json

from lilicorr_ckpt.checkpoint.geometry import head_declared, routed_by_projector
from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.config.siblings import foreign_sibling_tensors, sibling_route
from lilicorr_ckpt.checks.config.types import config_read
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.families import SIBLINGS
from lilicorr_ckpt.runtimes import RuntimeProfile

# ---------------------------------------------------------------- catalogue
rule(
    "LC010",
    "architecture",
    "error",
    CFG,
    "`architectures` is missing or names no DFlash-family drafter.",
    'Set "architectures": ["LiLiCorrDraftModel"] (or DFlashDraftModel for a head-free draft).',
    doc="Fires when `architectures` is absent or empty, or when `architectures[0]` is not a drafter class of "
    "the DFlash family (LiLiCorrDraftModel, DFlashDraftModel, DFlash2DraftModel, DSparkDraftModel, "
    "DominoDraftModel, Qwen3DSparkModel). For `Qwen3ForCausalLM` with `dflash_config.projector_type: "
    '"lilicorr"` or `lilicorr_enabled: true` it fires only for the runtimes that do not route that pair '
    "to LiLiCorr (SGLang and vLLM). An `architectures` of the wrong JSON type is LC001's.",
    why="Every runtime picks the draft model class from `architectures[0]`. With no name, or a name outside "
    "its registry of drafters, there is nothing to build and the load is refused before a weight is read. "
    "TensorRT-LLM routes `Qwen3ForCausalLM` with a LiLiCorr projector marker to its LiLiCorr model; "
    "SGLang and vLLM see a plain model class, not a drafter, and refuse it.",
    example='    "architectures": ["Qwen3ForCausalLM"]\n\n'
    'with no `projector_type` in dflash_config: refused by every runtime. With `"projector_type": '
    '"lilicorr"` only SGLang and vLLM refuse it.',
)
rule(
    "LC011",
    "architecture-head-mismatch",
    "error",
    CFG,
    "The declared architecture and the head it carries disagree.",
    "Declare LiLiCorrDraftModel for a checkpoint with lilicorr.* tensors, DFlashDraftModel for one without.",
    doc="Fires when the architecture and the `lilicorr.*` tensors disagree: head tensors under an "
    "architecture that builds no LiLiCorr head (DFlashDraftModel, a sibling-head class); "
    "LiLiCorrDraftModel declared while the checkpoint has tensors but none under `lilicorr.`. For "
    'DFlashDraftModel with `projector_type: "lilicorr"` or `lilicorr_enabled: true` it is judged per '
    "runtime: with head tensors it fires for SGLang and vLLM, which ignore the marker; without them (but "
    "with lilicorr_* geometry) for TensorRT-LLM, which follows the marker and expects a head.",
    why="The architecture decides which modules exist. Head tensors under DFlashDraftModel load into nothing: "
    "SGLang drops them and serves the plain DFlash draft, a different function than the one trained, "
    "without an error; vLLM has no parameter for them and refuses. TensorRT-LLM loads them only when a "
    "projector marker routes the class to LiLiCorr. A LiLiCorrDraftModel without head tensors fails every "
    "loader's head coverage check.",
    example='    "architectures": ["DFlashDraftModel"]\n\n'
    "with `lilicorr.out_head.weight`, `lilicorr.in_head.weight`, ... in model.safetensors.",
)
rule(
    "LC013",
    "head-geometry-unused",
    "warning",
    CFG,
    "DFlashDraftModel is declared with lilicorr_* geometry: the loaders that select the class from architectures "
    "never build the head.",
    "Declare LiLiCorrDraftModel, or drop the lilicorr_* keys for a head-free draft.",
    doc="Fires for DFlashDraftModel whose dflash_config carries LiLiCorr geometry (any `lilicorr_*` key, or "
    '`projector_type: "lilicorr"`) while the checkpoint has no `lilicorr.*` tensor. With a projector '
    'marker (`projector_type: "lilicorr"` or `lilicorr_enabled: true`) it fires only for SGLang and '
    "vLLM: TensorRT-LLM then expects a head, which LC011 reports.",
    why="SGLang and vLLM select the class from `architectures` and build a plain DFlash draft: the lilicorr_* "
    "keys are never read. That loads and serves, but the config says a head was trained: either it was "
    "lost in export, or the keys were copied from another drafter. Either way the served draft is not the "
    "one the config describes.",
    example='    "architectures": ["DFlashDraftModel"],\n    "dflash_config": {"block_size": 16, '
    '"lilicorr_candidate_topk": 8, "lilicorr_hidden_size": 1024}\n\n'
    "and no `lilicorr.*` tensor in the files.",
)
rule(
    "LC108",
    "lilicorr-disabled",
    "error",
    CFG,
    "lilicorr_enabled is false on a LiLiCorrDraftModel.",
    "Set lilicorr_enabled true, or declare DFlashDraftModel and drop the head tensors.",
    doc="Fires when `architectures[0]` is LiLiCorrDraftModel and `dflash_config.lilicorr_enabled` is false.",
    why="The class and the switch contradict each other, and the loaders refuse rather than pick one: SGLang "
    "parses the config as plain DFlash and the model then requires the lilicorr_* geometry it ignored; "
    'vLLM refuses with "requires lilicorr_enabled=True".',
    example='    "architectures": ["LiLiCorrDraftModel"],\n    "dflash_config": {"lilicorr_enabled": '
    'false, "lilicorr_candidate_topk": 8, ...}',
)


# ---------------------------------------------------------------- checks


def architecture(ctx: Context) -> None:
    cfg = ctx.config
    arch = cfg.architecture
    has_head_tensors = any(n.startswith("lilicorr.") for n in ctx.names.by_canonical)
    if cfg.architectures is None or not cfg.architectures:
        if not ctx.parsed.invalid("$.architectures"):
            ctx.emit(
                "LC010",
                "config.json has no `architectures`; loaders select the drafter class from it",
                file="config.json",
                pointer="$.architectures",
                expected='["LiLiCorrDraftModel"]',
                actual="absent",
            )
        return
    if cfg.family is None:
        d = cfg.dflash
        projector = d.projector_type == "lilicorr" or d.lilicorr_enabled is True
        routers = [
            p
            for p in ctx.profiles
            if projector and p.projector_type_routes and arch in p.projector_routed_architectures
        ]
        strict = [p for p in ctx.profiles if p not in routers]
        tail = (
            (
                f" ({names(routers, 'routes')} it to LiLiCorr through dflash_config.projector_type / "
                "lilicorr_enabled; the others select the class from architectures)"
            )
            if projector and routers
            else ""
        )
        ctx.emit(
            "LC010",
            f"architectures[0] is `{arch}`, not a DFlash-family drafter the loaders know{tail}",
            runtimes=[p.name for p in strict] if routers else (),
            file="config.json",
            pointer="$.architectures[0]",
            expected="LiLiCorrDraftModel | DFlashDraftModel",
            actual=arch,
        )
        return
    sibling = ctx.geometry.family if ctx.geometry.family in SIBLINGS else None
    if sibling:
        sibling_route(ctx, sibling, arch)
    foreign_sibling_tensors(ctx, arch, sibling)
    disabling = _lilicorr_disabled(ctx) if cfg.family == "lilicorr" else []
    if disabling:
        value = ctx.parsed.raw["dflash_config"]["lilicorr_enabled"]
        ctx.emit(
            "LC108",
            f"dflash_config.lilicorr_enabled is {json.dumps(value)} on LiLiCorrDraftModel: "
            + "; ".join(
                f"{p.display}: {p.lilicorr_disabled or 'not established (validate keeps it refused)'}"
                for p in disabling
            ),
            runtimes=() if len(disabling) == len(ctx.profiles) else [p.name for p in disabling],
            file="config.json",
            pointer="$.dflash_config.lilicorr_enabled",
            expected="true",
            actual=json.dumps(value),
        )
    routers = [p for p in ctx.profiles if p.projector_type_routes]
    others = [p for p in ctx.profiles if not p.projector_type_routes]
    if routed_by_projector(cfg) and has_head_tensors:
        ctx.emit_for(
            "LC011",
            others,
            f"architectures declares {arch} but the checkpoint has lilicorr.* head "
            "tensors: these loaders select the class from architectures, build no head and drop them "
            "silently"
            + (
                f" ({names(routers, 'routes|route')} it to LiLiCorr through "
                "dflash_config.projector_type / lilicorr_enabled)"
                if routers
                else ""
            ),
            file="config.json",
            pointer="$.architectures[0]",
            expected="LiLiCorrDraftModel",
            actual=arch,
        )
    elif routed_by_projector(cfg) and head_declared(cfg):
        ctx.emit_for(
            "LC013",
            others,
            "DFlashDraftModel declared with lilicorr_* geometry: the head is never built",
            file="config.json",
            pointer="$.architectures[0]",
            expected="LiLiCorrDraftModel",
            actual=arch,
        )
        if ctx.table.tensors:
            ctx.emit_for(
                "LC011",
                routers,
                'DFlashDraftModel with dflash_config.projector_type "lilicorr" (or '
                f"lilicorr_enabled true): {names(routers, 'routes|route')} it to LiLiCorr, but the "
                "checkpoint has no lilicorr.* tensors",
                file="config.json",
                pointer="$.dflash_config.projector_type",
                expected="lilicorr.* tensors",
                actual="none",
            )
    elif cfg.family != "lilicorr" and has_head_tensors:
        ctx.emit(
            "LC011",
            f"architectures declares {arch} but the checkpoint has lilicorr.* head tensors: the "
            "loader builds no head and drops them silently",
            file="config.json",
            pointer="$.architectures[0]",
            expected="LiLiCorrDraftModel",
            actual=arch,
        )
    elif cfg.family == "lilicorr" and not has_head_tensors and ctx.table.tensors:
        ctx.emit(
            "LC011",
            "LiLiCorrDraftModel declared but the checkpoint has no lilicorr.* tensors "
            "(a draft with no LiLiCorr head should declare DFlashDraftModel)",
            file="config.json",
            pointer="$.architectures[0]",
            expected="lilicorr.* tensors",
            actual="none",
        )
    elif cfg.family == "dflash" and head_declared(cfg):
        ctx.emit(
            "LC013",
            "DFlashDraftModel declared with lilicorr_* geometry: the head is never built",
            file="config.json",
            pointer="$.architectures[0]",
            expected="LiLiCorrDraftModel",
            actual=arch,
        )


def _lilicorr_disabled(ctx: Context) -> list[RuntimeProfile]:
    """The profiles that read dflash_config.lilicorr_enabled as off: `false` for all; any other falsy value (null,
    0, "") for those that read it as a truth value (vLLM lilicorr.py: `if not draft_config.get("lilicorr_enabled",
    True)`)."""
    nested = ctx.parsed.raw.get("dflash_config")
    if not isinstance(nested, dict) or "lilicorr_enabled" not in nested:
        return []
    value = nested["lilicorr_enabled"]
    if value is False:
        return list(ctx.profiles)
    if isinstance(value, bool) or value:
        return []
    path = "$.dflash_config.lilicorr_enabled"
    # "truth?": null is absent (SGLang lilicorr_utils.py: `enabled is not None and not bool(enabled)`)
    readers = ("truth",) if value is None else ("truth", "truth?")
    return [p for p in ctx.profiles if config_read(p, ctx.geometry.family, path) in readers]
