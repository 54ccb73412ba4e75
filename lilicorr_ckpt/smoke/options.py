"""smoke's options and the checks that need no model (torch-free), and `runner`: the one door to the torch side."""

from __future__ import annotations

import math
import os
from typing import Protocol

import msgspec

from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.install import runtime_hint
from lilicorr_ckpt.outfile import Inputs
from lilicorr_ckpt.smoke.gates import DEFAULT_MIN_HEAD_GAIN, DEFAULT_TOLERANCE
from lilicorr_ckpt.smoke.profile import SmokeReport

DTYPES = ("float32", "bfloat16", "float16")


class SmokeOptions(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    target: str
    gpu: bool = False
    probes: str = "code,chat,math"
    limit: int = 8
    max_new_tokens: int = 128
    temperature: float = 0.0
    seeds: tuple[int, ...] = (0,)
    num_speculative_tokens: int | None = None
    min_tau: float | None = None
    min_accept_rates: tuple[float, ...] = ()
    min_head_gain: float = DEFAULT_MIN_HEAD_GAIN
    baseline: str | None = None
    tolerance: float = DEFAULT_TOLERANCE
    dtype: str | None = None  # float32 on the CPU, bfloat16 with --gpu
    runtime: str = "all"
    warmup: bool = True
    batch: int | None = (
        None  # probes decoded side by side per arm; None: as many as fit on the GPU, 1 on the CPU
    )
    sweep: tuple[int, ...] = ()  # batch sizes every arm is timed again at, after the measured run


MAX_NEW_TOKENS = 1 << 16  # far beyond any probe; the target's positions bound it further once it is read
MAX_TEMPERATURE = 100.0  # softmax(logits / T) is uniform to float precision long before this
MAX_SEED = 2**63 - 1  # what torch.Generator.manual_seed takes on every platform
MAX_BATCH = 4096  # slots of the device loop; memory bounds it further once the models are read
MAX_SWEEP = 16  # batch sizes one --sweep times (each is a whole pass of every arm)


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def check_options(opts: SmokeOptions) -> None:
    """Usage errors that need no model (exit 4): every option's range, so no value reaches torch unchecked."""
    if not 2 <= opts.max_new_tokens <= MAX_NEW_TOKENS:
        raise UsageError(
            f"--max-new-tokens must be in [2, {MAX_NEW_TOKENS}] (the first token comes from the "
            f"prefill), got {opts.max_new_tokens}"
        )
    if not math.isfinite(opts.temperature) or not 0 <= opts.temperature <= MAX_TEMPERATURE:
        raise UsageError(
            f"--temperature must be a finite number in [0, {MAX_TEMPERATURE:g}], got {opts.temperature}"
        )
    if not opts.seeds:
        raise UsageError("--seeds needs at least one seed")
    bad_seeds = [s for s in opts.seeds if not 0 <= s <= MAX_SEED]
    if bad_seeds:
        raise UsageError(f"--seeds must be integers in [0, 2**63 - 1], got {bad_seeds[0]}")
    for option, value in (
        ("--min-tau", opts.min_tau),
        ("--min-head-gain", opts.min_head_gain),
        ("--tolerance", opts.tolerance),
    ):
        if not _finite(value):
            raise UsageError(f"{option} must be a finite number, got {value}")
    if opts.min_tau is not None and opts.min_tau < 0:
        raise UsageError(f"--min-tau must be >= 0, got {opts.min_tau}")
    if opts.limit is not None and opts.limit > 1 << 20:
        raise UsageError(f"--limit must be at most {1 << 20}, got {opts.limit}")
    if opts.temperature == 0 and len(opts.seeds) > 1:
        raise UsageError(
            "--seeds with more than one seed needs --temperature > 0: greedy decoding is deterministic"
        )
    if opts.dtype is not None and opts.dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {opts.dtype!r}")
    if opts.tolerance < 0:
        raise UsageError(f"--tolerance must be >= 0, got {opts.tolerance}")
    if any(not 0 <= f <= 1 for f in opts.min_accept_rates):
        raise UsageError("--min-accept-rates takes probabilities in [0, 1]")
    if opts.batch is not None and not 1 <= opts.batch <= MAX_BATCH:
        raise UsageError(f"--batch must be in [1, {MAX_BATCH}], got {opts.batch}")
    if len(opts.sweep) > MAX_SWEEP:
        raise UsageError(f"--sweep takes at most {MAX_SWEEP} batch sizes, got {len(opts.sweep)}")
    bad_sizes = [b for b in opts.sweep if not 1 <= b <= MAX_BATCH]
    if bad_sizes:
        raise UsageError(f"--sweep takes batch sizes in [1, {MAX_BATCH}], got {bad_sizes[0]}")
    if len(set(opts.sweep)) != len(opts.sweep):
        raise UsageError(f"--sweep names a batch size twice: {','.join(map(str, opts.sweep))}")
    if opts.num_speculative_tokens is not None and not 1 <= opts.num_speculative_tokens <= 1 << 16:
        raise UsageError(f"--num-speculative-tokens must be >= 1, got {opts.num_speculative_tokens}")


class Runner(Protocol):
    """smoke.run.run_smoke's signature."""

    def __call__(
        self, opts: SmokeOptions, progress: Progress | None = None, *, started: float | None = None
    ) -> SmokeReport: ...


def runner() -> Runner:
    """smoke.run.run_smoke, or a usage error naming the runtime extra: smoke.run imports torch, transformers and
    lilicorr_runtime, which nothing else on the command line does."""
    try:
        from lilicorr_ckpt.smoke.run import run_smoke
    except ImportError as exc:
        raise UsageError(f"{runtime_hint('smoke')}; the import failed: {exc}") from None
    return run_smoke


def smoke_inputs(path: str, target: str, baseline: str | None, probes: str | None) -> Inputs:
    """What a smoke run reads, so that none of its outputs (-o, --html, the GPU's tile and kernel tables) writes
    over it: the checkpoint, the target, the baseline profile and a probe file (not the bundled categories)."""
    inputs = Inputs().add(path, "the checkpoint").add(target, "the target")
    inputs.add(baseline, "the --baseline profile")
    if probes and os.path.isfile(probes):
        inputs.add(probes, "the --probes file")
    return inputs
