"""The DFlash backbone's config: causality, activation, sizes, attention windows, RoPE, vocabulary, dtype and the speculator keys (LC117-LC123, LC129-LC138, LC143, LC144, LC147, LC149, LC174, LC175, LC180)."""

from __future__ import annotations

import json
import math
import re

from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES
from lilicorr_ckpt.checks.config.common import CFG, is_number
from lilicorr_ckpt.checks.config.schema import integral_floats
from lilicorr_ckpt.checks.config.types import config_read
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.families import FAMILIES
from lilicorr_ckpt.runtimes import RuntimeProfile

# ---------------------------------------------------------------- catalogue
rule(
    "LC117",
    "causal",
    "error",
    CFG,
    'The draft is declared causal, which the runtime refuses ("requires non-causal").',
    "Set dflash_config.causal (and is_causal) to false.",
    doc="Fires when `dflash_config.causal` or the top-level `is_causal` is true, for the runtimes that refuse "
    "a causal draft: TensorRT-LLM. SGLang's behaviour is LC133, vLLM's LC134.",
    why='TensorRT-LLM refuses the config ("requires non-causal draft attention"). The same checkpoint loads '
    "on the other runtimes, with different results (see LC133 and LC134), so the flag decides where the "
    "drafter can be served at all.",
    example='    "dflash_config": {"causal": true}',
)
rule(
    "LC118",
    "backbone-geometry",
    "error",
    CFG,
    "A backbone geometry key is missing or invalid.",
    "Write the draft's hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size.",
    doc="Fires when hidden_size, num_hidden_layers, num_attention_heads or intermediate_size is absent or < "
    "1; when num_key_value_heads is < 1 or does not divide num_attention_heads; when head_dim is absent "
    "and hidden_size is not divisible by num_attention_heads; when num_hidden_layers names more "
    "layers than the files hold tensors (that count is not expanded); and when draft_vocab_size is negative, "
    "for the runtimes whose draft head is sized by it (vLLM's DFlash, DFlash2 and DSpark), or 0 for the same "
    "runtimes (no drafted token comes from the trained head: DFlash's draft logits are all -inf).",
    why="These keys size every backbone tensor. Without them no loader can build the draft's layers, and the "
    "checker cannot list the tensors either (backbone coverage is then skipped: LC215). Grouped-query "
    "attention needs the key/value heads to divide the query heads.",
    example='    "num_attention_heads": 16, "num_key_value_heads": 6',
)
rule(
    "LC183",
    "intermediate-size-default",
    "warning",
    CFG,
    "intermediate_size is absent: the runtime builds its config class's default MLP width and zero-pads the "
    "trained MLP tensors into it.",
    "Write the trained intermediate_size.",
    doc="Fires when config.json has no `intermediate_size`, the model_type's config class has a default for it "
    "(transformers' classes: Qwen3Config and Qwen2Config 22016, LlamaConfig 11008, MistralConfig 14336, and the "
    "other common decoder types), and the draft layers' MLP tensors (float or NVFP4-packed) are of one width no "
    "larger than that default, for the runtimes whose linear weight loaders zero-pad a narrower tensor: "
    "SGLang (LC118 for the others, and for every runtime when the tensors are wider or of several widths).",
    why="SGLang reads the config through transformers' config class of its model_type (Qwen3Config for a qwen3 "
    "drafter), whose default fills the absent key, and its "
    "MergedColumnParallelLinear / RowParallelLinear weight loaders pad a loaded weight narrower than the "
    "parameter with zeros (pad_or_narrow_weight): the padded gate and up rows give silu(0) * 0 = 0 and the "
    "padded down_proj columns add nothing, so the trained function is served, at the default's memory and "
    "compute. vLLM narrows the loaded weight to the parameter and refuses the narrower tensor.",
    example='    config.json without "intermediate_size", MLP tensors of width 3072 (SGLang builds 22016).',
)
rule(
    "LC184",
    "draft-multiplier-not-finite",
    "error",
    CFG,
    "A multiplier the draft applies when it drafts (DFlash2's dflash_config.output_multiplier and "
    "input_embedding_scale, the top-level logit_scale) is NaN or infinite: the draft loads and serves NaN.",
    "Write the finite value the drafter was trained with, or remove the key (default 1).",
    doc="Fires on a DFlash2 head when dflash_config.output_multiplier or dflash_config.input_embedding_scale is "
    "NaN or infinite, for the runtimes that read the key with float(): SGLang (output_multiplier) and vLLM "
    "(both); and on any head when the top-level logit_scale is, for the runtimes that build the draft head's "
    "logits processor with it: vLLM (qwen3_dflash.py, qwen3_dspark.py).",
    why="SGLang's parser refuses `output_multiplier <= 0`, which NaN passes; DFlash2DraftModel then multiplies "
    "every candidate logit by it. vLLM's qwen3_dflash2.py passes output_multiplier to the candidates' "
    "LogitsProcessor as its scale and multiplies the input embeddings by input_embedding_scale. Every score "
    "the draft serves is NaN. No other head reads either key. vLLM's DFlash-family model classes build their "
    'logits processor with `scale=getattr(config, "logit_scale", 1.0)`.',
    example='    "dflash_config": {"output_multiplier": NaN}',
)
rule(
    "LC119",
    "attention-windows",
    "error",
    CFG,
    "layer_types / sliding_window are inconsistent.",
    "Give one layer_types entry per draft layer; when any layer is sliding_attention, set sliding_window "
    "(and, for a qwen2 / qwen3 model_type, use_sliding_window: true).",
    doc="Fires when `layer_types` has another number of entries than num_hidden_layers (fewer, for every "
    'runtime; more, for SGLang and vLLM); when an entry is neither "full_attention" nor '
    '"sliding_attention"; when a layer is sliding_attention but `sliding_window` is unset (not for vLLM '
    "when `dflash_config.swa_window_size` >= 1, which it reads instead), or, for SGLang and vLLM and a "
    "qwen2 / qwen3 model_type, set without `use_sliding_window: true`; and when `dflash_config.use_swa` is "
    "true with neither swa_window_size nor sliding_window.",
    why="SGLang and vLLM read config.json through transformers' config classes, which refuse a "
    "layer_types list of another length than num_hidden_layers (validate_layer_type) and, for Qwen2 / "
    "Qwen3, keep sliding_window only when use_sliding_window is true. SGLang refuses an unknown entry "
    '("Unsupported DFLASH draft layer type") while vLLM builds it as full attention, another function; '
    'SGLang refuses a sliding layer without sliding_window ("require config.sliding_window"), vLLM takes '
    "the window from swa_window_size and otherwise refuses it (qwen3_dflash.py `_resolve_layer_attention`: "
    "\"requires a window size\"). TensorRT-LLM's reading was not established and is judged as SGLang's.",
    example='    "num_hidden_layers": 2,\n    "layer_types": ["sliding_attention"]',
)
rule(
    "LC120",
    "draft-vocabulary",
    "error",
    CFG,
    "A reduced or remapped draft vocabulary the runtime's draft head does not serve; LiLiCorr needs the full "
    "target vocabulary.",
    "Drop draft_vocab_size / draft_id_to_target_id and train with the target vocabulary.",
    doc="Fires when config.json has `draft_id_to_target_id`, or a `draft_vocab_size` different from "
    "vocab_size: a reduced or remapped draft vocabulary, as EAGLE-3 and speculators drafters use (for vLLM, "
    "which never reads the `draft_id_to_target_id` key, only the draft_vocab_size). It fires "
    "for the runtimes that read the keys and do not serve a reduced vocabulary for the drafter's head: vLLM "
    "for LiLiCorr (its DFlash, DFlash2 and DSpark drafts load one: LC178 says where the ids then go), "
    "TensorRT-LLM for every head.",
    why="LiLiCorr drafts and scores candidates over the target's full vocabulary. vLLM refuses a reduced one "
    '("LiLiCorr candidates require the full target vocabulary"); what TensorRT-LLM does with it was not '
    "established. SGLang never reads the keys (LC149).",
    example='    "vocab_size": 151936, "draft_vocab_size": 32000',
)
rule(
    "LC121",
    "fp16-dtype",
    "warning",
    CFG,
    "The draft is stored as float16, which overflows in DFlash drafting.",
    "Export bfloat16.",
    doc='Fires when config.json\'s `torch_dtype` (or `dtype`) is float16 ("float16", "fp16" or "half").',
    why="Every runtime loads float16 weights, but DFlash drafting overflows in float16: in one LMDeploy "
    "report acceptance fell to 0.06 of 15. The drafter serves and barely helps, with no error.",
    example='    "torch_dtype": "float16"',
)
rule(
    "LC122",
    "vocab-size",
    "error",
    CFG,
    "vocab_size is missing; candidates and mask ids cannot be checked.",
    "Write the target's vocab_size.",
    doc="Fires when config.json has no `vocab_size` (one of the wrong type is LC001's).",
    why="The vocabulary sizes the mask-token range, the candidate top-K bound, an owned lm_head and the "
    "sibling heads' tables. Without it those checks cannot run, and nothing ties the draft to its "
    "target's vocabulary (LC503 needs it too).",
    example='    {"architectures": ["LiLiCorrDraftModel"], "hidden_size": 2048, "num_hidden_layers": '
    "2, ...}\n\n"
    'with no "vocab_size" key.',
)
rule(
    "LC123",
    "output-multiplier",
    "error",
    CFG,
    "dflash_config.output_multiplier is not > 0: the runtime's DFlash config parser refuses it, or its first "
    "draft step fails on it.",
    "Remove output_multiplier (default 1) or write the positive value the drafter was trained with.",
    doc="Fires when `dflash_config.output_multiplier` is a number <= 0, for the runtimes that read it there "
    "and require it positive: SGLang for every head (a NaN passes that check: LC184), and vLLM for a DFlash2 "
    "head, whose first draft step fails on it.",
    why='SGLang\'s DFlash config parser refuses the config ("must be positive"). vLLM applies the multiplier '
    "only to DFlash2's candidate logits (qwen3_dflash2.py), through a top-k selection that raises for a "
    "non-positive scale (logits_processor.py get_top_k_tokens) at the first draft step; it does not apply it "
    "on the other heads, and TensorRT-LLM does not read it, so they load the same file.",
    example='    "dflash_config": {"output_multiplier": 0}',
)
rule(
    "LC129",
    "output-multiplier-not-read",
    "info",
    CFG,
    "A top-level output_multiplier: the runtime reads it only from dflash_config, so this value is ignored.",
    "Move it into dflash_config (or drop it: the default is 1).",
    doc="Fires when config.json has a top-level `output_multiplier`, for the runtimes that read the "
    "multiplier only from dflash_config: SGLang.",
    why="SGLang never reads the top-level key: a drafter trained with a multiplier other than 1 is served "
    "there with 1, without an error. vLLM does not apply the multiplier on the LiLiCorr path and "
    "TensorRT-LLM does not read it.",
    example='    "output_multiplier": 2.0,\n    "dflash_config": {"block_size": 16}',
)
rule(
    "LC131",
    "hidden-act",
    "error",
    CFG,
    "hidden_act is not silu, which the runtime's DFlash MLP refuses.",
    "Train/export with silu (the DFlash backbone supports no other activation).",
    doc='Fires when `hidden_act` is present and is not "silu" (any case), for the runtimes whose DFlash MLP '
    'supports silu only: vLLM; and SGLang, whose MLP also builds "swigluoai", unless it is that one '
    "(then it fires when `swiglu_alpha` or `swiglu_limit` is missing).",
    why='SGLang\'s DFlash MLP refuses other activations ("Unsupported DFlash activation") and reads '
    "config.swiglu_alpha / swiglu_limit for swigluoai (an AttributeError without them); vLLM passes it to "
    "its Qwen2 MLP, which supports silu only.",
    example='    "hidden_act": "gelu"',
)
rule(
    "LC132",
    "hidden-act-unconfirmed",
    "warning",
    CFG,
    "hidden_act is not silu; whether this runtime supports another activation is not confirmed.",
    "Use silu, or test the runtime yourself.",
    doc='Fires when `hidden_act` is present and is not "silu", for the runtimes whose support for other '
    "activations is not confirmed: TensorRT-LLM.",
    why="TensorRT-LLM builds the draft MLP with the activation of the Hugging Face backbone; whether a "
    "non-silu value is honoured, refused or replaced was not traced. It may load and serve a different "
    "function.",
    example='    "hidden_act": "gelu_pytorch_tanh"',
)
rule(
    "LC133",
    "causal-run-bidirectionally",
    "error",
    CFG,
    "The draft is declared causal but the runtime runs its full-attention layers bidirectionally whatever the "
    "config says: it loads cleanly and serves a different function than the one trained.",
    "Serve a causal drafter with a runtime that honours causal, or retrain non-causally.",
    doc="Fires when `dflash_config.causal` is true and the top-level `is_causal` is absent, for the runtimes "
    "that run the draft's full-attention layers bidirectionally whatever that key says: SGLang (an explicit "
    "`is_causal: false` is read first, and states the bidirectional layers SGLang runs).",
    why="SGLang never reads dflash_config.causal and builds the full-attention layers as encoder-only "
    "(bidirectional). A drafter trained causally loads cleanly and scores a different function than the "
    "one trained: a silent mis-load, hence an error. SGLang does read the top-level is_causal (writing "
    "the flag there is the fix).",
    example='    "dflash_config": {"causal": true}',
)
rule(
    "LC134",
    "causal-honoured",
    "info",
    CFG,
    "The draft is declared causal and the runtime drafts causally as declared.",
    "Nothing to do for this runtime.",
    doc="Fires when `dflash_config.causal` or the top-level `is_causal` is true, for the runtimes that draft "
    "causally as declared: vLLM (it reads is_causal, then dflash_config.causal), and SGLang for the "
    "top-level is_causal (models/dflash.py _get_dflash_attention_type).",
    why="Nothing breaks on these runtimes: the draft serves as trained. It is reported so that the per-runtime "
    "verdicts show where a causal drafter is served as declared; SGLang ignores dflash_config.causal "
    "(LC133) and TensorRT-LLM refuses the flag (LC117).",
    example='    "is_causal": true',
)
rule(
    "LC185",
    "causal-contradiction",
    "warning",
    CFG,
    "The top-level is_causal and dflash_config.causal disagree: the runtime reads is_causal and never looks at "
    "dflash_config.causal.",
    "Write the attention the draft was trained with in both keys (or drop dflash_config.causal).",
    doc="Fires when the top-level `is_causal` is false and `dflash_config.causal` is true (or another truthy "
    "value), for the runtimes that read an explicit is_causal first: vLLM (qwen3_dflash.py "
    "`_dflash_layer_causal`: `bool(is_causal)` unless it is None, then dflash_config.causal) and SGLang "
    "(models/dflash.py `_get_dflash_attention_type` reads only the text config's is_causal), in every "
    "supported release: they run the full-attention layers bidirectionally. (The other contradiction, is_causal "
    "true beside a false dflash_config.causal, is reported as the true is_causal those runtimes read: LC134, "
    "LC117.)",
    why="The config states two attentions. Both engines serve the one is_causal names (bidirectional) and load "
    "cleanly, so the draft is served as trained only if it was trained bidirectionally; a reader of dflash_config.causal (the drafter's training code, another tool) sees the "
    "other. A warning, not an error: exports such as DFlash2's write an explicit is_causal that is the "
    "trained value.",
    example='    "is_causal": false,\n    "dflash_config": {"causal": true}',
)
rule(
    "LC135",
    "swa-window-zero",
    "error",
    CFG,
    "use_swa is true with swa_window_size < 1, which the runtime refuses.",
    "Write the trained window (>= 1), or set use_swa false.",
    doc="Fires when `dflash_config.use_swa` is true and `dflash_config.swa_window_size` is < 1, for the "
    "runtimes that refuse it: TensorRT-LLM.",
    why='TensorRT-LLM refuses the config at build ("swa_window_size=0 is invalid"). vLLM passes the value '
    "through (LC136) and SGLang does not read it (LC137), so the three runtimes disagree on one key.",
    example='    "dflash_config": {"use_swa": true, "swa_window_size": 0}',
)
rule(
    "LC136",
    "swa-window-zero-literal",
    "warning",
    CFG,
    "use_swa is true with swa_window_size < 1: the runtime passes the value through as a literal window.",
    "Write the trained window (>= 1), or set use_swa false.",
    doc="Fires when `dflash_config.use_swa` is true and `dflash_config.swa_window_size` is < 1, for the "
    "runtimes that pass the value through as the layers' window: vLLM.",
    why="vLLM builds the sliding layers with a literal window of that size (0) instead of refusing it, so the "
    "draft loads and attends with a window it was not trained with.",
    example='    "dflash_config": {"use_swa": true, "swa_window_size": 0}',
)
rule(
    "LC137",
    "swa-keys-ignored",
    "info",
    CFG,
    "dflash_config.use_swa / swa_window_size are not read by the "
    "runtime (it takes windows from layer_types and sliding_window).",
    "Nothing to do for this runtime.",
    doc="Fires when `dflash_config.use_swa` is true and `dflash_config.swa_window_size` is < 1, for the "
    "runtimes that do not read these keys: SGLang (it takes windows from layer_types and sliding_window; "
    "use_swa is read only for the Nemotron-3.5 layout).",
    why="Nothing is refused on this runtime: the keys are ignored. It is reported so the per-runtime verdicts "
    "show why SGLang loads what TensorRT-LLM refuses (LC135) and vLLM mis-builds (LC136).",
    example='    "dflash_config": {"use_swa": true, "swa_window_size": 0}',
)
rule(
    "LC138",
    "use-swa-ignored",
    "error",
    CFG,
    "use_swa is true without layer_types: the runtime does not read use_swa and serves every layer with full "
    "attention, a different function than the one trained.",
    'Write layer_types (one "sliding_attention" entry per sliding layer) and sliding_window.',
    doc="Fires when `dflash_config.use_swa` is true and config.json has no `layer_types`, for the runtimes "
    "that do not read use_swa: SGLang.",
    why="vLLM and TensorRT-LLM make every layer sliding; SGLang does not read use_swa (outside the "
    "Nemotron-3.5 layout) and serves every layer with full attention. The draft loads cleanly there and "
    "computes a different function than the one trained.",
    example='    "sliding_window": 2048,\n    "dflash_config": {"use_swa": true, "swa_window_size": '
    "2048}\n\n"
    "and no layer_types.",
)
rule(
    "LC144",
    "window-semantics",
    "warning",
    CFG,
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
    "validated for all runtimes.",
)
rule(
    "LC147",
    "rope-theta-defaulted",
    "info",
    CFG,
    "rope_theta is absent; the runtime assumes its default.",
    "Write the trained rope_theta (the target's) in config.json.",
    doc="Fires when config.json has no rope_theta (neither at the top level nor in rope_parameters): the "
    "finding names the value each selected runtime assumes.",
    why="The drafter loads, with the runtime's default base: the transformers default of its config class "
    "(10000 for Qwen3) in SGLang, vLLM and TensorRT-LLM. vLLM's own 1e6 "
    "(`set_default_rope_theta` in qwen3_dflash.py) applies only to a config class that leaves "
    "rope_parameters without a base, which transformers' Qwen3Config never does. That is right only if "
    "the drafter was trained with that base; writing the key makes the checkpoint say what it was "
    "trained with.",
    example='    config.json without "rope_theta", validated with --runtime vllm (assumes 10000).',
)
rule(
    "LC149",
    "draft-vocabulary-ignored",
    "warning",
    CFG,
    "A reduced or remapped draft vocabulary, which the runtime never reads: candidates come from the target's full "
    "head.",
    "Drop draft_vocab_size / draft_id_to_target_id if the drafter was trained over the full vocabulary.",
    doc="Fires when config.json has `draft_id_to_target_id`, or a `draft_vocab_size` different from "
    "vocab_size, for the runtimes that read neither: SGLang; and when it has only `draft_id_to_target_id`, "
    "for the runtimes that read only draft_vocab_size: vLLM (LC120 for the others).",
    why="SGLang's DFlash-family drafts take their candidates from the target's lm_head over the full "
    "vocabulary and never read the draft vocabulary keys. That is the trained function only if the "
    "drafter was trained over the full vocabulary, which the keys say it was not.",
    example='    "vocab_size": 151936, "draft_vocab_size": 32000',
)
rule(
    "LC143",
    "layer-types-long",
    "warning",
    CFG,
    "layer_types has more entries than the draft has layers; the extra entries are ignored.",
    "Give exactly one entry per draft layer.",
    doc="Fires when `layer_types` has more entries than num_hidden_layers, for the runtimes that read the "
    "first entries (LC119 for SGLang and vLLM, whose transformers config class refuses the length).",
    why="These loaders read the first num_hidden_layers entries and ignore the rest, so it serves. But a list of the wrong length can be another model's (the target's layer_types "
    "copied into the draft), and its first entries need not be the pattern the draft was trained with.",
    example='    "num_hidden_layers": 2,\n    "layer_types": ["sliding_attention", "full_attention", '
    '"sliding_attention", "full_attention"]',
)
rule(
    "LC174",
    "sample-from-anchor",
    "error",
    CFG,
    "dflash_config.sample_from_anchor is true, which the runtime's DFlash speculator refuses.",
    "Remove dflash_config.sample_from_anchor (DFlash drafts use the anchor as the bonus token).",
    doc="Fires when dflash_config.sample_from_anchor is true (or, read as a truth value, any truthy JSON value), "
    "for the runtimes that refuse it: vLLM.",
    why="vLLM's DFlash speculator (and the LiLiCorr, DFlash2 and DSpark speculators built on it) refuses "
    'the config at start-up: "sample_from_anchor=True is not supported for DFlash" '
    "(spec_decode/dflash/speculator.py `DFlashSpeculator.__init__`). A DSpark drafter declares it at the "
    "top level, which is read elsewhere.",
    example='    "dflash_config": {"sample_from_anchor": true}',
)
rule(
    "LC175",
    "no-aux-hidden-state",
    "error",
    CFG,
    "use_aux_hidden_state is false: the runtime builds no fc and drops fc.weight, so the draft runs without the "
    "target's hidden states.",
    "Remove use_aux_hidden_state (DFlash-family drafters read the target's states).",
    doc="Fires when `use_aux_hidden_state` is false or another falsy value (null, 0, an empty string) in "
    "dflash_config, eagle_config or at the top level (the first of these that has the key), for the runtimes "
    "that read it: vLLM.",
    why="vLLM builds the fc projection only when use_aux_hidden_state is true (qwen3_dflash.py "
    "`DFlashQwen3Model.__init__`) and then maps every `fc.` tensor to nothing (`load_weights`): the "
    "trained fc.weight is dropped and the draft serves without the target's features it was trained on.",
    example='    "dflash_config": {"use_aux_hidden_state": false}',
)
rule(
    "LC180",
    "attention-sinks-missing",
    "error",
    CFG,
    "The config turns attention sinks on, but the checkpoint has no sink tensor for every layer: the runtime "
    "serves those sinks at their initial values.",
    "Write the trained layers.N.self_attn.attention_sink_bias tensors, or turn the sinks off.",
    doc="Fires for the runtimes that build a learnt attention sink per draft layer from the config, when "
    "some `layers.N.self_attn.attention_sink_bias` tensor is missing: SGLang and vLLM when "
    "`dflash_config.attention_sink_bias` is true; vLLM also, when dflash_config has no such key, when the "
    "top-level `add_swa_attention_sink_bias` is any truthy JSON value (read uncast).",
    why="vLLM's DFlash decoder layer builds `make_attention_sink(num_heads)` when the flag is true "
    "(qwen3_dflash.py `DFlashQwen3DecoderLayer.__init__`), SGLang's attention a per-head parameter (models/"
    "dflash.py), and each loads it like any parameter: without the "
    "tensor the sink keeps its initial value and every attention score is shifted by an untrained logit, "
    "with no error.",
    example='    "add_swa_attention_sink_bias": true\n\n(and no layers.0.self_attn.attention_sink_bias tensor)',
)


