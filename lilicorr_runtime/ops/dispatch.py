"""How an op picks its implementation: the Triton kernel on CUDA, the torch reference everywhere else (and under
autograd, since the kernels have no backward), and the one shape-error message every dispatcher raises."""

from __future__ import annotations

import torch


def shape_error(op: str, expected: str, **tensors: torch.Tensor | None) -> ValueError:
    got = ", ".join(f"{name} {list(t.shape)}" for name, t in tensors.items() if t is not None)
    return ValueError(f"{op} expects {expected}; got {got}")


def is_integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def use_triton(*tensors: torch.Tensor) -> bool:
    if not all(t.is_cuda for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False  # the kernels have no backward: training runs the differentiable references
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def kernel_backend(device: torch.device | str) -> str:
    """ "triton" when the draft-step ops run as Triton kernels on `device`, else "torch"."""
    return "triton" if use_triton(torch.empty(0, device=device)) else "torch"
