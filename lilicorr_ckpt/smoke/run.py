"""`smoke`: decode the probe prompts with the head, the head-free control and the target alone, in one process.

Imports torch and lilicorr_runtime (the runtime extra) at import time (transformers only when the target is built
through it): the command line and
`lilicorr_ckpt.smoke.smoke` import it through `smoke.options.runner` only when smoke runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import io
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch

from lilicorr_ckpt import __version__
from lilicorr_ckpt.checkpoint import Checkpoint, load_checkpoint, resolve_target_spec
from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.errors import InputError, SmokeRefused, UsageError
from lilicorr_ckpt.smoke.assemble import assemble
from lilicorr_ckpt.smoke.fit import fit_refusal, loaded_info, require_fit
from lilicorr_ckpt.smoke.gates import (
    Divergence,
    ParityCheck,
    read_baseline,
)
from lilicorr_ckpt.smoke.load import build_valid_drafter
from lilicorr_ckpt.smoke.options import SmokeOptions, check_options, smoke_inputs
from lilicorr_ckpt.smoke.phases import Phases
from lilicorr_ckpt.smoke.probes import Probe, counts, digest, load_probes
from lilicorr_ckpt.smoke.profile import (
    ARMS,
    Arm,
    ChatTemplate,
    DraftCheckpoint,
    KernelVariants,
    MeasurementConditions,
    SmokeReport,
    SweepPoint,
    TargetRecord,
    TargetSource,
    checkpoint_id,
)
from lilicorr_ckpt.smoke.target_files import check_target_files
from lilicorr_ckpt.smoke.threads import ThreadChooser
from lilicorr_ckpt.smoke.ties import first_near_tie
from lilicorr_ckpt.smoke.tokenize import tokenize_probes
from lilicorr_runtime import (
    CheckpointRefused,
    SpeculativeDecoder,
    acceptance_stats,
    load_target,
    ops,
    settings,
)
from lilicorr_runtime.ops import warm
from lilicorr_runtime.ops.tuning import tuner
from lilicorr_runtime.target.fast import PREFILL_ROWS, FastTarget

# Two kernels may round a near-tie either way. A divergence whose target logit gap is below this fraction
# of the logit's magnitude (at least 1.0) is a tie-flip, not a bug: a few ulps of the dtype, accumulated.
TIE_RELATIVE = {"float32": 2.0**-14, "float16": 2.0**-8, "bfloat16": 2.0**-5}
PARITY_BLOCKS = 4
MAX_DEFAULT_BATCH = 256  # the default --batch on the GPU: as many probes as fit, at most this many


Run = tuple[Probe, int, list[int], dict[str, Any]]  # probe, seed, prompt ids, arm -> result

CPU_THREADS = 1  # intra-op threads on the CPU unless OMP_NUM_THREADS says otherwise (docs/performance.md)
# the counts a batched CPU run chooses between by timing its blocks (smoke.threads)
CPU_BATCH_THREADS = (1, 2)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads() -> int:
    """Token-by-token decoding of small models gains nothing from many intra-op threads and loses much to their
    contention on a shared machine, so smoke on the CPU uses min(cores, CPU_THREADS) unless OMP_NUM_THREADS is set
    (torch reads it itself)."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads()
    threads = max(1, min(_cores(), CPU_THREADS))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


# glibc serves an allocation above its mmap threshold (at most 32 MB by default) with fresh pages, so a batched CPU
# step's [rows, vocab] temporaries (the verify logits in fp32: 50 MB at 32 x 8 rows) page-fault on every step, a third
# of the time their conversion takes. Up to this size they come from the heap, which keeps freed memory up to the
# trim threshold for the next step.
CPU_MMAP_THRESHOLD = 256 << 20
CPU_TRIM_THRESHOLD = 512 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def cpu_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for a batched CPU run (see CPU_MMAP_THRESHOLD); False, changing
    nothing, where the C library is not glibc or refuses."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, CPU_MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, CPU_TRIM_THRESHOLD)
    )


@contextlib.contextmanager
def batch_cpu_tuning(progress: Progress, enabled: bool) -> Iterator[ThreadChooser | None]:
    """For a batched CPU run: glibc's thresholds raised (cpu_heap) and the ThreadChooser its arms and checks report
    to; on leaving, the thread count it started with again. Nothing (None) unless `enabled`."""
    if not enabled:
        yield None
        return
    cpu_heap()
    before = torch.get_num_threads()
    try:
        yield batch_thread_chooser(progress)
    finally:
        torch.set_num_threads(before)


def batch_thread_chooser(progress: Progress) -> ThreadChooser | None:
    """For batched arms on the CPU: a ThreadChooser between CPU_BATCH_THREADS (the counts the cores allow), which
    times the blocks and keeps the faster count; None when OMP_NUM_THREADS fixes the count or one core is all."""
    counts = [c for c in CPU_BATCH_THREADS if c <= _cores()]
    if os.environ.get("OMP_NUM_THREADS", "").strip() or len(counts) < 2:
        return None

    def switched(threads: int, seconds: float, baseline: float) -> None:
        progress.note(f"{threads} intra-op thread(s) from here: {baseline / seconds:.1f}x as fast")

    return ThreadChooser(counts, torch.set_num_threads, on_switch=switched)