rule(
    "LC160",
    "gemma-norm-not-read",
    "error",
    CFG,
    "use_gemma_norm is true, but the runtime release builds plain RMSNorm: every norm serves x * w instead of the "
    "trained x * (1 + w).",
    "Serve a release that reads use_gemma_norm, or (if the drafter was trained with plain RMSNorm) drop the key.",
    doc="Fires when config.json sets `use_gemma_norm: true`, for the runtime releases that never read the key "
    "and build every norm of the draft (q/k norms, the layer norms, `norm`, `hidden_norm`) as a plain "
    "RMSNorm, and for those where reading it was not established (judged as not reading it).",
    why="Gemma's RMSNorm multiplies by (1 + w); a plain RMSNorm by w. With the trained weights (near 0 for a "
    "Gemma norm) every normalised activation is scaled wrong: the draft loads and drafts garbage. SGLang reads "
    "the key from the release that added Gemma drafters; vLLM's DFlash models do not read it.",
    example='    "use_gemma_norm": true',
)
rule(
    "LC161",
    "rope-dim-not-read",
    "error",
    CFG,
    "rope_dim narrows the rotary embedding, but the runtime release rotates the whole head.",
    "Serve a release that reads rope_dim, or retrain with the rotary over the whole head.",
    doc="Fires when `rope_scaling` or `rope_parameters` carries `rope_dim` smaller than head_dim, for the runtime "
    "releases that build the draft's rotary embedding over the whole head dimension whatever it says, and for "
    "those where reading it was not established (judged as not reading it).",
    why="The trained drafter rotates only the first rope_dim dimensions of each head; a full-width rotary "
    "rotates the rest too, so every query and key is served in another frame: the draft loads and its "
    "attention is wrong.",
    example='    "head_dim": 128, "rope_scaling": {"rope_type": "default", "rope_dim": 64}',
)

