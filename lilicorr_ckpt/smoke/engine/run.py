"""`smoke PATH --engine sglang=URL | vllm=URL`: the probes against a server the user runs, acceptance as that
engine counts it, beside the reference runtime's.

Order of work: everything that needs no server first (options, probes, the reference profile, validate, the
tokenizer), so a typo costs no request; then the server is checked to serve this drafter; then, with
--reference, the reference runtime decodes the probes here; then the probes go to the server, each once per seed
(a bounded loop: len(probes) x len(seeds) requests, each bounded in time and retries).
"""

from __future__ import annotations

import contextlib
import platform
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt import __version__
from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.checks.run import require_valid
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.errors import CheckpointInvalid, SmokeRefused, UsageError
from lilicorr_ckpt.report.modelcard import base_model_of, serving_command, sh
from lilicorr_ckpt.report.validate import finding_lines
from lilicorr_ckpt.smoke.engine import compare as cmp
from lilicorr_ckpt.smoke.engine import consistency
from lilicorr_ckpt.smoke.engine.profile import (
    Counted,
    EngineAcceptance,
    EngineReport,
    EngineRequest,
    Throughput,
    acceptance,
)
from lilicorr_ckpt.smoke.engine.servers import (
    VLLM,
    Expectation,
    Generation,
    SGLang,
    SpecCounters,
    drafter_names,
    with_counters,
)
from lilicorr_ckpt.smoke.engine.target import tokenizer_for
from lilicorr_ckpt.smoke.engine.transport import DEFAULT_TIMEOUT, Client, Endpoint, EngineError
from lilicorr_ckpt.smoke.gates import measured_gate, position_gate, tau_floor_gate
from lilicorr_ckpt.smoke.options import SmokeOptions, check_options, runner
from lilicorr_ckpt.smoke.probes import Probe, counts, digest, load_probes
from lilicorr_ckpt.smoke.profile import (
    DraftCheckpoint,
    Gate,
    MeasurementConditions,
    SmokeReport,
    checkpoint_id,
)
from lilicorr_ckpt.smoke.tokenize import tokenize_probes

MAX_CONCURRENCY = 256
SERVED_FAMILIES = (None, "dflash", "lilicorr")  # what SGLang's DFLASH and vLLM's method "dflash" serve


class Secret:
    """A credential: kept out of every repr, so no debug print or traceback shows it."""

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)" if self._value else "Secret(None)"


class EngineOptions(msgspec.Struct, frozen=True, kw_only=True):
    endpoint: Endpoint
    api_key: Secret = msgspec.field(default_factory=lambda: Secret(None))
    concurrency: int = 1
    timeout: float = DEFAULT_TIMEOUT
    served_drafter: str | None = (
        None  # the name the server gives the drafter, when it is not the checkpoint's own
    )
    reference: bool = False  # also decode the probes with the reference runtime here
    tolerance: float | None = None  # --tolerance, when given: the relative tau difference allowed


def check_engine_options(opts: SmokeOptions, engine: EngineOptions) -> None:
    """Usage errors of engine mode (exit 4), before anything is read."""
    if not 1 <= engine.concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency must be in [1, {MAX_CONCURRENCY}], got {engine.concurrency}")
    if not 0 < engine.timeout <= 24 * 3600:
        raise UsageError(f"--timeout must be a number of seconds in (0, 86400], got {engine.timeout:g}")
    if opts.gpu and not engine.reference:
        raise UsageError(
            "--gpu with --engine applies to the reference run: add --reference to decode the probes "
            "with the reference runtime on this GPU too, or leave --gpu out"
        )
    if opts.batch is not None and not engine.reference:
        raise UsageError(
            "--batch with --engine applies to the reference run: add --reference, or use --concurrency N "
            "for requests in flight on the server"
        )
    if engine.reference and opts.baseline:
        raise UsageError("--reference and --baseline both give the reference: choose one")
    if opts.runtime not in ("all", engine.endpoint.kind):
        raise UsageError(
            f"--runtime {opts.runtime} with --engine {engine.endpoint.kind}: the checkpoint is validated "
            f"for the engine it is served by ({engine.endpoint.kind})"
        )
    if engine.endpoint.kind == "sglang" and opts.num_speculative_tokens is not None:
        raise UsageError(
            "--num-speculative-tokens does not apply to --engine sglang: SGLang's DFLASH drafts whole "
            "blocks (block_size - 1 tokens per step, read from the drafter's config)"
        )


