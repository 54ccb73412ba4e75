"""DSpark: the DFlash backbone with a low-rank Markov head over the previous token (and an optional confidence
head), in DeepSpec's served layout (`markov_head.*`) or Model-Optimizer's flat one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lilicorr_ckpt.families.base import HeadBuilder, HeadGeometry, QuantLinears, Routes

NAME = "dspark"
TITLE = "DSpark"
# Qwen3DSparkModel is DeepSpec's class, what SGLang and vLLM load for a Qwen3-backbone DSpark
ARCHITECTURES = ("DSparkDraftModel", "Qwen3DSparkModel")
PROJECTOR_TYPE: str | None = "dspark"
CONFIG_KEYS = (
    "markov_rank",
    "markov_head_type",
    "enable_confidence_head",
    "use_confidence_head",
    "confidence_head_with_markov",
)
HEAD_PREFIXES = ("markov_head.", "confidence_head.")
# Model-Optimizer's flat names (top level, beside the backbone)
HEAD_NAMES = (
    "markov_w1.weight",
    "markov_w2.weight",
    "gate_proj.weight",
    "gate_proj.bias",
    "joint_proj.weight",
    "joint_proj.bias",
    "confidence_proj.weight",
    "confidence_proj.bias",
)
HUB_TAGS = ("dspark",)
ROUTES: Routes = {
    "sglang": (
        ("Qwen3DSparkModel", "loads", "the entry class of SGLang's dspark model"),
        ("DSparkDraftModel", "loads", "dspark.py registers DSparkDraftModel (EntryClass) as well"),
        (
            "DFlashDraftModel",
            "refuses",
            "SGLang routes DFlashDraftModel as plain DFlash and drops the flat "
            "Model-Optimizer Markov names, leaving the Markov head at its initialisation",
        ),
    ),
    "vllm": (
        ("Qwen3DSparkModel", "loads", "registry.py maps Qwen3DSparkModel to qwen3_dspark"),
        (
            "DSparkDraftModel",
            "loads",
            "config/speculative.py rewrites a Qwen3 DSparkDraftModel (model_type qwen3) to Qwen3DSparkModel",
        ),
        (
            "DFlashDraftModel",
            "refuses",
            "qwen3_dflash.py has no parameter for the flat Model-Optimizer DSpark "
            "names (AutoWeightsLoader refuses them)",
        ),
    ),
    "trtllm": (
        (
            "*",
            "unconfirmed",
            "TensorRT-LLM's Qwen3 DSpark drafter follows the DeepSpec layout; its routing and "
            "checks were not read",
        ),
    ),
}
_MARKOV = {"markov_rank": 8, "markov_head_type": "vanilla"}


def nemotron_35(raw: Mapping[str, Any]) -> bool:
    """SGLang's Nemotron-3.5 draft layout (speculative/dflash_utils.py is_nemotron_35_draft_config, alike in every
    release modelled): architectures naming DFlashDraftModel or Qwen3DSparkModel, has_embed_tokens true,
    has_lm_head not, config.json's quantization_config quant_algo W4A16_NVFP4, eagle_aux_hidden_state_layer_ids
    each target_layer_id + 1, and sample_from_anchor false (dflash_config's, else the top level's, default true)."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not {"DFlashDraftModel", "Qwen3DSparkModel"} & {
        a for a in archs if isinstance(a, str)
    }:
        return False
    if not raw.get("has_embed_tokens") or raw.get("has_lm_head"):
        return False
    qc = raw.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_algo") != "W4A16_NVFP4":
        return False
    nested = raw.get("dflash_config")
    nested = nested if isinstance(nested, dict) else {}
    taps = nested.get("target_layer_ids", raw.get("target_layer_ids"))
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(taps, list) or not isinstance(aux, list) or not taps or len(taps) != len(aux):
        return False
    try:
        if any(int(t) + 1 != int(a) for t, a in zip(taps, aux, strict=True)):
            return False
    except (TypeError, ValueError):
        return False
    return nested.get("sample_from_anchor", raw.get("sample_from_anchor", True)) is False


