"""`convert --to zlab|speculators`: a drafter's config.json in the z-lab layout or in the speculators layout.

The z-lab layout (a transformers config with `dflash_config`, as z-lab, SGLang and ModelOpt write it) is convert's
own: every phase of the plan works on it. A speculators source (checkpoint/speculators.py) is read as the z-lab
config it stands for before planning (`zlab_from_speculators`), and a speculators output is written from the planned
z-lab config at the end (`speculators_from_zlab`). The tensors are the same in both layouts: only config.json
changes.

What the speculators layout can express is decided by what vLLM's translation of it serves
(configs/speculators/algos.py, modelled by `checkpoint.speculators.translate`): the output is read back through that
translation, and it must be the drafter the z-lab config describes (the same geometry, head, taps, block, anchor
layout and per-layer attention mask), which speculators' own classes must read as trained the same way. A drafter
it cannot express is refused, naming what would be lost.

The z-lab config travels whole in `transformer_layer_config` (less `architectures`, `auto_map` and
`quantization_config`, which the layout states at its top level): vLLM takes the nested config as the base of the
config it serves, so every key it reads there is served as the z-lab config states it, and `--to zlab` gives the
same config back. speculators' keys (`aux_hidden_state_layer_ids`, `mask_token_id`, the proposal's
`speculative_tokens`, `sliding_window_non_causal`, ...) are derived from the z-lab reading, and win when the two
disagree (an edited speculators config).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from lilicorr_ckpt.checkpoint.config import DraftConfig, ParsedConfig, parse_config
from lilicorr_ckpt.checkpoint.geometry import Geometry, resolve_geometry
from lilicorr_ckpt.checkpoint.speculators import (
    DFLASH2_KEYS,
    FORMAT_VERSION,
    KINDS,
    SpeculatorsOrigin,
    is_speculators,
    kind_of,
    translate,
)
from lilicorr_ckpt.errors import ConversionRefused

ZLAB, SPECULATORS = "zlab", "speculators"
LAYOUTS = (ZLAB, SPECULATORS)
DISPLAY = {ZLAB: "z-lab", SPECULATORS: "speculators"}
# the top-level keys the speculators layout states itself (the rest of the z-lab config is nested)
NOT_NESTED = ("architectures", "auto_map", "quantization_config")
# top-level keys DSpark's translation adds that a z-lab config may state in dflash_config alone
DUPLICATES = ("mask_token_id", "target_layer_ids", "block_size")
WHY_NOT = {
    "lilicorr": "the LiLiCorr head (the lilicorr.* tensors and dflash_config.lilicorr_*): vLLM's translation declares "
    "DFlashDraftModel or DFlash2DraftModel and rebuilds dflash_config from mask_token_id, target_layer_ids, "
    "sample_from_anchor, causal (and DFlash2's convolution and selector keys), so no speculators config is served "
    "with the head",
    "domino": "the Domino head (prefix GRU and embed_proj, dflash_config.projector_type domino): vLLM's translation "
    "rebuilds dflash_config without projector_type, gru_hidden_dim or emb_dim",
}
# the draft layers whose attention mask is compared (one list entry each): a config stating more (10**9) is refused
# by the planning, which counts the tensors; the mask is never built that long
MASK_LAYERS = 4096


def layout_of(raw: dict[str, Any]) -> str:
    """The layout a config.json is written in (speculators: a kind vLLM's translation reads)."""
    return SPECULATORS if is_speculators(raw) and kind_of(raw) in KINDS else ZLAB


def _parse(doc: dict[str, Any]) -> ParsedConfig:
    return parse_config(json.dumps(doc, allow_nan=True).encode())


def served_causal(cfg: DraftConfig, layers: int) -> list[bool]:
    """Whether vLLM serves each draft layer causally (qwen3_dflash.py `_dflash_layer_causal`: a top-level is_causal,
    then dflash_config.causal, then sliding layers causal and full-attention layers bidirectional)."""
    types = list(cfg.layer_types or [])
    out = []
    for i in range(layers):
        if cfg.is_causal is not None:
            out.append(bool(cfg.is_causal))
        elif cfg.dflash.causal is not None:
            out.append(bool(cfg.dflash.causal))
        else:
            out.append(i < len(types) and types[i] == "sliding_attention")
    return out


def trained_causal(origin: SpeculatorsOrigin, layers: int) -> list[bool]:
    """Whether speculators trains each draft layer causally (models/dflash/attention.py)."""
    return [origin.trained_causal(i) for i in range(layers)]


def _mask_text(causal: list[bool]) -> str:
    return "[" + ", ".join("causal" if c else "bidirectional" for c in causal) + "]"


def served_anchor_first(cfg: DraftConfig, family: str | None) -> bool:
    """Whether the anchor is the first drafted token as vLLM serves the z-lab config: DSpark reads the top-level
    sample_from_anchor (spec_decode/dspark/speculator.py, anchor-first when absent); DFlash drafts fill-in."""
    if family == "dspark":
        return True if cfg.sample_from_anchor is None else bool(cfg.sample_from_anchor)
    return bool(cfg.dflash.sample_from_anchor)


def _geometry_differences(a: Geometry, b: Geometry) -> list[str]:
    out = []
    for field in a.__struct_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if x != y:
            out.append(f"{field} {json.dumps(_plain(x))} would be served as {json.dumps(_plain(y))}")
    return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# ---------------------------------------------------------------- z-lab -> speculators


def speculators_from_zlab(zlab: dict[str, Any], *, verifier: str | None = None) -> dict[str, Any]:
    """The speculators config.json for a z-lab config (the planned output's). Refused when the layout cannot
    express the drafter, naming what would be lost."""
    parsed = _parse(zlab)
    cfg = parsed.config
    g = resolve_geometry(cfg)
    family = g.family
    if family in WHY_NOT:
        raise ConversionRefused(
            f"the speculators layout cannot express this {family} drafter", [f"lost: {WHY_NOT[family]}"]
        )
    if family not in KINDS:
        raise ConversionRefused(
            "the speculators layout cannot express this drafter",
            [
                f"architectures {cfg.architectures!r} is not a DFlash, DFlash2 or DSpark drafter (the kinds vLLM's "
                "speculators translation reads)"
            ],
        )
    arch = cfg.architecture
    if arch != KINDS[family] and not (
        family == "dspark" and arch in ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")
    ):
        raise ConversionRefused(
            "the speculators layout cannot express this drafter",
            [
                f"lost: architectures [{arch}]: vLLM's translation of a {family} speculators config declares {KINDS[family]}"
            ],
        )
    reasons = []
    layers = None if g.num_layers is None else min(g.num_layers, MASK_LAYERS)
    if g.block_size is None or not g.block_size_declared:
        reasons.append("block_size is not stated (the proposal's speculative_tokens is derived from it)")
    if g.target_layer_ids is None:
        reasons.append("target_layer_ids is not stated (aux_hidden_state_layer_ids is derived from it)")
    if g.mask_token_id is None:
        reasons.append("mask_token_id is not stated (vLLM's translation requires it)")
    if layers is None:
        reasons.append("num_hidden_layers is not stated")
    if reasons:
        raise ConversionRefused("the z-lab config lacks what the speculators layout states", reasons)
    assert layers is not None and g.block_size is not None and g.target_layer_ids is not None
    anchor_first = served_anchor_first(cfg, family)
    if anchor_first and family != "dspark":
        raise ConversionRefused(
            "the speculators layout cannot express this drafter",
            [
                "lost: dflash_config.sample_from_anchor true: vLLM's DFlash translation serves the fill-in layout only "
                "(its block is speculative_tokens + 1)"
            ],
        )
    mask = served_causal(cfg, layers)
    sliding = [t == "sliding_attention" for t in _layer_types(cfg, layers)]
    # speculators trains full-attention layers bidirectionally, and sliding layers causally unless
    # sliding_window_non_causal; vLLM's DFlash / DFlash2 translation serves every layer with causal = not that key
    if any(c and not s for c, s in zip(mask, sliding, strict=True)):
        raise ConversionRefused(
            "the speculators layout cannot express this drafter's attention mask",
            [
                f"lost: the causal full-attention layers of {_mask_text(mask)}: speculators trains every "
                "full-attention layer bidirectionally"
            ],
        )
    sliding_masks = {c for c, s in zip(mask, sliding, strict=True) if s}
    if len(sliding_masks) > 1:
        raise ConversionRefused(
            "the speculators layout cannot express this drafter's attention mask",
            [
                f"lost: sliding layers of both kinds in {_mask_text(mask)}: sliding_window_non_causal sets one for all"
            ],
        )
    non_causal = sliding_masks != {True}  # every sliding layer bidirectional (or none is sliding)
    taps = list(g.target_layer_ids)
    _refuse_last_layer_tap(taps, g.num_target_layers)
    tokens = g.block_size if anchor_first else g.block_size - 1
    nested = {k: copy.deepcopy(v) for k, v in zlab.items() if k not in NOT_NESTED}
    out: dict[str, Any] = {"architectures": [arch]}
    if "quantization_config" in zlab:
        out["quantization_config"] = copy.deepcopy(zlab["quantization_config"])
    out["aux_hidden_state_layer_ids"] = [t + 1 for t in taps]
    out["block_size"] = g.block_size
    out["draft_vocab_size"] = g.draft_vocab_size if g.draft_vocab_size is not None else g.vocab_size
    dtype = cfg.model_dtype
    if dtype is not None:
        out["dtype"] = dtype
    out["mask_token_id"] = g.mask_token_id
    out["sample_from_anchor"] = anchor_first
    out["sliding_window_non_causal"] = non_causal
    if family == "dflash2":
        values = {
            "conv_kernel_size": g.conv_kernel_size or None,
            "conv_group_size": g.conv_group_size if g.conv_kernel_size else None,
            "selector_rank": g.selector_rank,
            "selector_top_k": g.selector_top_k,
        }
        for key in DFLASH2_KEYS:
            if values[key] is not None:
                out[key] = values[key]
    if family == "dspark":
        out["markov_rank"] = g.markov_rank
        out["markov_head_type"] = g.markov_head_type
        out["enable_confidence_head"] = g.confidence_head
        out["confidence_head_with_markov"] = g.confidence_with_markov
        if cfg.use_aux_hidden_state is not None:
            out["use_aux_hidden_state"] = cfg.use_aux_hidden_state
    out["speculators_config"] = {
        "algorithm": family,
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {
                "accept_tolerance": 0.0,
                "proposal_type": "greedy",
                "speculative_tokens": tokens,
                "verifier_accept_k": 1,
            }
        ],
        "verifier": {"architectures": [], "name_or_path": verifier},
    }
    out["speculators_model_type"] = family
    out["speculators_version"] = FORMAT_VERSION
    out["target_hidden_size"] = cfg.target_hidden_size
    out["tie_word_embeddings"] = bool(cfg.tie_word_embeddings)
    out["transformer_layer_config"] = nested
    _check_same_drafter(zlab, out)
    return out


