"""`smoke` reports as text (a table for people) and JUnit (a testcase per gate). Torch-free."""

from __future__ import annotations

import click

from lilicorr_ckpt.report.escape import printable, xml_attr, xml_text
from lilicorr_ckpt.smoke.profile import MeasurementConditions, SmokeReport

_LABEL = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}
_COLOR = {"pass": "green", "fail": "red", "skip": "yellow"}
# the table's columns, defined in the report itself (docs/smoke.md says the same)
TAU_LINE = (
    "tau      tokens committed per verification block (accepted drafts plus the target's own token), over "
    "every block of the arm"
)
TAU_REQ_LINE = "tau/req  each request's own tau, averaged over the requests"
CPU_SPEEDUP_LINE = (
    "speedup  tok/s over the ar arm's; on the CPU it means nothing: a small model decodes at the speed of "
    "Python and kernel launches, so only tau carries over to a GPU"
)
GPU_SPEEDUP_LINE = (
    "speedup  tok/s over the ar arm's on the same prompts, prefill included, one request at a time"
)
GPU_BATCH_SPEEDUP_LINE = (
    "speedup  tok/s over the ar arm's on the same prompts, prefill included, each arm at the batch above: a "
    "batch's verify costs more than its ar step, so --batch 1 gives the speed-up one request sees"
)


def _speedup_line(device: str, concurrency: int) -> str:
    if device.startswith("cpu"):
        return CPU_SPEEDUP_LINE
    return GPU_SPEEDUP_LINE if concurrency <= 1 else GPU_BATCH_SPEEDUP_LINE


def _sweep_lines(r: SmokeReport) -> list[str]:
    """--sweep: tok/s and speed-up over the ar arm per batch size, one line each."""
    arms = list(r.sweep[0].tokens_per_second)
    spec = [a for a in arms if a != "ar"]
    lines = [
        f"speed by batch size (--sweep; {r.sweep[0].requests} prompts, each arm's tokens over its elapsed time)",
        "batch"
        + "".join(f"  {a + ' tok/s':>13}" for a in arms)
        + "".join(f"  {a + ' speedup':>15}" for a in spec)
        + "  same tokens",
    ]
    for point in r.sweep:
        speedups = "".join(
            f"  {'n/a' if point.speedup_vs_ar[a] is None else f'{point.speedup_vs_ar[a]:.2f}x':>15}"
            for a in spec
        )
        same = "not compared" if point.same_tokens is None else f"{point.same_tokens}/{point.requests}"
        lines.append(
            f"{point.batch:>5}"
            + "".join(f"  {point.tokens_per_second[a]:13.1f}" for a in arms)
            + speedups
            + f"  {same}"
        )
    if r.measurement_conditions.device.startswith("cpu"):
        lines.append(f"  {CPU_SPEEDUP_LINE}")
    lines.append(
        "  same tokens: requests whose every arm emitted exactly the measured run's tokens at that batch size"
    )
    return lines


def _time_lines(m: MeasurementConditions) -> list[str]:
    """Where the run's wall time went, by phase, and on a GPU what its Triton kernels cost before they ran."""
    if not m.phase_seconds:
        return []
    total = sum(m.phase_seconds.values())
    spent = ", ".join(f"{name.replace('_', ' ')} {seconds:.1f}" for name, seconds in m.phase_seconds.items())
    lines = [f"time (s): {spent}; {total:.1f} in all"]
    k = m.kernel_variants
    if k is not None:
        lines.append(
            f"kernels: {k.ahead_compiled} of {k.ahead} stored variants compiled ahead ({k.ahead_seconds:.1f} s, "
            f"beside the loading); the launches waited {k.read_seconds:.1f} s to read them and "
            f"{k.at_launch_seconds:.1f} s for {k.at_launch} more not compiled ahead ({k.launched} variants in all)"
            + (f"; {k.tuned} GEMM shape(s) tuned ({k.tuning_seconds:.1f} s)" if k.tuned else "")
        )
    return lines