QUANT_LINEARS: QuantLinears = {
    "vllm": (
        (
            "markov_head.markov_w2",
            None,
            "models/qwen3_dspark.py DSparkMarkovHead.__init__: markov_w2 is a ParallelLMHead built with the "
            "draft's quant_config (prefix model.markov_head.markov_w2)",
        ),
    ),
    # VanillaMarkov / GatedMarkovHead / RNNHead and the confidence head build nn.Linear (float whatever the config)
    "sglang": (
        (
            "markov_head.markov_w2",
            nemotron_35,
            "models/dspark.py Nemotron35VanillaMarkov.__init__ (build_nemotron_35_markov_head, chosen for the "
            "Nemotron-3.5 layout): markov_w2 is a ReplicatedLinear built with the quant_config (prefix "
            "markov_head.markov_w2); every other config builds VanillaMarkov's nn.Linear",
        ),
    ),
}
FIXTURES: Mapping[str, Mapping[str, Any]] = {
    # Qwen3DSparkModel with the Markov keys at the top level and markov_head.* / confidence_head.* tensors
    # (DeepSpec; what SGLang and vLLM serve)
    "dspark-deepspec": {
        "head": False,
        "architecture": "Qwen3DSparkModel",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        **_MARKOV,
    },
    # DSparkDraftModel + auto_map, the Markov keys also in dflash_config, the same tensors
    "dspark-specforge": {
        "head": False,
        "architecture": "DSparkDraftModel",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
        "dflash": {**_MARKOV},
        **_MARKOV,
    },
    # DFlashDraftModel + projector_type "dspark", flat markov_w1 / confidence_proj names (Model-Optimizer's
    # export, which no serving loader read accepts)
    "dspark-modelopt": {
        "head": False,
        "dflash": {"projector_type": "dspark", "use_confidence_head": True, **_MARKOV},
    },
}
DESCRIBED_KEYS = ("markov_rank", "markov_head_type")


def carried(g: HeadGeometry) -> bool:
    return g.family == NAME


def head_tensors(b: HeadBuilder, g: HeadGeometry) -> str | None:
    """The Markov tables W1, W2 [V, r], the gated or rnn projection, and the confidence head, float in every
    loader read."""
    M, V, r = g.hidden_size, g.vocab_size, g.markov_rank
    if M is None or V is None:
        return "needs hidden_size and vocab_size"
    if r is None:
        return "DSpark needs markov_rank > 0"
    flat = g.dspark_layout == "modelopt"
    mk = "" if flat else "markov_head."
    b.param(f"{mk}markov_w1.weight", (V, r), "head")
    # W2 projects to the draft's vocabulary (its reduced one, when it has one: speculators, vLLM)
    b.param(f"{mk}markov_w2.weight", (g.draft_vocab_size or V, r), "head")
    if g.markov_head_type == "gated":
        b.param(f"{mk}gate_proj.weight", (r, M + r), "head")
        b.param(f"{mk}gate_proj.bias", (r,), "head")
    elif g.markov_head_type == "rnn":
        b.param(f"{mk}joint_proj.weight", (3 * r, 2 * r + M), "head")
        b.param(f"{mk}joint_proj.bias", (3 * r,), "head")
    if g.confidence_head:
        width = M + r if (g.confidence_with_markov or flat) else M
        conf = "confidence_proj" if flat else "confidence_head.proj"
        b.param(f"{conf}.weight", (1, width), "head")
        b.param(f"{conf}.bias", (1,), "head")
    return None


def describe(shown: Mapping[str, Any], g: Mapping[str, Any]) -> list[str]:
    confidence = (
        "with confidence head" + (" on [h ; W1[x]]" if g["confidence_with_markov"] else "")
        if g["confidence_head"]
        else "no confidence head"
    )
    return [
        f"  markov     rank {shown['markov_rank']}, {shown['markov_head_type']} head, {confidence}, "
        f"{shown['dspark_layout']} layout (DSpark)"
    ]