rule(
    "LC181",
    "norm-eps",
    "error",
    CFG,
    "rms_norm_eps is not a finite number > 0: every RMSNorm of the draft then divides by a norm with no floor.",
    "Write the rms_norm_eps the drafter was trained with (the target's, typically 1e-6 or 1e-5).",
    doc="Fires when config.json's `rms_norm_eps` is a number that is NaN, infinite, zero or negative (one of the "
    "wrong type is LC001's), for every runtime: each builds the draft's RMSNorms (and the q/k norms) with it.",
    why="The loaders store the epsilon on each norm module and use it only when the draft runs, so the drafter "
    "loads without a word. RMSNorm computes x / sqrt(mean(x^2) + eps): with eps <= 0 a row whose mean square is "
    "at most |eps| becomes NaN or infinite, and a NaN eps makes every output NaN. The draft is served, and "
    "proposes nothing the target accepts.",
    example='    "rms_norm_eps": -1e-6',
)


# ---------------------------------------------------------------- checks


def backbone_config(ctx: Context) -> None:
    _causal(ctx)
    _output_multiplier(ctx)
    _hidden_act(ctx)
    integral_floats(ctx)
    _sizes(ctx)
    _layer_types_length(ctx)
    _sliding_window(ctx)
    _use_swa(ctx)
    _window_semantics(ctx)
    _rope_theta(ctx)
    _gemma_norm(ctx)
    _rope_dim(ctx)
    _unknown_layer_types(ctx)
    _draft_vocabulary(ctx)
    _fp16(ctx)
    _norm_eps(ctx)