def refuse_caches_over_inputs(opts: SmokeOptions) -> None:
    """UsageError (exit 4) when LILICORR_TILE_CACHE or LILICORR_KERNEL_CACHE, which a GPU run writes, names one
    of the run's inputs (the checkpoint's files, the target's, the baseline, the probe file)."""
    inputs = smoke_inputs(opts.path, opts.target, opts.baseline, opts.probes)
    for setting, path in (
        (settings.TILE_CACHE, settings.tile_cache()),
        (settings.KERNEL_CACHE, settings.kernel_cache()),
    ):
        if path is not None:
            inputs.refuse(path, setting.name, fix=f"point {setting.name} at another file, or set it to off")


def run_smoke(
    opts: SmokeOptions, progress: Progress | None = None, *, started: float | None = None
) -> SmokeReport:
    """Decode the probes with every arm and judge the gates. `started`: the seconds the process spent before this
    call (the command line's interpreter and imports), reported as the first phase."""
    phases = Phases(started)
    waits_before = warm.launch_waits()  # the process's so far: an earlier run's are not this one's
    tuned_before = tuner.tuning_done()
    check_options(opts)
    try:  # the runtime's LILICORR_* variables, judged before anything loads
        settings.check()
    except settings.SettingError as exc:
        raise UsageError(str(exc)) from None
    if opts.gpu:
        refuse_caches_over_inputs(opts)
    progress = progress or Progress(enabled=False, name="smoke")
    if opts.gpu:
        tuner.announce = progress.note  # a first run on this GPU tunes its GEMMs: said, not a silent warm-up
    try:
        return _run(opts, progress, phases, (waits_before, tuned_before))
    finally:
        tuner.announce = None


