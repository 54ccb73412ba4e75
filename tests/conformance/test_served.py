"""served.py: what a built drafter computes that its loaded tensors cannot show (the harnesses' oracle for
config numbers that change no shape)."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.served import BootOutOfMemory, bounded_build, degenerate_numerics


class _Head(torch.nn.Module):
    def __init__(self, logit_scale: object = 1.0, vector_eps: object = 1e-6):
        super().__init__()
        self.logit_scale = logit_scale
        self.vector_eps = vector_eps
        self.norm = torch.nn.LayerNorm(4, eps=1e-5)


def test_a_sound_model_is_no_finding():
    assert degenerate_numerics(_Head()) is None
    assert degenerate_numerics(torch.nn.RMSNorm(4, eps=None)) is None  # None: the dtype's own epsilon


@pytest.mark.parametrize("eps", [0.0, -1e-6, math.nan, math.inf, "1e-6"])
def test_an_eps_without_a_positive_finite_floor_serves_another_function(eps):
    verdict, what = degenerate_numerics(_Head(vector_eps=eps))
    assert verdict == "SW" and "vector_eps" in what


@pytest.mark.parametrize(("scale", "verdict"), [(math.nan, "SW"), (math.inf, "SW"), (True, "SW"), ("2", "C")])
def test_a_logit_scale_that_is_no_finite_number(scale, verdict):
    found = degenerate_numerics(_Head(logit_scale=scale))
    assert found is not None and found[0] == verdict and "logit_scale" in found[1]


def test_a_tensor_logit_scale_is_a_loaded_parameter_not_a_config_number():
    assert degenerate_numerics(_Head(logit_scale=torch.tensor(float("nan")))) is None


def test_a_build_past_the_module_limit_is_a_boot_failure_and_the_constructor_is_restored():
    original = torch.nn.Module.__init__
    with pytest.raises(BootOutOfMemory, match="more than 5 modules"), bounded_build(limit=5):
        torch.nn.Sequential(*[torch.nn.Identity() for _ in range(10)])
    assert torch.nn.Module.__init__ is original
    with bounded_build(limit=5):
        torch.nn.Sequential(torch.nn.Identity())  # within the limit: built
