"""Config rules (LC0xx: schema and architecture; LC1xx: geometry keys): catalogue rows and checks."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import LILICORR_KEYS
from lilicorr_ckpt.checkpoint.geometry import head_declared, routed_by_projector
from lilicorr_ckpt.checkpoint.manifest import DSPARK_FLAT_NAMES, SIBLING_HEAD_PREFIXES
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check, is_pow2, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.runtimes import RuntimeProfile

# ---------------------------------------------------------------- catalogue
CFG = "config"
rule("LC001", "config-field-type", "error", CFG, "A config.json field has the wrong JSON type.",
     "Write the value with the type the loaders cast to (integers for sizes and ids, numbers for eps/scale).",
     doc="Parses config.json into the typed draft config and fires once for every field whose JSON type is not "
         "the one the loaders read: a string where an integer is expected (`\"block_size\": \"16\"`), a number "
         "where a list is (`target_layer_ids`), a string where a bool is (`attention_sink_bias`), an integer "
         "beyond the int64 range. A whole-number float such as `4.0` is not a type error here (it is read as "
         "4; LC139-LC141 say what each runtime does with it). The field is then treated as absent, so the "
         "other checks still run, and the rules that need it stay silent about it.",
     why="The loaders read these keys with plain casts and type checks. SGLang's DFlash config parser refuses "
         "a `target_layer_ids` that is not a list of integers and an `attention_sink_bias` that is not a bool; "
         "vLLM uses `attention_sink_bias` as a flag, so a string such as \"false\" counts as true there. "
         "Elsewhere a string reaches arithmetic and the load stops with an untyped error far from the key that "
         "caused it.",
     example="    \"dflash_config\": {\"block_size\": \"16\", \"target_layer_ids\": 1}\n\n"
             "reports `$.dflash_config.block_size: expected an integer, found \"16\" (string)` and the same "
             "for `target_layer_ids` (expected an array).")
rule("LC002", "config-duplicate-key", "warning", CFG, "config.json repeats a key; readers keep only the last one.",
     "Remove the duplicate so every reader sees the same value.",
     doc="Fires for every key written twice in the same JSON object of config.json, at any depth (two "
         "`vocab_size` entries at the top level, two `block_size` entries inside dflash_config). The checks "
         "use the last value, as Python's json module does.",
     why="JSON leaves duplicate keys undefined. Python's json module keeps the last value without a word; "
         "other parsers, editors and the person reviewing the file may see the first. The checkpoint then has "
         "two geometries, and which one a reader gets depends on its parser, with no error anywhere.",
     example="    {\"vocab_size\": 151936, \"hidden_size\": 2048, \"vocab_size\": 151669}")
rule("LC003", "config-unknown-key", "info", CFG, "A key no loader reads (kept, not an error).",
     "Nothing to do unless it is a misspelling of a key the loaders read.",
     doc="Fires for a config.json key that no field of the draft config reads, at the top level or inside "
         "dflash_config, when its name contains `lilicorr`, `conv`, `block`, `target` or `mask`: the words of "
         "the keys the loaders do read, so the key is probably a misspelling of one. Other unknown keys "
         "(training metadata, transformers' own fields) are passed over.",
     why="No loader refuses an unknown key: it is ignored, and the key it was meant to be is absent. The "
         "loader then falls back where it has a fallback (SGLang assumes a block size of 16, resolves the mask "
         "token through the tokenizer, guesses the target layers) or refuses with a message about the missing "
         "key rather than the misspelt one.",
     example="    \"dflash_config\": {\"lilicorr_topk\": 8}\n\n"
             "where `lilicorr_candidate_topk` was meant (LC101 then reports the real key as missing).")
rule("LC010", "architecture", "error", CFG, "`architectures` is missing or names no DFlash-family drafter.",
     'Set "architectures": ["LiLiCorrDraftModel"] (or DFlashDraftModel for a head-free draft).',
     doc="Fires when `architectures` is absent or empty, or when `architectures[0]` is not a drafter class of "
         "the DFlash family (LiLiCorrDraftModel, DFlashDraftModel, DFlash2DraftModel, DSparkDraftModel, "
         "DominoDraftModel, Qwen3DSparkModel). For `Qwen3ForCausalLM` with `dflash_config.projector_type: "
         "\"lilicorr\"` or `lilicorr_enabled: true` it fires only for the runtimes that do not route that pair "
         "to LiLiCorr (SGLang and vLLM). An `architectures` of the wrong JSON type is LC001's.",
     why="Every runtime picks the draft model class from `architectures[0]`. With no name, or a name outside "
         "its registry of drafters, there is nothing to build and the load is refused before a weight is read. "
         "TensorRT-LLM routes `Qwen3ForCausalLM` with a LiLiCorr projector marker to its LiLiCorr model; "
         "SGLang and vLLM see a plain model class, not a drafter, and refuse it.",
     example="    \"architectures\": [\"Qwen3ForCausalLM\"]\n\n"
             "with no `projector_type` in dflash_config: refused by every runtime. With `\"projector_type\": "
             "\"lilicorr\"` only SGLang and vLLM refuse it.")
rule("LC011", "architecture-head-mismatch", "error", CFG,
     "The declared architecture and the head it carries disagree.",
     "Declare LiLiCorrDraftModel for a checkpoint with lilicorr.* tensors, DFlashDraftModel for one without.",
     doc="Fires when the architecture and the `lilicorr.*` tensors disagree: head tensors under an "
         "architecture that builds no LiLiCorr head (DFlashDraftModel, a sibling-head class); "
         "LiLiCorrDraftModel declared while the checkpoint has tensors but none under `lilicorr.`. For "
         "DFlashDraftModel with `projector_type: \"lilicorr\"` or `lilicorr_enabled: true` it is judged per "
         "runtime: with head tensors it fires for SGLang and vLLM, which ignore the marker; without them (but "
         "with lilicorr_* geometry) for TensorRT-LLM, which follows the marker and expects a head.",
     why="The architecture decides which modules exist. Head tensors under DFlashDraftModel load into nothing: "
         "SGLang drops them and serves the plain DFlash draft, a different function than the one trained, "
         "without an error; vLLM has no parameter for them and refuses. TensorRT-LLM loads them only when a "
         "projector marker routes the class to LiLiCorr. A LiLiCorrDraftModel without head tensors fails every "
         "loader's head coverage check.",
     example="    \"architectures\": [\"DFlashDraftModel\"]\n\n"
             "with `lilicorr.out_head.weight`, `lilicorr.in_head.weight`, ... in model.safetensors.")
rule("LC014", "sibling-route", "error", CFG,
     "A DFlash2, DSpark or Domino head declared under an architecture the runtime does not load as that head (it "
     "routes it elsewhere, or loads it as plain DFlash and drops the head).",
     "Declare the architecture each runtime loads: Qwen3DSparkModel for a Qwen3 DSpark, DFlashDraftModel with "
     "projector_type \"domino\" for Domino, DFlash2DraftModel for DFlash2 (`lilicorr-ckpt convert` writes them).",
     doc="For a DFlash2, DSpark or Domino head (the family comes from `architectures[0]`, or from "
         "DFlashDraftModel's `dflash_config.projector_type` \"dflash2\" / \"dspark\" / \"domino\"), looks up "
         "how each selected runtime routes that family under that architecture, and fires once per runtime "
         "that refuses the pair or routes it to another model. A pair that no route lists counts as refused.",
     why="The runtimes register each sibling head under one class name. Under another name the checkpoint is "
         "refused, or, worse, loads as something else: SGLang routes a DSpark head declared as "
         "DFlashDraftModel as plain DFlash and drops Model-Optimizer's flat Markov names, serving the Markov "
         "head at its initialisation; SGLang loads Domino only as DFlashDraftModel with projector_type "
         "\"domino\"; vLLM 0.33.0 has no Domino model at all (its DFlash model has no parameter for the "
         "prefix GRU).",
     example="    \"architectures\": [\"DFlashDraftModel\"],\n    \"dflash_config\": {\"projector_type\": "
             "\"dspark\", ...}\n\n"
             "with Model-Optimizer's flat Markov names: no serving loader reads them. `lilicorr-ckpt convert` "
             "writes `Qwen3DSparkModel` with the Markov head nested, which SGLang and vLLM both load.")
rule("LC015", "sibling-unconfirmed", "warning", CFG,
     "A DFlash2, DSpark or Domino head whose loading by this runtime is UNCONFIRMED (the loader was not read, or "
     "only patch scripts show it).", "Test the runtime yourself before publishing for it.",
     doc="The same lookup as LC014; fires once per runtime whose route for the head's family and architecture "
         "is recorded as unconfirmed: the loader was not read, or only registry-verification or patch scripts "
         "show it.",
     why="Whether the checkpoint loads with its head, loads without it, or is refused was not established from "
         "that runtime's code. Examples: every sibling head in TensorRT-LLM (its paths were not read).",
     example="    \"architectures\": [\"DFlash2DraftModel\"],\n    \"dflash_config\": {\"projector_type\": "
             "\"dflash2\", \"selector_rank\": 64, \"selector_top_k\": 32, ...}\n\n"
             "gives one LC015 warning for vLLM and one for TensorRT-LLM.")
rule("LC016", "sibling-head-undeclared", "error", CFG,
     "Sibling head tensors (candidate_selector.*, markov_head.*, prefix_gru.*, ...) under an architecture that "
     "builds no such head: every loader drops or refuses them.",
     "Declare the sibling architecture (or projector_type) the tensors belong to, or remove them.",
     doc="Fires when tensors of a sibling head are present but the config declares no head of that family: "
         "`candidate_selector.*` (DFlash2), `markov_head.*`, `confidence_head.*` or Model-Optimizer's flat "
         "DSpark names (`markov_w1.weight`, `gate_proj.weight`, `confidence_proj.weight`, ...) (DSpark), "
         "`prefix_gru.*` and `embed_proj.*` (Domino), under LiLiCorrDraftModel, plain DFlashDraftModel or "
         "another sibling's architecture.",
     why="A loader builds the head the architecture (and projector_type) declares, and has no parameter for "
         "another head's tensors: loaders that skip unknown names serve the draft without the head, strict "
         "ones refuse the checkpoint. Either way the trained head is not served.",
     example="    \"architectures\": [\"DFlashDraftModel\"]\n\n"
             "(no projector_type) with `markov_head.markov_w1.weight` [V, r] and "
             "`markov_head.markov_w2.weight` [V, r] in the files: a DSpark head nobody builds.")
rule("LC013", "head-geometry-unused", "warning", CFG,
     "DFlashDraftModel is declared with lilicorr_* geometry: the loaders that select the class from architectures "
     "never build the head.", "Declare LiLiCorrDraftModel, or drop the lilicorr_* keys for a head-free draft.",
     doc="Fires for DFlashDraftModel whose dflash_config carries LiLiCorr geometry (any `lilicorr_*` key, or "
         "`projector_type: \"lilicorr\"`) while the checkpoint has no `lilicorr.*` tensor. With a projector "
         "marker (`projector_type: \"lilicorr\"` or `lilicorr_enabled: true`) it fires only for SGLang and "
         "vLLM: TensorRT-LLM then expects a head, which LC011 reports.",
     why="SGLang and vLLM select the class from `architectures` and build a plain DFlash draft: the lilicorr_* "
         "keys are never read. That loads and serves, but the config says a head was trained: either it was "
         "lost in export, or the keys were copied from another drafter. Either way the served draft is not the "
         "one the config describes.",
     example="    \"architectures\": [\"DFlashDraftModel\"],\n    \"dflash_config\": {\"block_size\": 16, "
             "\"lilicorr_candidate_topk\": 8, \"lilicorr_hidden_size\": 1024}\n\n"
             "and no `lilicorr.*` tensor in the files.")
rule("LC101", "lilicorr-key-missing", "error", CFG, "A required lilicorr_* geometry key is missing from dflash_config.",
     "Add every lilicorr_* key to dflash_config with the values the head was trained with.",
     doc="For a declared LiLiCorr head (LiLiCorrDraftModel, or DFlashDraftModel with `projector_type: "
         "\"lilicorr\"` / `lilicorr_enabled: true`, not disabled), fires once for each of the eight geometry "
         "keys missing from dflash_config: lilicorr_candidate_topk, lilicorr_hidden_size, lilicorr_num_layers, "
         "lilicorr_num_heads, lilicorr_mlp_ratio, lilicorr_factor_dim, lilicorr_vector_eps, "
         "lilicorr_logit_scale. A copy at the top level of config.json does not count (the message says when "
         "one is there).",
     why="The head's shapes and its scoring come from these values, and no loader has defaults for them: "
         "SGLang refuses (\"is required\"), TensorRT-LLM refuses (\"missing config fields\"), vLLM fails with "
         "a KeyError (a later revision says \"Missing dflash_config.X\"). A guessed value could load tensors "
         "of matching shape and score a different function, which is why nobody guesses.",
     example="    \"dflash_config\": {\"lilicorr_candidate_topk\": 8, \"lilicorr_hidden_size\": 1024, "
             "\"lilicorr_num_layers\": 2,\n                      \"lilicorr_num_heads\": 8, "
             "\"lilicorr_mlp_ratio\": 2.0, \"lilicorr_factor_dim\": 64,\n                      "
             "\"lilicorr_vector_eps\": 1e-6}\n\n"
             "lacks lilicorr_logit_scale; writing it at the top level of config.json instead does not help.")
rule("LC102", "lilicorr-key-not-finite", "error", CFG, "A lilicorr_* value is NaN or infinite.",
     "Write the finite value the head was trained with.",
     doc="Fires for a lilicorr_* key in dflash_config whose value is NaN or infinite (config.json may hold the "
         "non-standard tokens `NaN` and `Infinity`, which Python's json module accepts).",
     why="These values set the head's normalisation epsilon, its logit scale and its geometry. A NaN passes "
         "comparisons such as `value <= 0` unnoticed, so a positivity check does not stop it, and it then "
         "spreads through every candidate score: the draft serves, and proposes nothing useful. An infinite "
         "size cannot build at all.",
     example="    \"dflash_config\": {\"lilicorr_logit_scale\": NaN}")
rule("LC103", "lilicorr-value-range", "error", CFG, "A lilicorr_* value is out of its range (must be > 0).",
     "Write the trained value; every lilicorr_* key except hidden_size must be positive.",
     doc="Fires for a lilicorr_* key in dflash_config that is <= 0 (every one except lilicorr_hidden_size, "
         "which LC105 judges), and when `int(lilicorr_hidden_size * lilicorr_mlp_ratio)` rounds down to 0, "
         "which leaves the head MLP without a width. It also reports `dflash_config.lilicorr_num_layers` when "
         "it names more layers than the files hold tensors (that count is not expanded).",
     why="Counts and widths <= 0 give shapes no loader can build. For lilicorr_logit_scale the runtimes "
         "differ: SGLang and TensorRT-LLM refuse a value <= 0 (\"must be positive\"), so LC103 fires for them; "
         "vLLM does not check it and scores candidates with the declared scale (LC170).",
     example="    \"dflash_config\": {\"lilicorr_logit_scale\": 0.0}\n\n"
             "or lilicorr_hidden_size 64 with lilicorr_mlp_ratio 0.01 (int(0.64) is 0).")
rule("LC104", "topk-power-of-two", "error", CFG,
     "lilicorr_candidate_topk is not a power of two <= 16, which the runtime's fused top-k requires.",
     "Retrain/export with K in {1, 2, 4, 8, 16}, or serve with a runtime that accepts any K.",
     doc="Fires when lilicorr_candidate_topk (an integer >= 1) is not a power of two or is above 16, for each "
         "runtime with that limit: SGLang and vLLM. TensorRT-LLM accepts any K >= 1.",
     why="SGLang and vLLM refuse the config at load (\"must be a power of two\"): their fused candidate top-k "
         "holds its tiles in one Triton lane group. Every tensor can be right and the drafter is still "
         "unservable there; TensorRT-LLM serves the same checkpoint.",
     example="    \"dflash_config\": {\"lilicorr_candidate_topk\": 12}\n\n"
             "(also 32: a power of two, but above 16).")
rule("LC105", "head-width", "error", CFG, "lilicorr_hidden_size is negative, or 0 where the runtime refuses 0.",
     "Write the head's real width (the exporter writes the width, never 0).",
     doc="Fires when lilicorr_hidden_size is negative (every runtime), or exactly 0 for the runtimes that "
         "refuse 0 (TensorRT-LLM). SGLang and vLLM read 0 as \"as wide as the draft\" (hidden_size).",
     why="TensorRT-LLM refuses a 0 width (\"dimensions must be positive\") while SGLang and vLLM resolve it to "
         "hidden_size, so the same checkpoint serves on two runtimes and is refused on the third. A negative "
         "width builds nowhere.",
     example="    \"hidden_size\": 2048,\n    \"dflash_config\": {\"lilicorr_hidden_size\": 0}\n\n"
             "Write 2048, the width the head really has.")
rule("LC106", "heads-divide-width", "error", CFG, "lilicorr_num_heads does not divide the head width.",
     "Use a head count that divides lilicorr_hidden_size.",
     doc="Fires when lilicorr_num_heads does not divide the head width: lilicorr_hidden_size, or hidden_size "
         "when lilicorr_hidden_size is 0.",
     why="The head's attention splits its width into lilicorr_num_heads equal heads. Every runtime refuses a "
         "count that does not divide it (\"must be divisible\"), before any weight is loaded.",
     example="    \"dflash_config\": {\"lilicorr_hidden_size\": 1024, \"lilicorr_num_heads\": 12}")
rule("LC107", "vector-eps-range", "error", CFG, "lilicorr_vector_eps is outside (0, 0.5), which the runtime refuses.",
     "Write the trained vector_eps; it must lie in (0, 0.5).",
     doc="Fires when lilicorr_vector_eps is a finite number >= 0.5, for the runtimes that require it inside "
         "(0, 0.5): TensorRT-LLM. Values <= 0 are LC103's, non-finite ones LC102's.",
     why="TensorRT-LLM refuses the config (\"Invalid LiLiCorr normalization epsilon\"); SGLang and vLLM load "
         "it. The checkpoint is unservable on one runtime for a single constant.",
     example="    \"dflash_config\": {\"lilicorr_vector_eps\": 0.5}")
rule("LC108", "lilicorr-disabled", "error", CFG, "lilicorr_enabled is false on a LiLiCorrDraftModel.",
     "Set lilicorr_enabled true, or declare DFlashDraftModel and drop the head tensors.",
     doc="Fires when `architectures[0]` is LiLiCorrDraftModel and `dflash_config.lilicorr_enabled` is false.",
     why="The class and the switch contradict each other, and the loaders refuse rather than pick one: SGLang "
         "parses the config as plain DFlash and the model then requires the lilicorr_* geometry it ignored; "
         "vLLM refuses with \"requires lilicorr_enabled=True\".",
     example="    \"architectures\": [\"LiLiCorrDraftModel\"],\n    \"dflash_config\": {\"lilicorr_enabled\": "
             "false, \"lilicorr_candidate_topk\": 8, ...}")
rule("LC110", "block-size-missing", "error", CFG, "block_size is absent and the runtime refuses the config (see LC125 for those that assume a default).",
     "Write dflash_config.block_size (and the top-level block_size for older readers).",
     doc="Fires when neither `dflash_config.block_size` nor the top-level `block_size` is present (and neither "
         "has the wrong type, which is LC001's), once for each selected runtime without a default: vLLM and "
         "TensorRT-LLM. SGLang's default is LC125.",
     why="The block size is the number of positions drafted per step, fixed at training. vLLM refuses the "
         "config (\"requires 1 <= num_speculative_tokens < trained block_size\"), TensorRT-LLM too (\"requires "
         "dflash_config.block_size or block_size\").",
     example="    \"dflash_config\": {\"mask_token_id\": 151669, \"target_layer_ids\": [1, 9, 17, 25, 33]}\n\n"
             "and no `block_size` anywhere in config.json.")
rule("LC111", "block-size-conflict", "warning", CFG,
     "dflash_config.block_size and the top-level block_size disagree (the nested one wins).",
     "Make both keys hold the trained block size.",
     doc="Fires when `dflash_config.block_size` and the top-level `block_size` are both present and differ.",
     why="SGLang, vLLM and TensorRT-LLM use the nested value; older TensorRT-LLM revisions read the top-level "
         "one. The block size served then depends on the reader's version, and one of the two values is not "
         "the trained one.",
     example="    \"block_size\": 8,\n    \"dflash_config\": {\"block_size\": 16}")
rule("LC112", "block-size-range", "error", CFG, "block_size must be an integer >= 2 for a LiLiCorr drafter.",
     "Write the trained block size (16 for the published recipes).",
     doc="Fires when the block size (dflash_config's, else the top-level one) is below 2 for a LiLiCorr "
         "drafter, or below 1 for any other drafter.",
     why="A LiLiCorr head scores candidates across the positions of a block; a block of one position leaves "
         "nothing to draft. Every runtime refuses it (TensorRT-LLM: \"Invalid LiLiCorr attention, block\").",
     example="    \"dflash_config\": {\"block_size\": 1}")
rule("LC113", "target-layer-ids", "error", CFG,
     "target_layer_ids is missing, empty, negative, duplicated or out of range.",
     "Write the exact target layer ids the drafter was trained on (HF convention: id i reads the output of layer i).",
     doc="Looks at `target_layer_ids` (dflash_config's, else the top-level one) and fires when it is missing, "
         "empty, holds a negative id, repeats an id, or holds an id >= num_target_layers. When the largest id "
         "equals num_target_layers the message says the ids look shifted by one.",
     why="The draft reads the hidden states of exactly these target layers, and fc.weight's input columns "
         "follow them. Without the list SGLang guesses the ids with build_target_layer_ids (wrong for 14 of 20 "
         "published checkpoints, sglang#37475), vLLM feeds fc the target's default taps (layers 2, L/2 and L-3: "
         "interfaces.py `get_eagle3_default_aux_hidden_state_layers`), TensorRT-LLM takes fc's input width from "
         "the checkpoint. An id beyond the target is refused by SGLang (\"out-of-range layer id\") and fails "
         "vLLM at run time. Wrong ids that happen to be in range load cleanly and collapse acceptance; a "
         "negative id would index from the end.",
     example="    \"num_target_layers\": 36,\n    \"dflash_config\": {\"target_layer_ids\": [2, 10, 18, 26, "
             "36]}\n\n"
             "36 is not a layer of a 36-layer target (ids are 0..35: id i reads the output of layer i).")
rule("LC114", "target-layer-ids-order", "warning", CFG, "target_layer_ids is not ascending.",
     "Check the order: fc's input columns follow the list order, so the order must be the trained one.",
     doc="Fires when `target_layer_ids` (with no negative or repeated ids) is not in ascending order.",
     why="No loader refuses it. fc.weight's input columns are laid out in list order, so a reordered list "
         "loads cleanly and feeds each column block another layer's hidden state. That is only right if the "
         "drafter was trained with exactly this order; an unsorted list is usually a hand edit.",
     example="    \"dflash_config\": {\"target_layer_ids\": [17, 1, 33]}")
rule("LC115", "mask-token", "error", CFG, "mask_token_id is missing or outside the vocabulary.",
     "Write dflash_config.mask_token_id: the id the drafter was trained with, < vocab_size.",
     doc="Looks at `mask_token_id` (dflash_config's, else the top-level one) and fires when it is absent, "
         "negative, or not below vocab_size.",
     why="The mask token fills the draft positions of every block, so a wrong one serves a different function. "
         "Without it the runtimes fall back differently: SGLang resolves the `<|MASK|>` token through the "
         "tokenizer, TensorRT-LLM falls back to vocab_size, an id outside the embedding, vLLM has no fallback. "
         "SGLang refuses a negative id (\"must be non-negative\"); an id >= vocab_size is outside the "
         "embedding table.",
     example="    \"vocab_size\": 151936,\n    \"dflash_config\": {\"mask_token_id\": 151936}")
rule("LC116", "conv-geometry", "error", CFG,
     "conv_kernel_size / conv_group_size are inconsistent (set alone, negative, kernel > block, width not divisible).",
     "Write both keys as trained, or neither for a convolution-free drafter.",
     doc="Checks dflash_config's `conv_kernel_size` / `conv_group_size` and fires when either is negative; "
         "when only one of them is > 0 (for SGLang and vLLM, which need both or neither; for TensorRT-LLM when "
         "the kernel size is set without a group size); when conv_kernel_size exceeds the block size "
         "(TensorRT-LLM); and when hidden_size is not divisible by conv_group_size.",
     why="Each runtime refuses these at load: SGLang \"needs conv_kernel_size and conv_group_size together\" "
         "and its grouped convolution says the group size \"must divide hidden_size\"; vLLM \"must enable "
         "both\"; TensorRT-LLM wants a group > 0 when taps > 0 and a kernel size \"between 0 and block_size\".",
     example="    \"dflash_config\": {\"block_size\": 16, \"conv_kernel_size\": 4}\n\n"
             "(no conv_group_size).")
rule("LC117", "causal", "error", CFG, "The draft is declared causal, which the runtime refuses (\"requires "
     "non-causal\").", "Set dflash_config.causal (and is_causal) to false.",
     doc="Fires when `dflash_config.causal` or the top-level `is_causal` is true, for the runtimes that refuse "
         "a causal draft: TensorRT-LLM. SGLang's behaviour is LC133, vLLM's LC134.",
     why="TensorRT-LLM refuses the config (\"requires non-causal draft attention\"). The same checkpoint loads "
         "on the other runtimes, with different results (see LC133 and LC134), so the flag decides where the "
         "drafter can be served at all.",
     example="    \"dflash_config\": {\"causal\": true}")
rule("LC118", "backbone-geometry", "error", CFG, "A backbone geometry key is missing or invalid.",
     "Write the draft's hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size.",
     doc="Fires when hidden_size, num_hidden_layers, num_attention_heads or intermediate_size is absent or < "
         "1; when num_key_value_heads is < 1 or does not divide num_attention_heads; when head_dim is absent "
         "and hidden_size is not divisible by num_attention_heads; and when num_hidden_layers names more "
         "layers than the files hold tensors (that count is not expanded).",
     why="These keys size every backbone tensor. Without them no loader can build the draft's layers, and the "
         "checker cannot list the tensors either (backbone coverage is then skipped: LC215). Grouped-query "
         "attention needs the key/value heads to divide the query heads.",
     example="    \"num_attention_heads\": 16, \"num_key_value_heads\": 6")
rule("LC119", "attention-windows", "error", CFG, "layer_types / sliding_window are inconsistent.",
     "Give one layer_types entry per draft layer and a sliding_window when any layer is sliding_attention.",
     doc="Fires when `layer_types` has another number of entries than num_hidden_layers (fewer, for every "
         "runtime; more, for SGLang and vLLM); when an entry is neither \"full_attention\" nor "
         "\"sliding_attention\"; when a layer is sliding_attention but `sliding_window` is unset (not for vLLM "
         "when `dflash_config.swa_window_size` >= 1, which it reads instead), or, for SGLang and vLLM and a "
         "qwen2 / qwen3 model_type, set without `use_sliding_window: true`; and when `dflash_config.use_swa` is "
         "true with neither swa_window_size nor sliding_window.",
     why="SGLang 0.5.23 and vLLM 0.33.0 read config.json through transformers' config classes, which refuse a "
         "layer_types list of another length than num_hidden_layers (validate_layer_type) and, for Qwen2 / "
         "Qwen3, keep sliding_window only when use_sliding_window is true. SGLang refuses an unknown entry "
         "(\"Unsupported DFLASH draft layer type\") while vLLM builds it as full attention, another function; "
         "SGLang refuses a sliding layer without sliding_window (\"require config.sliding_window\"), vLLM takes "
         "the window from swa_window_size and otherwise refuses it (qwen3_dflash.py `_resolve_layer_attention`: "
         "\"requires a window size\"). TensorRT-LLM's reading was not established and is judged as SGLang's.",
     example="    \"num_hidden_layers\": 2,\n    \"layer_types\": [\"sliding_attention\"]")
rule("LC120", "draft-vocabulary", "error", CFG, "A reduced or remapped draft vocabulary; LiLiCorr needs the full target vocabulary.",
     "Drop draft_vocab_size / draft_id_to_target_id and train with the target vocabulary.",
     doc="Fires when config.json has `draft_id_to_target_id`, or a `draft_vocab_size` different from "
         "vocab_size: a reduced or remapped draft vocabulary, as EAGLE-3 drafters use.",
     why="LiLiCorr drafts and scores candidates over the target's full vocabulary. vLLM refuses a reduced one "
         "(\"LiLiCorr candidates require the full target vocabulary\"); what TensorRT-LLM does with it was not "
         "established. SGLang never reads the keys (LC149).",
     example="    \"vocab_size\": 151936, \"draft_vocab_size\": 32000")
rule("LC121", "fp16-dtype", "warning", CFG, "The draft is stored as float16, which overflows in DFlash drafting.",
     "Export bfloat16.",
     doc="Fires when config.json's `torch_dtype` (or `dtype`) is float16 (\"float16\", \"fp16\" or \"half\").",
     why="Every runtime loads float16 weights, but DFlash drafting overflows in float16: in lmdeploy#4991 "
         "acceptance fell to 0.06 of 15. The drafter serves and barely helps, with no error.",
     example="    \"torch_dtype\": \"float16\"")
rule("LC122", "vocab-size", "error", CFG, "vocab_size is missing; candidates and mask ids cannot be checked.",
     "Write the target's vocab_size.",
     doc="Fires when config.json has no `vocab_size` (one of the wrong type is LC001's).",
     why="The vocabulary sizes the mask-token range, the candidate top-K bound, an owned lm_head and the "
         "sibling heads' tables. Without it those checks cannot run, and nothing ties the draft to its "
         "target's vocabulary (LC503 needs it too).",
     example="    {\"architectures\": [\"LiLiCorrDraftModel\"], \"hidden_size\": 2048, \"num_hidden_layers\": "
             "2, ...}\n\n"
             "with no \"vocab_size\" key.")
rule("LC123", "output-multiplier", "error", CFG, "dflash_config.output_multiplier is not > 0, which the runtime's "
     "DFlash config parser requires.", "Remove output_multiplier (default 1) or write the positive value the drafter was trained with.",
     doc="Fires when `dflash_config.output_multiplier` is a number <= 0, for the runtimes that read it there "
         "and require it positive: SGLang.",
     why="SGLang's DFlash config parser refuses the config (\"must be positive\"). vLLM does not apply the "
         "multiplier on the LiLiCorr path and TensorRT-LLM does not read it, so they load the same file.",
     example="    \"dflash_config\": {\"output_multiplier\": 0}")

rule("LC124", "topk-exceeds-vocab", "warning", CFG,
     "lilicorr_candidate_topk exceeds vocab_size: MLX refuses it; the other runtimes document no check.",
     "Write the trained K; it cannot exceed the vocabulary.",
     doc="Fires when lilicorr_candidate_topk (>= 1) is larger than vocab_size.",
     why="The head takes the top K candidates of the vocabulary; there are fewer than K. MLX refuses it; "
         "SGLang, vLLM and TensorRT-LLM document no check, so what they serve is not established.",
     example="    \"vocab_size\": 8,\n    \"dflash_config\": {\"lilicorr_candidate_topk\": 16}")
rule("LC125", "block-size-defaulted", "warning", CFG,
     "block_size is absent and the runtime silently assumes its default.",
     "Write dflash_config.block_size (and the top-level block_size for older readers).",
     doc="Fires when block_size is absent from dflash_config and the top level (and neither has the wrong "
         "type), once for each selected runtime that assumes a default instead of refusing: SGLang, which uses "
         "16. vLLM and TensorRT-LLM refuse (LC110).",
     why="SGLang loads the config without a word and drafts 16 positions per step. A drafter trained with "
         "another block size then serves with a block it never saw: it loads cleanly and acceptance drops.",
     example="    \"dflash_config\": {\"mask_token_id\": 151669, \"target_layer_ids\": [1, 9, 17, 25, 33]}\n\n"
             "for a drafter trained with block_size 8: SGLang serves it with 16.")
rule("LC126", "block-size-top-level-only", "info", CFG, "block_size is only at the top level of config.json.",
     "Write it in dflash_config too.",
     doc="Fires when the block size is only at the top level of config.json (no `dflash_config.block_size`) "
         "and its value is valid.",
     why="Where both keys are present the audited loaders use dflash_config's (LC111); a top-level key alone "
         "relies on each reader falling back to it. Writing it in dflash_config as well keeps readers that "
         "look only in dflash_config (as SGLang does for output_multiplier) in agreement.",
     example="    \"block_size\": 16,\n    \"dflash_config\": {\"mask_token_id\": 151669, "
             "\"target_layer_ids\": [1, 9, 17, 25, 33]}")
rule("LC127", "mask-token-top-level-only", "info", CFG,
     "mask_token_id is only at the top level; MLX-style readers require it in dflash_config.",
     "Write dflash_config.mask_token_id too.",
     doc="Fires when mask_token_id is only at the top level of config.json (a valid id, but no "
         "`dflash_config.mask_token_id`).",
     why="MLX-style readers take the mask token from dflash_config only and refuse the config without it. The "
         "runtimes judged here accept the top-level key, so this is informational.",
     example="    \"mask_token_id\": 151669,\n    \"dflash_config\": {\"block_size\": 16}")
rule("LC129", "output-multiplier-not-read", "info", CFG,
     "A top-level output_multiplier: the runtime reads it only from dflash_config, so this value is ignored.",
     "Move it into dflash_config (or drop it: the default is 1).",
     doc="Fires when config.json has a top-level `output_multiplier`, for the runtimes that read the "
         "multiplier only from dflash_config: SGLang.",
     why="SGLang never reads the top-level key: a drafter trained with a multiplier other than 1 is served "
         "there with 1, without an error. vLLM does not apply the multiplier on the LiLiCorr path and "
         "TensorRT-LLM does not read it.",
     example="    \"output_multiplier\": 2.0,\n    \"dflash_config\": {\"block_size\": 16}")
rule("LC131", "hidden-act", "error", CFG, "hidden_act is not silu, which the runtime's DFlash MLP refuses.",
     "Train/export with silu (the DFlash backbone supports no other activation).",
     doc="Fires when `hidden_act` is present and is not \"silu\" (any case), for the runtimes whose DFlash MLP "
         "supports silu only: vLLM; and SGLang, whose MLP also builds \"swigluoai\", unless it is that one "
         "(then it fires when `swiglu_alpha` or `swiglu_limit` is missing).",
     why="SGLang's DFlash MLP refuses other activations (\"Unsupported DFlash activation\") and reads "
         "config.swiglu_alpha / swiglu_limit for swigluoai (an AttributeError without them); vLLM passes it to "
         "its Qwen2 MLP, which supports silu only.",
     example="    \"hidden_act\": \"gelu\"")
rule("LC132", "hidden-act-unconfirmed", "warning", CFG,
     "hidden_act is not silu; whether this runtime supports another activation is not confirmed.",
     "Use silu, or test the runtime yourself.",
     doc="Fires when `hidden_act` is present and is not \"silu\", for the runtimes whose support for other "
         "activations is not confirmed: TensorRT-LLM.",
     why="TensorRT-LLM builds the draft MLP with the activation of the Hugging Face backbone; whether a "
         "non-silu value is honoured, refused or replaced was not traced. It may load and serve a different "
         "function.",
     example="    \"hidden_act\": \"gelu_pytorch_tanh\"")
rule("LC133", "causal-run-bidirectionally", "error", CFG,
     "The draft is declared causal but the runtime runs its full-attention layers bidirectionally whatever the "
     "config says: it loads cleanly and serves a different function than the one trained.",
     "Serve a causal drafter with a runtime that honours causal, or retrain non-causally.",
     doc="Fires when `dflash_config.causal` is true (and the top-level `is_causal` is not), for the runtimes "
         "that run the draft's full-attention layers bidirectionally whatever that key says: SGLang.",
     why="SGLang never reads dflash_config.causal and builds the full-attention layers as encoder-only "
         "(bidirectional). A drafter trained causally loads cleanly and scores a different function than the "
         "one trained: a silent mis-load, hence an error. SGLang does read the top-level is_causal (writing "
         "the flag there is the fix).",
     example="    \"dflash_config\": {\"causal\": true}")
rule("LC134", "causal-honoured", "info", CFG, "The draft is declared causal and the runtime drafts causally as "
     "declared.", "Nothing to do for this runtime.",
     doc="Fires when `dflash_config.causal` or the top-level `is_causal` is true, for the runtimes that draft "
         "causally as declared: vLLM (it reads is_causal, then dflash_config.causal), and SGLang for the "
         "top-level is_causal (models/dflash.py _get_dflash_attention_type).",
     why="Nothing breaks on these runtimes: the draft serves as trained. It is reported so that the per-runtime "
         "verdicts show where a causal drafter is served as declared; SGLang ignores dflash_config.causal "
         "(LC133) and TensorRT-LLM refuses the flag (LC117).",
     example="    \"is_causal\": true")
rule("LC135", "swa-window-zero", "error", CFG,
     "use_swa is true with swa_window_size < 1, which the runtime refuses.",
     "Write the trained window (>= 1), or set use_swa false.",
     doc="Fires when `dflash_config.use_swa` is true and `dflash_config.swa_window_size` is < 1, for the "
         "runtimes that refuse it: TensorRT-LLM.",
     why="TensorRT-LLM refuses the config at build (\"swa_window_size=0 is invalid\"). vLLM passes the value "
         "through (LC136) and SGLang does not read it (LC137), so the three runtimes disagree on one key.",
     example="    \"dflash_config\": {\"use_swa\": true, \"swa_window_size\": 0}")
rule("LC136", "swa-window-zero-literal", "warning", CFG,
     "use_swa is true with swa_window_size < 1: the runtime passes the value through as a literal window.",
     "Write the trained window (>= 1), or set use_swa false.",
     doc="Fires when `dflash_config.use_swa` is true and `dflash_config.swa_window_size` is < 1, for the "
         "runtimes that pass the value through as the layers' window: vLLM.",
     why="vLLM builds the sliding layers with a literal window of that size (0) instead of refusing it, so the "
         "draft loads and attends with a window it was not trained with.",
     example="    \"dflash_config\": {\"use_swa\": true, \"swa_window_size\": 0}")
rule("LC137", "swa-keys-ignored", "info", CFG, "dflash_config.use_swa / swa_window_size are not read by the "
     "runtime (it takes windows from layer_types and sliding_window).", "Nothing to do for this runtime.",
     doc="Fires when `dflash_config.use_swa` is true and `dflash_config.swa_window_size` is < 1, for the "
         "runtimes that do not read these keys: SGLang (it takes windows from layer_types and sliding_window; "
         "use_swa is read only for the Nemotron-3.5 layout).",
     why="Nothing is refused on this runtime: the keys are ignored. It is reported so the per-runtime verdicts "
         "show why SGLang loads what TensorRT-LLM refuses (LC135) and vLLM mis-builds (LC136).",
     example="    \"dflash_config\": {\"use_swa\": true, \"swa_window_size\": 0}")
rule("LC138", "use-swa-ignored", "error", CFG,
     "use_swa is true without layer_types: the runtime does not read use_swa and serves every layer with full "
     "attention, a different function than the one trained.",
     "Write layer_types (one \"sliding_attention\" entry per sliding layer) and sliding_window.",
     doc="Fires when `dflash_config.use_swa` is true and config.json has no `layer_types`, for the runtimes "
         "that do not read use_swa: SGLang.",
     why="vLLM and TensorRT-LLM make every layer sliding; SGLang does not read use_swa (outside the "
         "Nemotron-3.5 layout) and serves every layer with full attention. The draft loads cleanly there and "
         "computes a different function than the one trained.",
     example="    \"sliding_window\": 2048,\n    \"dflash_config\": {\"use_swa\": true, \"swa_window_size\": "
             "2048}\n\n"
             "and no layer_types.")
rule("LC139", "integral-float", "error", CFG,
     "An integer setting is written as a whole-number float (4.0), which the runtime does not cast: it refuses it "
     "or fails with a TypeError.", "Write the value as a JSON integer (4, not 4.0).",
     doc="Fires when an integer setting is written as a whole-number float (`4.0`), for each runtime that does "
         "not cast it. Three groups of keys, each judged by how the runtime's code reads it: the LiLiCorr "
         "integers in dflash_config (lilicorr_candidate_topk, lilicorr_hidden_size, lilicorr_num_layers, "
         "lilicorr_num_heads, lilicorr_factor_dim) used uncast by vLLM and TensorRT-LLM; the backbone integers "
         "(top-level hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, "
         "intermediate_size, vocab_size, block_size, num_target_layers; dflash_config's block_size, "
         "num_target_layers, conv_kernel_size, conv_group_size) used uncast by vLLM, and the ones the "
         "transformers config class declares int (hidden_size, num_hidden_layers, num_attention_heads, "
         "num_key_value_heads, head_dim, intermediate_size, vocab_size) refused by SGLang and vLLM; "
         "mask_token_id, which SGLang checks to be an integer.",
     why="A float where Python needs an int fails at build: SGLang 0.5.23 and vLLM 0.33.0 read config.json "
         "through transformers' config class, which refuses a float in its integer fields (\"expected int, got "
         "float\"); vLLM computes `candidate_topk & (candidate_topk - 1)` and the block's slot count with the "
         "raw values (a TypeError); TensorRT-LLM's LiLiCorr head uses the raw values for tensor sizes and "
         "ranges (a TypeError). SGLang refuses a float mask_token_id "
         "(\"must be an integer\").",
     example="    \"num_hidden_layers\": 2.0,\n    \"dflash_config\": {\"lilicorr_candidate_topk\": 8.0}")
rule("LC140", "integral-float-unconfirmed", "warning", CFG,
     "An integer setting is written as a whole-number float (4.0); whether the runtime casts it is not confirmed.",
     "Write the value as a JSON integer (4, not 4.0).",
     doc="The same keys as LC139; fires for each runtime for which it is not confirmed whether it casts them: "
         "TensorRT-LLM for the backbone integers.",
     why="TensorRT-LLM's draft builder would fail on a float layer count in `range(num_draft_layers)` if it "
         "used the value uncast; that path was not traced, so the load may work or fail with a TypeError.",
     example="    \"num_hidden_layers\": 2.0")
rule("LC141", "integral-float-cast", "info", CFG,
     "An integer setting is written as a whole-number float (4.0), which the runtime casts with int().",
     "Write the value as a JSON integer for the runtimes that do not cast.",
     doc="The same keys as LC139; fires for each runtime that casts them with int(): SGLang for the LiLiCorr "
         "integers and the ones its DFlash parser reads (block_size, num_target_layers, the conv keys), vLLM "
         "and TensorRT-LLM for mask_token_id.",
     why="Nothing breaks on these runtimes. It is reported because the same file fails on the runtimes that do "
         "not cast (LC139), so the value should still be written as an integer.",
     example="    \"dflash_config\": {\"lilicorr_num_layers\": 2.0}")
rule("LC142", "num-target-layers-range", "error", CFG, "num_target_layers is < 1, which the runtime refuses.",
     "Write the target's layer count.",
     doc="Fires when num_target_layers (dflash_config's or the top-level one) is < 1, for the runtimes that "
         "refuse it: SGLang.",
     why="SGLang refuses the config (\"must be positive\"); vLLM and TensorRT-LLM load it. A zero or negative "
         "layer count is never the target's, so every target_layer_id is then also out of range (LC113).",
     example="    \"num_target_layers\": 0")
rule("LC150", "selector-geometry", "error", CFG,
     "DFlash2 selector keys the runtime refuses: selector_rank / selector_top_k set alone, missing or "
     "negative, or a top_k above vocab_size.", "Write the trained selector_rank and selector_top_k.",
     doc="For a DFlash2 head, checks `dflash_config.selector_rank` and `selector_top_k` per runtime: for "
         "SGLang it fires when only one of them is set or either is negative, and when neither is (its "
         "DFlash2DraftModel needs a selector); for vLLM when either is missing or negative, or selector_top_k "
         "is larger than vocab_size.",
     why="SGLang's DFlash config parser refuses the config (\"selector needs rank and top_k together\"), and "
         "DFlash2DraftModel.__init__ refuses one without them (\"requires dflash_config.selector_rank\"). "
         "vLLM 0.33.0 reads both with a plain index and checks no range (qwen3_dflash2.py "
         "`DFlash2Qwen3Model.__init__`, spec_decode/dflash2/speculator.py `DFlash2Speculator.__init__`): a "
         "missing key is a KeyError, a negative size fails to build, and a top_k above the vocabulary fails "
         "the top-k at the first draft step. The selector's tensors are sized by these values, so they cannot "
         "be guessed.",
     example="    \"dflash_config\": {\"projector_type\": \"dflash2\", \"selector_rank\": 64}\n\n"
             "(no selector_top_k): refused by both.")
rule("LC151", "dflash2-conv-required", "error", CFG,
     "A DFlash2 head without conv_kernel_size / conv_group_size: DFlash2's grouped convolutions are mandatory.",
     "Write the trained conv_kernel_size and conv_group_size in dflash_config.",
     doc="Fires for a DFlash2 head when `dflash_config.conv_kernel_size` and `conv_group_size` are not both > "
         "0.",
     why="DFlash2's grouped convolutions are part of the head, not an option: vLLM reads both keys with a "
         "plain index (a KeyError without them) and Model-Optimizer refuses to export a DFlash2 head without "
         "them.",
     example="    \"architectures\": [\"DFlash2DraftModel\"],\n    \"dflash_config\": {\"selector_rank\": 64, "
             "\"selector_top_k\": 32}")
rule("LC152", "markov-rank", "error", CFG,
     "DSpark's markov_rank is missing or <= 0 at the top level of config.json, where the runtime reads it.",
     "Write the trained markov_rank at the top level (DeepSpec's layout).",
     doc="For a DSpark head, fires when the top-level `markov_rank` of config.json is absent or <= 0, for the "
         "runtimes that read it from the top level and require it > 0: SGLang and vLLM. When only "
         "`dflash_config.markov_rank` is present (Model-Optimizer and SpecForge write it there) the message "
         "says so.",
     why="SGLang's Markov head builder refuses the config (\"DSpark requires markov_rank > 0\"); vLLM's "
         "qwen3_dspark reads config.markov_rank at the top level. A rank only in dflash_config is invisible to "
         "both.",
     example="    \"architectures\": [\"Qwen3DSparkModel\"],\n    \"dflash_config\": {\"markov_rank\": 256}\n\n"
             "and no top-level markov_rank.")
rule("LC153", "markov-head-type", "error", CFG, "markov_head_type is not one the runtime builds.",
     "Write vanilla, gated or rnn as trained.",
     doc="For a DSpark head, fires when `markov_head_type` (top level, else dflash_config; \"vanilla\" when "
         "absent) is not one the runtime builds: SGLang builds vanilla, gated and rnn; vLLM builds vanilla only "
         "(qwen3_dspark.py `DSparkMarkovHead`: it does not read markov_head_type, and has no parameter for the "
         "gated or rnn tensors).",
     why="The Markov head's tensors and its computation depend on the type; a runtime that does not build it "
         "refuses the config, so the drafter cannot be served there.",
     example="    \"markov_head_type\": \"lstm\"")
rule("LC155", "domino-shift-label", "error", CFG, "Domino's dflash_config.shift_label is not a JSON bool.",
     "Write true (the trained setting) or false.",
     doc="For a Domino head, fires when `dflash_config.shift_label` is absent or is not a JSON bool, for the "
         "runtimes that check it: SGLang.",
     why="SGLang's DFlash config parser requires a JSON bool and refuses anything else, including 1 / 0 and "
         "strings such as \"true\".",
     example="    \"dflash_config\": {\"projector_type\": \"domino\", \"shift_label\": 1}")
rule("LC156", "domino-prefix-len", "error", CFG, "Domino's pure_draft_prefix_len is not 1, the only value the "
     "runtime serves.", "Write pure_draft_prefix_len 1 (and train with it).",
     doc="For a Domino head, fires when `dflash_config.pure_draft_prefix_len` is not 1 (absent included), for "
         "the runtimes that check it: SGLang.",
     why="SGLang serves Domino only with a pure draft prefix of one position and refuses the config otherwise.",
     example="    \"dflash_config\": {\"projector_type\": \"domino\", \"pure_draft_prefix_len\": 2}")
rule("LC157", "domino-dims", "error", CFG, "Domino's gru_hidden_dim or emb_dim is missing or < 1.",
     "Write the trained gru_hidden_dim and emb_dim in dflash_config.",
     doc="For a Domino head, fires when `gru_hidden_dim` or `emb_dim` (dflash_config's, else the top-level "
         "one) is missing or < 1, for the runtimes that require them: SGLang.",
     why="They size the prefix GRU and the embedding projection; SGLang refuses the config without them.",
     example="    \"dflash_config\": {\"projector_type\": \"domino\", \"emb_dim\": 512}\n\n"
             "(no gru_hidden_dim).")
rule("LC158", "domino-emb-dim-conflict", "error", CFG,
     "dflash_config.emb_dim and the top-level emb_dim differ, which the runtime refuses.",
     "Make both hold the trained emb_dim.",
     doc="For a Domino head, fires when `dflash_config.emb_dim` and the top-level `emb_dim` are both present "
         "and differ, for the runtimes that compare them: SGLang.",
     why="SGLang refuses the config (\"emb_dim differs\"). The reference Domino checkpoint writes emb_dim at "
         "both levels, so readers take it from either; two values make the embedding projection's width "
         "ambiguous.",
     example="    \"emb_dim\": 512,\n    \"dflash_config\": {\"projector_type\": \"domino\", \"emb_dim\": 256}")
rule("LC159", "domino-block-size", "error", CFG, "A Domino draft with block_size <= 1, which the runtime refuses.",
     "Write the trained block size (16 for the reference checkpoint).",
     doc="For a Domino head, fires when the block size (dflash_config's, else the top-level one) is <= 1, for "
         "the runtimes that check it: SGLang.",
     why="SGLang refuses a Domino draft whose block size is 1 or less, so the checkpoint cannot be served "
         "there.",
     example="    \"dflash_config\": {\"projector_type\": \"domino\", \"block_size\": 1}")
rule("LC144", "window-semantics", "warning", CFG,
     "A LiLiCorr draft has sliding-window layers, and the selected runtimes serve them with different attention "
     "(causal over the last w tokens, or non-causal over a symmetric window): at most one matches training.",
     "Serve the drafter with the runtime whose sliding-window semantics it was trained with.",
     doc="For a LiLiCorr drafter, fires when some draft layers use sliding-window attention (a "
         "`sliding_attention` entry in layer_types with a window from sliding_window, or from "
         "dflash_config.swa_window_size where the runtime reads it; or dflash_config.use_swa where the runtime "
         "applies it to every layer) and the selected runtimes that serve those layers run them differently.",
     why="SGLang and vLLM run a sliding layer causally over the last w tokens; TensorRT-LLM's LiLiCorr drafter "
         "runs it non-causally over a symmetric window (w-1 tokens on each side). The same weights then "
         "compute two different functions: acceptance is lower, silently, wherever the semantics differ "
         "from the ones the drafter was trained with.",
     example='    "layer_types": ["sliding_attention", "full_attention"],\n    "sliding_window": 8\n\n'
             "validated for all runtimes.")
rule("LC147", "rope-theta-defaulted", "info", CFG, "rope_theta is absent; the runtime assumes its default.",
     "Write the trained rope_theta (the target's) in config.json.",
     doc="Fires when config.json has no rope_theta (neither at the top level nor in rope_parameters): the "
         "finding names the value each selected runtime assumes.",
     why="The drafter loads, with the runtime's default base: the transformers default of its config class "
         "(10000 for Qwen3) in SGLang, vLLM and TensorRT-LLM. vLLM 0.33.0's own 1e6 "
         "(`set_default_rope_theta` in qwen3_dflash.py) applies only to a config class that leaves "
         "rope_parameters without a base, which transformers' Qwen3Config never does. That is right only if "
         "the drafter was trained with that base; writing the key makes the checkpoint say what it was "
         "trained with.",
     example="    config.json without \"rope_theta\", validated with --runtime vllm (assumes 10000).")
rule("LC145", "target-layer-ids-permuted", "error", CFG,
     "target_layer_ids is not ascending, and the runtime captures the target's layers in layer order: fc reads a "
     "permuted concatenation, a different function than the one trained.",
     "Write target_layer_ids in ascending order, with fc.weight's column blocks permuted to match (or retrain).",
     doc="Fires when `target_layer_ids` (with no negative or repeated ids) is not ascending, for the runtimes "
         "that capture the target's hidden states in layer order whatever the list order: SGLang and vLLM. "
         "The others read the list in its order (LC114, a warning).",
     why="SGLang 0.5.23's target models capture a layer's hidden state while their forward pass walks the "
         "layers in order (models/qwen3.py Qwen3Model.forward: `if i in self.layers_to_capture`); vLLM 0.33.0 "
         "turns the ids into capture points with `sorted(set(...))` (interfaces.py "
         "`EagleModelMixin._set_aux_hidden_state_layers`). Either way the captures are concatenated in layer "
         "order, while fc.weight's column blocks were trained in list order: with [17, 1, 33] the block trained "
         "on layer 17 reads layer 1. The draft loads cleanly and serves another function.",
     example="    \"dflash_config\": {\"target_layer_ids\": [17, 1, 33]}")
rule("LC148", "target-layer-ids-last-layer", "error", CFG,
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
         "project_target_hidden refuses the first batch (\"target_hidden feature dim mismatch\").",
     example="    \"num_target_layers\": 36,\n    \"dflash_config\": {\"target_layer_ids\": [1, 17, 35]}")
rule("LC149", "draft-vocabulary-ignored", "warning", CFG,
     "A reduced or remapped draft vocabulary, which the runtime never reads: candidates come from the target's full "
     "head.", "Drop draft_vocab_size / draft_id_to_target_id if the drafter was trained over the full vocabulary.",
     doc="Fires when config.json has `draft_id_to_target_id`, or a `draft_vocab_size` different from "
         "vocab_size, for the runtimes that read neither: SGLang (LC120 for the others).",
     why="SGLang's DFlash-family drafts take their candidates from the target's lm_head over the full "
         "vocabulary and never read the draft vocabulary keys. That is the trained function only if the "
         "drafter was trained over the full vocabulary, which the keys say it was not.",
     example="    \"vocab_size\": 151936, \"draft_vocab_size\": 32000")
rule("LC143", "layer-types-long", "warning", CFG,
     "layer_types has more entries than the draft has layers; the extra entries are ignored.",
     "Give exactly one entry per draft layer.",
     doc="Fires when `layer_types` has more entries than num_hidden_layers, for the runtimes that read the "
         "first entries (LC119 for SGLang and vLLM, whose transformers config class refuses the length).",
     why="These loaders read the first num_hidden_layers entries and ignore the rest, so it serves. But a list of the wrong length can be another model's (the target's layer_types "
         "copied into the draft), and its first entries need not be the pattern the draft was trained with.",
     example="    \"num_hidden_layers\": 2,\n    \"layer_types\": [\"sliding_attention\", \"full_attention\", "
             "\"sliding_attention\", \"full_attention\"]")

rule("LC170", "logit-scale-served", "warning", CFG,
     "lilicorr_logit_scale is <= 0 and the runtime serves it as declared (no check): candidate scores are flat (0) "
     "or inverted (< 0).", "Write the trained lilicorr_logit_scale (a positive number).",
     doc="Fires when dflash_config.lilicorr_logit_scale is <= 0, for the runtimes that do not check it: vLLM. "
         "The runtimes that refuse it report LC103.",
     why="vLLM 0.33.0 stores the scale as it is (lilicorr.py `LiLiCorrHead`) and multiplies every candidate "
         "score by it, so the checkpoint loads and drafts with the function its config declares: a scale of 0 "
         "scores every candidate path alike, a negative one prefers the worst. That is rarely what was trained; "
         "SGLang and TensorRT-LLM refuse it.",
     example="    \"dflash_config\": {\"lilicorr_logit_scale\": 0.0}")
rule("LC173", "eagle-aux-layer-ids", "error", CFG,
     "A top-level eagle_aux_hidden_state_layer_ids names other target layers than target_layer_ids, and the "
     "runtime reads it first.", "Remove eagle_aux_hidden_state_layer_ids, or make it target_layer_ids + 1.",
     doc="Fires when config.json has a non-empty top-level `eagle_aux_hidden_state_layer_ids` that is not "
         "dflash_config.target_layer_ids with 1 added to each id, for the runtimes that read it before the "
         "DFlash taps: vLLM.",
     why="vLLM 0.33.0 takes the target layers fc reads from `eagle_aux_hidden_state_layer_ids` when it is set "
         "(eagle3_utils.py `get_eagle3_aux_layers_from_config`), in its capture convention (id + 1), and only "
         "otherwise from dflash_config.target_layer_ids. A stale EAGLE-3 key left in the config then replaces "
         "the trained taps: the drafter loads and reads other layers' states.",
     example="    \"eagle_aux_hidden_state_layer_ids\": [2, 18, 34],\n    \"dflash_config\": "
             "{\"target_layer_ids\": [1, 9, 17, 25, 33]}")
rule("LC174", "sample-from-anchor", "error", CFG,
     "dflash_config.sample_from_anchor is true, which the runtime's DFlash speculator refuses.",
     "Remove dflash_config.sample_from_anchor (DFlash drafts use the anchor as the bonus token).",
     doc="Fires when dflash_config.sample_from_anchor is true, for the runtimes that refuse it: vLLM.",
     why="vLLM 0.33.0's DFlash speculator (and the LiLiCorr, DFlash2 and DSpark speculators built on it) refuses "
         "the config at start-up: \"sample_from_anchor=True is not supported for DFlash\" "
         "(spec_decode/dflash/speculator.py `DFlashSpeculator.__init__`). A DSpark drafter declares it at the "
         "top level, which is read elsewhere.",
     example="    \"dflash_config\": {\"sample_from_anchor\": true}")
rule("LC175", "no-aux-hidden-state", "error", CFG,
     "use_aux_hidden_state is false: the runtime builds no fc and drops fc.weight, so the draft runs without the "
     "target's hidden states.", "Remove use_aux_hidden_state (DFlash-family drafters read the target's states).",
     doc="Fires when `use_aux_hidden_state` is false in dflash_config, eagle_config or at the top level, for the "
         "runtimes that read it: vLLM.",
     why="vLLM 0.33.0 builds the fc projection only when use_aux_hidden_state is true (qwen3_dflash.py "
         "`DFlashQwen3Model.__init__`) and then maps every `fc.` tensor to nothing (`load_weights`): the "
         "trained fc.weight is dropped and the draft serves without the target's features it was trained on.",
     example="    \"dflash_config\": {\"use_aux_hidden_state\": false}")


# ---------------------------------------------------------------- checks


LISTED_DUPLICATE_KEYS = 20  # LC002 findings of their own; the rest are one finding


@check
def config_schema(ctx: Context) -> None:
    for issue in ctx.parsed.issues:
        ctx.emit("LC001", f"config.json {issue.describe()}", file="config.json", pointer=issue.path,
                 expected=issue.expected, actual=issue.found)
    repeated = list(ctx.parsed.duplicate_keys.items())  # one entry per key, with its count
    for key, count in repeated[:LISTED_DUPLICATE_KEYS]:
        ctx.emit("LC002", f"config.json repeats the key `{key}` ({count} times); JSON readers keep the last value",
                 file="config.json", subjects=[key])
    rest = repeated[LISTED_DUPLICATE_KEYS:]
    if rest:  # a config repeating 690k keys is one more finding, not 690k of them
        ctx.emit("LC002", f"config.json repeats {len(rest)} more keys ({sum(c for _, c in rest)} occurrences): "
                 f"{shorten(k for k, _ in rest)}; JSON readers keep the last value of each", file="config.json",
                 subjects=[k for k, _ in rest])
    interesting = [k for k in ctx.parsed.unknown_keys if "lilicorr" in k or "conv" in k or "block" in k
                   or "target" in k or "mask" in k]
    for key in interesting:
        ctx.emit("LC003", f"config.json key {key} is not read by any loader (misspelt?)", file="config.json",
                 pointer=key)


@check
def architecture(ctx: Context) -> None:
    cfg = ctx.config
    arch = cfg.architecture
    has_head_tensors = any(n.startswith("lilicorr.") for n in ctx.names.by_canonical)
    if cfg.architectures is None or not cfg.architectures:
        if not ctx.parsed.invalid("$.architectures"):
            ctx.emit("LC010", "config.json has no `architectures`; loaders select the drafter class from it",
                     file="config.json", pointer="$.architectures", expected='["LiLiCorrDraftModel"]', actual="absent")
        return
    if cfg.family is None:
        d = cfg.dflash
        projector = d.projector_type == "lilicorr" or d.lilicorr_enabled is True
        routers = [p for p in ctx.profiles if projector and p.projector_type_routes
                   and arch in p.projector_routed_architectures]
        strict = [p for p in ctx.profiles if p not in routers]
        tail = (f" ({_names(routers, 'routes')} it to LiLiCorr through dflash_config.projector_type / "
                "lilicorr_enabled; the others select the class from architectures)") if projector and routers else ""
        ctx.emit("LC010", f"architectures[0] is `{arch}`, not a DFlash-family drafter the loaders know{tail}",
                 runtimes=[p.name for p in strict] if routers else (), file="config.json",
                 pointer="$.architectures[0]", expected="LiLiCorrDraftModel | DFlashDraftModel", actual=arch)
        return
    sibling = ctx.geometry.family if ctx.geometry.family in ("dflash2", "dspark", "domino") else None
    if sibling:
        _sibling_route(ctx, sibling, arch)
    stray = sorted({n.split(".", 1)[0] + "." for n in ctx.names.by_canonical if n.startswith(SIBLING_HEAD_PREFIXES)
                    or n in DSPARK_FLAT_NAMES})
    owner = {"candidate_selector.": "dflash2", "markov_head.": "dspark", "confidence_head.": "dspark",
             "prefix_gru.": "domino", "embed_proj.": "domino"}
    foreign = [s for s in stray if owner.get(s, "dspark") != sibling]
    if foreign:
        ctx.emit("LC016", f"tensors under {', '.join(f'`{s}*`' for s in foreign)} belong to a "
                 f"{'/'.join(sorted({owner.get(s, 'dspark') for s in foreign}))} head, but the config declares "
                 f"{arch}{' (' + sibling + ')' if sibling else ''}: no loader builds that head here, so they are "
                 "dropped or refused", file="config.json", pointer="$.architectures[0]",
                 subjects=[n for n in ctx.names.by_canonical if any(n.startswith(s) for s in foreign)])
    if cfg.family == "lilicorr" and cfg.dflash.lilicorr_enabled is False:
        ctx.emit("LC108", "dflash_config.lilicorr_enabled is false on LiLiCorrDraftModel: " + "; ".join(
                 f"{p.display}: {p.lilicorr_disabled or 'not established (validate keeps it refused)'}"
                 for p in ctx.profiles),
                 file="config.json", pointer="$.dflash_config.lilicorr_enabled", expected="true", actual="false")
    routers = [p for p in ctx.profiles if p.projector_type_routes]
    others = [p for p in ctx.profiles if not p.projector_type_routes]
    if routed_by_projector(cfg) and has_head_tensors:
        ctx.emit_for("LC011", others, f"architectures declares {arch} but the checkpoint has lilicorr.* head "
                     "tensors: these loaders select the class from architectures, build no head and drop them "
                     "silently" + (f" ({names(routers, 'routes|route')} it to LiLiCorr through "
                                   "dflash_config.projector_type / lilicorr_enabled)" if routers else ""),
                     file="config.json", pointer="$.architectures[0]",
                     expected="LiLiCorrDraftModel", actual=arch)
    elif routed_by_projector(cfg) and head_declared(cfg):
        ctx.emit_for("LC013", others, "DFlashDraftModel declared with lilicorr_* geometry: the head is never built",
                     file="config.json", pointer="$.architectures[0]",
                     expected="LiLiCorrDraftModel", actual=arch)
        if ctx.table.tensors:
            ctx.emit_for("LC011", routers, "DFlashDraftModel with dflash_config.projector_type \"lilicorr\" (or "
                         f"lilicorr_enabled true): {names(routers, 'routes|route')} it to LiLiCorr, but the "
                         "checkpoint has no lilicorr.* tensors", file="config.json", pointer="$.dflash_config.projector_type",
                         expected="lilicorr.* tensors", actual="none")
    elif cfg.family != "lilicorr" and has_head_tensors:
        ctx.emit("LC011", f"architectures declares {arch} but the checkpoint has lilicorr.* head tensors: the "
                 "loader builds no head and drops them silently", file="config.json", pointer="$.architectures[0]",
                 expected="LiLiCorrDraftModel", actual=arch)
    elif cfg.family == "lilicorr" and not has_head_tensors and ctx.table.tensors:
        ctx.emit("LC011", "LiLiCorrDraftModel declared but the checkpoint has no lilicorr.* tensors "
                 "(a draft with no LiLiCorr head should declare DFlashDraftModel)",
                 file="config.json", pointer="$.architectures[0]", expected="lilicorr.* tensors", actual="none")
    elif cfg.family == "dflash" and head_declared(cfg):
        ctx.emit("LC013", "DFlashDraftModel declared with lilicorr_* geometry: the head is never built",
                 file="config.json", pointer="$.architectures[0]",
                 expected="LiLiCorrDraftModel", actual=arch)


@check
def lilicorr_geometry(ctx: Context) -> None:
    g = ctx.geometry
    if not g.lilicorr_enabled or not (ctx.config.family in ("lilicorr", None) or routed_by_projector(ctx.config)):
        return
    d = msgspec.structs.asdict(ctx.config.dflash)
    for key in LILICORR_KEYS:
        path = f"$.dflash_config.{key}"
        value = d[key]
        if value is None:
            if ctx.parsed.invalid(path):
                continue
            top = ctx.parsed.raw.get(key)
            where = " (it is at the top level; loaders read it only from dflash_config)" if top is not None else ""
            ctx.emit("LC101", f"dflash_config.{key} is missing{where}: every loader refuses a LiLiCorr config "
                     "without it (no default: a guess would load cleanly and score a different function)",
                     file="config.json", pointer=path, expected="present", actual="absent", subjects=[key])
            continue
        if isinstance(value, float) and not math.isfinite(value):
            ctx.emit("LC102", f"dflash_config.{key} is {value}", file="config.json", pointer=path,
                     expected="a finite number", actual=value, subjects=[key])
            continue
        if key == "lilicorr_hidden_size":
            if value < 0:
                ctx.emit("LC105", f"dflash_config.{key} is {value}", file="config.json", pointer=path,
                         expected=">= 0", actual=value, subjects=[key])
            elif value == 0:
                refuse = [p for p in ctx.profiles if not p.hidden_size_zero_ok]
                width = [p for p in ctx.profiles if p.hidden_size_zero_ok]
                ctx.emit_for("LC105", refuse, f"dflash_config.{key} is 0, which {_names(refuse, 'refuses|refuse')} it"
                             + (f" ({_names(width, 'reads|read')} it as the draft width {g.hidden_size})"
                                if width else ""),
                             file="config.json", pointer=path, expected=f">= 1 (the real width, {g.hidden_size})",
                             actual=0, subjects=[key])
            continue
        if value <= 0 and key == "lilicorr_logit_scale":
            checked = [p for p in ctx.profiles if p.logit_scale_checked]
            served = [p for p in ctx.profiles if not p.logit_scale_checked]
            ctx.emit_for("LC103", checked, f"dflash_config.{key} is {value}: {_names(checked, 'refuses|refuse')} it",
                         file="config.json", pointer=path, expected="> 0", actual=value, subjects=[key])
            ctx.emit_for("LC170", served, f"dflash_config.{key} is {value}: {_names(served, 'serves|serve')} it "
                         "as declared (no check), scoring every candidate path " + (
                             "alike" if value == 0 else "in reverse"), file="config.json", pointer=path,
                         expected="> 0", actual=value, subjects=[key])
        elif value <= 0:
            ctx.emit("LC103", f"dflash_config.{key} is {value}", file="config.json", pointer=path,
                     expected="> 0", actual=value, subjects=[key])
    k = d["lilicorr_candidate_topk"]
    if isinstance(k, int) and k > 0:
        bad = [p for p in ctx.profiles if p.topk_power_of_two_max is not None
               and (not is_pow2(k) or k > p.topk_power_of_two_max)]
        if bad:
            ctx.emit_for("LC104", bad, f"lilicorr_candidate_topk is {k}: the fused candidate top-k holds its tiles "
                         "in one Triton lane group, so it must be a power of two <= 16",
                         file="config.json", pointer="$.dflash_config.lilicorr_candidate_topk",
                         expected="one of 1, 2, 4, 8, 16", actual=k)
        if g.vocab_size is not None and k > g.vocab_size:
            # only MLX (not a --runtime profile) is known to refuse K > V
            ctx.emit("LC124", f"lilicorr_candidate_topk {k} exceeds vocab_size {g.vocab_size}: MLX refuses it; "
                     f"{names(ctx.profiles, 'documents|document')} no check (a top-K over fewer than K tokens)",
                     file="config.json", pointer="$.dflash_config.lilicorr_candidate_topk",
                     expected=f"<= {g.vocab_size}", actual=k)
    n, h = g.head_num_heads, g.head_hidden_size
    if n is not None and h is not None and h % n:
        ctx.emit("LC106", f"lilicorr_num_heads {n} does not divide the head width {h}", file="config.json",
                 pointer="$.dflash_config.lilicorr_num_heads", expected=f"a divisor of {h}", actual=n)
    if g.head_mlp_width == 0:
        ctx.emit("LC103", f"int(lilicorr_hidden_size * lilicorr_mlp_ratio) is 0 (h={h}, ratio={g.head_mlp_ratio})",
                 file="config.json", pointer="$.dflash_config.lilicorr_mlp_ratio", expected="> 0", actual=0)
    eps = d["lilicorr_vector_eps"]
    if isinstance(eps, float) and math.isfinite(eps) and eps > 0 and eps >= 0.5:
        ctx.emit_for("LC107", [p for p in ctx.profiles if p.vector_eps_below_half],
                     f"lilicorr_vector_eps is {eps}", file="config.json",
                     pointer="$.dflash_config.lilicorr_vector_eps", expected="in (0, 0.5)", actual=eps)


@check
def block_size(ctx: Context) -> None:
    cfg = ctx.config
    nested, top = cfg.dflash.block_size, cfg.block_size
    if nested is None and top is None:
        if ctx.parsed.invalid("$.block_size") or ctx.parsed.invalid("$.dflash_config.block_size"):
            return
        for p in ctx.profiles:
            if p.block_size_default is None:
                ctx.emit("LC110", f"block_size is absent: {p.display} refuses the config", runtimes=[p.name],
                         file="config.json", pointer="$.dflash_config.block_size", expected="present", actual="absent")
            else:
                ctx.emit("LC125", f"block_size is absent: {p.display} silently assumes {p.block_size_default}",
                         runtimes=[p.name], file="config.json",
                         pointer="$.dflash_config.block_size", expected="present", actual="absent")
        return
    if nested is not None and top is not None and nested != top:
        older = [p for p in ctx.profiles if p.block_size_top_level_in_older]
        ctx.emit("LC111", f"dflash_config.block_size is {nested} but the top-level block_size is {top}; "
                 f"{names(ctx.profiles, 'uses|use')} {nested}"
                 + (f" (older {names(older)} revisions read the top-level {top})" if older else "")
                 + f"; a reader of the top level only would use {top}", file="config.json",
                 pointer="$.block_size", expected=nested, actual=top)
    value = nested if nested is not None else top
    minimum = 2 if ctx.geometry.lilicorr_enabled else 1
    if value < minimum:
        ctx.emit("LC112", f"block_size is {value}", file="config.json",
                 pointer="$.dflash_config.block_size" if nested is not None else "$.block_size",
                 expected=f">= {minimum}", actual=value)
    elif nested is None:
        ctx.emit("LC126", "block_size is only at the top level; write it in dflash_config too",
                 file="config.json", pointer="$.dflash_config.block_size")


@check
def target_layer_ids(ctx: Context) -> None:
    cfg = ctx.config
    ids = cfg.dflash.target_layer_ids if cfg.dflash.target_layer_ids is not None else cfg.target_layer_ids
    path = "$.dflash_config.target_layer_ids" if cfg.dflash.target_layer_ids is not None else "$.target_layer_ids"
    if ids is None:
        if ctx.parsed.invalid("$.target_layer_ids") or ctx.parsed.invalid("$.dflash_config.target_layer_ids"):
            return
        fallbacks = "; ".join(f"{p.display} {p.target_layer_ids_fallback}" for p in ctx.profiles)
        ctx.emit("LC113", f"target_layer_ids is missing ({fallbacks}); wrong taps load cleanly and collapse acceptance",
                 file="config.json", pointer="$.dflash_config.target_layer_ids", expected="the trained ids",
                 actual="absent")
        return
    if not ids:
        ctx.emit("LC113", "target_layer_ids is empty", file="config.json", pointer=path,
                 expected="at least one id", actual="[]")
        return
    negative = [i for i in ids if i < 0]
    if negative:
        ctx.emit("LC113", f"target_layer_ids has negative ids {negative} (they would wrap around silently)",
                 file="config.json", pointer=path, expected="ids >= 0", actual=ids)
    seen: set[int] = set()
    dups = sorted({i for i in ids if i in seen or seen.add(i)})
    if dups:
        ctx.emit("LC113", f"target_layer_ids repeats {dups}", file="config.json", pointer=path,
                 expected="unique ids", actual=ids)
    n = ctx.geometry.num_target_layers
    declared = [v for v in (cfg.dflash.num_target_layers, cfg.num_target_layers) if v is not None]
    for v in declared:
        if v < 1:
            ctx.emit_for("LC142", [p for p in ctx.profiles if p.num_target_layers_positive],
                         f"num_target_layers is {v}", file="config.json", pointer="$.num_target_layers",
                         expected=">= 1", actual=v)
            break
    if n is not None:
        out = [i for i in ids if i >= n]
        if out:
            shifted = " (they look shifted by +1: ids are 'output of layer i', 0-based)" if max(ids) == n else ""
            ctx.emit("LC113", f"target_layer_ids {out} are >= num_target_layers {n}{shifted}", file="config.json",
                     pointer=path, expected=f"ids in 0..{n - 1}", actual=ids)
    if not negative and not dups and list(ids) != sorted(ids):
        ordered = [p for p in ctx.profiles if p.captures_in_layer_order]
        ctx.emit_for("LC145", ordered, f"target_layer_ids {ids} is not ascending: {_names(ordered, 'captures|capture')} "
                     f"the target's layers in layer order, so fc receives the hidden states of {sorted(ids)} "
                     "concatenated and each of its column blocks reads another layer than the one trained",
                     file="config.json", pointer=path, expected=sorted(ids), actual=ids)
        ctx.emit_for("LC114", [p for p in ctx.profiles if not p.captures_in_layer_order],
                     f"target_layer_ids {ids} is not ascending", file="config.json", pointer=path)
    target = ctx.target.num_layers if ctx.target is not None and ctx.target.num_layers else n
    if target is not None and not negative and target - 1 in ids:
        arch = ctx.target.architecture if ctx.target is not None else None
        blind = [p for p in ctx.profiles if p.final_layer_capture_architectures is not None
                 and arch not in p.final_layer_capture_architectures]
        ctx.emit_for("LC148", blind, f"target_layer_ids includes {target - 1}, the target's last layer: "
                     f"{_names(blind, 'captures|capture')} the hidden state of layer i as the input of layer i+1, "
                     f"which the last layer has none of, so {'a ' + arch if arch else 'a Qwen2/Qwen3/Llama'} target "
                     f"hands fc {len(ids) - 1} of its {len(ids)} features and the first batch fails (\"target_hidden "
                     "feature dim mismatch\")", file="config.json", pointer=path, actual=ids,
                     expected=f"ids below {target - 1}, or a target that captures its last layer's output")
    _eagle_aux_layer_ids(ctx, ids)


def _eagle_aux_layer_ids(ctx: Context, ids: list[int]) -> None:
    """A top-level eagle_aux_hidden_state_layer_ids replacing the DFlash taps where the runtime reads it first."""
    aux = ctx.config.eagle_aux_hidden_state_layer_ids
    if not aux or ctx.config.dflash.target_layer_ids is None:
        return
    trained = [i + 1 for i in ctx.config.dflash.target_layer_ids]
    if list(aux) != trained:
        readers = [p for p in ctx.profiles if p.reads_eagle_aux_layer_ids]
        ctx.emit_for("LC173", readers, f"eagle_aux_hidden_state_layer_ids {list(aux)} is not target_layer_ids + 1 "
                     f"({trained}): {_names(readers, 'reads|read')} it first, so fc reads the target layers it "
                     "names instead of the trained ones", file="config.json",
                     pointer="$.eagle_aux_hidden_state_layer_ids", expected=trained, actual=list(aux))


@check
def mask_token(ctx: Context) -> None:
    cfg = ctx.config
    mask = cfg.dflash.mask_token_id if cfg.dflash.mask_token_id is not None else cfg.mask_token_id
    if mask is None:
        if ctx.parsed.invalid("$.dflash_config.mask_token_id") or ctx.parsed.invalid("$.mask_token_id"):
            return
        what = "; ".join(f"{p.display} {p.mask_token_fallback}" for p in ctx.profiles)
        ctx.emit("LC115", f"mask_token_id is missing ({what})", file="config.json",
                 pointer="$.dflash_config.mask_token_id", expected="the trained mask id", actual="absent")
        return
    if mask < 0:
        ctx.emit("LC115", f"mask_token_id is {mask}", file="config.json", pointer="$.dflash_config.mask_token_id",
                 expected=">= 0", actual=mask)
    elif cfg.vocab_size is not None and mask >= cfg.vocab_size:
        ctx.emit("LC115", f"mask_token_id {mask} is not below vocab_size {cfg.vocab_size}", file="config.json",
                 pointer="$.dflash_config.mask_token_id", expected=f"< {cfg.vocab_size}", actual=mask)
    elif cfg.dflash.mask_token_id is None:
        ctx.emit("LC127", "mask_token_id is only at the top level; MLX-style readers require it in dflash_config",
                 file="config.json", pointer="$.dflash_config.mask_token_id")


@check
def conv_geometry(ctx: Context) -> None:
    d = ctx.config.dflash
    taps, group = d.conv_kernel_size, d.conv_group_size
    for key, value in (("conv_kernel_size", taps), ("conv_group_size", group)):
        if value is not None and value < 0:
            ctx.emit("LC116", f"dflash_config.{key} is {value}", file="config.json",
                     pointer=f"$.dflash_config.{key}", expected=">= 0", actual=value)
    t, gsz = taps or 0, group or 0
    if (t > 0) != (gsz > 0):
        strict = [p for p in ctx.profiles if p.conv_keys_both_or_neither or t > 0]
        shown = [("absent" if v is None else v) for v in (taps, group)]
        ctx.emit_for("LC116", strict, f"conv_kernel_size is {shown[0]} and conv_group_size is {shown[1]}: both or neither",
                     file="config.json", pointer="$.dflash_config.conv_kernel_size",
                     expected="both > 0 or both 0", actual=f"{shown[0]}/{shown[1]}")
    if t > 0:
        b = ctx.geometry.block_size
        if b is not None and t > b:
            ctx.emit_for("LC116", [p for p in ctx.profiles if p.conv_kernel_within_block],
                         f"conv_kernel_size {t} exceeds block_size {b}", file="config.json",
                         pointer="$.dflash_config.conv_kernel_size", expected=f"<= {b}", actual=t)
    m = ctx.geometry.hidden_size
    if gsz > 0 and m is not None and m % gsz:
        ctx.emit("LC116", f"hidden_size {m} is not divisible by conv_group_size {gsz}", file="config.json",
                 pointer="$.dflash_config.conv_group_size", expected=f"a divisor of {m}", actual=gsz)


@check
def backbone_config(ctx: Context) -> None:
    cfg = ctx.config
    if cfg.dflash.causal is True or cfg.is_causal is True:
        nested = cfg.is_causal is not True
        key = "$.dflash_config.causal" if nested else "$.is_causal"
        what = "dflash_config.causal" if nested else "is_causal"
        # a true top-level is_causal is read by its own statement where a runtime has one (causal_top_level)
        by = {mode: [p for p in ctx.profiles if (p.causal if nested else p.causal_top_level or p.causal) == mode]
              for mode in ("refuses", "ignores", "honours")}
        if by["refuses"]:
            ctx.emit_for("LC117", by["refuses"], f"{what} is true: {_names(by['refuses'], 'refuses|refuse')} a causal LiLiCorr "
                         "draft (\"requires non-causal draft attention\")", file="config.json", pointer=key,
                         expected="false", actual="true")
        if by["ignores"]:
            readers = [p for p in by["ignores"] if p.causal_top_level == "honours"]
            hint = (f" ({_names(readers, 'reads|read')} the top-level is_causal instead: write it there)"
                    if readers else "")
            ctx.emit_for("LC133", by["ignores"], f"{what} is true but {_names(by['ignores'], 'never reads|never read')} it "
                         f"and runs full-attention layers bidirectionally{hint}: the draft loads cleanly and scores a "
                         "different function than the one trained", file="config.json", pointer=key,
                         expected="false", actual="true")
        if by["honours"]:
            ctx.emit_for("LC134", by["honours"], f"{what} is true: {_names(by['honours'], 'drafts|draft')} causally as "
                         "declared", file="config.json", pointer=key)
    nested_mult = ctx.parsed.raw.get("dflash_config", {}).get("output_multiplier") \
        if isinstance(ctx.parsed.raw.get("dflash_config"), dict) else None
    readers = [p for p in ctx.profiles if p.output_multiplier_nested_positive]
    if _is_number(nested_mult) and not (nested_mult > 0):
        ctx.emit_for("LC123", readers, f"dflash_config.output_multiplier is {nested_mult}: "
                     f"{_names(readers, 'requires|require')} it > 0 (default 1)", file="config.json", pointer="$.dflash_config.output_multiplier",
                     expected="> 0", actual=nested_mult)
    if cfg.output_multiplier is not None:
        ctx.emit_for("LC129", readers, f"the top-level output_multiplier ({cfg.output_multiplier}) is not read: "
                     f"{_names(readers, 'reads|read')} output_multiplier from dflash_config only", file="config.json",
                     pointer="$.output_multiplier")
    act = cfg.hidden_act
    if act is not None and act.lower() != "silu":
        supporting = [p for p in ctx.profiles if act.lower() in p.extra_hidden_acts]
        absent = [k for k in _ACT_KEYS.get(act.lower(), ()) if not _is_number(ctx.parsed.raw.get(k))]
        if absent:
            ctx.emit_for("LC131", supporting, f"hidden_act is {act!r} without {' and '.join(absent)}: "
                         f"{_names(supporting, 'reads|read')} config.{absent[0]} to build the MLP (an AttributeError)",
                         file="config.json", pointer=f"$.{absent[0]}", expected="a number", actual="absent")
        for mode, rule_id, verb in (("silu-only", "LC131", "refuses|refuse"),
                                    ("unconfirmed", "LC132", "is|are")):
            mine = [p for p in ctx.profiles if p.hidden_act == mode and p not in supporting]
            ctx.emit_for(rule_id, mine, f"hidden_act is {act!r}: {_names(mine, verb)} "
                         + ("it (the DFlash MLP supports only silu)" if rule_id == "LC131" else "not confirmed to "
                            "support it"), file="config.json",
                         pointer="$.hidden_act", expected='"silu"', actual=act)
    _integral_floats(ctx)
    for key, value in (("hidden_size", cfg.hidden_size), ("num_hidden_layers", cfg.num_hidden_layers),
                       ("num_attention_heads", cfg.num_attention_heads), ("intermediate_size", cfg.intermediate_size)):
        if ctx.parsed.invalid(f"$.{key}"):
            continue
        if value is None or value < 1:
            ctx.emit("LC118", f"{key} is {'absent' if value is None else value}", file="config.json",
                     pointer=f"$.{key}", expected=">= 1", actual="absent" if value is None else value)
    g = ctx.geometry
    if cfg.num_key_value_heads is not None and g.num_heads and (cfg.num_key_value_heads < 1
                                                               or g.num_heads % cfg.num_key_value_heads):
        ctx.emit("LC118", f"num_key_value_heads {cfg.num_key_value_heads} does not divide num_attention_heads "
                 f"{g.num_heads}", file="config.json", pointer="$.num_key_value_heads")
    if cfg.head_dim is None and g.hidden_size and g.num_heads and g.hidden_size % g.num_heads:
        ctx.emit("LC118", "head_dim is absent and hidden_size is not divisible by num_attention_heads",
                 file="config.json", pointer="$.head_dim")
    if cfg.vocab_size is None and not ctx.parsed.invalid("$.vocab_size"):
        ctx.emit("LC122", "vocab_size is absent", file="config.json", pointer="$.vocab_size")
    if cfg.layer_types is not None and g.num_layers is not None and len(cfg.layer_types) < g.num_layers:
        ctx.emit("LC119", f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft layers",
                 file="config.json", pointer="$.layer_types", expected=g.num_layers, actual=len(cfg.layer_types))
    elif cfg.layer_types is not None and g.num_layers is not None and len(cfg.layer_types) > g.num_layers:
        exact = [p for p in ctx.profiles if p.layer_types_length_exact]
        lenient = [p for p in ctx.profiles if not p.layer_types_length_exact]
        ctx.emit_for("LC119", exact, f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft layers: "
                     f"{_names(exact, 'reads|read')} the config through transformers' Qwen3Config, which refuses it "
                     "(\"num_hidden_layers must be equal to the number of layer_types\")", file="config.json",
                     pointer="$.layer_types", expected=g.num_layers, actual=len(cfg.layer_types))
        ctx.emit_for("LC143", lenient, f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft "
                     f"layers; {_names(lenient, 'reads|read')} the first ones", file="config.json",
                     pointer="$.layer_types", expected=g.num_layers, actual=len(cfg.layer_types))
    swa = cfg.dflash.swa_window_size
    if cfg.layer_types and "sliding_attention" in cfg.layer_types and not cfg.sliding_window:
        readers = [p for p in ctx.profiles if p.swa_window_size_read and swa is not None and swa >= 1]
        strict = [p for p in ctx.profiles if p not in readers]
        if strict:
            ctx.emit("LC119", "a layer is sliding_attention but sliding_window is not set"
                     + (f" ({_names(strict, 'reads|read')} no window from dflash_config.swa_window_size; "
                        f"{_names(readers, 'takes|take')} it from there)" if readers else ""),
                     runtimes=[p.name for p in strict] if readers else (), file="config.json",
                     pointer="$.sliding_window")
    if (cfg.layer_types and "sliding_attention" in cfg.layer_types and cfg.sliding_window
            and cfg.model_type in SLIDING_WINDOW_FLAG_MODEL_TYPES and ctx.parsed.raw.get("use_sliding_window") is not True):
        # transformers' Qwen2 / Qwen3 config classes keep sliding_window only with use_sliding_window true
        dropping = [p for p in ctx.profiles if p.sliding_window_needs_flag
                    and not (p.swa_window_size_read and swa is not None and swa >= 1)]
        ctx.emit_for("LC119", dropping, f"a layer is sliding_attention but use_sliding_window is not true: the "
                     f"{cfg.model_type} config class then sets sliding_window to None, and "
                     f"{_names(dropping, 'refuses|refuse')} the sliding layers (no window)", file="config.json",
                     pointer="$.use_sliding_window", expected="true",
                     actual=json.dumps(ctx.parsed.raw.get("use_sliding_window")))
    if cfg.dflash.use_swa:
        if swa is None and not cfg.sliding_window:
            ctx.emit("LC119", "dflash_config.use_swa is true but neither swa_window_size nor sliding_window is set",
                     file="config.json", pointer="$.dflash_config.swa_window_size")
        elif (swa is None and cfg.model_type in SLIDING_WINDOW_FLAG_MODEL_TYPES
              and ctx.parsed.raw.get("use_sliding_window") is not True):
            dropping = [p for p in ctx.profiles if p.sliding_window_needs_flag and p.use_swa == "applied"]
            ctx.emit_for("LC119", dropping, f"dflash_config.use_swa is true with no swa_window_size, and "
                         f"sliding_window {cfg.sliding_window} without use_sliding_window: "
                         f"{_names(dropping, 'reads|read')} the config through transformers' Qwen3Config, which "
                         "drops sliding_window, and refuses the sliding layers (\"requires a window size\")",
                         file="config.json", pointer="$.use_sliding_window", expected="true",
                         actual="absent" if cfg.use_sliding_window is None else cfg.use_sliding_window)
        if swa is not None and swa < 1:
            for mode, rule_id, verb, text in (
                    ("refuses", "LC135", "refuses|refuse", "it"),
                    ("literal", "LC136", "passes|pass", f"{swa} through as the layers' window"),
                    ("ignored", "LC137", "does not read|do not read", "use_swa / swa_window_size")):
                mine = [p for p in ctx.profiles if p.swa_window_zero == mode]
                ctx.emit_for(rule_id, mine, f"dflash_config.use_swa is true with swa_window_size {swa}: "
                             f"{_names(mine, verb)} {text}", file="config.json",
                             pointer="$.dflash_config.swa_window_size", expected=">= 1", actual=swa)
        if cfg.layer_types is None:
            ignoring = [p for p in ctx.profiles if p.use_swa == "ignored"]
            ctx.emit_for("LC138", ignoring, f"dflash_config.use_swa is true and layer_types is absent: "
                         f"{_names(ignoring, 'does not read|do not read')} use_swa: every layer is served with full attention "
                         "(the others make every layer sliding)", file="config.json", pointer="$.layer_types",
                         expected="layer_types", actual="absent")
    _window_semantics(ctx)
    _rope_theta(ctx)
    unknown = sorted({t for t in cfg.layer_types or [] if t not in ("full_attention", "sliding_attention")})
    if unknown:
        ctx.emit("LC119", f"unknown layer_types {unknown}", file="config.json", pointer="$.layer_types")
    if cfg.draft_id_to_target_id is not None or (cfg.draft_vocab_size is not None and cfg.vocab_size is not None
                                                 and cfg.draft_vocab_size != cfg.vocab_size):
        ignoring = [p for p in ctx.profiles if not p.reads_draft_vocab]
        ctx.emit_for("LC120", [p for p in ctx.profiles if p.reads_draft_vocab], "the config declares a "
                     "reduced/remapped draft vocabulary; LiLiCorr drafts over the full target vocabulary",
                     file="config.json", pointer="$.draft_vocab_size")
        ctx.emit_for("LC149", ignoring, f"the config declares a reduced/remapped draft vocabulary, which "
                     f"{_names(ignoring, 'never reads|never read')}: candidates come from the target's full head, "
                     "the function trained only if the drafter was trained over the full vocabulary",
                     file="config.json", pointer="$.draft_vocab_size")
    if (cfg.model_dtype or "").lower() in ("float16", "fp16", "half"):
        ctx.emit("LC121", "torch_dtype is float16; DFlash drafts overflow in fp16 (acceptance fell to 0.06 of 15 "
                 "in lmdeploy#4991)", file="config.json", pointer="$.torch_dtype")


_names = names

# model types whose transformers config class keeps sliding_window only with use_sliding_window true
SLIDING_WINDOW_FLAG_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def _window_semantics(ctx: Context) -> None:
    """Sliding-window layers mean different functions on different runtimes (RuntimeProfile.sliding_semantics)."""
    cfg = ctx.config
    if not ctx.geometry.lilicorr_enabled:
        return
    swa = cfg.dflash.swa_window_size
    listed = bool(cfg.layer_types) and "sliding_attention" in (cfg.layer_types or [])
    serving = []
    dropped = cfg.model_type in SLIDING_WINDOW_FLAG_MODEL_TYPES and ctx.parsed.raw.get("use_sliding_window") is not True
    for p in ctx.profiles:
        window = None if p.sliding_window_needs_flag and dropped else cfg.sliding_window  # LC119 for those
        window = window or (swa if p.swa_window_size_read and swa is not None and swa >= 1 else None)
        by_use_swa = cfg.dflash.use_swa is True and cfg.layer_types is None and p.use_swa == "applied" and bool(
            swa if swa is not None and swa >= 1 else cfg.sliding_window)
        if (listed and window) or by_use_swa:
            serving.append(p)
    known = [p for p in serving if p.sliding_semantics]
    if len({p.sliding_semantics for p in known}) > 1:
        by: dict[str, list[RuntimeProfile]] = {}
        for p in known:
            by.setdefault(p.sliding_semantics or "", []).append(p)
        ctx.emit("LC144", "sliding-window layers are served differently: " + "; ".join(
            f"{names(ps, 'runs|run')} them {what}" for what, ps in by.items()) + ": the draft computes the trained "
            "function only on the runtimes matching its training", runtimes=[p.name for p in known],
            file="config.json", pointer="$.layer_types" if listed else "$.dflash_config.use_swa")


def _rope_theta(ctx: Context) -> None:
    """rope_theta absent: each runtime assumes its own default (RuntimeProfile.rope_theta_default)."""
    cfg = ctx.config
    params = cfg.rope_parameters if isinstance(cfg.rope_parameters, dict) else {}
    if cfg.rope_theta is not None or "rope_theta" in params or ctx.parsed.invalid("$.rope_theta"):
        return
    known = [p for p in ctx.profiles if p.rope_theta_default]
    by: dict[str, list[RuntimeProfile]] = {}
    for p in known:
        by.setdefault(p.rope_theta_default or "", []).append(p)
    text = "rope_theta is absent: " + "; ".join(f"{names(ps, 'assumes|assume')} {what}" for what, ps in by.items())
    ctx.emit_for("LC147", known, text, file="config.json", pointer="$.rope_theta", expected="the trained rope_theta",
                 actual="absent")


# activations beyond silu that read their own constants from config.json (dflash.py DFlashMLP: swigluoai)
_ACT_KEYS = {"swigluoai": ("swiglu_alpha", "swiglu_limit")}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# integer settings by the class of code that reads them, and the profile field saying what that code does
_INTEGRAL_FLOAT = {"lilicorr": lambda p: p.integral_float_lilicorr, "backbone": lambda p: p.integral_float_backbone,
                   "typed": lambda p: p.integral_float_typed or p.integral_float_backbone,
                   "mask_token": lambda p: p.integral_float_mask_token}
# the backbone integers the transformers config class declares as int fields (the rest are extra keys it keeps as
# written)
_INT_TYPED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size")
_INT_LILICORR = ("lilicorr_candidate_topk", "lilicorr_hidden_size", "lilicorr_num_layers", "lilicorr_num_heads",
                 "lilicorr_factor_dim")
_INT_BACKBONE_TOP = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "vocab_size", "block_size", "num_target_layers")
_INT_BACKBONE_NESTED = ("block_size", "num_target_layers", "conv_kernel_size", "conv_group_size")


def _integral_floats(ctx: Context) -> None:
    """Whole-number floats where the runtimes need integers: config.py reads 4.0 as 4 for every other check;
    each runtime casts, crashes or refuses (the audit in docs/validate.md)."""
    raw = ctx.parsed.raw
    nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    found: dict[str, list[str]] = {"lilicorr": [], "backbone": [], "typed": [], "mask_token": []}

    def floaty(v: Any) -> bool:
        return isinstance(v, float) and math.isfinite(v) and v.is_integer()

    found["lilicorr"] = [f"dflash_config.{k}" for k in _INT_LILICORR if floaty(nested.get(k))]
    found["backbone"] = ([k for k in _INT_BACKBONE_TOP if floaty(raw.get(k)) and k not in _INT_TYPED]
                         + [f"dflash_config.{k}" for k in _INT_BACKBONE_NESTED if floaty(nested.get(k))])
    found["typed"] = [k for k in _INT_TYPED if floaty(raw.get(k))]
    found["mask_token"] = ([k for k in ("mask_token_id",) if floaty(raw.get(k))]
                           + [f"dflash_config.{k}" for k in ("mask_token_id",) if floaty(nested.get(k))])
    verbs = {"crashes": ("LC139", "uses|use", "it uncast (a TypeError at build)"),
             "refuses": ("LC139", "refuses|refuse", "it (an explicit integer check)"),
             "config-class": ("LC139", "refuses|refuse", "it: transformers' config class declares these fields int "
                              "and its strict validation rejects a float (\"expected int, got float\")"),
             "unconfirmed": ("LC140", "is|are", "not confirmed to cast it"),
             "casts": ("LC141", "casts|cast", "it with int()")}
    for kind, keys in found.items():
        if not keys:
            continue
        for mode, (rule_id, verb, rest) in verbs.items():
            mine = [p for p in ctx.profiles if _INTEGRAL_FLOAT[kind](p) == mode]
            ctx.emit_for(rule_id, mine, f"{', '.join(keys)} written as a whole-number float: {_names(mine, verb)} "
                         f"{rest}", file="config.json", pointer=f"$.{keys[0]}", subjects=keys)


def _sibling_route(ctx: Context, family: str, arch: str | None) -> None:
    """Which runtimes load this sibling head under this architecture (RuntimeProfile.sibling_routes)."""
    by: dict[str, list[tuple[RuntimeProfile, str]]] = {"refuses": [], "unconfirmed": []}
    for p in ctx.profiles:
        verdict, why = p.sibling_route(family, arch)
        if verdict in by:
            by[verdict].append((p, why))
    for verdict, rule_id in (("refuses", "LC014"), ("unconfirmed", "LC015")):
        for p, why in by[verdict]:
            ctx.emit(rule_id, f"{family} head declared as {arch}: {why}", runtimes=[p.name], file="config.json",
                     pointer="$.architectures[0]", actual=arch)


@check
def speculator_keys(ctx: Context) -> None:
    """Keys the runtimes' speculators and backbones read beyond the head geometry."""
    cfg = ctx.config
    if cfg.dflash.sample_from_anchor:
        refusing = [p for p in ctx.profiles if p.sample_from_anchor_refused]
        ctx.emit_for("LC174", refusing, f"dflash_config.sample_from_anchor is true: {_names(refusing, 'refuses|refuse')} "
                     "it (\"sample_from_anchor=True is not supported for DFlash\")", file="config.json",
                     pointer="$.dflash_config.sample_from_anchor", expected="absent or false", actual=True)
    eagle = ctx.parsed.raw.get("eagle_config")
    declared = [("$.dflash_config.use_aux_hidden_state", cfg.dflash.use_aux_hidden_state),
                ("$.eagle_config.use_aux_hidden_state",
                 eagle.get("use_aux_hidden_state") if isinstance(eagle, dict) else None),
                ("$.use_aux_hidden_state", cfg.use_aux_hidden_state)]
    # qwen3_dflash.py: dflash_config over eagle_config, then the top level
    path, value = next(((k, v) for k, v in declared if v is not None), (None, None))
    if value is False:
        readers = [p for p in ctx.profiles if p.use_aux_hidden_state_read]
        ctx.emit_for("LC175", readers, f"use_aux_hidden_state is false ({path[2:]}): {_names(readers, 'builds|build')} "
                     "no fc and drops fc.weight, so the draft runs without the target's hidden states",
                     file="config.json", pointer=path, expected="true or absent", actual=False)