def _run(
    opts: SmokeOptions,
    progress: Progress,
    phases: Phases,
    before: tuple[dict[str, dict[str, float]], tuple[int, float]],
) -> SmokeReport:
    """run_smoke's body; `before`: the process's launch waits and tuning when the run began."""
    waits_before, tuned_before = before
    probes = load_probes(opts.probes, opts.limit)
    baseline = read_baseline(opts.baseline) if opts.baseline else None
    _quiet_transformers()  # our own progress line stands for the loading steps
    if opts.gpu and not torch.cuda.is_available():
        raise InputError(
            f"--gpu needs a CUDA device, and torch {torch.__version__} sees none "
            "(torch.cuda.is_available() is False); run without --gpu for the CPU reference"
        )
    device = "cuda" if opts.gpu else "cpu"
    if not opts.gpu:
        cpu_threads()
    # the kernel variants an earlier run on this GPU compiled, compiled again now in the background, while the
    # drafter and the target load (a no-op where Triton's cache already holds them)
    warming = warm.start(device) if opts.gpu else None
    dtype_name = opts.dtype or ("bfloat16" if opts.gpu else "float32")
    dtype = getattr(torch, dtype_name)

    progress.note("loading the drafter")
    ckpt = load_checkpoint(opts.path)
    check_target_files(
        resolve_target_spec(opts.target), opts.target
    )  # its config must describe its weights, then
    header = read_target(opts.target)  # the taps, widths and vocabulary are judged before the weights load
    try:
        drafter = build_valid_drafter(ckpt, runtime=opts.runtime, dtype=dtype, device=device)
    except CheckpointRefused as exc:  # a misfit too is named now, not after the user fixes the first refusal
        misfit = fit_refusal(ckpt, header, path=opts.path, spec=opts.target, runtime=opts.runtime)
        raise SmokeRefused(str(exc) if misfit is None else f"{exc}\n{misfit}") from None
    draft_info = _draft_info(opts.path, opts.runtime, ckpt, drafter)
    require_fit(ckpt, header, path=opts.path, spec=opts.target, runtime=opts.runtime)
    phases.mark("drafter")
    progress.note("loading the target")
    target, target_info = _load_target(opts.target, dtype, device)
    require_fit(
        ckpt, loaded_info(header, target), path=opts.path, spec=opts.target, runtime=opts.runtime, loaded=True
    )
    if target.tokenizer is None:
        raise InputError(
            f"target {opts.target!r} has no tokenizer (tokenizer.json / tokenizer_config.json); smoke "
            "tokenizes the probe prompts with it"
        )

    g = drafter.geometry
    block_size = g.block_size
    if (
        block_size is None
    ):  # the runtime builds no drafter without one; named here rather than a TypeError below
        raise InputError(
            f"drafter {opts.path!r}: its config gives no block_size; smoke drafts a block at a time"
        )
    slots = block_size - 1
    n = slots if opts.num_speculative_tokens is None else opts.num_speculative_tokens
    if n > slots:
        raise UsageError(
            f"--num-speculative-tokens {n} exceeds the drafter's {slots} slots (block_size {block_size})"
        )
    if len(opts.min_accept_rates) > n:
        raise UsageError(
            f"--min-accept-rates gives {len(opts.min_accept_rates)} floors, but only {n} positions "
            "are drafted"
        )
    has_head = drafter.lilicorr is not None
    arms = [a for a in ARMS if a != "head" or has_head]
    eos = list(target.eos_token_ids)  # the generation config's, as HF generate stops
    outside = [e for e in eos if not isinstance(e, int) or not 0 <= e < target.vocab_size]
    if outside:
        raise InputError(
            f"target {opts.target!r}: eos_token_id {outside[0]} is outside its vocabulary "
            f"({target.vocab_size} tokens); fix eos_token_id in config.json / generation_config.json"
        )
    prompts, chat = _tokenize(target.tokenizer, probes, eos)
    positions = getattr(target.model.config, "max_position_embeddings", None)
    for probe, ids in zip(probes, prompts, strict=True):
        if isinstance(positions, int) and len(ids) + opts.max_new_tokens + block_size > positions:
            raise InputError(
                f"probe {probe.id}: {len(ids)} prompt tokens + --max-new-tokens {opts.max_new_tokens} "
                f"+ one block ({block_size}) exceed the target's {positions} positions; lower "
                "--max-new-tokens or shorten the prompt"
            )
        if max(ids) >= target.vocab_size:
            raise InputError(
                f"probe {probe.id}: the target's tokenizer gives id {max(ids)}, outside its embedding "
                f"table ({target.vocab_size} rows): the tokenizer does not belong to this model"
            )

    phases.mark("target")
    if warming is not None:
        progress.note(f"compiling {len(warming.jobs)} kernel variants ahead, {warming.workers} at a time")
        warming.join()
        phases.mark("kernels_ahead")
    first_logits_finite(target, prompts[0], drafter.target_layer_ids, opts.target)
    phases.mark("first_forward")
    batch = _batch_size(opts, target, drafter, prompts, n)
    _check_sweep(opts, target, len(prompts))
    # batched arms need the device loop, which runs on the fast target path (on the CPU too, without graphs)
    loop: Literal["device", "eager"] | None = "device" if batch > 1 else None

    def decoder(arm: Arm, seed: int, keep: bool = False, size: int | None = None) -> Any:
        """The arm's decoder; `size` (--sweep): one for that batch size, else the measured run's."""
        arm_loop = loop if size is None else ("device" if size > 1 else None)
        try:
            return SpeculativeDecoder(
                target,
                None if arm == "ar" else drafter,
                mode=arm,
                num_speculative_tokens=None if arm == "ar" else n,
                temperature=opts.temperature,
                seed=seed,
                keep_proposals=keep,
                loop=None if keep else arm_loop,
            )
        except ValueError as exc:
            raise SmokeRefused(
                f"{exc}\n  `lilicorr-ckpt validate {opts.path} --target {opts.target}` lists every mismatch"
            ) from None

    # one decoder per arm, re-seeded for each seed: a warm-up on the longest prompt sizes the caches (and captures
    # the CUDA graphs) once, outside the timed runs
    decoders = {arm: decoder(arm, opts.seeds[0]) for arm in arms}
    phases.mark("decoders")
    if opts.warmup:
        progress.note("warming up")
        longest = max(prompts, key=len)
        for arm in arms:
            if batch == 1:
                decoders[arm].generate(longest, opts.max_new_tokens, eos_token_ids=eos)
                continue
            rows = len(longest) + opts.max_new_tokens + decoders[arm].num_tokens + 2
            decoders[arm].device_loop(batch, rows, opts.max_new_tokens, set(eos))  # sized for every probe
            decoders[arm].generate_many([longest] * batch, 4, eos, batch=batch)  # captures the block's graph
        phases.mark("warm_up")

    progress.start(len(prompts) * len(opts.seeds) * len(arms))
    runs: list[Run] = []
    elapsed: dict[str, float] | None = None  # batched: each arm's wall time over all its probes
    divergences: list[Divergence] = []
    near_ties: dict[tuple[str, int], int | None] | None = None
    # batched on the CPU: the thread count chosen by timing the blocks, back to smoke's after the checks
    with batch_cpu_tuning(progress, batch > 1 and not opts.gpu) as chooser:
        for seed in opts.seeds:
            for arm in arms:
                decoders[arm].generator.manual_seed(seed)
            if batch == 1:
                for probe, ids in zip(probes, prompts, strict=True):
                    by_arm: dict[str, Any] = {}
                    for arm in arms:  # interleaved, so machine drift lands on every arm alike
                        by_arm[arm] = decoders[arm].generate(ids, opts.max_new_tokens, eos_token_ids=eos)
                        progress.step(f"{arm} {probe.id}")
                    runs.append((probe, seed, ids, by_arm))
                phases.mark("decode")
                continue
            elapsed = elapsed or dict.fromkeys(arms, 0.0)
            results = {}
            for arm in arms:  # whole arms, one after another: each batch shares the GPU only with its own arm
                progress.note(f"decoding the {arm} arm: {len(probes)} probes, {batch} at a time")
                if chooser is not None:
                    chooser.restart()
                begin = time.perf_counter()
                results[arm] = decoders[arm].generate_many(
                    prompts,
                    opts.max_new_tokens,
                    eos,
                    batch=batch,
                    progress=_arm_progress(progress, arm, chooser),
                )
                if opts.gpu:
                    torch.cuda.synchronize()
                elapsed[arm] += time.perf_counter() - begin
                phases.mark(f"decode_{arm}")
            for i, (probe, ids) in enumerate(zip(probes, prompts, strict=True)):
                batched: dict[str, Any] = {arm: results[arm][i] for arm in arms}
                runs.append((probe, seed, ids, batched))

        if opts.temperature == 0:
            progress.note("checking losslessness")
            divergences, near_ties = greedy_checks(
                target, runs, dtype_name, eos, opts.max_new_tokens, progress, chooser
            )
            phases.mark("lossless")
    sweep: list[SweepPoint] = []
    if opts.sweep:
        measured = {arm: [list(r[3][arm].tokens) for r in runs[: len(prompts)]] for arm in arms}
        with batch_cpu_tuning(progress, max(opts.sweep) > 1 and not opts.gpu) as chooser:
            for size in opts.sweep:
                sweep.append(
                    _sweep_point(size, arms, decoder, prompts, eos, opts, measured, progress, chooser)
                )
        phases.mark("sweep")
    parity: list[ParityCheck] | None = None
    parity_reason = ""
    if opts.gpu:
        progress.note("kernel parity")
        if ops.kernel_backend(device) != "triton":
            parity_reason = "Triton is not importable here: the draft step ran the torch references"
        elif not has_head:
            parity_reason = "the checkpoint has no head: the control's per-slot argmax runs no kernel"
        else:
            parity = kernel_parity(
                decoder("head", 0, keep=True), prompts[0], n, opts.temperature, eos, PARITY_BLOCKS
            )
        phases.mark("parity")
    progress.finish()
    variants = _kernel_variants(warming, device, waits_before, tuned_before) if opts.gpu else None
    if opts.gpu:
        warm.save()  # the variants this run compiled, for the next fresh cache on this GPU

    conditions = MeasurementConditions(
        probes=opts.probes,
        probe_counts=counts(probes),
        probe_digest=digest(probes),
        limit=opts.limit,
        max_new_tokens=opts.max_new_tokens,
        temperature=opts.temperature,
        seeds=list(opts.seeds),
        warmup=opts.warmup,
        device=torch.cuda.get_device_name() if opts.gpu else f"cpu ({platform.machine()})",
        dtype=dtype_name,
        kernel_backend=ops.kernel_backend(device),
        concurrency=batch,
        versions=_versions(),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        phase_seconds=phases.report(),
        kernel_variants=variants,
    )
    return assemble(
        opts=opts,
        runs=runs,
        arms=arms,
        has_head=has_head,
        n=n,
        block_size=block_size,
        near_ties=near_ties,
        draft_info=draft_info,
        target_info=target_info,
        chat=chat,
        conditions=conditions,
        divergences=divergences,
        parity=parity,
        parity_reason=parity_reason,
        baseline=baseline,
        acceptance_stats=acceptance_stats,
        elapsed=elapsed,
        sweep=sweep,
    )


