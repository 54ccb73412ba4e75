"""`smoke --engine` reports as text (a table for people) and JUnit (a testcase per gate). Torch-free.

Everything shown may quote the server (its paths, its version) or the inputs: it goes through `printable`, and the
server's text was scrubbed of credentials when it was read.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

import click

from lilicorr_ckpt.report.escape import printable
from lilicorr_ckpt.report.smoke import junit_suite
from lilicorr_ckpt.smoke.engine.profile import EngineAcceptance, EngineReport

_LABEL = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}
_COLOR = {"pass": "green", "fail": "red", "skip": "yellow"}
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def _rate(value: float | None) -> str:
    return "     n/a" if value is None else f"{value:8.3f}"


def render_text(r: EngineReport, *, color: bool = False) -> str:
    def paint(text: str, status: str) -> str:
        return click.style(text, fg=_COLOR[status], bold=status == "fail") if color else text

    e, d, t, m = r.engine, r.draft_checkpoint, r.target_model, r.measurement_conditions
    name = ENGINE_NAMES[e.kind] + (f" {e.version}" if e.version else "")
    head = f", K={d.candidate_topk}" if d.head else ", no head"
    sampling = "greedy" if m.temperature == 0 else f"T={m.temperature:g}, seeds {','.join(map(str, m.seeds))}"
    counts = ", ".join(f"{k} {v}" for k, v in m.probe_counts.items())
    lines = [
        f"lilicorr-ckpt smoke {d.id} --engine {e.kind}",
        f"  engine   {name} at {e.url}: target {e.served_target or '?'}, drafter "
        f"{e.served_drafter or '(not named by the server)'}, {e.num_speculative_tokens} drafted per step",
        f"  checked  {e.drafter_check}",
        f"  drafter  {d.architecture or 'unknown architecture'}: B={r.block_size}{head}"
        + (f", {d.quant_algo}" if d.quant_algo else ""),
        f"  target   {t.id}: hidden {t.hidden_size}, {t.num_layers} layers, vocab {t.vocab_size} (tokenizer "
        "and chat template applied here)",
        f"  prompts  {counts} ({sum(m.probe_counts.values())}), up to {m.max_new_tokens} new tokens, {sampling}, "
        f"concurrency {m.concurrency}",
    ]
    if e.launch_command:
        lines += ["  launch   " + e.launch_command.replace("\n", "\n           ")]

    cmp = r.reference
    lines += ["", "acceptance (tau: tokens per verification step, the target's own included)"]
    ref_cell = f"  {'reference':>9}  {'delta':>7}" if cmp is not None else ""
    lines.append(f"{'scope':<10} {'requests':>8} {'engine':>8}{ref_cell}")
    ref_by_scope = {i.scope: i for i in ([cmp.overall, *cmp.per_category] if cmp is not None else [])}
    rows: list[tuple[str, EngineAcceptance]] = [*r.per_category.items(), ("all", r.acceptance)]
    for scope, acc in rows:
        item = ref_by_scope.get(scope)
        extra = ""
        if cmp is not None:
            extra = (
                f"  {item.reference:9.3f}  {item.relative_delta:+7.1%}"
                if item is not None
                else f"  {'n/a':>9}"
            )
        tau = (
            f"{acc.mean_accept_length:8.3f}" if acc.blocks else f"{'n/a':>8}"
        )  # no step: every request ended at once
        lines.append(f"{scope[:10]:<10} {acc.requests:8d} {tau}{extra}")
    if not r.per_request:
        lines.append(
            f"(the engine reports acceptance for the whole run only at concurrency {m.concurrency}: no "
            "per-category or per-request figures)"
        )
    a = r.acceptance
    if a.conditional_accept_rates is not None:
        lines += ["", "acceptance by position (cond = given the earlier ones; marg = all up to it)"]
        ref_head = f"  {'ref cond':>8} {'ref marg':>8}" if cmp is not None else ""
        lines.append(f"pos  {'cond':>8} {'marg':>8}{ref_head}")
        ref_positions = {p.position: p for p in cmp.positions} if cmp is not None else {}
        for i in range(r.num_speculative_tokens):
            p = ref_positions.get(i + 1)
            tail = f"  {p.reference_conditional:8.3f} {p.reference_marginal:8.3f}" if p is not None else ""
            marg = a.marginal_accept_rates[i] if a.marginal_accept_rates is not None else None
            lines.append(f"{i + 1:>3}  {_rate(a.conditional_accept_rates[i])} {_rate(marg)}{tail}")
    if a.acceptance_length_histogram is not None:
        hist = " ".join(f"{k}:{v}" for k, v in a.acceptance_length_histogram.items())
        lines.append(f"accept lengths (engine, bonus token included): {hist}")
    tp = r.throughput
    lines += [
        "",
        f"throughput  {tp.tokens_per_second:.1f} tokens/s, {tp.requests_per_second:.2f} requests/s at "
        f"concurrency {tp.concurrency} ({tp.tokens} tokens, {tp.requests} requests in {tp.wall_time_s:.1f} s; "
        f"mean latency {tp.mean_latency_s:.2f} s), measured here end to end",
    ]
    if tp.engine_tokens_per_second is not None and tp.engine_time_s is not None:
        clock = "meta_info e2e_latency" if r.engine.kind == "sglang" else "e2e_request_latency_seconds"
        lines.append(
            f"            {tp.engine_tokens_per_second:.1f} tokens/s per request as the engine timed them "
            f"({clock}: {tp.engine_time_s:.1f} s over the {tp.requests} requests, without the network)"
        )
    if cmp is not None:
        lines.append(f"reference   {cmp.source} ({cmp.arm} arm; {cmp.device}, {cmp.dtype})")

    lines = [
        printable(line) if "\n" not in line else "\n".join(printable(x) for x in line.split("\n"))
        for line in lines
    ] + ["", "gates"]
    for g in r.gates:
        lines.append(f"  {paint(_LABEL[g.status], g.status)}  {printable(g.name):<17} {printable(g.summary)}")
        lines += [f"        {printable(detail)}" for detail in g.details]
    failed = sum(g.status == "fail" for g in r.gates)
    skipped = sum(g.status == "skip" for g in r.gates)
    ran = len(r.gates) - skipped
    tail = f" ({skipped} skipped)" if skipped else ""
    word = "gate" if ran == 1 else "gates"
    verdict = (
        paint("FAIL", "fail") + f" {failed} of {ran} {word} failed"
        if failed
        else paint("PASS", "pass") + f" {ran} {word} passed"
    )
    return "\n".join([*lines, "", verdict + tail]) + "\n"


def render_junit(r: EngineReport) -> str:
    cases = []
    for g in r.gates:
        summary, text = printable(g.summary), "\n".join(printable(line) for line in [g.summary, *g.details])
        if g.status == "fail":
            body = (
                f'<failure message={quoteattr(summary[:300])} type="lilicorr-ckpt">{escape(text)}</failure>'
            )
        elif g.status == "skip":
            body = f"<skipped message={quoteattr(summary[:300])}/>"
        else:
            body = f"<system-out>{escape(text)}</system-out>"
        cases.append(
            f'  <testcase classname="lilicorr-ckpt.smoke.engine" name={quoteattr(printable(g.name))}>'
            f"{body}</testcase>"
        )
    return junit_suite(
        f"{r.draft_checkpoint.id} --engine {r.engine.kind}",
        cases,
        sum(g.status == "fail" for g in r.gates),
        sum(g.status == "skip" for g in r.gates),
    )