def _refuse_last_layer_tap(taps: list[int], num_target_layers: int | None) -> None:
    """A tap on the verifier's last layer has no place in the speculators layout: speculators captures that layer
    for every drafter and splits it off as the training target (`verifier_last_hidden_states`, train/data.py), never
    a feature, and its own z-lab converter drops such a tap without a word (convert/dflash/converter.py), leaving fc
    a feature block short. Refused, naming the tap, rather than written or dropped. Known only where the config
    states the verifier's layer count (num_target_layers, as ModelOpt writes it)."""
    if num_target_layers is None or num_target_layers < 1 or num_target_layers - 1 not in taps:
        return
    last = num_target_layers - 1
    raise ConversionRefused(
        "the speculators layout cannot carry a tap on the verifier's last layer",
        [
            f"lost: target_layer_ids {json.dumps(taps)} taps layer {last}, the last of the verifier's "
            f"{num_target_layers} (num_target_layers), which would be aux_hidden_state_layer_ids {last + 1}: "
            "speculators' data pipeline splits the verifier's last layer off the captured states as its training "
            "target (verifier_last_hidden_states), not a feature, and its own z-lab converter drops such a tap "
            "silently, leaving fc a feature block short",
            "fix: keep the z-lab layout (--to zlab), which vLLM reads as well, or retrain with taps below layer "
            f"{last}",
        ],
    )


