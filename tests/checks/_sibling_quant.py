"""The sibling-head linears a loader builds through the quant config (checks/sibling_quant.py), as checkpoints: each
case with what each engine's released loader does with it (every release of the engine alike) and the error rules
validate gives on the linear. The conformance suites serve them (tests/conformance/vllm/test_vllm_sibling_quant.py,
tests/conformance/sglang/test_sibling_quant.py); tests/checks/test_sibling_quant.py checks validate alone.

Loader letters as the harnesses give them: L loads, R refuses, C crashes, SW loads but serves another function."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.manifest import quant_scheme

from ._support import edit_config, set_exclusions

MARKOV_W2 = "markov_head.markov_w2"


class Case(NamedTuple):
    name: str
    build: Callable[[Path], Path]
    loader: dict[str, str]  # engine -> what its released loader does (every release)
    rules: dict[str, tuple[str, ...]]  # engine -> the error rules validate gives on the sibling linear
    why: str  # the loader's statement that decides it


def nemotron_35(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config keys that select SGLang's Nemotron-3.5 layout (families/dspark.py nemotron_35); the quant_algo
    (W4A16_NVFP4) comes with the checkpoint's quantization."""
    cfg = copy.deepcopy(cfg)
    cfg["has_embed_tokens"] = True
    cfg["has_lm_head"] = False
    cfg["eagle_aux_hidden_state_layer_ids"] = [t + 1 for t in cfg["dflash_config"]["target_layer_ids"]]
    cfg["dflash_config"]["sample_from_anchor"] = False
    return cfg


def _own_embedding(tensors: fixtures.Tensors) -> None:
    """The Nemotron-3.5 draft's own input embedding (has_embed_tokens: SGLang builds and loads it)."""
    cfg = fixtures.sibling_config("dspark-deepspec")
    shape = (cfg["vocab_size"], cfg["hidden_size"])
    tensors["embed_tokens.weight"] = (
        "BF16",
        shape,
        fixtures.encode(fixtures._values("embed_tokens.weight", shape, 0), "BF16"),
    )


def _quantized_markov_w2(algo: str) -> Callable[[fixtures.Tensors], None]:
    """markov_w2 stored quantized in `algo`'s layout, with its scales."""

    def mutate(tensors: fixtures.Tensors) -> None:
        _, shape, _ = tensors.pop(f"{MARKOV_W2}.weight")
        weight = fixtures._values(f"{MARKOV_W2}.weight", shape, 0)
        scheme = quant_scheme(algo)
        assert scheme is not None
        tensors.update(fixtures._quantized(MARKOV_W2, weight, scheme, 0))

    return mutate


def _both(*mutations: Callable[[fixtures.Tensors], None]) -> Callable[[fixtures.Tensors], None]:
    def mutate(tensors: fixtures.Tensors) -> None:
        for m in mutations:
            m(tensors)

    return mutate


def dspark(
    *,
    quant: str = "NVFP4",
    rank: int = 8,
    exclude: tuple[str, ...] = (),
    nemotron: bool = False,
    stored: str | None = None,
) -> Callable[[Path], Path]:
    """A DSpark drafter (SpecForge's DSparkDraftModel; DeepSpec's Qwen3DSparkModel for the Nemotron-3.5 layout)
    quantized `quant`, markov_w2 in float (or `stored` quantized), with `exclude` added to the exclusions."""

    def build(path: Path) -> Path:
        cfg = fixtures.sibling_config("dspark-deepspec" if nemotron else "dspark-specforge", markov_rank=rank)
        mutations = [_own_embedding] if nemotron else []
        if stored:
            mutations.append(_quantized_markov_w2(stored))
        out = fixtures.write_checkpoint(
            path, nemotron_35(cfg) if nemotron else cfg, quant=quant, mutate=_both(*mutations)
        )
        if exclude:
            set_exclusions(out, lambda patterns: patterns + list(exclude))
        return out

    return build