def render_text(r: SmokeReport, *, color: bool = False) -> str:
    def paint(text: str, status: str) -> str:
        if not color:
            return text
        return click.style(text, fg=_COLOR[status], bold=status == "fail")

    d, t, m, c = r.draft_checkpoint, r.target_model, r.measurement_conditions, r.chat_template
    head = f", K={d.candidate_topk}" if d.head else ", no head"
    lines = [
        f"lilicorr-ckpt smoke {d.id}",
        f"  drafter  {d.architecture or 'unknown architecture'}: B={r.block_size}{head}, "
        f"{r.num_speculative_tokens} drafted per block"
        + (f", {d.quant_algo}" if d.quant_algo else "")
        + f" (loaded under runtime {d.runtime})",
        f"  target   {t.architecture} {t.id}: hidden {t.hidden_size}, {t.num_layers} layers, vocab {t.vocab_size}; "
        f"{t.forward}" + (f"; {t.loaded}" if t.loaded.startswith("transformers' GGUF loader") else ""),
    ]
    probe_counts = ", ".join(f"{k} {v}" for k, v in m.probe_counts.items())
    sampling = "greedy" if m.temperature == 0 else f"T={m.temperature:g}, seeds {','.join(map(str, m.seeds))}"
    lines.append(
        f"  prompts  {probe_counts} ({sum(m.probe_counts.values())}), up to {m.max_new_tokens} new tokens, "
        f"{sampling}; {m.device}, {m.dtype}, {m.kernel_backend} draft ops"
    )
    if c.applied_prompts:
        thinking = {"disabled": "enable_thinking=False", "no-switch": "no thinking switch in the template"}[
            c.thinking
        ]
        chat = f"chat template on {c.applied_prompts} prompt(s) ({thinking})"
    else:
        chat = "no chat template applied" + ("" if c.present else " (the tokenizer has none)")
    raw = f", {c.raw_prompts} raw" if c.raw_prompts else ""
    eos = " ".join(f"{i} {tok}" for i, tok in zip(c.eos_token_ids, c.eos_tokens, strict=True)) or "none"
    lines.append(f"  template {chat}{raw}; eos {eos}")

    categories = list(r.per_category)
    lines += [
        "",
        "arm        tau   tau/req    tok/s  speedup" + "".join(f"  {cat[:8]:>8}" for cat in categories),
    ]
    for arm, s in r.arms.items():
        speed = (
            "1.00x" if arm == "ar" else (f"{s.speedup_vs_ar:.2f}x" if s.speedup_vs_ar is not None else "n/a")
        )
        cells = "".join(f"  {r.per_category[cat].arms[arm].mean_accept_length:8.3f}" for cat in categories)
        lines.append(
            f"{arm:<8} {s.mean_accept_length:6.3f} {s.mean_accept_length_per_request:8.3f} "
            f"{s.tokens_per_second:8.1f} {speed:>8}{cells}"
        )
    if m.concurrency > 1:
        lines.append(
            f"tok/s and speedup: each arm's tokens over its elapsed time at batch {m.concurrency} (the "
            "probes side by side); tau per request"
        )
    if r.head_gain.overall is not None:
        per = "".join(
            f"  {cat} {'n/a' if g is None else f'{g:+.1%}'}" for cat, g in r.head_gain.per_category.items()
        )
        lines.append(
            f"head gain over control {r.head_gain.overall:+.1%}" + (f" ({per.strip()})" if per else "")
        )
    lines += [
        f"  {TAU_LINE}",
        f"  {TAU_REQ_LINE}",
        f"  {_speedup_line(m.device, m.concurrency)}",
    ]

    if r.sweep:
        lines += ["", *_sweep_lines(r)]

    spec_arms = [a for a in r.arms if a != "ar"]
    if r.num_speculative_tokens:
        lines += [
            "",
            "acceptance by position (cond = given the earlier ones; marg = all up to it)",
            "pos" + "".join(f"  {a + ' cond':>12} {a + ' marg':>12}" for a in spec_arms),
        ]
        for i in range(r.num_speculative_tokens):
            lines.append(
                f"{i + 1:>3}"
                + "".join(
                    f"  {r.arms[a].conditional_accept_rates[i]:12.3f} {r.arms[a].marginal_accept_rates[i]:12.3f}"
                    for a in spec_arms
                )
            )
    hist = " ".join(f"{k}:{v}" for k, v in r.acceptance_length_histogram.items())
    lines.append(f"accept lengths ({r.primary_arm}, bonus token included): {hist}")
    mc, mono = r.validation.mean_consistency, r.validation.marginal_monotonicity
    lines.append(
        f"profile: 1 + sum(marginal) = {mc.implied_mean_accept_length:.3f} vs tau "
        f"{mc.reported_mean_accept_length:.3f} ({'ok' if mc.passed else 'INCONSISTENT'}); marginals "
        f"{'non-increasing' if mono.passed else 'INCREASE at ' + str([v.position for v in mono.violations])}"
    )

    lines += _time_lines(m)

    # everything above may quote the drafter, the target, the tokenizer or the probes file: shown, never obeyed
    lines = [printable(line) for line in lines] + ["", "gates"]
    for g in r.gates:
        lines.append(f"  {paint(_LABEL[g.status], g.status)}  {printable(g.name):<17} {printable(g.summary)}")
        lines += [f"        {printable(detail)}" for detail in g.details]
    failed = sum(g.status == "fail" for g in r.gates)
    skipped = sum(g.status == "skip" for g in r.gates)
    undecided = sum(g.status == "fail" and g.inconclusive for g in r.gates)
    ran = len(r.gates) - skipped
    notes = [f"{undecided} inconclusive"] * bool(undecided) + [f"{skipped} skipped"] * bool(skipped)
    tail = f" ({'; '.join(notes)})" if notes else ""
    gates = "gate" if ran == 1 else "gates"
    verdict = (
        paint("FAIL", "fail") + f" {failed} of {ran} {gates} failed"
        if failed
        else paint("PASS", "pass") + f" {ran} {gates} passed"
    )
    lines += ["", verdict + tail]
    return "\n".join(lines) + "\n"


