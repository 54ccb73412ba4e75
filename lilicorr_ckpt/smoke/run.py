"""`smoke`: decode the probe prompts with the head, the head-free control and the target alone, in one process.

Imports torch, transformers and lilicorr_runtime (the runtime extra) at import time: the command line and
`lilicorr_ckpt.smoke.smoke` import it through `smoke.options.runner` only when smoke runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import torch
import transformers

from lilicorr_ckpt import __version__
from lilicorr_ckpt.checkpoint import Checkpoint, load_checkpoint, resolve_target_spec
from lilicorr_ckpt.checkpoint.source import PICKLE_SUFFIXES
from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.checkpoint.tensors import read_header
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.errors import InputError, SmokeRefused, UsageError
from lilicorr_ckpt.smoke.gates import (
    ArmAgreement,
    Divergence,
    ParityCheck,
    baseline_gate,
    compare_baseline,
    head_gate,
    lossless_gate,
    measured_gate,
    parity_gate,
    position_gate,
    read_baseline,
    tau_floor_gate,
)
from lilicorr_ckpt.smoke.load import build_valid_drafter
from lilicorr_ckpt.smoke.options import SmokeOptions, check_options
from lilicorr_ckpt.smoke.probes import Probe, counts, digest, load_probes
from lilicorr_ckpt.smoke.profile import (
    ARMS,
    ArmStats,
    CategoryProfile,
    ChatTemplate,
    DraftCheckpoint,
    HeadGain,
    MeasurementConditions,
    RequestRecord,
    SmokeReport,
    TargetRecord,
    checkpoint_id,
    dense_histogram,
    dense_rates,
    per_request_mean,
    position_counts,
    relative_gain,
    validation_of,
)
from lilicorr_ckpt.smoke.ties import reference_ties
from lilicorr_ckpt.smoke.tokenize import tokenize_probes
from lilicorr_runtime import CheckpointRefused, SpeculativeDecoder, acceptance_stats, load_target, ops
from lilicorr_runtime.target.fast import FastTarget

# Two kernels may round a near-tie either way. A divergence whose target logit gap is below this fraction
# of the logit's magnitude (at least 1.0) is a tie-flip, not a bug: a few ulps of the dtype, accumulated.
TIE_RELATIVE = {"float32": 2.0 ** -14, "float16": 2.0 ** -8, "bfloat16": 2.0 ** -5}
PARITY_BLOCKS = 4
MAX_DEFAULT_BATCH = 256  # the default --batch on the GPU: as many probes as fit, at most this many


CPU_THREADS = 1  # intra-op threads on the CPU unless OMP_NUM_THREADS says otherwise (docs/performance.md)


def cpu_threads() -> int:
    """Token-by-token decoding of small models gains nothing from many intra-op threads and loses much to their
    contention on a shared machine, so smoke on the CPU uses min(cores, CPU_THREADS) unless OMP_NUM_THREADS is set
    (torch reads it itself)."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, min(cores, CPU_THREADS))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def run_smoke(opts: SmokeOptions, progress: Progress | None = None) -> SmokeReport:
    check_options(opts)
    progress = progress or Progress(enabled=False, name="smoke")
    probes = load_probes(opts.probes, opts.limit)
    baseline = read_baseline(opts.baseline) if opts.baseline else None
    transformers.utils.logging.disable_progress_bar()  # our own progress line stands for the loading steps
    if opts.gpu and not torch.cuda.is_available():
        raise InputError(f"--gpu needs a CUDA device, and torch {torch.__version__} sees none "
                         "(torch.cuda.is_available() is False); run without --gpu for the CPU reference")
    device = "cuda" if opts.gpu else "cpu"
    if not opts.gpu:
        cpu_threads()
    dtype_name = opts.dtype or ("bfloat16" if opts.gpu else "float32")
    dtype = getattr(torch, dtype_name)

    progress.note("loading the drafter")
    ckpt = load_checkpoint(opts.path)
    try:
        drafter = build_valid_drafter(ckpt, runtime=opts.runtime, dtype=dtype, device=device)
    except CheckpointRefused as exc:
        raise SmokeRefused(str(exc)) from None
    draft_info = _draft_info(opts.path, opts.runtime, ckpt, drafter)
    progress.note("loading the target")
    target, target_info = _load_target(opts.target, dtype, device)
    if target.tokenizer is None:
        raise InputError(f"target {opts.target!r} has no tokenizer (tokenizer.json / tokenizer_config.json); smoke "
                         "tokenizes the probe prompts with it")

    g = drafter.geometry
    slots = g.block_size - 1
    n = slots if opts.num_speculative_tokens is None else opts.num_speculative_tokens
    if n > slots:
        raise UsageError(f"--num-speculative-tokens {n} exceeds the drafter's {slots} slots (block_size {g.block_size})")
    if len(opts.min_accept_rates) > n:
        raise UsageError(f"--min-accept-rates gives {len(opts.min_accept_rates)} floors, but only {n} positions "
                         "are drafted")
    has_head = drafter.lilicorr is not None
    arms = [a for a in ARMS if a != "head" or has_head]
    eos = list(target.eos_token_ids)  # the generation config's, as HF generate stops
    outside = [e for e in eos if not isinstance(e, int) or not 0 <= e < target.vocab_size]
    if outside:
        raise InputError(f"target {opts.target!r}: eos_token_id {outside[0]} is outside its vocabulary "
                         f"({target.vocab_size} tokens); fix eos_token_id in config.json / generation_config.json")
    prompts, chat = _tokenize(target.tokenizer, probes, eos)
    positions = getattr(target.model.config, "max_position_embeddings", None)
    for probe, ids in zip(probes, prompts, strict=True):
        if isinstance(positions, int) and len(ids) + opts.max_new_tokens + g.block_size > positions:
            raise InputError(f"probe {probe.id}: {len(ids)} prompt tokens + --max-new-tokens {opts.max_new_tokens} "
                             f"+ one block ({g.block_size}) exceed the target's {positions} positions; lower "
                             "--max-new-tokens or shorten the prompt")
        if max(ids) >= target.vocab_size:
            raise InputError(f"probe {probe.id}: the target's tokenizer gives id {max(ids)}, outside its embedding "
                             f"table ({target.vocab_size} rows): the tokenizer does not belong to this model")

    first_logits_finite(target, prompts[0], drafter.target_layer_ids, opts.target)
    batch = _batch_size(opts, target, drafter, prompts, n)
    # batched arms need the device loop, which runs on the fast target path (on the CPU too, without graphs)
    loop = "device" if batch > 1 else None

    def decoder(arm: str, seed: int, keep: bool = False) -> Any:
        try:
            return SpeculativeDecoder(target, None if arm == "ar" else drafter, mode=arm,
                                      num_speculative_tokens=None if arm == "ar" else n,
                                      temperature=opts.temperature, seed=seed, keep_proposals=keep,
                                      loop=None if keep else loop)
        except ValueError as exc:
            raise SmokeRefused(f"{exc}\n  `lilicorr-ckpt validate {opts.path} --target {opts.target}` "
                               "lists every mismatch") from None

    # one decoder per arm, re-seeded for each seed: a warm-up on the longest prompt sizes the caches (and captures
    # the CUDA graphs) once, outside the timed runs
    decoders = {arm: decoder(arm, opts.seeds[0]) for arm in arms}
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

    progress.start(len(prompts) * len(opts.seeds) * len(arms))
    runs: list[tuple[Probe, int, list[int], dict[str, Any]]] = []  # probe, seed, prompt ids, arm -> result
    elapsed: dict[str, float] | None = None  # batched: each arm's wall time over all its probes
    for seed in opts.seeds:
        for arm in arms:
            decoders[arm].generator.manual_seed(seed)
        if batch == 1:
            for probe, ids in zip(probes, prompts, strict=True):
                by_arm = {}
                for arm in arms:  # interleaved, so machine drift lands on every arm alike
                    by_arm[arm] = decoders[arm].generate(ids, opts.max_new_tokens, eos_token_ids=eos)
                    progress.step(f"{arm} {probe.id}")
                runs.append((probe, seed, ids, by_arm))
            continue
        elapsed = elapsed or dict.fromkeys(arms, 0.0)
        results = {}
        for arm in arms:  # whole arms, one after another: each batch shares the GPU only with its own arm
            begin = time.perf_counter()
            results[arm] = decoders[arm].generate_many(prompts, opts.max_new_tokens, eos, batch=batch)
            if opts.gpu:
                torch.cuda.synchronize()
            elapsed[arm] += time.perf_counter() - begin
            for probe in probes:
                progress.step(f"{arm} {probe.id}")
        for i, (probe, ids) in enumerate(zip(probes, prompts, strict=True)):
            runs.append((probe, seed, ids, {arm: results[arm][i] for arm in arms}))

    divergences: list[Divergence] = []
    if opts.temperature == 0:
        progress.note("checking losslessness")
        divergences = lossless_divergences(target, decoders["ar"], runs, dtype_name, eos, opts.max_new_tokens, batch)
    parity: list[ParityCheck] | None = None
    parity_reason = ""
    if opts.gpu:
        progress.note("kernel parity")
        if ops.kernel_backend(device) != "triton":
            parity_reason = "Triton is not importable here: the draft step ran the torch references"
        elif not has_head:
            parity_reason = "the checkpoint has no head: the control's per-slot argmax runs no kernel"
        else:
            parity = kernel_parity(decoder("head", 0, keep=True), prompts[0], n, opts.temperature,
                                   eos, PARITY_BLOCKS)
    # greedy: where another stack may pick either of two near-tied tokens (smoke --engine compares up to there)
    near_ties = reference_ties(target, runs) if opts.temperature == 0 else None
    progress.finish()

    conditions = MeasurementConditions(
        probes=opts.probes, probe_counts=counts(probes), probe_digest=digest(probes), limit=opts.limit,
        max_new_tokens=opts.max_new_tokens, temperature=opts.temperature, seeds=list(opts.seeds),
        warmup=opts.warmup, device=torch.cuda.get_device_name() if opts.gpu else f"cpu ({platform.machine()})",
        dtype=dtype_name, kernel_backend=ops.kernel_backend(device), concurrency=batch,
        versions=_versions(), measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return assemble(opts=opts, runs=runs, arms=arms, has_head=has_head, n=n, block_size=g.block_size, near_ties=near_ties,
                    draft_info=draft_info, target_info=target_info, chat=chat, conditions=conditions,
                    divergences=divergences, parity=parity, parity_reason=parity_reason, baseline=baseline,
                    elapsed=elapsed)


def assemble(*, opts: SmokeOptions, runs: Sequence[tuple[Probe, int, list[int], dict[str, Any]]],
             arms: Sequence[str], has_head: bool, n: int, block_size: int, draft_info: DraftCheckpoint,
             near_ties: dict[tuple[str, int], int | None] | None = None,
             target_info: TargetRecord, chat: ChatTemplate, conditions: MeasurementConditions,
             divergences: Sequence[Divergence], parity: Sequence[ParityCheck] | None, parity_reason: str,
             baseline: Any, elapsed: dict[str, float] | None = None) -> SmokeReport:
    """The report. `elapsed` (batched arms): each arm's wall time over all its probes, which the overall tok/s
    divide by; per category, and per request, tok/s divide by the requests' own (overlapping) wall times."""
    primary = "head" if has_head else "control"

    def arm_stats(results: Sequence[Any], arm: str, ar_tps: float | None, wall: float | None = None) -> ArmStats:
        s = acceptance_stats(results)
        if wall is not None:
            s = msgspec.structs.replace(s, wall_time_s=wall, tokens_per_second=s.tokens / wall if wall > 0 else 0.0)
        width = 0 if arm == "ar" else n
        return ArmStats(
            requests=s.requests, blocks=s.blocks, tokens=s.tokens, mean_accept_length=round(s.tau, 6),
            mean_accept_length_per_request=round(per_request_mean(s.tau_per_request,
                                                                   [len(r.blocks) for r in results]), 6),
            conditional_accept_rates=[round(x, 6) for x in dense_rates(s.conditional_acceptance, width)],
            marginal_accept_rates=[round(x, 6) for x in dense_rates(s.marginal_acceptance, width)],
            acceptance_length_histogram=dense_histogram(s.committed_histogram, 1 if arm == "ar" else block_size),
            wall_time_s=round(s.wall_time_s, 6), tokens_per_second=round(s.tokens_per_second, 3),
            speedup_vs_ar=None if not ar_tps else round(s.tokens_per_second / ar_tps, 4),
            position_counts=position_counts([(b.drafted, b.accepted) for r in results for b in r.blocks], width))

    def arms_for(selected: Sequence[Any], walls: dict[str, float] | None = None) -> dict[str, ArmStats]:
        ar = arm_stats([r[3]["ar"] for r in selected], "ar", None, walls["ar"] if walls else None)
        out = {arm: arm_stats([r[3][arm] for r in selected], arm, ar.tokens_per_second, walls[arm] if walls else None)
               for arm in arms if arm != "ar"}
        return {**out, "ar": ar}

    overall = arms_for(runs, elapsed)
    categories = list(dict.fromkeys(r[0].category for r in runs))
    per_category = {}
    for c in categories:
        c_arms = arms_for([r for r in runs if r[0].category == c])
        p = c_arms[primary]
        per_category[c] = CategoryProfile(
            requests=p.requests, mean_accept_length=p.mean_accept_length,
            mean_accept_length_per_request=p.mean_accept_length_per_request,
            conditional_accept_rates=p.conditional_accept_rates, marginal_accept_rates=p.marginal_accept_rates,
            acceptance_length_histogram=p.acceptance_length_histogram, arms=c_arms)
    main = overall[primary]

    def tau(arms_: dict[str, ArmStats], arm: str) -> float:
        return arms_[arm].mean_accept_length

    gains = {c: relative_gain(tau(p.arms, "head"), tau(p.arms, "control")) if has_head else None
             for c, p in per_category.items()}
    head_gain = HeadGain(overall=relative_gain(tau(overall, "head"), tau(overall, "control")) if has_head else None,
                         per_category=gains)

    diverged = {(d.request, d.seed, d.arm) for d in divergences if not d.tie}  # a tie is re-anchored, not a loss
    requests = []
    for probe, seed, ids, by_arm in runs:
        lossless = None if opts.temperature > 0 else not any((probe.id, seed, a) in diverged for a in by_arm)
        requests.append(RequestRecord(
            id=probe.id, category=probe.category, seed=seed, prompt_tokens=len(ids),
            new_tokens={a: len(r.tokens) for a, r in by_arm.items()},
            tau={a: round(sum(b.committed for b in r.blocks) / len(r.blocks), 6) if r.blocks else 0.0
                 for a, r in by_arm.items()},
            tokens_per_second={a: round(len(r.tokens) / r.wall_time_s, 3) if r.wall_time_s > 0 else 0.0
                               for a, r in by_arm.items()},
            lossless=lossless, blocks={a: len(r.blocks) for a, r in by_arm.items()},
            reference_tokens=list(by_arm["ar"].tokens) if opts.temperature == 0 else [],
            first_near_tie=(near_ties or {}).get((probe.id, seed))))

    spec_runs = len(runs) * (len(arms) - 1)
    gates = [measured_gate(main.blocks, main.requests, primary),
             lossless_gate(spec_runs, divergences, opts.temperature, conditions.dtype),
             head_gate(has_head, tau(overall, "head") if has_head else None, tau(overall, "control"),
                       opts.min_head_gain, gains, agreement(runs, opts.temperature) if has_head else None)]
    if opts.min_tau is not None:
        gates.append(tau_floor_gate(opts.min_tau, main.mean_accept_length, primary))
    if opts.min_accept_rates:
        gates.append(position_gate(opts.min_accept_rates, main.marginal_accept_rates, primary))
    comparison = None
    if baseline is not None:
        assert opts.baseline is not None
        comparison = compare_baseline(
            opts.baseline, baseline, taus={a: s.mean_accept_length for a, s in overall.items()},
            category_taus={c: {a: s.mean_accept_length for a, s in p.arms.items()} for c, p in per_category.items()},
            conditions=conditions, num_speculative_tokens=n, target=target_info, tolerance=opts.tolerance)
        gates.append(baseline_gate(comparison))
    gates.append(parity_gate(opts.gpu, parity, parity_reason))

    return SmokeReport(
        measured=main.blocks > 0, method="lilicorr" if has_head else "dflash", draft_checkpoint=draft_info,
        target_model=target_info, num_speculative_tokens=n, block_size=block_size, max_supported_k=block_size - 1,
        conditional_accept_rates=main.conditional_accept_rates, marginal_accept_rates=main.marginal_accept_rates,
        mean_accept_length=main.mean_accept_length,
        mean_accept_length_per_request=main.mean_accept_length_per_request,
        accept_length_by_k={str(n): main.mean_accept_length},
        acceptance_length_histogram=main.acceptance_length_histogram, per_category=per_category,
        measurement_conditions=conditions, validation=validation_of(main), primary_arm=primary, arms=overall,
        head_gain=head_gain, chat_template=chat, requests=requests, gates=gates, baseline=comparison,
        passed=all(gate.status != "fail" for gate in gates))


def agreement(runs: Sequence[tuple[Probe, int, list[int], dict[str, Any]]], temperature: float) -> ArmAgreement:
    """The head arm's blocks against the control's. Under greedy decoding both arms emit the target's tokens, so
    equal accepted counts in every block of every request is what a head that takes the control's top-1 candidate
    (a zero or missing head) produces; sampled arms draw differently, and only the accepted totals are compared."""
    def accepted(result: Any) -> list[int]:
        return [b.accepted for b in result.blocks]

    identical = None
    if temperature == 0:
        identical = sum(accepted(r[3]["head"]) == accepted(r[3]["control"]) for r in runs)
    return ArmAgreement(requests=len(runs), identical=identical,
                        head_accepted=sum(sum(accepted(r[3]["head"])) for r in runs),
                        control_accepted=sum(sum(accepted(r[3]["control"])) for r in runs))


def _draft_info(path: str, runtime: str, ckpt: Checkpoint, drafter: Any) -> DraftCheckpoint:
    g = drafter.geometry
    local = Path(path).expanduser()
    return DraftCheckpoint(id=checkpoint_id(str(local.resolve())) if local.is_dir() else path,
                           architecture=ckpt.parsed.config.architecture, head=drafter.lilicorr is not None,
                           candidate_topk=g.candidate_topk if drafter.lilicorr is not None else None,
                           conv_kernel_size=g.conv_kernel_size or None,
                           quant_algo=ckpt.quant.quant_algo if ckpt.quant is not None else None, runtime=runtime)


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def check_target_files(resolved: Any, spec: str) -> None:
    """Before anything is allocated: a target directory must hold safetensors weights (pickles are never opened,
    not even by a library), and the sizes its config states must match what those weights hold, so a config
    saying 10**6 layers or a vocabulary of 10**9 is refused instead of built."""
    if resolved.kind == "gguf":
        return
    root = resolved.path
    weights = sorted(root.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise InputError(f"target {spec!r} holds only pickle weights ({', '.join(pickles[:3])}); pickles are never "
                             "opened (unpickling runs code): convert the target to safetensors first")
        raise InputError(f"target {spec!r} has no *.safetensors weights")
    info = read_target(spec)  # config plus the embedding's header shape, no tensor data
    layers: set[int] = set()
    for path in weights:
        tensors, _ = read_header(path, path.name)
        layers.update(int(m.group(1)) for name in tensors if (m := _LAYER_INDEX.search(name)))
    problems = []
    if info.unreadable:
        problems += [f"{key}: {why}" for key, why in info.unreadable.items()]
    if info.num_layers is not None and layers and info.num_layers != max(layers) + 1:
        problems.append(f"num_hidden_layers is {info.num_layers}, but the weights hold layers 0..{max(layers)}")
    if info.embedding_rows is not None and info.vocab_size is not None and info.vocab_size != info.embedding_rows:
        problems.append(f"vocab_size is {info.vocab_size}, but the embedding has {info.embedding_rows} rows")
    if info.embedding_width is not None and info.hidden_size is not None and info.hidden_size != info.embedding_width:
        problems.append(f"hidden_size is {info.hidden_size}, but the embedding is {info.embedding_width} wide")
    if problems:
        raise InputError(f"target {spec!r}: its config.json does not describe its weights: " + "; ".join(problems))
    vocab = info.embedding_rows or info.vocab_size
    for name, value in info.special_ids.items():
        if vocab is not None and not 0 <= value < vocab:
            raise InputError(f"target {spec!r}: {name}_token_id {value} is outside its vocabulary ({vocab} tokens); "
                             "fix it in config.json / generation_config.json")


def _load_target(spec: str, dtype: Any, device: str) -> tuple[Any, TargetRecord]:
    resolved = resolve_target_spec(spec)
    check_target_files(resolved, spec)
    if resolved.kind == "gguf":
        kind, ident = "gguf", resolved.path.name
    elif resolved.kind == "directory":
        kind, ident = "directory", checkpoint_id(str(resolved.path))
    else:
        kind, ident = "hf_cache", spec
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # GGUF dequantization draws its own bar; ours says "loading"
            target = load_target(spec, dtype=dtype, device=device)
    except InputError:
        raise
    except Exception as exc:  # transformers and tokenizers raise anything (even bare Exception) on hostile files
        raise InputError(f"cannot load target {spec!r}: {type(exc).__name__}: {str(exc)[:500]}") from None
    config = target.config
    architectures = getattr(target.model.config, "architectures", None) or [type(target.model).__name__]
    return target, TargetRecord(id=ident, source=kind, architecture=architectures[0],
                               hidden_size=int(config.hidden_size), num_layers=int(config.num_hidden_layers),
                               vocab_size=int(target.vocab_size), forward=target.path_note)


def first_logits_finite(target: Any, prompt: Sequence[int], layer_ids: Any, spec: str) -> None:
    """One forward of the first prompt: a target whose logits are NaN or infinite (an all-NaN lm_head or
    embedding) makes every comparison meaningless, so it is refused instead of measured."""
    with torch.inference_mode():
        target.reset()
        step = target.forward(torch.tensor(list(prompt), device=target.device), layer_ids)
        finite = bool(torch.isfinite(step.logits).all())
        target.reset()
    if not finite:
        raise SmokeRefused(f"target {spec!r} gives non-finite logits (NaN or Inf) on the first prompt: its weights "
                           "are broken (check lm_head and embed_tokens); nothing was measured")


def _tokenize(tokenizer: Any, probes: Sequence[Probe], eos: Sequence[int]) -> tuple[list[list[int]], ChatTemplate]:
    return tokenize_probes(tokenizer, probes, eos)  # torch-free, shared with smoke --engine


def _batch_size(opts: SmokeOptions, target: Any, drafter: Any, prompts: Sequence[Sequence[int]], n: int) -> int:
    """--batch, or by default as many probes as fit in half the free GPU memory (three arms' caches and logits per
    slot), at most MAX_DEFAULT_BATCH; 1 on the CPU or for a target off the fast path."""
    if opts.batch is not None:
        if opts.batch > 1 and not isinstance(target, FastTarget):
            raise InputError(f"--batch {opts.batch} needs a target on the fast path (Llama, Qwen2, Qwen3); "
                             f"{opts.target!r} runs {target.path_note}")
        return min(opts.batch, len(prompts))
    if not opts.gpu or not isinstance(target, FastTarget):
        return 1
    rows = max(len(p) for p in prompts) + opts.max_new_tokens + n + 2
    capacity = max(256, 1 << (rows - 1).bit_length())
    core, g = target.core, drafter.geometry
    element = torch.finfo(target.dtype).bits // 8
    target_kv = 2 * core.num_layers * core.num_kv_heads * capacity * core.head_dim * element
    draft_kv = 2 * g.num_layers * g.num_kv_heads * capacity * g.head_dim * element
    logits = 6 * (n + 1) * target.vocab_size * 4  # verify logits, probabilities, proposals, draft logits (fp32)
    per_slot = 3 * (target_kv + draft_kv + logits)  # one device loop per arm
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(len(prompts), MAX_DEFAULT_BATCH, int(free // 2 // per_slot)))


def lossless_divergences(target: Any, ar_decoder: Any, runs: Sequence[tuple[Probe, int, list[int], dict[str, Any]]],
                         dtype: str, eos: Sequence[int], max_new_tokens: int, batch: int) -> list[Divergence]:
    """Every speculative generation against target-only greedy decoding, token by token over its whole length.

    At a divergence the target's logits after the common prefix are recomputed in one forward. A gap within the
    dtype's round-off is a numerical tie: two kernels may round it either way. The reference is then regenerated
    from the speculative prefix (prompt + the speculative tokens through the tie, target-only greedy from there;
    all regenerations of a round run as one batch) and the comparison goes on past it, so every token is checked.
    Any other divergence is a runtime bug and ends that generation's check."""
    tok = target.tokenizer
    found: list[Divergence] = []
    # probe, seed, arm, prompt ids, speculative tokens, the reference aligned with them, checked before this index
    pending = [(probe, seed, arm, ids, result.tokens, by_arm["ar"].tokens, 0)
               for probe, seed, ids, by_arm in runs for arm, result in by_arm.items() if arm != "ar"]
    while pending:
        anchors = []
        for probe, seed, arm, ids, got, ref, start in pending:
            common = min(len(got), len(ref))
            i = next((j for j in range(start, common) if got[j] != ref[j]), common)
            if i == len(got) == len(ref):
                continue  # equal to the end
            want = ref[i] if i < len(ref) else -1
            emitted = got[i] if i < len(got) else -1
            gap, tie = None, False
            if want >= 0 and emitted >= 0:
                target.reset()
                logits = target.forward(torch.tensor(ids + got[:i]), None).logits[-1]  # [V] fp32
                gap = float(logits[want] - logits[emitted])
                tie = abs(gap) <= TIE_RELATIVE[dtype] * max(1.0, float(logits[want].abs()))
                target.reset()
            found.append(Divergence(request=probe.id, seed=seed, arm=arm, position=i, expected=want, emitted=emitted,
                                    logit_gap=gap, tie=tie,
                                    expected_text=tok.decode([want]) if want >= 0 else "<end>",
                                    emitted_text=tok.decode([emitted]) if emitted >= 0 else "<end>"))
            if tie and i + 1 < len(got):  # tokens follow the tie: re-anchor the reference on the speculative one
                anchors.append((probe, seed, arm, ids, got, i))
        pending = []
        if anchors:
            prefixes = [ids + got[:i + 1] for _, _, _, ids, got, i in anchors]
            budgets = [max_new_tokens - (i + 1) for *_, i in anchors]
            again = ar_decoder.generate_many(prefixes, max(budgets), eos, batch=max(1, min(batch, len(prefixes))))
            pending = [(probe, seed, arm, ids, got, got[:i + 1] + result.tokens[:budget], i + 1)
                       for (probe, seed, arm, ids, got, i), result, budget in zip(anchors, again, budgets, strict=True)]
    return found


def kernel_parity(head_decoder: Any, prompt: Sequence[int], n: int,
                  temperature: float, eos: Sequence[int], blocks: int) -> list[ParityCheck]:
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


def _compare(block: int, op: str, ref: Sequence[Any], got: Sequence[Any],
             exact: Sequence[int]) -> ParityCheck:
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        if a.shape != b.shape:
            return ParityCheck(block=block, op=op, passed=False, detail=f"output {i}: shape {tuple(b.shape)}, "
                               f"reference {tuple(a.shape)}")
        a, b = a.cpu(), b.cpu()
        if i in exact:
            same = bool(torch.equal(a, b))
        else:
            same = bool(torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-5, equal_nan=True))
        if not same:
            where = (a != b).nonzero()
            first = tuple(where[0].tolist()) if len(where) else ()
            return ParityCheck(block=block, op=op, passed=False,
                               detail=f"output {i} differs first at {first}: kernel {b[first].tolist() if first else b}, "
                                      f"reference {a[first].tolist() if first else a}")
    return ParityCheck(block=block, op=op, passed=True)


def _versions() -> dict[str, str]:
    out = {"lilicorr-ckpt": __version__, "torch": str(torch.__version__), "transformers": transformers.__version__,
           "python": platform.python_version()}
    try:
        import triton

        out["triton"] = str(triton.__version__)
    except ImportError:
        pass
    return out