def launch_command(kind: str, opts: SmokeOptions, n: int, port: int) -> str:
    """The command that starts the server this run expects, from the card's renderer."""
    base = base_model_of(opts.target, None)
    target = sh(base) if base else sh(opts.target)
    return "\n".join(serving_command(kind, target, opts.path, n, port=port))


def _draft_record(path: str, kind: str, ckpt: Any) -> DraftCheckpoint:
    g = ckpt.geometry
    local = Path(path).expanduser()
    return DraftCheckpoint(
        id=checkpoint_id(str(local.resolve())) if local.is_dir() else path,
        architecture=ckpt.parsed.config.architecture,
        head=g.lilicorr_enabled,
        candidate_topk=g.candidate_topk if g.lilicorr_enabled else None,
        conv_kernel_size=g.conv_kernel_size or None,
        quant_algo=ckpt.quant.quant_algo if ckpt.quant is not None else None,
        runtime=kind,
    )


def _require_servable(ckpt: Any, path: str, kind: str) -> None:
    """validate's verdict for the engine named: a checkpoint that release refuses would fail on the server's first
    batch (or at load), so no request is sent; the other engine's verdict says where it can be measured instead."""
    try:
        require_valid(ckpt, kind)
    except CheckpointInvalid as exc:
        [verdict] = exc.report.runtimes
        lines = [line for f in exc.report.findings if f.severity == "error" for line in finding_lines(f)]
        other = "vllm" if kind == "sglang" else "sglang"
        try:
            [elsewhere] = require_valid(ckpt, other).runtimes
            hint = (
                f"\n{elsewhere.display} serves it (validate --runtime {other} passes): measure it there with "
                f"--engine {other}=URL"
            )
        except CheckpointInvalid as also:
            hint = f"\n{also.report.runtimes[0].display} refuses it too (validate --runtime {other})"
        raise SmokeRefused(
            f"{verdict.display} refuses {path} (validate --runtime {kind}), so a server started with "
            "it would fail at load or on its first batch; no request was sent:\n" + "\n".join(lines) + hint
        ) from None


