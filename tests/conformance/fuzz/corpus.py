"""Every disagreement the fuzzer found, as the case that reproduces it: the conformance suite runs each against every
supported release and asserts validate agrees with the executed loader (run.py prints new ones in this form)."""

from __future__ import annotations

from .cases import Case

CORPUS: tuple[Case, ...] = ()