def render_junit(r: SmokeReport) -> str:
    cases = []
    for g in r.gates:
        summary, text = printable(g.summary), "\n".join(printable(line) for line in [g.summary, *g.details])
        if g.status == "fail":
            body = (
                f'<failure message={xml_attr(summary[:300])} type="lilicorr-ckpt">{xml_text(text)}</failure>'
            )
        elif g.status == "skip":
            body = f"<skipped message={xml_attr(summary[:300])}/>"
        else:
            body = f"<system-out>{xml_text(text)}</system-out>"
        cases.append(
            f'  <testcase classname="lilicorr-ckpt.smoke" name={xml_attr(printable(g.name))}>{body}</testcase>'
        )
    return junit_suite(
        r.draft_checkpoint.id,
        cases,
        sum(g.status == "fail" for g in r.gates),
        sum(g.status == "skip" for g in r.gates),
    )


def junit_suite(path: str, cases: list[str], failures: int, skipped: int = 0) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name={xml_attr("lilicorr-ckpt smoke " + printable(path))} tests="{len(cases)}" '
        f'failures="{failures}" errors="0" skipped="{skipped}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )


def junit_refusal(path: str, message: str) -> str:
    text = "\n".join(printable(line) for line in message.splitlines())
    case = (
        f'  <testcase classname="lilicorr-ckpt.smoke" name="loads"><failure message='
        f'{xml_attr(text.split(chr(10))[0][:300])} type="lilicorr-ckpt">{xml_text(text)}</failure></testcase>'
    )
    return junit_suite(path, [case], 1)