def run_engine(
    opts: SmokeOptions,
    engine: EngineOptions,
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
) -> EngineReport:
    """Measure the drafter as the server at engine.endpoint serves it. `say` gets the lines meant for stderr (the
    launch command, retries); `progress` the request count."""
    check_options(opts)
    check_engine_options(opts, engine)
    progress = progress or Progress(enabled=False, name="smoke")
    say = say or (lambda text: None)
    kind = engine.endpoint.kind
    probes = load_probes(opts.probes, opts.limit)
    reference: SmokeReport | None = cmp.read_reference(opts.baseline) if opts.baseline else None

    progress.note("reading the drafter")
    ckpt = load_checkpoint(opts.path)
    _require_servable(ckpt, opts.path, kind)
    g = ckpt.geometry
    if g.family not in SERVED_FAMILIES:
        raise SmokeRefused(
            f"{opts.path} is a {g.family} drafter; smoke --engine measures DFlash and LiLiCorr "
            "drafters (served by SGLang's DFLASH and vLLM's method dflash)"
        )
    assert g.block_size is not None  # validate refuses a checkpoint without one
    block = g.block_size
    n = opts.num_speculative_tokens if opts.num_speculative_tokens is not None else block - 1
    if n > block - 1:
        raise UsageError(
            f"--num-speculative-tokens {n} exceeds the drafter's {block - 1} slots (block_size {block})"
        )
    if len(opts.min_accept_rates) > n:
        raise UsageError(
            f"--min-accept-rates gives {len(opts.min_accept_rates)} floors, but only {n} positions are "
            "drafted"
        )
    draft = _draft_record(opts.path, kind, ckpt)

    progress.note("loading the tokenizer")
    target = tokenizer_for(opts.target)  # a GGUF's direct reader plugs in there (engine/target.py)
    if g.vocab_size is not None and g.vocab_size != target.vocab_size:
        raise SmokeRefused(
            f"drafter and target do not match: the drafter's vocab_size is {g.vocab_size}, the "
            f"target's {target.vocab_size}\n  `lilicorr-ckpt validate {opts.path} --target "
            f"{opts.target}` lists every mismatch"
        )
    eos = list(target.eos_token_ids)
    prompts, chat = tokenize_probes(target.tokenizer, probes, eos)
    for probe, ids in zip(probes, prompts, strict=True):
        if max(ids) >= target.vocab_size:
            raise EngineError(
                f"probe {probe.id}: the target's tokenizer gives id {max(ids)}, outside its vocabulary "
                f"({target.vocab_size}): the tokenizer does not belong to this model"
            )

    launch = launch_command(kind, opts, n, engine.endpoint.port)
    progress.finish()
    say(
        f"engine: {engine.endpoint.url} must serve this drafter, started as:\n  "
        + launch.replace("\n", "\n  ")
    )
    client = Client(engine.endpoint, api_key=engine.api_key.reveal(), timeout=engine.timeout, notify=say)
    server = SGLang(client, target.vocab_size) if kind == "sglang" else VLLM(client, target.vocab_size)
    progress.note(f"checking the server at {engine.endpoint.url}")
    record = server.check(
        Expectation(
            drafter_names=drafter_names(opts.path),
            served_drafter=engine.served_drafter,
            block_size=block,
            num_speculative_tokens=n,
            launch=launch,
        )
    )
    record = msgspec.structs.replace(record, launch_command=launch)
    limit = record.max_model_len
    for probe, ids in zip(probes, prompts, strict=True):
        if limit is not None and len(ids) + opts.max_new_tokens > limit:
            raise EngineError(
                f"probe {probe.id}: {len(ids)} prompt tokens + --max-new-tokens {opts.max_new_tokens} "
                f"exceed the server's {limit} positions; lower --max-new-tokens or serve a longer context"
            )

    source = opts.baseline or ""
    if engine.reference:
        progress.note("decoding the probes with the reference runtime")
        reference = runner()(
            msgspec.structs.replace(
                opts, baseline=None, min_tau=None, min_accept_rates=(), min_head_gain=-1.0
            ),
            progress,
        )
        source = "this run (--reference)"

    jobs = [(probe, seed, ids) for seed in opts.seeds for probe, ids in zip(probes, prompts, strict=True)]
    generations, wall, per_request = _decode(server, jobs, opts, eos, engine.concurrency, progress, say)
    progress.finish()
    return _assemble(
        opts,
        engine,
        record,
        draft,
        target.record,
        chat,
        probes,
        jobs,
        generations,
        wall,
        per_request,
        n,
        block,
        reference,
        source,
        target.tokenizer,
    )


def _decode(
    server: SGLang | VLLM,
    jobs: Sequence[tuple[Probe, int, list[int]]],
    opts: SmokeOptions,
    eos: Sequence[int],
    concurrency: int,
    progress: Progress,
    say: Callable[[str], None],
) -> tuple[list[Generation], float, bool]:
    """Every job once: (generations in job order, wall time of the timed loop, whether acceptance is per request)."""

    def one(job: tuple[Probe, int, list[int]]) -> Generation:
        probe, seed, ids = job
        return server.generate(
            ids, opts.max_new_tokens, opts.temperature, seed, eos, f"lilicorr-smoke-{uuid.uuid4().hex}"
        )

    if opts.warmup:  # untimed and uncounted: the server's first request may still compile or capture graphs
        progress.note("warming up the server")
        longest = max(jobs, key=lambda j: len(j[2]))
        one(longest)
    per_request = not isinstance(server, VLLM) or concurrency == 1
    progress.start(len(jobs))
    before: SpecCounters | None = server.steady_counters() if isinstance(server, VLLM) else None
    out: list[Generation] = []
    begin = time.perf_counter()
    if concurrency == 1:
        for job in jobs:
            generation = one(job)
            if isinstance(server, VLLM):
                assert before is not None
                before, delta = server.settled_delta(before, generation)
                generation = with_counters(generation, delta)
            out.append(generation)
            progress.step(f"{job[0].id}")
        return out, time.perf_counter() - begin, per_request
    out = _in_parallel(one, jobs, concurrency, progress)
    wall = time.perf_counter() - begin
    if isinstance(server, VLLM):
        assert before is not None
        total = Generation(
            output_ids=[],
            completion_tokens=sum(g.completion_tokens for g in out) - len(out) + 1,
            finish="stop",
            stop_token=None,
            latency_s=wall,
        )
        _, delta = server.settled_delta(before, total, requests=len(out))
        out.append(with_counters(total, delta, requests=len(out)))  # the run's aggregate, last
    return out, wall, per_request