def _causal(ctx: Context) -> None:
    """LC117 / LC133 / LC134 / LC185: a causal draft, refused, run bidirectionally or honoured per runtime."""
    cfg = ctx.config
    # a truthy value of another JSON type declares the same as true: the runtimes that read it do so as a truth
    # value (LC004), and one that never reads it serves the same bidirectional layers whatever it holds
    block = ctx.parsed.raw.get("dflash_config")
    nested_causal = block.get("causal") if isinstance(block, dict) else None
    # (is_causal true beside a false dflash_config.causal is LC134 / LC117's: is_causal true is reported as read)
    if cfg.is_causal is False and bool(nested_causal):
        # vLLM qwen3_dflash.py _dflash_layer_causal (`if is_causal is not None: return bool(is_causal)`) and SGLang
        # models/dflash.py _get_dflash_attention_type (the text config's is_causal only): is_causal decides
        first = [p for p in ctx.profiles if "honours" in (p.causal_top_level, p.causal)]
        runs = "bidirectionally"
        ctx.emit_for(
            "LC185",
            first,
            f"is_causal is {json.dumps(cfg.is_causal)} but dflash_config.causal is {json.dumps(nested_causal)}: "
            f"{names(first, 'reads|read')} is_causal first and {'run' if len(first) > 1 else 'runs'} the "
            f"full-attention layers {runs}, never looking at dflash_config.causal; the draft is served as "
            f"trained only if it was trained {runs}",
            file="config.json",
            pointer="$.dflash_config.causal",
            expected=json.dumps(cfg.is_causal),
            actual=json.dumps(nested_causal),
        )
    if bool(nested_causal) or cfg.is_causal is True:
        nested = cfg.is_causal is not True
        key = "$.dflash_config.causal" if nested else "$.is_causal"
        what = "dflash_config.causal" if nested else "is_causal"
        if nested and nested_causal is not True:
            what += f" ({json.dumps(nested_causal)}, a true value)"
        # a true top-level is_causal is read by its own statement where a runtime has one (causal_top_level)
        by = {
            mode: [
                p for p in ctx.profiles if (p.causal if nested else p.causal_top_level or p.causal) == mode
            ]
            for mode in ("refuses", "ignores", "honours")
        }
        if nested and cfg.is_causal is False:
            # an explicit is_causal is read before dflash_config.causal (SGLang models/dflash.py
            # _get_dflash_attention_type, vLLM qwen3_dflash.py _dflash_layer_causal): those runtimes run the
            # bidirectional layers is_causal states
            first = [p for p in ctx.profiles if "honours" in (p.causal_top_level, p.causal)]
            by = {mode: [p for p in who if p not in first] for mode, who in by.items()}
        if by["refuses"]:
            ctx.emit_for(
                "LC117",
                by["refuses"],
                f"{what} is true: {names(by['refuses'], 'refuses|refuse')} a causal LiLiCorr "
                'draft ("requires non-causal draft attention")',
                file="config.json",
                pointer=key,
                expected="false",
                actual="true",
            )
        if by["ignores"]:
            readers = [p for p in by["ignores"] if p.causal_top_level == "honours"]
            hint = (
                f" ({names(readers, 'reads|read')} the top-level is_causal instead: write it there)"
                if readers
                else ""
            )
            ctx.emit_for(
                "LC133",
                by["ignores"],
                f"{what} is true but {names(by['ignores'], 'never reads|never read')} it "
                f"and runs full-attention layers bidirectionally{hint}: the draft loads cleanly and scores a "
                "different function than the one trained",
                file="config.json",
                pointer=key,
                expected="false",
                actual="true",
            )
        if by["honours"]:
            ctx.emit_for(
                "LC134",
                by["honours"],
                f"{what} is true: {names(by['honours'], 'drafts|draft')} causally as declared",
                file="config.json",
                pointer=key,
            )