def _kernel_variants(
    warming: Any,
    device: str,
    before: dict[str, dict[str, float]] | None = None,
    tuned_before: tuple[int, float] = (0, 0.0),
) -> KernelVariants | None:
    """What this GPU run compiled ahead, what its launches waited for and what it tuned (None where it did none
    of these). `before` and `tuned_before`: warm.launch_waits() and tuner.tuning_done() when the run began (an
    earlier run in this process did those)."""
    key = warm.device_key(torch.device(device))
    earlier = (before or {}).get(key, {})
    waits = {spec: s for spec, s in warm.launch_waits().get(key, {}).items() if spec not in earlier}
    ahead = {spec for _, spec in warming.jobs} if warming is not None else set()
    tuned, tuning = tuner.tuning_done()
    tuned, tuning = tuned - tuned_before[0], max(0.0, tuning - tuned_before[1])
    if warming is None and not waits and not tuned:
        return None
    late = {spec: s for spec, s in waits.items() if spec not in ahead}
    return KernelVariants(
        ahead=len(warming.jobs) if warming is not None else 0,
        ahead_compiled=warming.compiled if warming is not None else 0,
        ahead_seconds=round(warming.seconds, 3) if warming is not None else 0.0,
        launched=len(waits),
        at_launch=len(late),
        at_launch_seconds=round(sum(late.values()), 3),
        read_seconds=round(sum(s for spec, s in waits.items() if spec in ahead), 3),
        tuned=tuned,
        tuning_seconds=round(tuning, 3),
    )