def _in_parallel(
    one: Callable[[tuple[Probe, int, list[int]]], Generation],
    jobs: Sequence[tuple[Probe, int, list[int]]],
    concurrency: int,
    progress: Progress,
) -> list[Generation]:
    """one(job) for every job, `concurrency` at a time, results in job order. The workers are daemon threads: on the
    first failure or a Ctrl-C the run ends at once, abandoning the requests in flight (a pool's threads would be
    joined at exit, holding the process for up to --timeout seconds)."""
    results: list[Generation | None] = [None] * len(jobs)
    outcomes: queue.SimpleQueue[tuple[int, Generation | None, BaseException | None]] = queue.SimpleQueue()
    pending = iter(range(len(jobs)))
    lock = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                outcomes.put((i, one(jobs[i]), None))
            except BaseException as exc:  # handed to the main thread, which raises it
                outcomes.put((i, None, exc))
                return

    for k in range(min(concurrency, len(jobs))):
        threading.Thread(target=work, name=f"smoke-engine-{k}", daemon=True).start()
    try:
        for _ in jobs:
            i, generation, failure = outcomes.get()
            if failure is not None:
                raise failure  # the first failure ends the run
            results[i] = generation
            progress.step(jobs[i][0].id)
    finally:
        stop.set()  # no worker takes another job
    return [g for g in results if g is not None]