def _dflash2_multipliers(ctx: Context) -> None:
    """LC184: a NaN or infinite multiplier DFlash2 applies when it drafts. SGLang's `output_multiplier <= 0` check
    lets NaN through and DFlash2DraftModel._transform_unary_logits multiplies the logits by it; vLLM's
    qwen3_dflash2.py float()s output_multiplier into the candidates' LogitsProcessor scale and
    input_embedding_scale into the embedding's. No other head applies either."""
    family = ctx.geometry.family
    scale = ctx.parsed.raw.get("logit_scale")
    if is_number(scale) and not math.isfinite(scale):
        readers = [p for p in ctx.profiles if p.logit_scale_read]
        ctx.emit_for(
            "LC184",
            readers,
            f"logit_scale is {scale}: {names(readers, 'builds|build')} the draft head's logits processor with "
            "it as its scale, so every draft logit is NaN",
            file="config.json",
            pointer="$.logit_scale",
            expected="a finite number",
            actual=scale,
        )
    declared = ctx.parsed.raw.get("dflash_config")
    if family != "dflash2" or not isinstance(declared, dict):
        return
    for key in ("output_multiplier", "input_embedding_scale"):
        value = declared.get(key)
        if not is_number(value) or math.isfinite(value):
            continue
        path = f"$.dflash_config.{key}"
        appliers = [p for p in ctx.profiles if config_read(p, family, path) == "float()"]
        ctx.emit_for(
            "LC184",
            appliers,
            f"dflash_config.{key} is {value}: {names(appliers, 'loads|load')} it and "
            f"multiplies every DFlash2 {'logit' if key == 'output_multiplier' else 'input embedding'} by it, "
            "so the draft serves NaN",
            file="config.json",
            pointer=path,
            expected="a finite number",
            actual=value,
        )


def _output_multiplier(ctx: Context) -> None:
    """LC123 / LC129: dflash_config.output_multiplier not > 0, or a top-level one nobody reads."""
    cfg = ctx.config
    declared = ctx.parsed.raw.get("dflash_config")
    nested_mult = declared.get("output_multiplier") if isinstance(declared, dict) else None
    if isinstance(nested_mult, bool):
        # every release that reads it float()s it (SGLang parse_dflash_draft_config, vLLM qwen3_dflash2.py): false
        # is 0.0, which SGLang's `<= 0` check refuses and vLLM's first DFlash2 draft step fails on
        nested_mult = float(nested_mult)
    readers = [p for p in ctx.profiles if p.output_multiplier_nested_positive]
    _dflash2_multipliers(ctx)
    if is_number(nested_mult) and math.isfinite(nested_mult) and not (nested_mult > 0):
        ctx.emit_for(
            "LC123",
            readers,
            f"dflash_config.output_multiplier is {nested_mult}: "
            f"{names(readers, 'requires|require')} it > 0 (default 1)",
            file="config.json",
            pointer="$.dflash_config.output_multiplier",
            expected="> 0",
            actual=nested_mult,
        )
        stepping = [
            p
            for p in ctx.profiles
            if ctx.geometry.family in p.output_multiplier_step_positive and p not in readers
        ]
        ctx.emit_for(
            "LC123",
            stepping,
            f"dflash_config.output_multiplier is {nested_mult}: {names(stepping, 'scales|scale')} the DFlash2 "
            "candidates' logits by it and the first draft step fails on a scale <= 0 (the top-k candidate "
            "selection refuses a non-positive scale)",
            file="config.json",
            pointer="$.dflash_config.output_multiplier",
            expected="> 0",
            actual=nested_mult,
        )
    if cfg.output_multiplier is not None:
        ctx.emit_for(
            "LC129",
            readers,
            f"the top-level output_multiplier ({cfg.output_multiplier}) is not read: "
            f"{names(readers, 'reads|read')} output_multiplier from dflash_config only",
            file="config.json",
            pointer="$.output_multiplier",
        )


def _hidden_act(ctx: Context) -> None:
    """LC131 / LC132: an activation other than silu, refused, unconfirmed or missing its keys."""
    cfg = ctx.config
    act = cfg.hidden_act
    if act is not None and act.lower() != "silu":
        supporting = [p for p in ctx.profiles if act.lower() in p.extra_hidden_acts]
        absent = [k for k in _ACT_KEYS.get(act.lower(), ()) if not is_number(ctx.parsed.raw.get(k))]
        if absent:
            ctx.emit_for(
                "LC131",
                supporting,
                f"hidden_act is {act!r} without {' and '.join(absent)}: "
                f"{names(supporting, 'reads|read')} config.{absent[0]} to build the MLP (an AttributeError)",
                file="config.json",
                pointer=f"$.{absent[0]}",
                expected="a number",
                actual="absent",
            )
        for mode, rule_id, verb in (
            ("silu-only", "LC131", "refuses|refuse"),
            ("unconfirmed", "LC132", "is|are"),
        ):
            mine = [p for p in ctx.profiles if p.hidden_act == mode and p not in supporting]
            ctx.emit_for(
                rule_id,
                mine,
                f"hidden_act is {act!r}: {names(mine, verb)} "
                + (
                    "it (the DFlash MLP supports only silu)"
                    if rule_id == "LC131"
                    else "not confirmed to support it"
                ),
                file="config.json",
                pointer="$.hidden_act",
                expected='"silu"',
                actual=act,
            )


# the config class's intermediate_size where config.json has none, by model_type: the defaults of transformers'
# config classes (5.x, which both engines' AutoConfig builds; no supported SGLang or vLLM release registers a
# class of its own for these types). Every DFlash-family draft class sizes its dense MLP by config.intermediate_size
# whatever the model_type (SGLang models/dflash.py DFlashMLP). tests/conformance/test_config_defaults.py compares
# the table with the installed classes
CONFIG_CLASS_INTERMEDIATE = {
    "deepseek_v3": 18432,
    "gemma": 24576,
    "gemma2": 9216,
    "gemma3_text": 9216,
    "glm4": 13696,
    "gpt_oss": 2880,
    "granite": 11008,
    "llama": 11008,
    "mistral": 14336,
    "mixtral": 14336,
    "nemotron": 24576,
    "olmo2": 11008,
    "phi3": 8192,
    "qwen2": 22016,
    "qwen2_moe": 5632,
    "qwen3": 22016,
    "qwen3_moe": 6144,
}
_MLP_WEIGHT = re.compile(r"^layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\.weight$")


def _trained_mlp_width(ctx: Context) -> int | None:
    """The one width of the draft layers' MLP tensors, or None (none, or not one width): gate/up rows, down_proj
    columns (two 4-bit values a byte when packed)."""
    widths = set()
    for name, info in ctx.names.by_canonical.items():
        m = _MLP_WEIGHT.match(name)
        if not m:
            continue
        if len(info.shape) != 2 or (info.dtype not in FLOAT_DTYPES and info.dtype != "U8"):
            return None
        if m.group(1) != "down_proj":
            widths.add(info.shape[0])
        else:
            widths.add(info.shape[1] * (2 if info.dtype == "U8" else 1))
    return widths.pop() if len(widths) == 1 else None


