"""The LiLiCorr head's lilicorr_* geometry keys (LC101-LC107, LC124, LC170)."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import LILICORR_KEYS
from lilicorr_ckpt.checkpoint.geometry import routed_by_projector
from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.context import Context, is_pow2, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.runtimes import RuntimeProfile

# ---------------------------------------------------------------- catalogue
rule(
    "LC101",
    "lilicorr-key-missing",
    "error",
    CFG,
    "A required lilicorr_* geometry key is missing from dflash_config.",
    "Add every lilicorr_* key to dflash_config with the values the head was trained with.",
    doc="For a declared LiLiCorr head (LiLiCorrDraftModel, or DFlashDraftModel with `projector_type: "
    '"lilicorr"` / `lilicorr_enabled: true`, not disabled), fires once for each of the eight geometry '
    "keys missing from dflash_config: lilicorr_candidate_topk, lilicorr_hidden_size, lilicorr_num_layers, "
    "lilicorr_num_heads, lilicorr_mlp_ratio, lilicorr_factor_dim, lilicorr_vector_eps, "
    "lilicorr_logit_scale. A copy at the top level of config.json does not count (the message says when "
    "one is there).",
    why="The head's shapes and its scoring come from these values, and no loader has defaults for them: "
    'SGLang refuses ("is required"), TensorRT-LLM refuses ("missing config fields"), vLLM fails with '
    'a KeyError (a later revision says "Missing dflash_config.X"). A guessed value could load tensors '
    "of matching shape and score a different function, which is why nobody guesses.",
    example='    "dflash_config": {"lilicorr_candidate_topk": 8, "lilicorr_hidden_size": 1024, '
    '"lilicorr_num_layers": 2,\n                      "lilicorr_num_heads": 8, '
    '"lilicorr_mlp_ratio": 2.0, "lilicorr_factor_dim": 64,\n                      '
    '"lilicorr_vector_eps": 1e-6}\n\n'
    "lacks lilicorr_logit_scale; writing it at the top level of config.json instead does not help.",
)
rule(
    "LC102",
    "lilicorr-key-not-finite",
    "error",
    CFG,
    "A lilicorr_* value is NaN or infinite.",
    "Write the finite value the head was trained with.",
    doc="Fires for a lilicorr_* key in dflash_config whose value is NaN or infinite (config.json may hold the "
    "non-standard tokens `NaN` and `Infinity`, which Python's json module accepts).",
    why="These values set the head's normalisation epsilon, its logit scale and its geometry. A NaN passes "
    "comparisons such as `value <= 0` unnoticed, so a positivity check does not stop it, and it then "
    "spreads through every candidate score: the draft serves, and proposes nothing useful. An infinite "
    "size cannot build at all.",
    example='    "dflash_config": {"lilicorr_logit_scale": NaN}',
)
rule(
    "LC103",
    "lilicorr-value-range",
    "error",
    CFG,
    "A lilicorr_* value is out of its range (must be > 0).",
    "Write the trained value; every lilicorr_* key except hidden_size must be positive.",
    doc="Fires for a lilicorr_* key in dflash_config that is <= 0 (every one except lilicorr_hidden_size, "
    "which LC105 judges), and when `int(lilicorr_hidden_size * lilicorr_mlp_ratio)` rounds down to 0, "
    "which leaves the head MLP without a width. It also reports `dflash_config.lilicorr_num_layers` when "
    "it names more layers than the files hold tensors (that count is not expanded).",
    why="Counts and widths <= 0 give shapes no loader can build. For lilicorr_logit_scale the runtimes "
    'differ: SGLang and TensorRT-LLM refuse a value <= 0 ("must be positive"), so LC103 fires for them; '
    "vLLM does not check it and scores candidates with the declared scale (LC170). lilicorr_vector_eps <= 0 "
    "is refused by SGLang and loaded by vLLM, which then normalises the candidate vectors with no floor "
    "(F.normalize divides by max(norm, eps): a zero vector becomes NaN); the message says which.",
    example='    "dflash_config": {"lilicorr_logit_scale": 0.0}\n\n'
    "or lilicorr_hidden_size 64 with lilicorr_mlp_ratio 0.01 (int(0.64) is 0).",
)
rule(
    "LC104",
    "topk-power-of-two",
    "error",
    CFG,
    "lilicorr_candidate_topk is not a power of two <= 16, which the runtime's fused top-k requires.",
    "Retrain/export with K in {1, 2, 4, 8, 16}, or serve with a runtime that accepts any K.",
    doc="Fires when lilicorr_candidate_topk (an integer >= 1) is not a power of two or is above 16, for each "
    "runtime with that limit: SGLang and vLLM. TensorRT-LLM accepts any K >= 1.",
    why='SGLang and vLLM refuse the config at load ("must be a power of two"): their fused candidate top-k '
    "holds its tiles in one Triton lane group. Every tensor can be right and the drafter is still "
    "unservable there; TensorRT-LLM serves the same checkpoint.",
    example='    "dflash_config": {"lilicorr_candidate_topk": 12}\n\n'
    "(also 32: a power of two, but above 16).",
)
rule(
    "LC105",
    "head-width",
    "error",
    CFG,
    "lilicorr_hidden_size is negative, or 0 where the runtime refuses 0.",
    "Write the head's real width (the exporter writes the width, never 0).",
    doc="Fires when lilicorr_hidden_size is negative (every runtime), or exactly 0 for the runtimes that "
    'refuse 0 (TensorRT-LLM). SGLang and vLLM read 0 as "as wide as the draft" (hidden_size).',
    why='TensorRT-LLM refuses a 0 width ("dimensions must be positive") while SGLang and vLLM resolve it to '
    "hidden_size, so the same checkpoint serves on two runtimes and is refused on the third. A negative "
    "width builds nowhere.",
    example='    "hidden_size": 2048,\n    "dflash_config": {"lilicorr_hidden_size": 0}\n\n'
    "Write 2048, the width the head really has.",
)
rule(
    "LC106",
    "heads-divide-width",
    "error",
    CFG,
    "lilicorr_num_heads does not divide the head width.",
    "Use a head count that divides lilicorr_hidden_size.",
    doc="Fires when lilicorr_num_heads does not divide the head width: lilicorr_hidden_size, or hidden_size "
    "when lilicorr_hidden_size is 0.",
    why="The head's attention splits its width into lilicorr_num_heads equal heads. Every runtime refuses a "
    'count that does not divide it ("must be divisible"), before any weight is loaded.',
    example='    "dflash_config": {"lilicorr_hidden_size": 1024, "lilicorr_num_heads": 12}',
)
rule(
    "LC107",
    "vector-eps-range",
    "error",
    CFG,
    "lilicorr_vector_eps is outside (0, 0.5), which the runtime refuses.",
    "Write the trained vector_eps; it must lie in (0, 0.5).",
    doc="Fires when lilicorr_vector_eps is a finite number >= 0.5, for the runtimes that require it inside "
    "(0, 0.5): TensorRT-LLM. Values <= 0 are LC103's, non-finite ones LC102's.",
    why='TensorRT-LLM refuses the config ("Invalid LiLiCorr normalization epsilon"); SGLang and vLLM load '
    "it. The checkpoint is unservable on one runtime for a single constant.",
    example='    "dflash_config": {"lilicorr_vector_eps": 0.5}',
)
rule(
    "LC124",
    "topk-exceeds-vocab",
    "warning",
    CFG,
    "lilicorr_candidate_topk exceeds vocab_size: MLX refuses it; the other runtimes document no check.",
    "Write the trained K; it cannot exceed the vocabulary.",
    doc="Fires when lilicorr_candidate_topk (>= 1) is larger than vocab_size.",
    why="The head takes the top K candidates of the vocabulary; there are fewer than K. MLX refuses it; "
    "SGLang, vLLM and TensorRT-LLM document no check, so what they serve is not established.",
    example='    "vocab_size": 8,\n    "dflash_config": {"lilicorr_candidate_topk": 16}',
)
rule(
    "LC170",
    "logit-scale-served",
    "warning",
    CFG,
    "lilicorr_logit_scale is <= 0 and the runtime serves it as declared (no check): candidate scores are flat (0) "
    "or inverted (< 0).",
    "Write the trained lilicorr_logit_scale (a positive number).",
    doc="Fires when dflash_config.lilicorr_logit_scale is <= 0, for the runtimes that do not check it: vLLM. "
    "The runtimes that refuse it report LC103.",
    why="vLLM stores the scale as it is (lilicorr.py `LiLiCorrHead`) and multiplies every candidate "
    "score by it, so the checkpoint loads and drafts with the function its config declares: a scale of 0 "
    "scores every candidate path alike, a negative one prefers the worst. That is rarely what was trained; "
    "SGLang and TensorRT-LLM refuse it.",
    example='    "dflash_config": {"lilicorr_logit_scale": 0.0}',
)


# ---------------------------------------------------------------- checks


def lilicorr_geometry(ctx: Context) -> None:
    g = ctx.geometry
    if not g.lilicorr_enabled or not (
        ctx.config.family in ("lilicorr", None) or routed_by_projector(ctx.config)
    ):
        return
    d = msgspec.structs.asdict(ctx.config.dflash)
    for key in LILICORR_KEYS:
        _lilicorr_key(ctx, key, d[key])
    _candidate_topk(ctx, d["lilicorr_candidate_topk"])
    n, h = g.head_num_heads, g.head_hidden_size
    if n is not None and h is not None and h % n:
        ctx.emit(
            "LC106",
            f"lilicorr_num_heads {n} does not divide the head width {h}",
            file="config.json",
            pointer="$.dflash_config.lilicorr_num_heads",
            expected=f"a divisor of {h}",
            actual=n,
        )
    if g.head_mlp_width == 0:
        ctx.emit(
            "LC103",
            f"int(lilicorr_hidden_size * lilicorr_mlp_ratio) is 0 (h={h}, ratio={g.head_mlp_ratio})",
            file="config.json",
            pointer="$.dflash_config.lilicorr_mlp_ratio",
            expected="> 0",
            actual=0,
        )
    eps = d["lilicorr_vector_eps"]
    if isinstance(eps, float) and math.isfinite(eps) and eps > 0 and eps >= 0.5:
        ctx.emit_for(
            "LC107",
            [p for p in ctx.profiles if p.vector_eps_below_half],
            f"lilicorr_vector_eps is {eps}",
            file="config.json",
            pointer="$.dflash_config.lilicorr_vector_eps",
            expected="in (0, 0.5)",
            actual=eps,
        )


def _lilicorr_key(ctx: Context, key: str, value: Any) -> None:
    """LC101 / LC102 / LC103 / LC105 / LC170: one lilicorr_* key missing, not finite or out of its range."""
    g = ctx.geometry
    path = f"$.dflash_config.{key}"
    if value is None:
        if ctx.parsed.invalid(path):
            return
        top = ctx.parsed.raw.get(key)
        where = (
            " (it is at the top level; loaders read it only from dflash_config)" if top is not None else ""
        )
        ctx.emit(
            "LC101",
            f"dflash_config.{key} is missing{where}: every loader refuses a LiLiCorr config "
            "without it (no default: a guess would load cleanly and score a different function)",
            file="config.json",
            pointer=path,
            expected="present",
            actual="absent",
            subjects=[key],
        )
        return
    if isinstance(value, float) and not math.isfinite(value):
        nan_effect = _SERVED_NAN.get(key)
        ctx.emit(
            "LC102",
            f"dflash_config.{key} is {value}"
            + (
                f": it sizes nothing and passes a `<= 0` check, so {names(ctx.profiles, 'loads|load')} it, "
                f"then {_agree(ctx.profiles, 'serve')} {nan_effect}"
                if nan_effect and math.isnan(value)
                else ""
            ),
            file="config.json",
            pointer=path,
            expected="a finite number",
            actual=value,
            subjects=[key],
        )
        return
    if key == "lilicorr_hidden_size":
        if value < 0:
            ctx.emit(
                "LC105",
                f"dflash_config.{key} is {value}",
                file="config.json",
                pointer=path,
                expected=">= 0",
                actual=value,
                subjects=[key],
            )
        elif value == 0:
            refuse = [p for p in ctx.profiles if not p.hidden_size_zero_ok]
            width = [p for p in ctx.profiles if p.hidden_size_zero_ok]
            ctx.emit_for(
                "LC105",
                refuse,
                f"dflash_config.{key} is 0, which {names(refuse, 'refuses|refuse')} it"
                + (f" ({names(width, 'reads|read')} it as the draft width {g.hidden_size})" if width else ""),
                file="config.json",
                pointer=path,
                expected=f">= 1 (the real width, {g.hidden_size})",
                actual=0,
                subjects=[key],
            )
        return
    if value <= 0 and key == "lilicorr_logit_scale":
        checked = [p for p in ctx.profiles if p.logit_scale_checked]
        served = [p for p in ctx.profiles if not p.logit_scale_checked]
        ctx.emit_for(
            "LC103",
            checked,
            f"dflash_config.{key} is {value}: {names(checked, 'refuses|refuse')} it",
            file="config.json",
            pointer=path,
            expected="> 0",
            actual=value,
            subjects=[key],
        )
        ctx.emit_for(
            "LC170",
            served,
            f"dflash_config.{key} is {value}: {names(served, 'serves|serve')} it "
            "as declared (no check), scoring every candidate path "
            + ("alike" if value == 0 else "in reverse"),
            file="config.json",
            pointer=path,
            expected="> 0",
            actual=value,
            subjects=[key],
        )
    elif value <= 0 and key == "lilicorr_vector_eps":
        checked = [p for p in ctx.profiles if p.vector_eps_checked]
        served = [p for p in ctx.profiles if not p.vector_eps_checked]
        ctx.emit_for(
            "LC103",
            checked,
            f"dflash_config.{key} is {value}: {names(checked, 'refuses|refuse')} it",
            file="config.json",
            pointer=path,
            expected="> 0",
            actual=value,
            subjects=[key],
        )
        ctx.emit_for(
            "LC103",
            served,
            f"dflash_config.{key} is {value}: {names(served, 'loads|load')} it without a check, then "
            f"{_agree(served, 'serve')} candidate vectors normalised with no floor "
            "(F.normalize divides by max(norm, eps): a zero vector becomes NaN)",
            file="config.json",
            pointer=path,
            expected="> 0",
            actual=value,
            subjects=[key],
        )
    elif value <= 0:
        ctx.emit(
            "LC103",
            f"dflash_config.{key} is {value}",
            file="config.json",
            pointer=path,
            expected="> 0",
            actual=value,
            subjects=[key],
        )


def _agree(profiles: list[RuntimeProfile], verb: str) -> str:
    return verb if len(profiles) > 1 else verb + "s"


# what a NaN in a key that sizes nothing serves once loaded
_SERVED_NAN = {
    "lilicorr_vector_eps": "NaN candidate vectors (F.normalize under a NaN eps)",
    "lilicorr_logit_scale": "NaN candidate scores",
}


def _candidate_topk(ctx: Context, k: Any) -> None:
    """LC104 / LC124: a candidate top-k the fused kernel cannot hold, or larger than the vocabulary."""
    g = ctx.geometry
    if not (isinstance(k, int) and k > 0):
        return
    bad = [
        p
        for p in ctx.profiles
        if p.topk_power_of_two_max is not None and (not is_pow2(k) or k > p.topk_power_of_two_max)
    ]
    if bad:
        ctx.emit_for(
            "LC104",
            bad,
            f"lilicorr_candidate_topk is {k}: the fused candidate top-k holds its tiles "
            "in one Triton lane group, so it must be a power of two <= 16",
            file="config.json",
            pointer="$.dflash_config.lilicorr_candidate_topk",
            expected="one of 1, 2, 4, 8, 16",
            actual=k,
        )
    if g.vocab_size is not None and k > g.vocab_size:
        # only MLX (not a --runtime profile) is known to refuse K > V
        ctx.emit(
            "LC124",
            f"lilicorr_candidate_topk {k} exceeds vocab_size {g.vocab_size}: MLX refuses it; "
            f"{names(ctx.profiles, 'documents|document')} no check (a top-K over fewer than K tokens)",
            file="config.json",
            pointer="$.dflash_config.lilicorr_candidate_topk",
            expected=f"<= {g.vocab_size}",
            actual=k,
        )
