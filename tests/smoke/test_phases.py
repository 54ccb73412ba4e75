"""Where a smoke run's time goes (smoke/phases.py, and the phases the report carries)."""

from __future__ import annotations

import subprocess
import sys
import types

import msgspec
import pytest

from lilicorr_ckpt.smoke.phases import Phases, process_age


def test_phases_time_each_stretch_from_the_last_mark_and_add_up_a_name_marked_twice():
    ticks = iter([10.0, 10.5, 12.0, 12.25, 20.0, 21.0])
    phases = Phases(start=3.25, clock=lambda: next(ticks))
    assert phases.mark("load") == 0.5
    assert phases.mark("decode") == 1.5
    assert phases.mark("load") == 0.25  # a second stretch of the same phase
    phases.skip()  # 12.25 .. 20.0 belongs to no phase
    phases.mark("checks")
    assert phases.report() == {"start": 3.25, "load": 0.75, "decode": 1.5, "checks": 1.0}
    assert list(phases.report()) == ["start", "load", "decode", "checks"]  # in the order first marked


def test_a_clock_that_steps_back_never_makes_a_negative_phase():
    ticks = iter([5.0, 4.0])
    phases = Phases(clock=lambda: next(ticks))
    assert phases.mark("x") == 0.0 and phases.report() == {"x": 0.0}


def test_report_rounds_to_the_millisecond():
    ticks = iter([0.0, 0.12345678])
    phases = Phases(clock=lambda: next(ticks))
    phases.mark("x")
    assert phases.report() == {"x": 0.123}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_age_counts_from_the_process_start():
    code = "import time; time.sleep(0.6); from lilicorr_ckpt.smoke.phases import process_age; print(process_age())"
    age = float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert 0.55 <= age < 30
    here = process_age()
    assert here is not None and here > 0


def test_process_age_is_none_where_proc_cannot_be_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr("builtins.open", refuse)
    assert process_age() is None


def test_the_text_report_shows_the_phases_and_what_the_kernels_cost():
    from lilicorr_ckpt.report.smoke import _time_lines
    from lilicorr_ckpt.smoke.profile import KernelVariants, MeasurementConditions

    base = dict(
        probes="code,chat,math",
        probe_counts={"code": 1},
        probe_digest="d",
        limit=1,
        max_new_tokens=8,
        temperature=0.0,
        seeds=[0],
        warmup=True,
        device="NVIDIA H100 80GB HBM3",
        dtype="bfloat16",
        kernel_backend="triton",
    )
    assert _time_lines(MeasurementConditions(**base)) == []  # a profile from before phases were recorded
    variants = KernelVariants(
        ahead=60,
        ahead_compiled=58,
        ahead_seconds=12.34,
        launched=71,
        at_launch=13,
        at_launch_seconds=4.5,
        read_seconds=0.81,
        tuned=3,
        tuning_seconds=9.96,
    )
    m = MeasurementConditions(
        **base,
        phase_seconds={"start": 9.81, "target": 3.1, "kernels_ahead": 8.0, "warm_up": 6.2},
        kernel_variants=variants,
    )
    time_line, kernel_line = _time_lines(m)
    assert time_line == "time (s): start 9.8, target 3.1, kernels ahead 8.0, warm up 6.2; 27.1 in all"
    assert kernel_line == (
        "kernels: 58 of 60 stored variants compiled ahead (12.3 s, beside the loading); the launches waited 0.8 s "
        "to read them and 4.5 s for 13 more not compiled ahead (71 variants in all); 3 GEMM shape(s) tuned "
        "(10.0 s)"
    )
    # a run that tuned nothing says nothing of tuning
    quiet = msgspec.structs.replace(m, kernel_variants=msgspec.structs.replace(variants, tuned=0))
    assert "tuned" not in _time_lines(quiet)[1]


def test_kernel_variants_split_the_launches_waits_by_whether_the_variant_was_compiled_ahead(monkeypatch):
    from lilicorr_ckpt.smoke import run
    from lilicorr_runtime.ops import warm

    monkeypatch.setattr(warm, "device_key", lambda device: "gpu0")
    waits = {"gpu0": {"a": 0.5, "b": 0.25, "c": 3.0, "d": 1.0}, "gpu1": {"x": 9.0}}
    monkeypatch.setattr(warm, "launch_waits", lambda: waits)
    monkeypatch.setattr(run.tuner, "tuning_done", lambda: (0, 0.0))
    warming = types.SimpleNamespace(jobs=[(None, "a"), (None, "b"), (None, "z")], compiled=2, seconds=4.25)
    v = run._kernel_variants(warming, "cuda")
    assert (v.ahead, v.ahead_compiled, v.ahead_seconds) == (3, 2, 4.25)
    # a and b were compiled ahead: the launches only read them; c and d were compiled at their first launch
    assert (v.launched, v.at_launch, v.at_launch_seconds, v.read_seconds) == (4, 2, 4.0, 0.75)
    # a second run in one process: what the first one waited for is not this one's
    v = run._kernel_variants(warming, "cuda", {"gpu0": {"a": 0.5, "c": 3.0}})
    assert (v.launched, v.at_launch, v.at_launch_seconds, v.read_seconds) == (2, 1, 1.0, 0.25)
    # no ahead compile and nothing waited for: nothing to say
    assert run._kernel_variants(None, "cuda", waits) is None
    # the shapes tuned in this run: the process's count less the one when the run began
    monkeypatch.setattr(run.tuner, "tuning_done", lambda: (3, 7.0))
    v = run._kernel_variants(None, "cuda", waits, (1, 2.0))
    assert v is not None and (v.tuned, v.tuning_seconds, v.launched, v.ahead) == (2, 5.0, 0, 0)
    assert run._kernel_variants(None, "cuda", waits, (3, 7.0)) is None
