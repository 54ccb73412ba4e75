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


def test_a_boot_buffer_no_accelerator_holds_is_the_boots_out_of_memory():
    from conformance.served import MAX_BUFFER_BYTES, bounded_buffer

    fits = torch.empty((16, 1 << 20), dtype=torch.float32, device="meta")
    assert bounded_buffer(fits, "a logits buffer") is fits
    at_bound = torch.empty((MAX_BUFFER_BYTES // 8,), dtype=torch.int64, device="meta")
    assert bounded_buffer(at_bound, "block positions") is at_bound  # exactly the bound still fits
    with pytest.raises(BootOutOfMemory) as caught:  # a RuntimeError: the harnesses' refusal (R)
        bounded_buffer(torch.arange(1 << 40, device="meta"), "the block positions")
    assert isinstance(caught.value, RuntimeError)
    assert "the block positions" in str(caught.value) and "(1099511627776,) int64" in str(caught.value)
    assert "8 TiB" in str(caught.value)
    with pytest.raises(BootOutOfMemory, match="float32 buffer"):
        bounded_buffer(torch.empty((16, 1 << 40), dtype=torch.float32, device="meta"), "a logits buffer")