def _intermediate_absent(ctx: Context) -> list[RuntimeProfile]:
    """LC183 for the releases that build the config class's default MLP width and zero-pad the trained tensors
    into it; the releases left refuse the absent size (LC118)."""
    default = CONFIG_CLASS_INTERMEDIATE.get(ctx.config.model_type or "")
    width = _trained_mlp_width(ctx)
    padded = [p for p in ctx.profiles if p.intermediate_size_absent == "padded"]
    if default is None or width is None or width > default or not padded:
        return ctx.profiles
    ctx.emit_for(
        "LC183",
        padded,
        f"intermediate_size is absent: {names(padded, 'builds|build')} the {ctx.config.model_type} config "
        f"class's default {default} and zero-pads the trained MLP tensors (width {width}) into it: the trained function, with "
        f"{default // max(width, 1)}x the MLP's memory and compute",
        file="config.json",
        pointer="$.intermediate_size",
        expected=width,
        actual="absent",
    )
    return [p for p in ctx.profiles if p not in padded]


def _sizes(ctx: Context) -> None:
    """LC118 / LC122: the backbone sizes missing, invalid or not dividing; vocab_size absent."""
    cfg = ctx.config
    g = ctx.geometry
    for key, value in (
        ("hidden_size", cfg.hidden_size),
        ("num_hidden_layers", cfg.num_hidden_layers),
        ("num_attention_heads", cfg.num_attention_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if ctx.parsed.invalid(f"$.{key}"):
            continue
        if value is None and key == "intermediate_size":
            ctx.emit_for(
                "LC118",
                _intermediate_absent(ctx),
                f"{key} is absent",
                file="config.json",
                pointer=f"$.{key}",
                expected=">= 1",
                actual="absent",
            )
        elif value is None or value < 1:
            ctx.emit(
                "LC118",
                f"{key} is {'absent' if value is None else value}",
                file="config.json",
                pointer=f"$.{key}",
                expected=">= 1",
                actual="absent" if value is None else value,
            )
    g = ctx.geometry
    if (
        cfg.num_key_value_heads is not None
        and g.num_heads
        and (cfg.num_key_value_heads < 1 or g.num_heads % cfg.num_key_value_heads)
    ):
        ctx.emit(
            "LC118",
            f"num_key_value_heads {cfg.num_key_value_heads} does not divide num_attention_heads "
            f"{g.num_heads}",
            file="config.json",
            pointer="$.num_key_value_heads",
        )
    # a head_dim below 1 sizes q/k/v with a negative or empty dimension (vLLM and SGLang: "Trying to create tensor
    # with negative dimension"; SGLang's rotary of a zero-width head divides by zero), where 0 is not read as
    # absent (RuntimeProfile.head_dim_zero_derived)
    head_dim = cfg.head_dim
    sized = [p for p in ctx.profiles if not (head_dim == 0 and p.head_dim_zero_derived)]
    if head_dim is not None and head_dim < 1 and sized and not ctx.parsed.invalid("$.head_dim"):
        ctx.emit_for(
            "LC118",
            sized,
            f"head_dim is {head_dim}"
            + (
                "" if len(sized) == len(ctx.profiles) else f": {names(sized, 'sizes|size')} the heads with it"
            ),
            file="config.json",
            pointer="$.head_dim",
            expected=">= 1",
            actual=head_dim,
        )
    # target_hidden_size sizes fc's input where a release reads it (vLLM qwen3_dflash.py
    # _get_dflash_fc_input_size: `target_hidden_size or hidden_size`): a negative one is a negative dimension
    readers = [p for p in ctx.profiles if config_read(p, g.family, "$.target_hidden_size") != "unread"]
    width = cfg.target_hidden_size
    if width is not None and width < 0 and readers and not ctx.parsed.invalid("$.target_hidden_size"):
        ctx.emit_for(
            "LC118",
            readers,
            f"target_hidden_size is {width}: {names(readers, 'sizes|size')} fc's input with it (a negative "
            "dimension)",
            file="config.json",
            pointer="$.target_hidden_size",
            expected=">= 1",
            actual=width,
        )
    if cfg.head_dim is None and g.hidden_size and g.num_heads and g.hidden_size % g.num_heads:
        ctx.emit(
            "LC118",
            "head_dim is absent and hidden_size is not divisible by num_attention_heads",
            file="config.json",
            pointer="$.head_dim",
        )
    if cfg.vocab_size is None and not ctx.parsed.invalid("$.vocab_size"):
        ctx.emit("LC122", "vocab_size is absent", file="config.json", pointer="$.vocab_size")


def _layer_types_length(ctx: Context) -> None:
    """LC119 / LC143: layer_types shorter or longer than the draft layers."""
    cfg = ctx.config
    g = ctx.geometry
    if cfg.layer_types is not None and g.num_layers is not None and len(cfg.layer_types) < g.num_layers:
        ctx.emit(
            "LC119",
            f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft layers",
            file="config.json",
            pointer="$.layer_types",
            expected=g.num_layers,
            actual=len(cfg.layer_types),
        )
    elif cfg.layer_types is not None and g.num_layers is not None and len(cfg.layer_types) > g.num_layers:
        exact = [p for p in ctx.profiles if p.layer_types_length_exact]
        lenient = [p for p in ctx.profiles if not p.layer_types_length_exact]
        ctx.emit_for(
            "LC119",
            exact,
            f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft layers: "
            f"{names(exact, 'reads|read')} the config through transformers' Qwen3Config, which refuses it "
            '("num_hidden_layers must be equal to the number of layer_types")',
            file="config.json",
            pointer="$.layer_types",
            expected=g.num_layers,
            actual=len(cfg.layer_types),
        )
        ctx.emit_for(
            "LC143",
            lenient,
            f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft "
            f"layers; {names(lenient, 'reads|read')} the first ones",
            file="config.json",
            pointer="$.layer_types",
            expected=g.num_layers,
            actual=len(cfg.layer_types),
        )


def _sliding_window(ctx: Context) -> None:
    """LC119: sliding layers without a window, or with one the config class drops."""
    cfg = ctx.config
    swa = cfg.dflash.swa_window_size
    if cfg.layer_types and "sliding_attention" in cfg.layer_types and not cfg.sliding_window:
        readers = [p for p in ctx.profiles if p.swa_window_size_read and swa is not None and swa >= 1]
        strict = [p for p in ctx.profiles if p not in readers]
        if strict:
            ctx.emit(
                "LC119",
                "a layer is sliding_attention but sliding_window is not set"
                + (
                    f" ({names(strict, 'reads|read')} no window from dflash_config.swa_window_size; "
                    f"{names(readers, 'takes|take')} it from there)"
                    if readers
                    else ""
                ),
                runtimes=[p.name for p in strict] if readers else (),
                file="config.json",
                pointer="$.sliding_window",
            )
    if (
        cfg.layer_types
        and "sliding_attention" in cfg.layer_types
        and cfg.sliding_window
        and cfg.model_type in SLIDING_WINDOW_FLAG_MODEL_TYPES
        and ctx.parsed.raw.get("use_sliding_window") is not True
    ):
        # transformers' Qwen2 / Qwen3 config classes keep sliding_window only with use_sliding_window true
        dropping = [
            p
            for p in ctx.profiles
            if p.sliding_window_needs_flag and not (p.swa_window_size_read and swa is not None and swa >= 1)
        ]
        ctx.emit_for(
            "LC119",
            dropping,
            f"a layer is sliding_attention but use_sliding_window is not true: the "
            f"{cfg.model_type} config class then sets sliding_window to None, and "
            f"{names(dropping, 'refuses|refuse')} the sliding layers (no window)",
            file="config.json",
            pointer="$.use_sliding_window",
            expected="true",
            actual=json.dumps(ctx.parsed.raw.get("use_sliding_window")),
        )


def _swa_on(ctx: Context) -> list[RuntimeProfile]:
    """The profiles that read dflash_config.use_swa as on: `true`, or any truthy value for those that read it as a
    truth value (vLLM qwen3_dflash.py _resolve_layer_attention: `is_sliding = use_swa`)."""
    nested = ctx.parsed.raw.get("dflash_config")
    value = nested.get("use_swa") if isinstance(nested, dict) else None
    if value is None or isinstance(value, bool):
        return list(ctx.profiles) if value else []
    path = "$.dflash_config.use_swa"
    return [p for p in ctx.profiles if value and config_read(p, ctx.geometry.family, path) == "truth"]


def _use_swa(ctx: Context) -> None:
    """LC119 / LC135-LC138: dflash_config.use_swa and swa_window_size as each runtime reads them."""
    cfg = ctx.config
    swa = ctx.config.dflash.swa_window_size
    on = _swa_on(ctx)
    if on:
        if swa is None and not cfg.sliding_window:
            ctx.emit(
                "LC119",
                "dflash_config.use_swa is true but neither swa_window_size nor sliding_window is set",
                runtimes=() if len(on) == len(ctx.profiles) else [p.name for p in on],
                file="config.json",
                pointer="$.dflash_config.swa_window_size",
            )
        elif (
            swa is None
            and cfg.model_type in SLIDING_WINDOW_FLAG_MODEL_TYPES
            and ctx.parsed.raw.get("use_sliding_window") is not True
        ):
            dropping = [p for p in on if p.sliding_window_needs_flag and p.use_swa == "applied"]
            ctx.emit_for(
                "LC119",
                dropping,
                f"dflash_config.use_swa is true with no swa_window_size, and "
                f"sliding_window {cfg.sliding_window} without use_sliding_window: "
                f"{names(dropping, 'reads|read')} the config through transformers' Qwen3Config, which "
                'drops sliding_window, and refuses the sliding layers ("requires a window size")',
                file="config.json",
                pointer="$.use_sliding_window",
                expected="true",
                actual="absent" if cfg.use_sliding_window is None else cfg.use_sliding_window,
            )
        if swa is not None and swa < 1:
            for mode, rule_id, verb, text in (
                ("refuses", "LC135", "refuses|refuse", "it"),
                ("literal", "LC136", "passes|pass", f"{swa} through as the layers' window"),
                ("ignored", "LC137", "does not read|do not read", "use_swa / swa_window_size"),
            ):
                mine = [p for p in on if p.swa_window_zero == mode]
                ctx.emit_for(
                    rule_id,
                    mine,
                    f"dflash_config.use_swa is true with swa_window_size {swa}: {names(mine, verb)} {text}",
                    file="config.json",
                    pointer="$.dflash_config.swa_window_size",
                    expected=">= 1",
                    actual=swa,
                )
        if cfg.layer_types is None:
            ignoring = [p for p in on if p.use_swa == "ignored"]
            ctx.emit_for(
                "LC138",
                ignoring,
                f"dflash_config.use_swa is true and layer_types is absent: "
                f"{names(ignoring, 'does not read|do not read')} use_swa: every layer is served with full attention "
                "(the others make every layer sliding)",
                file="config.json",
                pointer="$.layer_types",
                expected="layer_types",
                actual="absent",
            )


def _unknown_layer_types(ctx: Context) -> None:
    """LC119: layer_types values no runtime knows."""
    cfg = ctx.config
    unknown = sorted({t for t in cfg.layer_types or [] if t not in ("full_attention", "sliding_attention")})
    if unknown:
        ctx.emit("LC119", f"unknown layer_types {unknown}", file="config.json", pointer="$.layer_types")


def _draft_vocabulary(ctx: Context) -> None:
    """LC120 / LC149: a reduced or remapped draft vocabulary."""
    cfg = ctx.config
    reduced = (
        cfg.draft_vocab_size is not None
        and cfg.vocab_size is not None
        and cfg.draft_vocab_size != cfg.vocab_size
    )
    mapped = cfg.draft_id_to_target_id is not None
    if not (reduced or mapped):
        return
    # a release that reads only draft_vocab_size sees no reduced vocabulary in the mapping key alone
    declaring = [p for p in ctx.profiles if reduced or p.reads_draft_id_map_key]
    family = ctx.geometry.family
    # the heads whose draft class loads a reduced vocabulary (LC178 judges what it does with the ids)
    served = [p for p in ctx.profiles if family in p.draft_vocab_mapped or family in p.draft_vocab_unmapped]
    title = FAMILIES[family].TITLE if family in FAMILIES else "the drafter"
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size < 0:
        # vLLM qwen3_dflash.py DFlashQwen3ForCausalLM.__init__: torch.zeros(draft_vocab_size) for the id map
        ctx.emit_for(
            "LC118",
            served,
            f"draft_vocab_size is {cfg.draft_vocab_size}: {names(served, 'builds|build')} the draft head and "
            "its draft-to-target id map from it, a negative tensor size the model's build refuses",
            file="config.json",
            pointer="$.draft_vocab_size",
            expected=">= 0",
            actual=cfg.draft_vocab_size,
        )
    elif cfg.draft_vocab_size == 0:
        # qwen3_dflash.py DFlashQwen3ForCausalLM.compute_logits: a zero-row draft_id_to_target_id scatters no
        # lm_head logit into the draft's vocabulary (`logits_new[:, targets] = logits`), all -inf, whose argmax
        # is token 0 at every draft step; qwen3_dspark.py sizes its head and id map by it alike
        ctx.emit_for(
            "LC118",
            served,
            f"draft_vocab_size is 0: {names(served, 'builds|build')} the draft head and its draft-to-target id "
            "map with no rows, so no drafted token comes from the trained head (DFlash: every draft logit is "
            "-inf and each drafted token is token 0)",
            file="config.json",
            pointer="$.draft_vocab_size",
            expected=">= 1",
            actual=0,
        )
    ctx.emit_for(
        "LC120",
        [p for p in declaring if p.reads_draft_vocab and p not in served],
        "the config declares a reduced/remapped draft vocabulary; "
        + (
            "LiLiCorr drafts over the full target vocabulary"
            if family == "lilicorr"
            else f"{title}'s draft head is not known to serve one there"
        ),
        file="config.json",
        pointer="$.draft_vocab_size",
    )
    trained = ": candidates come from the target's full head, the function trained only if the drafter was trained over the full vocabulary"
    blind = [p for p in ctx.profiles if not p.reads_draft_vocab]
    ctx.emit_for(
        "LC149",
        blind,
        f"the config declares a reduced/remapped draft vocabulary, which {names(blind, 'never reads|never read')}"
        + trained,
        file="config.json",
        pointer="$.draft_vocab_size",
    )
    key_only = [p for p in ctx.profiles if p.reads_draft_vocab and p not in declaring]
    ctx.emit_for(
        "LC149",
        key_only,
        f"the config maps draft ids to target ids in `draft_id_to_target_id`, a key "
        f"{names(key_only, 'never reads|never read')} (only a draft_vocab_size other than the target's "
        "vocabulary selects a reduced one)" + trained,
        file="config.json",
        pointer="$.draft_id_to_target_id",
    )


def _fp16(ctx: Context) -> None:
    """LC121: a float16 draft."""
    cfg = ctx.config
    if (cfg.model_dtype or "").lower() in ("float16", "fp16", "half"):
        ctx.emit(
            "LC121",
            "torch_dtype is float16; DFlash drafts overflow in fp16 (acceptance fell to 0.06 of 15 "
            "in one LMDeploy report)",
            file="config.json",
            pointer="$.torch_dtype",
        )


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
    swa_on = _swa_on(ctx)
    dropped = (
        cfg.model_type in SLIDING_WINDOW_FLAG_MODEL_TYPES
        and ctx.parsed.raw.get("use_sliding_window") is not True
    )
    for p in ctx.profiles:
        window = None if p.sliding_window_needs_flag and dropped else cfg.sliding_window  # LC119 for those
        window = window or (swa if p.swa_window_size_read and swa is not None and swa >= 1 else None)
        by_use_swa = (
            p in swa_on
            and cfg.layer_types is None
            and p.use_swa == "applied"
            and bool(swa if swa is not None and swa >= 1 else cfg.sliding_window)
        )
        if (listed and window) or by_use_swa:
            serving.append(p)
    known = [p for p in serving if p.sliding_semantics]
    if len({p.sliding_semantics for p in known}) > 1:
        by: dict[str, list[RuntimeProfile]] = {}
        for p in known:
            by.setdefault(p.sliding_semantics or "", []).append(p)
        ctx.emit(
            "LC144",
            "sliding-window layers are served differently: "
            + "; ".join(f"{names(ps, 'runs|run')} them {what}" for what, ps in by.items())
            + ": the draft computes the trained "
            "function only on the runtimes matching its training",
            runtimes=[p.name for p in known],
            file="config.json",
            pointer="$.layer_types" if listed else "$.dflash_config.use_swa",
        )


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
    text = "rope_theta is absent: " + "; ".join(
        f"{names(ps, 'assumes|assume')} {what}" for what, ps in by.items()
    )
    ctx.emit_for(
        "LC147",
        known,
        text,
        file="config.json",
        pointer="$.rope_theta",
        expected="the trained rope_theta",
        actual="absent",
    )


def _norm_eps(ctx: Context) -> None:
    """LC181: rms_norm_eps a number that is not finite and > 0 (every runtime builds its norms with it)."""
    eps = ctx.parsed.raw.get("rms_norm_eps")
    if not is_number(eps) or (math.isfinite(eps) and eps > 0):
        return
    ctx.emit(
        "LC181",
        f"rms_norm_eps is {eps}: every RMSNorm of the draft divides by sqrt(mean(x^2) + eps) with no positive floor "
        "(NaN where the mean square is at most |eps|, everywhere for a NaN eps)",
        file="config.json",
        pointer="$.rms_norm_eps",
        expected="a finite number > 0",
        actual=eps,
    )


def _gemma_norm(ctx: Context) -> None:
    """LC160: use_gemma_norm true, for the releases that build plain RMSNorm (RuntimeProfile.gemma_norm_read;
    a release where that was not established is judged as not reading it)."""
    if ctx.parsed.raw.get("use_gemma_norm") is not True:
        return
    plain = [p for p in ctx.profiles if p.gemma_norm_read is not True]
    ctx.emit_for(
        "LC160",
        plain,
        f"use_gemma_norm is true: {names(plain, 'does not read|do not read')} it, so every norm serves as a "
        "plain RMSNorm (x * w, not x * (1 + w))",
        file="config.json",
        pointer="$.use_gemma_norm",
        expected="a release that builds Gemma's RMSNorm",
        actual="plain RMSNorm",
    )


def _rope_dim(ctx: Context) -> None:
    """LC161: rope_scaling / rope_parameters rope_dim < head_dim, for the releases that rotate the whole head."""
    raw = ctx.parsed.raw
    head_dim = ctx.geometry.head_dim
    for key in ("rope_scaling", "rope_parameters"):
        block = raw.get(key)
        dim = block.get("rope_dim") if isinstance(block, dict) else None
        if isinstance(dim, int) and not isinstance(dim, bool) and head_dim and 0 < dim < head_dim:
            full = [p for p in ctx.profiles if p.rope_dim_read is not True]
            ctx.emit_for(
                "LC161",
                full,
                f"{key}.rope_dim is {dim} (head_dim {head_dim}): {names(full, 'rotates|rotate')} all {head_dim} "
                "dimensions of each head, so queries and keys are served in another frame",
                file="config.json",
                pointer=f"$.{key}.rope_dim",
                expected=f"a release that reads rope_dim ({dim} of {head_dim} dimensions rotated)",
                actual=f"{head_dim} dimensions rotated",
            )
            return


# activations beyond silu that read their own constants from config.json (dflash.py DFlashMLP: swigluoai)
_ACT_KEYS = {"swigluoai": ("swiglu_alpha", "swiglu_limit")}


def speculator_keys(ctx: Context) -> None:
    """Keys the runtimes' speculators and backbones read beyond the head geometry."""
    nested = ctx.parsed.raw.get("dflash_config")
    anchor = nested.get("sample_from_anchor") if isinstance(nested, dict) else None
    if anchor:
        # spec_decode/dflash/speculator.py: `if dflash_config.get("sample_from_anchor", False)`, any truthy value
        path = "$.dflash_config.sample_from_anchor"
        refusing = [
            p
            for p in ctx.profiles
            if p.sample_from_anchor_refused
            and (anchor is True or config_read(p, ctx.geometry.family, path) == "truth")
        ]
        ctx.emit_for(
            "LC174",
            refusing,
            f"dflash_config.sample_from_anchor is {json.dumps(anchor)}: {names(refusing, 'refuses|refuse')} "
            'it ("sample_from_anchor=True is not supported for DFlash")',
            file="config.json",
            pointer="$.dflash_config.sample_from_anchor",
            expected="absent or false",
            actual=json.dumps(anchor),
        )
    raw = ctx.parsed.raw
    blocks = [
        ("$.dflash_config.use_aux_hidden_state", raw.get("dflash_config")),
        ("$.eagle_config.use_aux_hidden_state", raw.get("eagle_config")),
        ("$.use_aux_hidden_state", raw),
    ]
    # qwen3_dflash.py DFlashQwen3Model.__init__: eagle_config updated with dflash_config, `.get(key, the top-level
    # attribute, default True)`, used as a truth value: a key present with any falsy value (null included) is off
    path, value = next(
        (
            (k, b["use_aux_hidden_state"])
            for k, b in blocks
            if isinstance(b, dict) and "use_aux_hidden_state" in b
        ),
        ("", True),
    )
    if not value:
        readers = [p for p in ctx.profiles if p.use_aux_hidden_state_read]
        ctx.emit_for(
            "LC175",
            readers,
            f"use_aux_hidden_state is false ({path[2:]}): {names(readers, 'builds|build')} "
            "no fc and drops fc.weight, so the draft runs without the target's hidden states",
            file="config.json",
            pointer=path,
            expected="true or absent",
            actual=json.dumps(value),
        )
    _attention_sinks(ctx)


def _attention_sinks(ctx: Context) -> None:
    """LC180: attention sinks built from the config with no trained tensor to load."""
    raw = ctx.parsed.raw
    nested = raw.get("dflash_config")
    # qwen3_dflash.py DFlashQwen3DecoderLayer: dflash_config.get("attention_sink_bias", the top-level
    # add_swa_attention_sink_bias, default False); a non-bool in dflash_config is LC001's
    if isinstance(nested, dict) and "attention_sink_bias" in nested:
        path, value = "$.dflash_config.attention_sink_bias", nested["attention_sink_bias"] is True
        builders = [p for p in ctx.profiles if p.attention_sinks_built]
    else:
        path, value = "$.add_swa_attention_sink_bias", bool(raw.get("add_swa_attention_sink_bias"))
        builders = [p for p in ctx.profiles if p.attention_sinks_top_level]
    layers = ctx.config.num_hidden_layers
    if not value or not builders or not isinstance(layers, int):
        return
    names_ = set(ctx.names.by_canonical)
    missing = [
        f"layers.{i}.self_attn.attention_sink_bias"
        for i in range(min(layers, 4096))
        if f"layers.{i}.self_attn.attention_sink_bias" not in names_
    ]
    if missing:
        ctx.emit_for(
            "LC180",
            builders,
            f"{path[2:]} turns attention sinks on: {names(builders, 'builds|build')} a sink per draft layer and "
            f"the checkpoint has none for {len(missing)} of {layers} layers ({missing[0]}), served at its initial "
            "value",
            file="config.json",
            pointer=path,
            subjects=missing[:20],
        )