@check
def sibling_config(ctx: Context) -> None:
    g, cfg = ctx.geometry, ctx.config
    d = cfg.dflash
    if g.family == "dflash2":
        rank, top_k = d.selector_rank, d.selector_top_k
        pair = [p for p in ctx.profiles if p.selector_check == "pair"]
        ranged = [p for p in ctx.profiles if p.selector_check == "range"]
        indexed = [p for p in ctx.profiles if p.selector_check == "indexed"]
        problems = [f"selector_{k} is absent" for k, v in (("rank", rank), ("top_k", top_k)) if v is None]
        problems += [f"selector_{k} is {v}" for k, v in (("rank", rank), ("top_k", top_k)) if v is not None and v < 0]
        if top_k is not None and g.vocab_size is not None and top_k > g.vocab_size:
            problems.append(f"selector_top_k {top_k} exceeds vocab_size {g.vocab_size}")
        if problems:
            ctx.emit_for("LC150", indexed, f"{'; '.join(problems)}: {_names(indexed, 'reads|read')} both keys with a "
                         "plain index (a KeyError without them), builds the selector's sizes from them and takes the "
                         "top selector_top_k of the vocabulary at every step", file="config.json",
                         pointer="$.dflash_config.selector_top_k")
        if (rank is None) != (top_k is None) or any(v is not None and v < 0 for v in (rank, top_k)):
            ctx.emit_for("LC150", pair, f"selector_rank is {rank} and selector_top_k is {top_k}: "
                         f"{_names(pair, 'needs|need')} both (>= 0) or neither", file="config.json",
                         pointer="$.dflash_config.selector_rank")
        elif not rank:
            required = [p for p in ctx.profiles if p.selector_required]
            ctx.emit_for("LC150", required, f"selector_rank is {rank}: {_names(required, 'refuses|refuse')} a "
                         "DFlash2 draft without a candidate selector (\"DFlash selector draft requires "
                         "dflash_config.selector_rank\")", file="config.json", pointer="$.dflash_config.selector_rank",
                         expected=">= 1", actual=rank)
        bad = []
        if rank is None or rank < 1:
            bad.append(f"selector_rank {rank} < 1")
        if top_k is None or top_k < 2 or (g.vocab_size is not None and top_k > g.vocab_size):
            bad.append(f"selector_top_k {top_k} outside [2, {g.vocab_size}]")
        if bad:
            ctx.emit_for("LC150", ranged, f"{'; '.join(bad)}: {_names(ranged, 'refuses|refuse')} it",
                         file="config.json", pointer="$.dflash_config.selector_top_k")
        if not g.has_conv and not ctx.parsed.invalid("$.dflash_config.conv_kernel_size"):
            indexed = [p for p in ctx.profiles if p.dflash2_conv_indexed]
            ctx.emit("LC151", "a DFlash2 head without conv_kernel_size / conv_group_size: its convolutions are "
                     "mandatory (" + (f"{names(indexed, 'reads|read')} both with a plain index; " if indexed else "")
                     + "Model-Optimizer refuses the export)",
                     file="config.json", pointer="$.dflash_config.conv_kernel_size", expected="both > 0")
    if g.family == "dspark":
        readers = [p for p in ctx.profiles if p.markov_rank_top_level]
        top = cfg.markov_rank
        if top is None or top <= 0:
            where = (f" (dflash_config.markov_rank is {d.markov_rank}, but {_names(readers, 'reads|read')} the top "
                     "level only)") if d.markov_rank is not None and top is None else ""
            ctx.emit_for("LC152", readers, f"markov_rank is {top if top is not None else 'absent'} at the top "
                         f"level{where}: {_names(readers, 'requires|require')} markov_rank > 0",
                         file="config.json", pointer="$.markov_rank", expected="> 0",
                         actual=top if top is not None else "absent")
        kind = g.markov_head_type
        if kind is not None:
            refuse = [p for p in ctx.profiles if p.markov_head_types and kind not in p.markov_head_types]
            ctx.emit_for("LC153", refuse, f"markov_head_type {kind!r}: {_names(refuse, 'builds|build')} only "
                         + " / ".join(sorted({t for p in refuse for t in p.markov_head_types})),
                         file="config.json", pointer="$.markov_head_type", actual=kind)
    if g.family == "domino":
        checkers = [p for p in ctx.profiles if p.domino_checks]
        if d.shift_label is not None and not isinstance(d.shift_label, bool) or d.shift_label is None:
            raw = ctx.parsed.raw.get("dflash_config", {}) if isinstance(ctx.parsed.raw.get("dflash_config"),
                                                                         dict) else {}
            shown = json.dumps(raw.get("shift_label")) if "shift_label" in raw else "absent"
            ctx.emit_for("LC155", checkers, f"dflash_config.shift_label is {shown}: "
                         f"{_names(checkers, 'requires|require')} a JSON bool", file="config.json",
                         pointer="$.dflash_config.shift_label", expected="true | false", actual=shown)
        if d.pure_draft_prefix_len != 1:
            ctx.emit_for("LC156", checkers, f"dflash_config.pure_draft_prefix_len is {d.pure_draft_prefix_len}: "
                         f"{_names(checkers, 'serves|serve')} only 1", file="config.json",
                         pointer="$.dflash_config.pure_draft_prefix_len", expected=1, actual=d.pure_draft_prefix_len)
        dims = [p for p in ctx.profiles if p.domino_dims_required]
        for key, value in (("gru_hidden_dim", g.gru_hidden_dim), ("emb_dim", g.emb_dim)):
            if value is None:
                ctx.emit_for("LC157", dims, f"{key} is missing or < 1: {_names(dims, 'requires|require')} it",
                             file="config.json", pointer=f"$.dflash_config.{key}", expected=">= 1")
        if d.emb_dim is not None and cfg.emb_dim is not None and d.emb_dim != cfg.emb_dim:
            ctx.emit_for("LC158", checkers, f"dflash_config.emb_dim {d.emb_dim} and the top-level emb_dim "
                         f"{cfg.emb_dim} differ: {_names(checkers, 'refuses|refuse')} it (\"emb_dim differs\")",
                         file="config.json", pointer="$.emb_dim", expected=d.emb_dim, actual=cfg.emb_dim)
        block = d.block_size if d.block_size is not None else cfg.block_size
        if block is not None and block <= 1:
            ctx.emit_for("LC159", checkers, f"block_size is {block}: {_names(checkers, 'refuses|refuse')} "
                         "a Domino draft with block_size <= 1", file="config.json", pointer="$.block_size",
                         expected="> 1", actual=block)
