"""The target layers the draft taps (LC113, LC114, LC142, LC145, LC148, LC173)."""

from __future__ import annotations

from collections import Counter

from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
rule(
    "LC113",
    "target-layer-ids",
    "error",
    CFG,
    "target_layer_ids is missing, empty, negative, duplicated or out of range.",
    "Write the exact target layer ids the drafter was trained on (HF convention: id i reads the output of layer i).",
    doc="Looks at `target_layer_ids` (dflash_config's, else the top-level one) and fires when it is missing, "
    "empty, holds a negative id, repeats an id, or holds an id >= num_target_layers. When the largest id "
    "equals num_target_layers the message says the ids look shifted by one.",
    why="The draft reads the hidden states of exactly these target layers, and fc.weight's input columns "
    "follow them. Without the list SGLang guesses the ids with build_target_layer_ids (wrong for 14 of 20 "
    "published checkpoints), vLLM feeds fc the target's default taps (layers 2, L/2 and L-3: "
    "interfaces.py `get_eagle3_default_aux_hidden_state_layers`), TensorRT-LLM takes fc's input width from "
    'the checkpoint. An id beyond the target is refused by SGLang ("out-of-range layer id") and fails '
    "vLLM at run time. Wrong ids that happen to be in range load cleanly and collapse acceptance; a "
    "negative id would index from the end.",
    example='    "num_target_layers": 36,\n    "dflash_config": {"target_layer_ids": [2, 10, 18, 26, '
    "36]}\n\n"
    "36 is not a layer of a 36-layer target (ids are 0..35: id i reads the output of layer i).",
)
rule(
    "LC114",
    "target-layer-ids-order",
    "warning",
    CFG,
    "target_layer_ids is not ascending.",
    "Check the order: fc's input columns follow the list order, so the order must be the trained one.",
    doc="Fires when `target_layer_ids` (with no negative or repeated ids) is not in ascending order.",
    why="No loader refuses it. fc.weight's input columns are laid out in list order, so a reordered list "
    "loads cleanly and feeds each column block another layer's hidden state. That is only right if the "
    "drafter was trained with exactly this order; an unsorted list is usually a hand edit.",
    example='    "dflash_config": {"target_layer_ids": [17, 1, 33]}',
)
rule(
    "LC142",
    "num-target-layers-range",
    "error",
    CFG,
    "num_target_layers is < 1, which the runtime refuses.",
    "Write the target's layer count.",
    doc="Fires when num_target_layers (dflash_config's or the top-level one) is < 1, for the runtimes that "
    "refuse it: SGLang.",
    why='SGLang refuses the config ("must be positive"); vLLM and TensorRT-LLM load it. A zero or negative '
    "layer count is never the target's, so every target_layer_id is then also out of range (LC113).",
    example='    "num_target_layers": 0',
)
rule(
    "LC145",
    "target-layer-ids-permuted",
    "error",
    CFG,
    "target_layer_ids is not ascending, and the runtime captures the target's layers in layer order: fc reads a "
    "permuted concatenation, a different function than the one trained.",
    "Write target_layer_ids in ascending order, with fc.weight's column blocks permuted to match (or retrain).",
    doc="Fires when `target_layer_ids` (with no negative or repeated ids) is not ascending, for the runtimes "
    "that capture the target's hidden states in layer order whatever the list order: SGLang and vLLM. "
    "The others read the list in its order (LC114, a warning).",
    why="SGLang's target models capture a layer's hidden state while their forward pass walks the "
    "layers in order (models/qwen3.py Qwen3Model.forward: `if i in self.layers_to_capture`); vLLM "
    "turns the ids into capture points with `sorted(set(...))` (interfaces.py "
    "`EagleModelMixin._set_aux_hidden_state_layers`). Either way the captures are concatenated in layer "
    "order, while fc.weight's column blocks were trained in list order: with [17, 1, 33] the block trained "
    "on layer 17 reads layer 1. The draft loads cleanly and serves another function.",
    example='    "dflash_config": {"target_layer_ids": [17, 1, 33]}',
)
rule(
    "LC148",
    "target-layer-ids-last-layer",
    "error",
    CFG,
    "A target_layer_id is the target's last layer, whose output the runtime's target model never captures: the "
    "first batch fails.",
    "Tap a layer below the last one (and retrain), or serve with a runtime whose target captures it.",
    doc="Fires when `target_layer_ids` holds num_target_layers - 1 (the target's layer count from --target "
    "when given), for the runtimes whose target model captures layer i's output as layer i+1's input: "
    "SGLang, except for the target architectures it captures after the last layer (Gemma 3 / 4, gpt-oss, "
    "Laguna, LFM2, MiniMax-M3, Nemotron-H; --target names the architecture).",
    why="SGLang's set_dflash_layers_to_capture records `id + 1` for each id, and Qwen2, Qwen3, Llama and most "
    "other targets capture inside their layer loop, which has no layer num_layers. The last layer's "
    "output is never captured, the target hands fc one feature block fewer than fc.weight expects, and "
    'project_target_hidden refuses the first batch ("target_hidden feature dim mismatch").',
    example='    "num_target_layers": 36,\n    "dflash_config": {"target_layer_ids": [1, 17, 35]}',
)
rule(
    "LC173",
    "eagle-aux-layer-ids",
    "error",
    CFG,
    "A top-level eagle_aux_hidden_state_layer_ids names other target layers than target_layer_ids, and the "
    "runtime reads it first.",
    "Remove eagle_aux_hidden_state_layer_ids, or make it target_layer_ids + 1.",
    doc="Fires when config.json has a non-empty top-level `eagle_aux_hidden_state_layer_ids` that is not "
    "dflash_config.target_layer_ids with 1 added to each id, for the runtimes that read it before the "
    "DFlash taps: vLLM.",
    why="vLLM takes the target layers fc reads from `eagle_aux_hidden_state_layer_ids` when it is set "
    "(eagle3_utils.py `get_eagle3_aux_layers_from_config`), in its capture convention (id + 1), and only "
    "otherwise from dflash_config.target_layer_ids. A stale EAGLE-3 key left in the config then replaces "
    "the trained taps: the drafter loads and reads other layers' states.",
    example='    "eagle_aux_hidden_state_layer_ids": [2, 18, 34],\n    "dflash_config": '
    '{"target_layer_ids": [1, 9, 17, 25, 33]}',
)