def _arm_progress(
    progress: Progress, arm: str, chooser: ThreadChooser | None
) -> Callable[[int, float], None]:
    """A batched arm's progress: called after every block with the probes that ended in it, so a log gets its line
    every interval while the arm decodes, not one line when the whole arm is done; and the block's time for the
    thread chooser."""
    blocks = 0

    def report(ended: int, seconds: float) -> None:
        nonlocal blocks
        if seconds > 0:  # a block ran (0: a request ended at its admission)
            blocks += 1
            if chooser is not None:
                chooser.done(seconds)
        progress.step(f"{arm} arm, block {blocks}", count=ended)

    return report


def _draft_info(path: str, runtime: str, ckpt: Checkpoint, drafter: Any) -> DraftCheckpoint:
    g = drafter.geometry
    local = Path(path).expanduser()
    return DraftCheckpoint(
        id=checkpoint_id(str(local.resolve())) if local.is_dir() else path,
        architecture=ckpt.parsed.config.architecture,
        head=drafter.lilicorr is not None,
        candidate_topk=g.candidate_topk if drafter.lilicorr is not None else None,
        conv_kernel_size=g.conv_kernel_size or None,
        quant_algo=ckpt.quant.quant_algo if ckpt.quant is not None else None,
        runtime=runtime,
    )


def _load_target(spec: str, dtype: Any, device: str) -> tuple[Any, TargetRecord]:
    resolved = resolve_target_spec(spec)
    check_target_files(resolved, spec)
    kind: TargetSource
    if resolved.kind == "gguf":
        kind, ident = "gguf", resolved.path.name
    elif resolved.kind == "directory":
        kind, ident = "directory", checkpoint_id(str(resolved.path))
    else:
        kind, ident = "hf_cache", spec
    try:
        with contextlib.redirect_stderr(
            io.StringIO()
        ):  # GGUF dequantization draws its own bar; ours says "loading"
            target = load_target(spec, dtype=dtype, device=device)
        _quiet_transformers()  # imported by the load when the target is not built without it
    except InputError:
        raise
    except (
        Exception
    ) as exc:  # transformers and tokenizers raise anything (even bare Exception) on hostile files
        raise InputError(f"cannot load target {spec!r}: {type(exc).__name__}: {str(exc)[:500]}") from None
    config = target.config
    architectures = getattr(target.model.config, "architectures", None) or [type(target.model).__name__]
    return target, TargetRecord(
        id=ident,
        source=kind,
        architecture=architectures[0],
        hidden_size=int(config.hidden_size),
        num_layers=int(config.num_hidden_layers),
        vocab_size=int(target.vocab_size),
        forward=target.path_note,
        loaded=target.load_note,
    )


def first_logits_finite(target: Any, prompt: Sequence[int], layer_ids: Any, spec: str) -> None:
    """One forward of the first prompt: a target whose logits are NaN or infinite (an all-NaN lm_head or
    embedding) makes every comparison meaningless, so it is refused instead of measured."""
    with torch.inference_mode():
        target.reset()
        step = target.forward(torch.tensor(list(prompt), device=target.device), layer_ids)
        finite = bool(torch.isfinite(step.logits).all())
        target.reset()
    if not finite:
        raise SmokeRefused(
            f"target {spec!r} gives non-finite logits (NaN or Inf) on the first prompt: its weights "
            "are broken (check lm_head and embed_tokens); nothing was measured"
        )


def _tokenize(
    tokenizer: Any, probes: Sequence[Probe], eos: Sequence[int]
) -> tuple[list[list[int]], ChatTemplate]:
    return tokenize_probes(tokenizer, probes, eos)  # torch-free, shared with smoke --engine


def _check_sweep(opts: SmokeOptions, target: Any, prompts: int) -> None:
    """--sweep's sizes against what this run can decode side by side (exit 4 before any arm runs)."""
    over = [b for b in opts.sweep if b > prompts]
    if over:
        raise UsageError(
            f"--sweep {over[0]}: only {prompts} prompts run, so at most {prompts} decode side by side; raise "
            "--limit (0 runs every bundled prompt) or drop that size"
        )
    if any(b > 1 for b in opts.sweep) and not isinstance(target, FastTarget):
        raise InputError(
            f"--sweep with batch sizes above 1 needs a target on the fast path (Llama, Qwen2, Qwen3); "
            f"{opts.target!r} runs {target.path_note}"
        )


