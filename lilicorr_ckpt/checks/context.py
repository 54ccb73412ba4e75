"""What every rule family shares: the Context a checkpoint is judged in, `emit`, and the check registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lilicorr_ckpt.checkpoint.load import Checkpoint
from lilicorr_ckpt.checkpoint.target import TargetInfo
from lilicorr_ckpt.checks.casts import cast_views, merge
from lilicorr_ckpt.checks.findings import RULES, bound_findings
from lilicorr_ckpt.results import Finding
from lilicorr_ckpt.runtimes import RELEASES, RuntimeProfile


class Context:
    """One checkpoint being judged: what was read, the runtimes it is judged for, and the findings so far."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        profiles: list[RuntimeProfile],
        target: TargetInfo | None,
        deep: bool,
        headers_only: bool = False,
    ):
        self.checkpoint = checkpoint
        self.source = checkpoint.source
        self.parsed = checkpoint.parsed
        self.config = checkpoint.parsed.config
        self.geometry = checkpoint.geometry
        self.manifest = checkpoint.manifest
        self.table = checkpoint.table
        self.names = checkpoint.names
        self.quant_configs = checkpoint.quant_configs
        self.quant_problems = checkpoint.quant_problems
        self.quant = checkpoint.quant
        self.profiles = profiles
        self.target = target
        self.deep = deep
        self.headers_only = headers_only  # a Hub repo read headers-only: no tensor byte may be read
        self.findings: list[Finding] = []

    @property
    def runtime_names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def emit(
        self,
        rule_id: str,
        message: str,
        *,
        fix: str | None = None,
        file: str | None = None,
        pointer: str | None = None,
        expected: Any = None,
        actual: Any = None,
        runtimes: Iterable[str] = (),
        subjects: Iterable[str] = (),
        silent_for: Iterable[str] = (),
    ) -> None:
        r = RULES[rule_id]
        runtimes = sorted(p for p in runtimes if p in self.runtime_names)
        self.findings.append(
            Finding(
                rule=r.id,
                name=r.name,
                severity=r.severity,
                message=message,
                fix=fix or r.fix,
                file=file,
                pointer=pointer,
                expected=None if expected is None else str(expected),
                actual=None if actual is None else str(actual),
                runtimes=runtimes,
                subjects=list(subjects),
                silent_for=sorted(p for p in silent_for if p in self.runtime_names),
            )
        )

    def emit_for(self, rule_id: str, profiles: list[RuntimeProfile], message: str, **kw: Any) -> None:
        """Emit once for the profiles among those selected; nothing when none is selected."""
        names = [p.name for p in profiles if p.name in self.runtime_names]
        if names:
            self.emit(rule_id, message, runtimes=names, **kw)


CHECKS: list[Callable[[Context], None]] = []


def check(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    CHECKS.append(fn)
    return fn


def names(profiles: list[RuntimeProfile], verb: str = "") -> str:
    """`SGLang and vLLM` (the profiles' display names) followed by `verb` in agreement: "reads|read". Several
    consecutive releases of one engine (three or more) read as a run: `vLLM 1.1.0 to 1.3.0`."""
    shown = _runs(profiles)
    text = ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + (shown[-1] if shown else "")
    if "|" in verb:
        one, several = verb.split("|")
        verb = several if len(profiles) > 1 else one
    return f"{text} {verb}".rstrip()


def _runs(profiles: list[RuntimeProfile]) -> list[str]:
    """Display names, with each run of three or more consecutive releases of an engine joined: `SGLang 1.1.0 to
    1.3.0`."""
    out: list[str] = []
    i = 0
    while i < len(profiles):
        p = profiles[i]
        chain = RELEASES.get(p.engine_id, ())
        at = next((k for k, q in enumerate(chain) if q.version == p.version), None)
        j = i
        while (
            at is not None
            and p.released
            and j + 1 < len(profiles)
            and profiles[j + 1].engine_id == p.engine_id
            and at + (j + 1 - i) < len(chain)
            and chain[at + (j + 1 - i)].version == profiles[j + 1].version
        ):
            j += 1
        if j - i < 2:  # two releases read better named than as a run
            out += [q.display for q in profiles[i : j + 1]]
        else:
            out.append(f"{p.display} to {profiles[j].version}")
        i = j + 1
    return out


def silently_initialised(ctx: Context) -> list[str]:
    """The selected releases that serve a missing head / convolution / lm_head tensor at its initial value."""
    return [p.name for p in ctx.profiles if p.head_coverage == "initialised"]


def coverage_effect(ctx: Context, what: str = "them") -> str:
    """`: SGLang 1.2.0 and vLLM 1.1.0 refuse the load; vLLM 1.2.0 serves them at their initial values (a silent
    mis-load)`: what each selected release does with a missing head, convolution, owned lm_head or head scale tensor
    (RuntimeProfile.head_coverage)."""
    refusing = [p for p in ctx.profiles if p.head_coverage == "refused"]
    serving = [p for p in ctx.profiles if p.head_coverage == "initialised"]
    parts = [f"{names(refusing, 'refuses|refuse')} the load"] if refusing else []
    if serving:
        parts.append(f"{names(serving, 'serves|serve')} {what} at their initial values (a silent mis-load)")
    return ": " + "; ".join(parts) if parts else ""


def is_pow2(k: int) -> bool:
    return k > 0 and k & (k - 1) == 0


def run_checks(ctx: Context) -> list[Finding]:
    """Every registered check, in registration order (lilicorr_ckpt.checks imports the families): once, or once
    per group of releases that cast config values alike (checks/casts.py)."""
    views = cast_views(ctx.checkpoint, ctx.profiles)
    if len(views) == 1 and views[0][1] is ctx.checkpoint:
        for fn in CHECKS:
            fn(ctx)
        return bound_findings(ctx.findings)  # a rule firing per tensor of a hostile checkpoint is summarised
    runs = []
    for profiles, checkpoint in views:
        sub = Context(
            checkpoint, profiles=profiles, target=ctx.target, deep=ctx.deep, headers_only=ctx.headers_only
        )
        for fn in CHECKS:
            fn(sub)
        runs.append(([p.name for p in profiles], sub.findings))
    ctx.findings = merge(runs, ctx.runtime_names)
    return bound_findings(ctx.findings)