# ---------------------------------------------------------------- checks


def target_layer_ids(ctx: Context) -> None:
    cfg = ctx.config
    ids = cfg.dflash.target_layer_ids if cfg.dflash.target_layer_ids is not None else cfg.target_layer_ids
    path = (
        "$.dflash_config.target_layer_ids"
        if cfg.dflash.target_layer_ids is not None
        else "$.target_layer_ids"
    )
    if ids is None:
        if ctx.parsed.invalid("$.target_layer_ids") or ctx.parsed.invalid("$.dflash_config.target_layer_ids"):
            return
        fallbacks = "; ".join(f"{p.display} {p.target_layer_ids_fallback}" for p in ctx.profiles)
        ctx.emit(
            "LC113",
            f"target_layer_ids is missing ({fallbacks}); wrong taps load cleanly and collapse acceptance",
            file="config.json",
            pointer="$.dflash_config.target_layer_ids",
            expected="the trained ids",
            actual="absent",
        )
        return
    if not ids:
        ctx.emit(
            "LC113",
            "target_layer_ids is empty",
            file="config.json",
            pointer=path,
            expected="at least one id",
            actual="[]",
        )
        return
    negative = [i for i in ids if i < 0]
    if negative:
        ctx.emit(
            "LC113",
            f"target_layer_ids has negative ids {negative} (they would wrap around silently)",
            file="config.json",
            pointer=path,
            expected="ids >= 0",
            actual=ids,
        )
    dups = sorted(i for i, count in Counter(ids).items() if count > 1)
    if dups:
        ctx.emit(
            "LC113",
            f"target_layer_ids repeats {dups}",
            file="config.json",
            pointer=path,
            expected="unique ids",
            actual=ids,
        )
    n = ctx.geometry.num_target_layers
    declared = [v for v in (cfg.dflash.num_target_layers, cfg.num_target_layers) if v is not None]
    for v in declared:
        if v < 1:
            ctx.emit_for(
                "LC142",
                [p for p in ctx.profiles if p.num_target_layers_positive],
                f"num_target_layers is {v}",
                file="config.json",
                pointer="$.num_target_layers",
                expected=">= 1",
                actual=v,
            )
            break
    if n is not None:
        out = [i for i in ids if i >= n]
        if out:
            shifted = (
                " (they look shifted by +1: ids are 'output of layer i', 0-based)" if max(ids) == n else ""
            )
            ctx.emit(
                "LC113",
                f"target_layer_ids {out} are >= num_target_layers {n}{shifted}",
                file="config.json",
                pointer=path,
                expected=f"ids in 0..{n - 1}",
                actual=ids,
            )
    if not negative and not dups and list(ids) != sorted(ids):
        ordered = [p for p in ctx.profiles if p.captures_in_layer_order]
        ctx.emit_for(
            "LC145",
            ordered,
            f"target_layer_ids {ids} is not ascending: {names(ordered, 'captures|capture')} "
            f"the target's layers in layer order, so fc receives the hidden states of {sorted(ids)} "
            "concatenated and each of its column blocks reads another layer than the one trained",
            file="config.json",
            pointer=path,
            expected=sorted(ids),
            actual=ids,
        )
        ctx.emit_for(
            "LC114",
            [p for p in ctx.profiles if not p.captures_in_layer_order],
            f"target_layer_ids {ids} is not ascending",
            file="config.json",
            pointer=path,
        )
    target = ctx.target.num_layers if ctx.target is not None and ctx.target.num_layers else n
    if target is not None and not negative and target - 1 in ids:
        arch = ctx.target.architecture if ctx.target is not None else None
        blind = [
            p
            for p in ctx.profiles
            if p.final_layer_capture_architectures is not None
            and arch not in p.final_layer_capture_architectures
        ]
        ctx.emit_for(
            "LC148",
            blind,
            f"target_layer_ids includes {target - 1}, the target's last layer: "
            f"{names(blind, 'captures|capture')} the hidden state of layer i as the input of layer i+1, "
            f"which the last layer has none of, so {'a ' + arch if arch else 'a Qwen2/Qwen3/Llama'} target "
            f'hands fc {len(ids) - 1} of its {len(ids)} features and the first batch fails ("target_hidden '
            'feature dim mismatch")',
            file="config.json",
            pointer=path,
            actual=ids,
            expected=f"ids below {target - 1}, or a target that captures its last layer's output",
        )
    _eagle_aux_layer_ids(ctx, ids)


def _eagle_aux_layer_ids(ctx: Context, ids: list[int]) -> None:
    """A top-level eagle_aux_hidden_state_layer_ids replacing the DFlash taps where the runtime reads it first."""
    aux = ctx.config.eagle_aux_hidden_state_layer_ids
    if not aux or ctx.config.dflash.target_layer_ids is None:
        return
    trained = [i + 1 for i in ctx.config.dflash.target_layer_ids]
    if list(aux) != trained:
        readers = [p for p in ctx.profiles if p.reads_eagle_aux_layer_ids]
        ctx.emit_for(
            "LC173",
            readers,
            f"eagle_aux_hidden_state_layer_ids {list(aux)} is not target_layer_ids + 1 "
            f"({trained}): {names(readers, 'reads|read')} it first, so fc reads the target layers it "
            "names instead of the trained ones",
            file="config.json",
            pointer="$.eagle_aux_hidden_state_layer_ids",
            expected=trained,
            actual=list(aux),
        )