def _assemble(
    opts: SmokeOptions,
    engine: EngineOptions,
    record: Any,
    draft: DraftCheckpoint,
    target: Any,
    chat: Any,
    probes: Sequence[Probe],
    jobs: Sequence[tuple[Probe, int, list[int]]],
    generations: list[Generation],
    wall: float,
    per_request: bool,
    n: int,
    block: int,
    reference: SmokeReport | None,
    source: str,
    tokenizer: Any,
) -> EngineReport:
    aggregate = None if per_request else generations.pop()
    requests = []
    counted: list[Counted] = []
    for (probe, seed, ids), gen in zip(jobs, generations, strict=True):
        blocks = gen.blocks if per_request else None
        accepted = gen.accepted if per_request else None
        tau = round(1.0 + accepted / blocks, 6) if blocks and accepted is not None else None
        requests.append(
            EngineRequest(
                id=probe.id,
                category=probe.category,
                seed=seed,
                prompt_tokens=len(ids),
                new_tokens=gen.completion_tokens,
                finish=gen.finish,
                latency_s=round(gen.latency_s, 6),
                tokens_per_second=round(gen.completion_tokens / gen.latency_s, 3)
                if gen.latency_s > 0
                else 0.0,
                blocks=blocks,
                accepted=accepted,
                tau=tau,
                reported=gen.reported,
                engine_latency_s=round(gen.engine_latency_s, 6) if gen.engine_latency_s is not None else None,
            )
        )
        if per_request:
            assert gen.blocks is not None and gen.accepted is not None
            counted.append(Counted(gen.blocks, gen.accepted, gen.position_accepted))
    tokens = sum(g.completion_tokens for g in generations)
    if aggregate is not None:
        assert aggregate.blocks is not None and aggregate.accepted is not None
        counted = [Counted(aggregate.blocks, aggregate.accepted, aggregate.position_accepted)]
    overall = acceptance(
        counted, n, requests=len(requests), tokens=tokens, wall_time_s=wall, per_request=per_request
    )
    per_category: dict[str, EngineAcceptance] = {}
    if per_request:
        for category in dict.fromkeys(p.category for p, _, _ in jobs):
            rows = [i for i, (p, _, _) in enumerate(jobs) if p.category == category]
            per_category[category] = acceptance(
                [counted[i] for i in rows],
                n,
                requests=len(rows),
                tokens=sum(generations[i].completion_tokens for i in rows),
                wall_time_s=sum(generations[i].latency_s for i in rows),
                per_request=True,
            )
    timed = (
        [aggregate.engine_latency_s] if aggregate is not None else [g.engine_latency_s for g in generations]
    )
    engine_time = sum(t for t in timed if t is not None) if timed and None not in timed else None
    throughput = Throughput(
        concurrency=engine.concurrency,
        requests=len(requests),
        tokens=tokens,
        wall_time_s=round(wall, 6),
        tokens_per_second=round(tokens / wall, 3) if wall > 0 else 0.0,
        requests_per_second=round(len(requests) / wall, 4) if wall > 0 else 0.0,
        mean_latency_s=round(sum(g.latency_s for g in generations) / max(len(generations), 1), 6),
        engine_time_s=round(engine_time, 6) if engine_time is not None else None,
        engine_tokens_per_second=round(tokens / engine_time, 3) if engine_time else None,
    )
    name = {"sglang": "SGLang", "vllm": "vLLM"}[record.kind]
    versions = {"lilicorr-ckpt": __version__, "python": platform.python_version()}
    with contextlib.suppress(ImportError):
        import transformers

        versions["transformers"] = transformers.__version__
    if record.version:
        versions[record.kind] = record.version
    conditions = MeasurementConditions(
        probes=opts.probes,
        probe_counts=counts(probes),
        probe_digest=digest(probes),
        limit=opts.limit,
        max_new_tokens=opts.max_new_tokens,
        temperature=opts.temperature,
        seeds=list(opts.seeds),
        warmup=opts.warmup,
        device=f"{name} server at {record.url}",
        dtype="as served",
        kernel_backend=record.kind,
        concurrency=engine.concurrency,
        engine=f"{name} {record.version or ''}".strip(),
        versions=versions,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )

    comparison = None
    if reference is not None:
        facts = cmp.RunFacts(
            conditions=conditions,
            num_speculative_tokens=n,
            block_size=block,
            target=target,
            drafter=draft,
            chat=chat,
            prompt_tokens={(p.id, s): len(ids) for p, s, ids in jobs},
        )
        outputs = {
            (p.id, s): (g.output_ids, g.stop_token) for (p, s, _), g in zip(jobs, generations, strict=True)
        }

        def decode(token: int) -> str:
            try:
                return str(tokenizer.decode([token]))
            except Exception:  # a tokenizer that cannot decode one id: the id is shown instead
                return f"<{token}>"

        result = cmp.compare(
            reference,
            source,
            facts,
            requests,
            outputs,
            overall,
            per_category,
            per_request,
            engine.tolerance,
            decode,
        )
        comparison = result.comparison
        requests = [
            msgspec.structs.replace(
                r,
                tokens_match=result.request_flags[(r.id, r.seed)][0],
                compared=result.request_flags[(r.id, r.seed)][1],
            )
            if (r.id, r.seed) in result.request_flags
            else r
            for r in requests
        ]

    # the figures the report carries and the gates read, once more against what an engine can count (each
    # request's were checked as it was read: this holds the arithmetic over them to the same bounds)
    for scope, figures in (("all", overall), *per_category.items()):
        consistency.acceptance(
            f"{record.url}: the engine's figures over {'the run' if scope == 'all' else scope}",
            figures,
            n,
            opts.max_new_tokens,
        )
    gates = [
        measured_gate(overall.blocks, overall.requests, "engine"),
        cmp.tau_gate(comparison),
        cmp.tokens_gate(comparison, opts.temperature),
    ]
    if opts.min_tau is not None:
        gates.append(tau_floor_gate(opts.min_tau, overall.mean_accept_length, "engine"))
    if opts.min_accept_rates and overall.marginal_accept_rates is None:
        gates.append(
            Gate(
                name="min-accept-rates",
                status="fail",
                summary="the engine reported no per-position counts (an SGLang release without "
                "spec_correct_drafts_histogram), so no position can be held to a floor",
            )
        )
    elif opts.min_accept_rates:
        gates.append(position_gate(opts.min_accept_rates, overall.marginal_accept_rates or [], "engine"))
    return EngineReport(
        engine=record,
        draft_checkpoint=draft,
        target_model=target,
        method="lilicorr" if draft.head else "dflash",
        block_size=block,
        num_speculative_tokens=n,
        measured=overall.blocks > 0,
        per_request=per_request,
        measurement_conditions=conditions,
        chat_template=chat,
        acceptance=overall,
        per_category=per_category,
        throughput=throughput,
        requests=requests,
        reference=comparison,
        gates=gates,
        passed=all(g.status != "fail" for g in gates),
    )