def dflash2(*, drop: tuple[str, ...] = ()) -> Callable[[Path], Path]:
    """A DFlash2 drafter quantized NVFP4 (its kernel projections in float), `drop` removed from the exclusions."""

    def build(path: Path) -> Path:
        out = fixtures.write_checkpoint(path, fixtures.sibling_config("dflash2"), quant="NVFP4")
        set_exclusions(out, lambda patterns: [p for p in patterns if p not in drop])
        return out

    return build


def converted(build: Callable[[Path], Path]) -> Callable[[Path], Path]:
    """`lilicorr-ckpt convert` of what `build` writes (its exclusions rewritten to cover every float linear)."""

    def convert(path: Path) -> Path:
        src = build(path.parent / f"{path.name}-src")
        done = subprocess.run(
            [sys.executable, "-m", "lilicorr_ckpt", "convert", str(src), str(path), "-q", "--force"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return path

    return convert


def edit(build: Callable[[Path], Path], fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Path]:
    def apply(path: Path) -> Path:
        out = build(path)
        edit_config(out, fn)
        return out

    return apply


VLLM_MARKOV = (
    "vLLM qwen3_dspark.py DSparkMarkovHead: markov_w2 is a ParallelLMHead built with the quant config"
)
SGLANG_PLAIN = "SGLang dspark.py VanillaMarkov: markov_w2 is an nn.Linear (float whatever the config)"
SGLANG_NEMOTRON = (
    "SGLang dspark.py Nemotron35VanillaMarkov: markov_w2 is a ReplicatedLinear with the quant config"
)
VLLM_CONV = (
    "vLLM qwen3_dflash2.py DFlashGroupedConv: kernel_projection is a ReplicatedLinear with the quant config"
)

CASES = [
    Case(
        "markov_w2_float_unexcluded_nvfp4_rank8",
        dspark(),
        {"vllm": "R", "sglang": "L"},
        {"vllm": ("LC305", "LC307"), "sglang": ()},
        f"{VLLM_MARKOV} (in_features 8: the NVFP4 build refuses it); {SGLANG_PLAIN}",
    ),
    Case(
        "markov_w2_float_unexcluded_nvfp4_rank16",
        dspark(rank=16),
        {"vllm": "R", "sglang": "L"},
        {"vllm": ("LC307",), "sglang": ()},
        f"{VLLM_MARKOV} (the float weight fails the packed parameter); {SGLANG_PLAIN}",
    ),
    Case(
        "markov_w2_float_unexcluded_fp8",
        dspark(quant="FP8"),
        {"vllm": "SW", "sglang": "L"},
        {"vllm": ("LC307",), "sglang": ()},
        f"{VLLM_MARKOV} (the float weight cast into FP8, its scales left at their initial values); {SGLANG_PLAIN}",
    ),
    Case(
        "markov_w2_float_excluded_by_suffix",
        dspark(exclude=("*markov_w2",)),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        "`*markov_w2` matches model.markov_head.markov_w2 (vLLM) and markov_head.markov_w2 (SGLang)",
    ),
    Case(
        "markov_w2_float_excluded_by_module_path",
        dspark(exclude=(MARKOV_W2,)),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        "vLLM prefixes `model.` to the unrooted pattern (0.33+) or matches it as a substring (0.31-0.32)",
    ),
    Case(
        "markov_w2_float_excluded_under_another_name",
        dspark(rank=16, exclude=("*markov_head.w2",)),
        {"vllm": "R", "sglang": "L"},
        {"vllm": ("LC307",), "sglang": ()},
        f"a pattern that names no served module excludes nothing; {VLLM_MARKOV}",
    ),
    Case(
        "kernel_projection_float_unexcluded_nvfp4",
        dflash2(drop=("*kernel_projection",)),
        {"vllm": "C", "sglang": "L"},
        {"vllm": ("LC307",), "sglang": ()},
        f"{VLLM_CONV} (its weight_loader asserts the packed shape); SGLang dflash.py DFlashGroupedConv builds it as an nn.Linear",
    ),
    Case(
        "kernel_projection_float_excluded",
        dflash2(),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        "`*kernel_projection` matches it in every release",
    ),
    Case(
        "nemotron_markov_w2_float_unexcluded_rank16",
        dspark(quant="W4A16_NVFP4", rank=16, nemotron=True),
        {"vllm": "R", "sglang": "C"},
        {"vllm": ("LC307",), "sglang": ("LC307",)},
        f"{VLLM_MARKOV}; {SGLANG_NEMOTRON} (its weight_loader asserts the packed shape)",
    ),
    Case(
        "nemotron_markov_w2_float_unexcluded_rank8",
        dspark(quant="W4A16_NVFP4", nemotron=True),
        {"vllm": "R", "sglang": "R"},
        {"vllm": ("LC305", "LC307"), "sglang": ("LC305", "LC307")},
        f"{VLLM_MARKOV}; {SGLANG_NEMOTRON} (in_features 8: its build refuses it)",
    ),
    Case(
        "nemotron_markov_w2_float_excluded",
        dspark(quant="W4A16_NVFP4", nemotron=True, exclude=("*markov_w2",)),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        "excluded as each engine names it",
    ),
    Case(
        "nemotron_selector_off_sample_from_anchor",
        edit(
            dspark(quant="W4A16_NVFP4", rank=16, nemotron=True),
            lambda cfg: cfg["dflash_config"].update(sample_from_anchor=True),
        ),
        {"vllm": "R", "sglang": "L"},
        {"vllm": ("LC307",), "sglang": ()},
        "sample_from_anchor true: SGLang's is_nemotron_35_draft_config is false, VanillaMarkov's nn.Linear is built",
    ),
    Case(
        "markov_w2_stored_nvfp4_unexcluded",
        dspark(rank=16, stored="NVFP4"),
        {"vllm": "L", "sglang": "R"},
        {"vllm": (), "sglang": ("LC209",)},
        f"{VLLM_MARKOV} (loads the packed weight); SGLang dspark.py load_weights: no parameter for its scales "
        '("DSpark unexpected markov weight")',
    ),
    Case(
        "nemotron_markov_w2_stored_w4a16_unexcluded",
        dspark(quant="W4A16_NVFP4", rank=16, nemotron=True, stored="W4A16_NVFP4"),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        f"{VLLM_MARKOV}; {SGLANG_NEMOTRON} (both load the packed weight)",
    ),
    Case(
        "converted_markov_w2_float_unexcluded_nvfp4",
        converted(dspark()),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        "convert excludes every float sibling linear (`*markov_w2`)",
    ),
    Case(
        "converted_markov_w2_float_unexcluded_fp8",
        converted(dspark(quant="FP8")),
        {"vllm": "L", "sglang": "L"},
        {"vllm": (), "sglang": ()},
        "convert excludes every float sibling linear (`*markov_w2`)",
    ),
]

# (case name, engine) -> why validate and that engine's loader still disagree (none: a quantized sibling linear is
# judged per release in the layout it builds, checks/sibling_quant.py quantized_siblings)
PENDING: dict[tuple[str, str], str] = {}


def verdict(path: Path, release: str) -> tuple[bool, dict[str, list[str]]]:
    """validate's verdict for one release (`vllm==0.33.0`): (accepts, error rule -> its messages)."""
    from lilicorr_ckpt import validate

    report = validate(str(path), runtime=release)
    (judged,) = report.runtimes
    errors: dict[str, list[str]] = {}
    for f in report.findings:
        if f.severity == "error":
            errors.setdefault(f.rule, []).append(f.message)
    return judged.accepted, errors


def sibling_rules(errors: dict[str, list[str]]) -> set[str]:
    """The error rules whose messages name a sibling-head linear of these cases."""
    return {
        rule
        for rule, messages in errors.items()
        if any(_LINEAR in m for m in messages for _LINEAR in LINEARS)
    }


LINEARS = (MARKOV_W2, "kernel_projection")