def _sweep_point(
    size: int,
    arms: Sequence[Arm],
    decoder: Callable[..., Any],
    prompts: Sequence[Sequence[int]],
    eos: Sequence[int],
    opts: SmokeOptions,
    measured: dict[Arm, list[list[int]]],
    progress: Progress,
    chooser: ThreadChooser | None,
) -> SweepPoint:
    """Every arm timed over the prompts at batch `size` (the first seed; a warm-up on the longest prompt first, so
    caches and CUDA graphs for this size are built outside the time), whole arms one after another."""
    seed = opts.seeds[0]
    walls: dict[str, float] = {}
    tokens: dict[str, list[list[int]]] = {}
    longest = max(prompts, key=len)
    # its own count, not the one the last phase started
    progress.start(len(prompts) * len(arms), unit=f"generations at batch {size}")
    for arm in arms:
        progress.note(f"--sweep: the {arm} arm at batch {size}, {len(prompts)} probes")
        runner = decoder(arm, seed, size=size)
        if opts.warmup:
            runner.generate_many([longest] * size, 4, eos, batch=size)
        runner.generator.manual_seed(seed)
        if chooser is not None:
            chooser.restart()
        begin = time.perf_counter()
        results = runner.generate_many(
            prompts, opts.max_new_tokens, eos, batch=size, progress=_arm_progress(progress, arm, chooser)
        )
        if opts.gpu:
            torch.cuda.synchronize()
        walls[arm] = time.perf_counter() - begin
        tokens[arm] = [list(r.tokens) for r in results]
    rates = {arm: sum(map(len, tokens[arm])) / walls[arm] if walls[arm] > 0 else 0.0 for arm in arms}
    ar = rates.get("ar") or 0.0
    same = None
    if opts.temperature == 0:
        same = sum(all(tokens[arm][i] == list(measured[arm][i]) for arm in arms) for i in range(len(prompts)))
    return SweepPoint(
        batch=size,
        requests=len(prompts),
        wall_time_s={arm: round(walls[arm], 4) for arm in arms},
        tokens_per_second={arm: round(rates[arm], 3) for arm in arms},
        speedup_vs_ar={arm: round(rates[arm] / ar, 4) if ar > 0 else None for arm in arms},
        same_tokens=same,
    )