def _layer_types(cfg: DraftConfig, layers: int) -> list[str]:
    types = list(cfg.layer_types or [])
    return [types[i] if i < len(types) else "full_attention" for i in range(layers)]


def _check_same_drafter(zlab: dict[str, Any], spec: dict[str, Any]) -> None:
    """The speculators config, read as vLLM translates it and as speculators trains it, is the z-lab drafter."""
    z, s = _parse(zlab), _parse(spec)
    assert s.speculators is not None
    gz, gs = resolve_geometry(z.config), resolve_geometry(s.config)
    reasons = _geometry_differences(gz, gs)
    layers = min(gz.num_layers or 0, MASK_LAYERS)
    want = served_causal(z.config, layers)
    served, trained = served_causal(s.config, layers), trained_causal(s.speculators, layers)
    if served != want:
        reasons.append(f"the attention mask {_mask_text(want)} would be served as {_mask_text(served)}")
    if trained != want:
        reasons.append(
            f"speculators would read the attention mask {_mask_text(want)} as {_mask_text(trained)}"
        )
    anchor = served_anchor_first(z.config, gz.family)
    if (
        served_anchor_first(s.config, gs.family) != anchor
        or s.speculators.trained_sample_from_anchor != anchor
    ):
        reasons.append(f"the anchor layout (sample_from_anchor {json.dumps(anchor)}) would change")
    if s.speculators.unread:
        reasons += list(s.speculators.unread)
    if reasons:
        raise ConversionRefused("the speculators layout cannot express this drafter", reasons)


