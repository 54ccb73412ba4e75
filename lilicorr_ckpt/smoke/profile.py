"""The `smoke` profile: msgspec types (schemas/smoke-profile.schema.json) and the arithmetic that fills them.

Torch-free. The leading fields follow ModelOpt specdec_bench's `speculation_profile.json` (schema 1.0)
and describe the primary arm (the head, or the control for a head-free checkpoint); the fields after
`validation` are lilicorr-ckpt's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from lilicorr_ckpt import __version__

SCHEMA_VERSION = "1.0"
CONSISTENCY_TOLERANCE = 0.02  # specdec_bench's default for the mean-consistency check

Arm = Literal["head", "control", "ar"]
ARMS: tuple[Arm, ...] = ("head", "control", "ar")
GateStatus = Literal["pass", "fail", "skip"]
TargetSource = Literal["directory", "hf_cache", "gguf"]  # where the target was read from
Thinking = Literal["disabled", "no-switch", "not-applied"]  # enable_thinking=False passed / template has none


class PositionCount(msgspec.Struct, frozen=True, kw_only=True):
    """The counts behind one draft position's rates: conditional = accepted / reached, marginal = accepted /
    drafted (so a published rate can be shown with the sample it came from)."""

    drafted: int  # blocks that drafted this position
    reached: int  # ... of which every earlier position was accepted
    accepted: int  # ... of which this position was accepted


class ArmStats(msgspec.Struct, frozen=True, kw_only=True):
    """One decoding arm over a set of requests (all prompts, or one category)."""

    requests: int
    blocks: int  # verification forwards; the prefill's first token is in none
    tokens: int  # emitted tokens, each request's prefill token included
    mean_accept_length: float  # tau: committed tokens per block, block-weighted (1.0 for "ar")
    mean_accept_length_per_request: float  # mean of the per-request tau over requests with a block
    conditional_accept_rates: list[float]  # [i]: P(draft i+1 accepted | drafts 1..i accepted)
    marginal_accept_rates: list[float]  # [i]: P(drafts 1..i+1 all accepted)
    acceptance_length_histogram: dict[int, int]  # committed tokens per block (bonus included) -> blocks
    wall_time_s: float
    tokens_per_second: float
    speedup_vs_ar: float | None  # tokens/s over the "ar" arm's on the same prompts
    position_counts: list[PositionCount] = []  # [i]: the counts behind the rates at draft position i+1


class CategoryProfile(msgspec.Struct, frozen=True, kw_only=True):
    requests: int
    mean_accept_length: float  # the primary arm's
    mean_accept_length_per_request: float
    conditional_accept_rates: list[float]
    marginal_accept_rates: list[float]
    acceptance_length_histogram: dict[int, int]
    arms: dict[str, ArmStats]


class DraftCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """What was measured; no full paths, so a profile can be published beside the checkpoint."""

    id: str  # the last two path components (a repo id stays a repo id), as specdec_bench publishes it
    architecture: str | None
    head: bool
    candidate_topk: int | None
    conv_kernel_size: int | None
    quant_algo: str | None
    runtime: str  # the validate profile the checkpoint was loaded under


class TargetRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # the repo id, the GGUF file name, or the directory's last two components
    source: TargetSource
    architecture: str | None
    hidden_size: int
    num_layers: int
    vocab_size: int
    forward: str = (
        "transformers eager forward"  # the runtime's target path: "fast path (...)" or transformers'
    )
    # how the weights and tokenizer were read: "read directly from the GGUF", "transformers' GGUF loader (why)",
    # or "transformers" (a directory or a repo id)
    loaded: str = "transformers"


class ChatTemplate(msgspec.Struct, frozen=True, kw_only=True):
    """What was done to turn probe text into prompt tokens."""

    present: bool  # the tokenizer carries a chat template
    applied_prompts: int  # prompts with chat: true that went through it
    raw_prompts: int  # prompts tokenized as plain text (chat: false, or no template)
    thinking: Thinking
    template_kwargs: dict[str, bool]  # extra arguments given to apply_chat_template
    template_sha256: str | None
    eos_token_ids: list[int]  # generation stops at these (the target's generation config)
    eos_tokens: list[str]


class KernelVariants(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU run's Triton kernel variants: those compiled ahead from the tables of earlier runs, what its launches
    waited for at each variant's first launch in this process, and the GEMM shapes it tuned."""

    ahead: int  # stored variants of this GPU (or its compute capability) compiled in the background
    ahead_compiled: int  # of those, the ones that compiled
    ahead_seconds: float  # the background compile's wall time, from its start while the models loaded
    launched: int  # distinct variants this run's launches waited for (each once per process)
    # of those, the ones not compiled ahead: compiled at their first launch (or read from a disk cache an
    # earlier process filled), and the launches' wait for them
    at_launch: int
    at_launch_seconds: float
    # the launches' wait for the ones compiled ahead (read from Triton's disk cache)
    read_seconds: float = 0.0
    # step GEMM shapes tuned in this run (no stored tile for them on this GPU and Triton), and the time tuning
    # took: the candidate tiles' compiles and their timing
    tuned: int = 0
    tuning_seconds: float = 0.0