def _batch_size(
    opts: SmokeOptions, target: Any, drafter: Any, prompts: Sequence[Sequence[int]], n: int
) -> int:
    """--batch, or by default as many probes as fit in half the free GPU memory (three arms' caches and logits per
    slot), at most MAX_DEFAULT_BATCH; 1 on the CPU or for a target off the fast path."""
    if opts.batch is not None:
        if opts.batch > 1 and not isinstance(target, FastTarget):
            raise InputError(
                f"--batch {opts.batch} needs a target on the fast path (Llama, Qwen2, Qwen3); "
                f"{opts.target!r} runs {target.path_note}"
            )
        return min(opts.batch, len(prompts))
    if not opts.gpu or not isinstance(target, FastTarget):
        return 1
    rows = max(len(p) for p in prompts) + opts.max_new_tokens + n + 2
    capacity = max(256, 1 << (rows - 1).bit_length())
    core, g = target.core, drafter.geometry
    element = torch.finfo(target.dtype).bits // 8
    target_kv = 2 * core.num_layers * core.num_kv_heads * capacity * core.head_dim * element
    draft_kv = 2 * g.num_layers * g.num_kv_heads * capacity * g.head_dim * element
    logits = (
        6 * (n + 1) * target.vocab_size * 4
    )  # verify logits, probabilities, proposals, draft logits (fp32)
    per_slot = 3 * (target_kv + draft_kv + logits)  # one device loop per arm
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(len(prompts), MAX_DEFAULT_BATCH, int(free // 2 // per_slot)))


def greedy_checks(
    target: Any,
    runs: Sequence[Run],
    dtype: str,
    eos: Sequence[int],
    max_new_tokens: int,
    progress: Progress | None = None,
    chooser: ThreadChooser | None = None,
) -> tuple[list[Divergence], dict[tuple[str, int], int | None]]:
    """The lossless check of every speculative generation and the reference's first near-tie per request, from
    one target forward over prompt + target-only tokens per request and, where an arm took the other token of a
    numerical tie, one more over that arm's tokens after it.

    Losslessness: each speculative generation against the `ar` arm's tokens, token by token. At the first
    divergence the target's logits after the common prefix (from the `ar` forward) give the gap between the two
    tokens; a gap within the dtype's round-off is a numerical tie, which two kernels may round either way. Past a
    tie the reference is the target's greedy choice given the speculative prefix: the arm's remaining tokens are
    fed to the target after the prefix through the tie (the cache holds the shared prefix), and each must be
    the argmax of the logits before it, or within round-off of it (another tie), so every token is checked. Any
    other divergence is a runtime bug and ends that generation's check. A generation that stops before eos and
    max_new_tokens while the target goes on diverges at its end.

    Near ties (for smoke --engine): the first `ar` token whose target logit gap to the runner-up is within
    bfloat16 round-off (ties.first_near_tie), from the same forward. `chooser` hears the rows forwarded for each
    request."""
    tok = target.tokenizer
    stops = set(eos)
    found: list[Divergence] = []
    near: dict[tuple[str, int], int | None] = {}

    def divergence(
        probe: Probe, seed: int, arm: str, i: int, want: int, emitted: int, logits: Any
    ) -> Divergence:
        gap, tie = None, False
        if want >= 0 and emitted >= 0:
            gap = float(logits[want] - logits[emitted])
            tie = abs(gap) <= TIE_RELATIVE[dtype] * max(1.0, float(logits[want].abs()))
        return Divergence(
            request=probe.id,
            seed=seed,
            arm=arm,
            position=i,
            expected=want,
            emitted=emitted,
            logit_gap=gap,
            tie=tie,
            expected_text=tok.decode([want]) if want >= 0 else "<end>",
            emitted_text=tok.decode([emitted]) if emitted >= 0 else "<end>",
        )

    if progress is not None:
        progress.start(len(runs), unit="requests checked")
    if chooser is not None:
        chooser.restart()
    # a request whose every arm emitted the reference's tokens needs only the reference's near-tie: those come
    # from batched forwards; a diverging one is checked alone, with the target's cache holding its prefix
    batched = isinstance(target, FastTarget)
    equal: list[Run] = []
    alone: list[Run] = []
    for run in runs:
        same = batched and all(list(r.tokens) == list(run[3]["ar"].tokens) for r in run[3].values())
        (equal if same else alone).append(run)
    if equal:
        for batch, logits in _batched_reference(
            target, [(ids, list(by["ar"].tokens)) for _, _, ids, by in equal]
        ):
            begin = time.perf_counter()
            for j, i in enumerate(batch):
                probe, seed, ids, by_arm = equal[i]
                ref = list(by_arm["ar"].tokens)
                p = len(ids)
                near[(probe.id, seed)] = (
                    first_near_tie(logits[j, p - 1 : p - 1 + len(ref)], ref) if ref else None
                )
                if progress is not None:
                    progress.step(f"{probe.id}")
            if chooser is not None:
                rows = sum(len(equal[i][2]) + len(equal[i][3]["ar"].tokens) for i in batch)
                chooser.done((time.perf_counter() - begin) / max(rows, 1))
    with torch.inference_mode():
        for probe, seed, ids, by_arm in alone:
            begin = time.perf_counter()
            ref = list(by_arm["ar"].tokens)
            p = len(ids)
            target.reset()
            # row p - 1 + j predicts ref[j]; the cache then holds prompt + ref
            ref_logits = target.forward(torch.tensor(list(ids) + ref, device=target.device), None).logits
            rows = p + len(ref)
            near[(probe.id, seed)] = (
                first_near_tie(ref_logits[p - 1 : p - 1 + len(ref)], ref) if ref else None
            )
            cached = len(ref)  # the cache holds prompt + ref[:cached]
            for arm, result in by_arm.items():
                if arm == "ar":
                    continue
                got = list(result.tokens)
                common = min(len(got), len(ref))
                i = next((j for j in range(common) if got[j] != ref[j]), common)
                if i == len(got) == len(ref):
                    continue  # equal to the end
                want = ref[i] if i < len(ref) else -1
                emitted = got[i] if i < len(got) else -1
                first = divergence(probe, seed, arm, i, want, emitted, ref_logits[p - 1 + i])
                found.append(first)
                if not first.tie or i + 1 >= len(got):
                    continue
                # past the tie: got[i + 1:] against the target's greedy choice after prompt + got[:i + 1]
                if cached < i:  # an earlier arm's tokens overwrote the rows past prompt + ref[:cached]
                    target.crop(p + cached)
                    target.forward(torch.tensor(ref[cached:i], device=target.device), None)
                    rows += i - cached
                target.crop(p + i)
                logits = target.forward(torch.tensor(got[i:], device=target.device), None).logits
                rows += len(got) - i
                cached = min(cached, i)
                # row r predicts got[i + 1 + r]; the last row predicts what follows the last token
                argmax = logits.argmax(dim=-1).tolist()
                for j in range(i + 1, len(got)):
                    row = j - i - 1
                    if got[j] == argmax[row]:
                        continue
                    later = divergence(probe, seed, arm, j, argmax[row], got[j], logits[row])
                    found.append(later)
                    if not later.tie:
                        break
                else:
                    if len(got) < max_new_tokens and got[-1] not in stops:
                        found.append(divergence(probe, seed, arm, len(got), argmax[-1], -1, logits[-1]))
            target.reset()
            if chooser is not None:
                chooser.done((time.perf_counter() - begin) / rows)
            if progress is not None:
                progress.step(f"{probe.id}")
    return found, near


# what one batched reference forward may hold beyond a one-request forward: its fp32 logits, its own K/V cache and
# its activations, estimated per row (one request always runs, as it did alone)
REFERENCE_BYTES = 1 << 30
REFERENCE_BATCH = 64  # requests per batched reference forward, at most


def reference_row_bytes(target: FastTarget) -> int:
    """Bytes a row of a batched reference forward takes: fp32 logits, its K and V in every layer, and the widest
    activations of a layer (the fused gate_up's output and a few hidden-width buffers, fp32 at most)."""
    core = target.core
    element = torch.empty((), dtype=core.dtype).element_size()
    cache = core.num_layers * 2 * core.num_kv_heads * core.head_dim * element
    activations = (2 * core.intermediate + 6 * core.hidden_size) * 4
    return target.vocab_size * 4 + cache + activations


def _batched_reference(
    target: FastTarget, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> Iterator[tuple[list[int], torch.Tensor]]:
    """(indices into `requests`, fp32 logits [len(indices), rows, V]) for batches of (prompt, reference tokens)
    requests, longest first: each forward runs a fresh cache of its own over prompt + reference per request,
    right-padded to the batch's longest (a row sees only the rows before it, so padding after a request changes
    none of its rows). Row i of request j predicts the token after its i-th. The step kernels compute every row
    as a one-request forward does, bit for bit on CUDA."""
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    per_row = reference_row_bytes(target)
    done = 0
    with torch.inference_mode():
        while done < len(order):
            longest = len(requests[order[done]][0]) + len(requests[order[done]][1])
            fit = max(1, min(REFERENCE_BATCH, REFERENCE_BYTES // max(1, longest * per_row)))
            batch = order[done : done + fit]
            done += len(batch)
            ids = torch.zeros(len(batch), longest, dtype=torch.long)
            for j, i in enumerate(batch):
                row = list(requests[i][0]) + list(requests[i][1])
                ids[j, : len(row)] = torch.tensor(row, dtype=torch.long)
            ids = ids.to(target.device)
            cache = target.core.new_cache(len(batch), longest)
            zero = torch.zeros((), dtype=torch.long, device=target.device)
            pad = torch.zeros(len(batch), dtype=torch.long, device=target.device)
            hidden, _ = target.core.forward(
                cache, target.embed_tokens(ids), zero, pad, (), step_kernels=longest <= PREFILL_ROWS or None
            )
            yield batch, target.step_logits(hidden)
            del cache, hidden


def kernel_parity(
    head_decoder: Any, prompt: Sequence[int], n: int, temperature: float, eos: Sequence[int], blocks: int
) -> list[ParityCheck]:
    """Rerun the first blocks of a prompt keeping the drafter's real logits and head scores, and compare
    each draft-step op with its torch reference on them: same candidates, same greedy and sampled paths."""
    result = head_decoder.generate(prompt, blocks * (n + 1) + 1, eos_token_ids=eos)
    generator = torch.Generator().manual_seed(0)
    checks = []
    for b, p in enumerate(result.proposals[:blocks]):
        logits = p.logits.flatten(0, 1)  # [n, V]
        k = p.candidate_ids.shape[-1]
        ref, got = ops.topk_lse_reference(logits, k), ops.topk_lse(logits, k)
        checks.append(_compare(b, "topk_lse", ref, got, exact=(1,)))
        ref_path = ops.greedy_walk_reference(p.start, p.pairs, p.candidate_ids)
        got_path = ops.greedy_walk(p.start, p.pairs, p.candidate_ids)
        checks.append(_compare(b, "greedy_walk", (ref_path,), (got_path,), exact=(0,)))
        device = p.start.device
        uniforms = torch.rand(1, p.candidate_ids.shape[1], generator=generator).to(device)  # [1, n]
        temps = torch.full((1,), temperature if temperature > 0 else 1.0, device=device)
        greedy = torch.zeros(1, dtype=torch.bool, device=device)
        ref_s = ops.sample_walk_reference(p.start, p.pairs, p.candidate_ids, uniforms, temps, greedy)
        got_s = ops.sample_walk(p.start, p.pairs, p.candidate_ids, uniforms, temps, greedy)
        checks.append(_compare(b, "sample_walk", ref_s, got_s, exact=(0,)))
    return checks


def _compare(
    block: int, op: str, ref: Sequence[Any], got: Sequence[Any], exact: Sequence[int]
) -> ParityCheck:
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        if a.shape != b.shape:
            return ParityCheck(
                block=block,
                op=op,
                passed=False,
                detail=f"output {i}: shape {tuple(b.shape)}, reference {tuple(a.shape)}",
            )
        a, b = a.cpu(), b.cpu()
        if i in exact:
            same = bool(torch.equal(a, b))
        else:
            same = bool(torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-5, equal_nan=True))
        if not same:
            where = (a != b).nonzero()
            first = tuple(where[0].tolist()) if len(where) else ()
            return ParityCheck(
                block=block,
                op=op,
                passed=False,
                detail=f"output {i} differs first at {first}: kernel {b[first].tolist() if first else b}, "
                f"reference {a[first].tolist() if first else a}",
            )
    return ParityCheck(block=block, op=op, passed=True)


def _quiet_transformers() -> None:
    """transformers' progress bars off, when it is imported: a Llama / Qwen2 / Qwen3 target is built without it
    (lilicorr_runtime/target/native.py), and smoke then never imports it."""
    module = sys.modules.get("transformers")
    if module is not None:
        module.utils.logging.disable_progress_bar()


def _version(package: str) -> str:
    """An installed package's version, read from its metadata (not by importing it)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _versions() -> dict[str, str]:
    out = {
        "lilicorr-ckpt": __version__,
        "torch": str(torch.__version__),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
    }
    try:
        import triton

        out["triton"] = str(triton.__version__)
    except ImportError:
        pass
    return out
