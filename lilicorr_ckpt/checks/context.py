"""What every rule family shares: the Context a checkpoint is judged in, `emit`, and the check registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lilicorr_ckpt.checkpoint.load import Checkpoint
from lilicorr_ckpt.checkpoint.target import TargetInfo
from lilicorr_ckpt.checks.findings import RULES, bound_findings
from lilicorr_ckpt.results import Finding
from lilicorr_ckpt.runtimes import RuntimeProfile


class Context:
    """One checkpoint being judged: what was read, the runtimes it is judged for, and the findings so far."""

    def __init__(
        self, checkpoint: Checkpoint, *, profiles: list[RuntimeProfile], target: TargetInfo | None, deep: bool
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
    """`SGLang and vLLM` (the profiles' display names) followed by `verb` in agreement: "reads|read"."""
    shown = (
        ", ".join(p.display for p in profiles[:-1])
        + (" and " if len(profiles) > 1 else "")
        + (profiles[-1].display if profiles else "")
    )
    if "|" in verb:
        one, several = verb.split("|")
        verb = several if len(profiles) > 1 else one
    return f"{shown} {verb}".rstrip()


def is_pow2(k: int) -> bool:
    return k > 0 and k & (k - 1) == 0


def run_checks(ctx: Context) -> list[Finding]:
    """Every registered check, in registration order (lilicorr_ckpt.checks imports the families)."""
    for fn in CHECKS:
        fn(ctx)
    return bound_findings(ctx.findings)  # a rule firing per tensor of a hostile checkpoint is summarised