class MeasurementConditions(msgspec.Struct, frozen=True, kw_only=True):
    probes: str  # the --probes value
    probe_counts: dict[str, int]  # category -> prompts run
    probe_digest: str  # sha256 over (id, category, chat, prompt) of the prompts run
    limit: int  # prompts per category (0: all)
    max_new_tokens: int
    temperature: float
    seeds: list[int]
    warmup: bool
    device: str
    dtype: str
    kernel_backend: str  # "triton" or "torch" for the draft-step ops
    concurrency: int = 1
    engine: str = "lilicorr_runtime"
    versions: dict[str, str] = {}
    measured_at: str = ""  # UTC, ISO 8601
    # wall time by phase, in order, in seconds: "start" is the process before smoke ran (interpreter and
    # imports; on the command line only), then loading, compiling ahead, warming up, decoding, the checks
    phase_seconds: dict[str, float] = {}
    kernel_variants: KernelVariants | None = None  # GPU runs


class MeanConsistency(msgspec.Struct, frozen=True, kw_only=True):
    implied_mean_accept_length: float  # 1 + sum(marginal_accept_rates)
    reported_mean_accept_length: float
    abs_delta: float
    tolerance: float
    passed: bool


class MonotonicityViolation(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    value: float
    previous: float


class MarginalMonotonicity(msgspec.Struct, frozen=True, kw_only=True):
    passed: bool
    violations: list[MonotonicityViolation]


class Validation(msgspec.Struct, frozen=True, kw_only=True):
    mean_consistency: MeanConsistency
    marginal_monotonicity: MarginalMonotonicity


class HeadGain(msgspec.Struct, frozen=True, kw_only=True):
    """tau(head) / tau(control) - 1, overall and per category (the check that a head actually loaded)."""

    overall: float | None
    per_category: dict[str, float | None]


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    category: str
    seed: int
    prompt_tokens: int
    new_tokens: dict[str, int]  # arm -> emitted tokens
    tau: dict[str, float]  # arm -> committed tokens per block within this request
    tokens_per_second: dict[str, float]
    lossless: bool | None  # greedy: every arm emitted the "ar" tokens (None when not checked)
    blocks: dict[str, int] = {}  # arm -> verification blocks within this request
    # greedy: the "ar" arm's emitted token ids, which `smoke --engine` compares an engine's output with
    reference_tokens: list[int] = []
    # greedy: the first of them whose target logit gap to the runner-up is within bfloat16 round-off (None: none
    # is); another stack may pick either token there, so engine outputs are compared up to it
    first_near_tie: int | None = None


class GainInterval(msgspec.Struct, frozen=True, kw_only=True):
    """The head gate's evidence: a confidence interval over prompts for tau(head) / tau(control) - 1."""

    prompts: int  # prompts with a verification block in either arm (every seed of a prompt pooled)
    confidence: float  # two-sided, 0.95
    gain: float  # the measured gain (block-weighted taus, as head_gain.overall)
    low: float | None  # the interval; None with a single prompt (no spread between prompts to judge by)
    high: float | None
    required: float  # --min-head-gain
    conclusive: bool  # low >= required (pass) or high < required (fail)
    needed_prompts: int | None  # inconclusive: about how many prompts would decide, at this per-prompt spread


class Gate(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    status: GateStatus
    summary: str  # one line: what was measured against what
    details: list[str] = []
    # a failure because this run cannot decide (too few prompts, or a drafter too weak to judge the head by), not a
    # verdict against the checkpoint; still a failure (exit 1)
    inconclusive: bool = False
    interval: GainInterval | None = None  # head-loaded: the confidence interval it judged by


class BaselineItem(msgspec.Struct, frozen=True, kw_only=True):
    metric: str  # e.g. "head tau", "head tau [code]"
    baseline: float
    measured: float
    relative_delta: float
    passed: bool


class BaselineComparison(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    tolerance: float  # relative; a drop beyond it fails
    conditions_match: bool
    condition_differences: list[str]
    items: list[BaselineItem]


class SweepPoint(msgspec.Struct, frozen=True, kw_only=True):
    """`smoke --sweep`: every arm timed again at one batch size, over the same prompts (the first seed)."""

    batch: int  # requests decoded side by side in each arm
    requests: int
    wall_time_s: dict[str, float]  # arm -> its elapsed time over all the requests, warm-up excluded
    tokens_per_second: dict[str, float]  # arm -> its emitted tokens over that time
    speedup_vs_ar: dict[str, float | None]  # arm -> tokens/s over the "ar" arm's at this batch size
    # requests whose every arm emitted exactly the tokens of the measured run (None: not compared, T > 0, where a
    # batch draws its random numbers in another order)
    same_tokens: int | None


class SmokeReport(msgspec.Struct, frozen=True, kw_only=True):
    """`lilicorr-ckpt smoke --format json` prints exactly this (and --out writes it)."""

    # -- specdec_bench speculation_profile.json fields (the primary arm) --
    schema_version: str = SCHEMA_VERSION
    measured: bool
    method: Literal["lilicorr", "dflash"]
    draft_checkpoint: DraftCheckpoint
    target_model: TargetRecord
    num_speculative_tokens: int
    block_size: int
    max_supported_k: int
    verification_method: Literal["longest_prefix"] = "longest_prefix"
    conditional_accept_rates: list[float]
    marginal_accept_rates: list[float]
    mean_accept_length: float
    mean_accept_length_per_request: float
    accept_length_model: Literal["measured_per_k"] = (
        "measured_per_k"  # a block drafter re-plans when K changes
    )
    accept_length_by_k: dict[str, float]
    acceptance_length_histogram: dict[int, int]
    per_category: dict[str, CategoryProfile]
    measurement_conditions: MeasurementConditions
    validation: Validation
    # -- lilicorr-ckpt's own --
    tool: str = "lilicorr-ckpt smoke"
    version: str = __version__
    primary_arm: Arm
    arms: dict[str, ArmStats]
    head_gain: HeadGain
    chat_template: ChatTemplate
    requests: list[RequestRecord]
    gates: list[Gate]
    baseline: BaselineComparison | None = None
    sweep: list[SweepPoint] = []  # --sweep: speed per batch size, in the order given
    passed: bool


def dense_rates(rates: Sequence[float], length: int) -> list[float]:
    """A per-position vector cut or zero-padded to `length` (positions never drafted were never accepted)."""
    return [float(rates[i]) if i < len(rates) else 0.0 for i in range(length)]


def position_counts(blocks: Sequence[tuple[int, int]], length: int) -> list[PositionCount]:
    """Per draft position 1..length, from (drafted, accepted) per block: the same definitions as the rates."""
    out = []
    for j in range(1, length + 1):
        drafted = [a for d, a in blocks if d >= j]
        out.append(
            PositionCount(
                drafted=len(drafted),
                reached=sum(a >= j - 1 for a in drafted),
                accepted=sum(a >= j for a in drafted),
            )
        )
    return out


def dense_histogram(counts: Sequence[int], block_size: int) -> dict[int, int]:
    """Index c-1 -> count, as {c: count} for every length 1..block_size (and any longer one observed)."""
    width = max(block_size, len(counts))
    return {c: int(counts[c - 1]) if c - 1 < len(counts) else 0 for c in range(1, width + 1)}


def per_request_mean(taus: Sequence[float], blocks: Sequence[int]) -> float:
    measured = [t for t, b in zip(taus, blocks, strict=True) if b > 0]
    return sum(measured) / len(measured) if measured else 0.0


def mean_consistency(
    mean_accept_length: float, marginal: Sequence[float], tolerance: float = CONSISTENCY_TOLERANCE
) -> MeanConsistency:
    """Longest-prefix verification: mean length = 1 + sum of the survival function, when the
    vector spans every length; a shorter vector (a K understated) shows up as a shortfall."""
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean_accept_length)
    return MeanConsistency(
        implied_mean_accept_length=round(implied, 6),
        reported_mean_accept_length=round(mean_accept_length, 6),
        abs_delta=round(delta, 6),
        tolerance=tolerance,
        passed=delta <= tolerance,
    )


def marginal_monotonicity(marginal: Sequence[float]) -> MarginalMonotonicity:
    violations = [
        MonotonicityViolation(position=i, value=marginal[i], previous=marginal[i - 1])
        for i in range(1, len(marginal))
        if marginal[i] > marginal[i - 1] + 1e-9
    ]
    return MarginalMonotonicity(passed=not violations, violations=violations)


def validation_of(stats: ArmStats) -> Validation:
    return Validation(
        mean_consistency=mean_consistency(stats.mean_accept_length, stats.marginal_accept_rates),
        marginal_monotonicity=marginal_monotonicity(stats.marginal_accept_rates),
    )


def relative_gain(head_tau: float, control_tau: float) -> float | None:
    return head_tau / control_tau - 1.0 if control_tau > 0 else None


def checkpoint_id(path: str) -> str:
    """The last two path components: a published profile must not carry a machine's directory layout."""
    parts = [p for p in path.replace("\\", "/").split("/") if p and p != "."]
    return "/".join(parts[-2:]) if parts else path


def encode(report: SmokeReport) -> bytes:
    return msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n"