# ---------------------------------------------------------------- speculators -> z-lab


def zlab_from_speculators(raw: dict[str, Any]) -> dict[str, Any]:
    """The z-lab config a speculators config.json stands for: vLLM's translation of it, with the attention mask
    speculators trained (not the one vLLM's translation serves: `sliding_window_non_causal` false becomes a causal
    mask for every layer there), and without the keys the translation adds that change nothing a z-lab reader
    reads. Refused when vLLM's translation cannot read it."""
    translation = translate(raw)
    origin = translation.origin
    if origin.unread:
        raise ConversionRefused("vLLM's translation cannot read this speculators config", list(origin.unread))
    nested = raw.get("transformer_layer_config")
    nested = nested if isinstance(nested, dict) else {}
    out: dict[str, Any] = copy.deepcopy(translation.config)
    kind = origin.kind
    stash = nested.get("dflash_config")
    stash = stash if isinstance(stash, dict) else {}
    if kind in ("dflash", "dflash2"):
        rebuilt = out["dflash_config"]
        merged = {**copy.deepcopy(stash), **rebuilt}
        if "sample_from_anchor" not in stash and rebuilt.get("sample_from_anchor") is False:
            del merged["sample_from_anchor"]  # the z-lab reading of an absent key
        if "causal" in stash:
            merged["causal"] = stash["causal"]
        out["dflash_config"] = merged
    layers = min(resolve_geometry(_parse(out).config).num_layers or 0, MASK_LAYERS)
    want = trained_causal(origin, layers)
    if served_causal(_parse(out).config, layers) != want:
        _write_mask(out, want, layers)
    _drop_added(out, nested, "causal" in stash, layers)
    if "dtype" not in nested and ("torch_dtype" in nested or "dtype" not in raw):
        out.pop("dtype", None)
    return out


def _drop_added(out: dict[str, Any], nested: dict[str, Any], stated_causal: bool, layers: int) -> None:
    """The keys the translation adds that change nothing SGLang or vLLM read from a z-lab config (vLLM's
    bookkeeping, defaults, copies of dflash_config's values), unless the nested config states them."""
    found = out.get("dflash_config")
    d: dict[str, Any] = found if isinstance(found, dict) else {}
    cfg = _parse(out).config
    taps = cfg.target_layer_ids if cfg.target_layer_ids is not None else cfg.dflash.target_layer_ids
    redundant = {
        "eagle_aux_hidden_state_layer_ids": taps is not None
        and out.get("eagle_aux_hidden_state_layer_ids") == [t + 1 for t in taps],
        "dspark_bonus_anchor": out.get("dspark_bonus_anchor") is (not out.get("sample_from_anchor", True)),
        "sample_from_anchor": out.get("sample_from_anchor") is True,  # DSpark's default in both engines
        "draft_vocab_size": out.get("draft_vocab_size") in (None, out.get("vocab_size")),
        "target_hidden_size": out.get("target_hidden_size") is None,
        **{key: key in d and d[key] == out.get(key) for key in DUPLICATES},
    }
    for key, drop in redundant.items():
        if drop and key in out and key not in nested:
            del out[key]
    if d and "causal" in d and not stated_causal:
        want = served_causal(_parse(out).config, layers)
        trial = {k: v for k, v in d.items() if k != "causal"}
        if served_causal(_parse({**out, "dflash_config": trial}).config, layers) == want:
            out["dflash_config"] = trial


def _write_mask(out: dict[str, Any], want: list[bool], layers: int) -> None:
    """State the trained mask the way both engines read it: no global causal where the layer types say it (sliding
    layers causal, full-attention layers bidirectional), `causal: false` where every layer is bidirectional."""
    out.pop("is_causal", None)
    d = out.setdefault("dflash_config", {})
    d.pop("causal", None)
    if served_causal(_parse(out).config, layers) != want:
        d["causal"] = all(want) if len(set(want)) == 1 else False
    if (
        served_causal(_parse(out).config, layers) != want
    ):  # pragma: no cover - every trained mask is expressible
        raise ConversionRefused(
            "the z-lab layout cannot express the attention mask this drafter was trained with",
            [_mask_text(want)],
        )
