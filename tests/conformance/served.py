"""What a built drafter computes that loading its tensors cannot show, for both conformance harnesses (the vLLM one,
tests/conformance/vllm/vllm_harness.py, and SGLang's, tests/conformance/sglang/engine.py).

A config value that changes no shape is stored on the module the release builds and used only when the draft
runs: a normalisation epsilon, a logit scale. The released code loads such a drafter without a word; what it then
serves is read off the constructed modules here:

- `degenerate_numerics(model)`: the eps of every norm the release built (RMSNorm / LayerNorm `eps` or
  `variance_epsilon`, the LiLiCorr head's `vector_eps` for `F.normalize`) and the LiLiCorr head's `logit_scale`.
  An eps that is NaN, infinite or <= 0 divides by a norm with no floor (a zero vector becomes NaN; a NaN eps makes
  every output NaN); a NaN or infinite logit scale makes every candidate score NaN, a bool multiplies them by 0
  or 1: the draft loads and serves another function (SW). A logit scale that is no number fails the first draft step's multiplication (C).
- the multipliers DFlash2 applies when it drafts (vLLM's LogitsProcessor scale and input_embedding_scale,
  SGLang's draft_config.output_multiplier): a NaN or infinite one makes every logit NaN (SW).
- `bounded_build()`: the release building more modules than any accelerator holds (a layer count of 2**40)
  is stopped as the out-of-memory failure a server meets at boot, instead of running the harness out of memory.
- `bounded_buffer(tensor, what)`: a buffer the release allocates at boot from a config size (the worker's block
  positions, the draft graph's logits), built by the released code on the meta device, fails the same way when it
  is larger than any accelerator holds.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

# the most modules a drafter's build may construct (a real drafter has hundreds; the fuzzer's huge sizes are 2**40):
# beyond it the build is stopped (200,000 cost 20 s of the corpus suite per release)
MAX_MODULES = 20_000

_EPS_ATTRS = ("eps", "variance_epsilon", "vector_eps")


class BootOutOfMemory(RuntimeError):
    """The build constructs more modules than a server could hold: it fails at boot, out of memory."""


@contextlib.contextmanager
def bounded_build(limit: int = MAX_MODULES) -> Iterator[None]:
    """Count the modules constructed inside; raise BootOutOfMemory (a RuntimeError, the harnesses' refusal) past
    `limit`."""
    original = torch.nn.Module.__init__
    built = 0

    def counted(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        nonlocal built
        built += 1
        if built > limit:
            raise BootOutOfMemory(
                f"the build constructs more than {limit} modules (a size from the config no accelerator holds): "
                "the server runs out of memory at boot"
            )
        original(self, *args, **kwargs)

    torch.nn.Module.__init__ = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.__init__ = original  # type: ignore[method-assign]


# the most bytes one boot-time buffer may take: more than any single accelerator holds (an H200 has 141 GB)
MAX_BUFFER_BYTES = 1 << 40


def bounded_buffer(tensor: torch.Tensor, what: str, limit: int = MAX_BUFFER_BYTES) -> torch.Tensor:
    """`tensor` (the released code's own allocation, made on the meta device) when it fits `limit` bytes; else
    BootOutOfMemory naming `what` and its shape."""
    size = tensor.numel() * tensor.element_size()
    if size > limit:
        raise BootOutOfMemory(
            f"{what} is a {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')} buffer "
            f"({size / (1 << 40):.0f} TiB, more than any accelerator holds): the server runs out of memory at boot"
        )
    return tensor


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_MULTIPLIED = "every draft logit (or input embedding) it multiplies is NaN"


def _logit_multiplier(module: torch.nn.Module) -> tuple[str, Any] | None:
    """(attribute, value) of a config multiplier the module applies when the draft runs: vLLM's LogitsProcessor
    `scale` (DFlash2's output_multiplier) and DFlash2Qwen3Model's `input_embedding_scale`; SGLang's
    DFlash2DraftModel `draft_config.output_multiplier` (applied by its _transform_unary_logits, the only class
    that does)."""
    attrs = module.__dict__
    if type(module).__name__ == "LogitsProcessor" and "scale" in attrs:
        return "scale", attrs["scale"]
    if "input_embedding_scale" in attrs:
        return "input_embedding_scale", attrs["input_embedding_scale"]
    draft = attrs.get("draft_config")
    if hasattr(type(module), "_transform_unary_logits") and hasattr(draft, "output_multiplier"):
        return "draft_config.output_multiplier", draft.output_multiplier
    return None


def degenerate_numerics(model: torch.nn.Module) -> tuple[str, str] | None:
    """(verdict, what) for the first degenerate config-derived number the built modules hold, or None.

    C: a logit scale that is no number (the first draft step multiplies the scores by it: TypeError);
    SW: an eps that is not a finite positive number, or a logit scale that is not finite."""
    bad_eps: list[str] = []
    for name, module in model.named_modules():
        scaled = _logit_multiplier(module)
        if scaled is not None and _number(scaled[1]) and not math.isfinite(scaled[1]):
            return ("SW", f"{name or type(module).__name__}.{scaled[0]} is {scaled[1]!r}: {_MULTIPLIED}")
        for attr in _EPS_ATTRS:
            if attr not in module.__dict__:
                continue
            value = module.__dict__[attr]
            if value is None and attr == "eps":
                continue  # torch's norms: None is the dtype's own epsilon
            if not _number(value) or not math.isfinite(value) or value <= 0:
                bad_eps.append(f"{name or type(module).__name__}.{attr}={value!r}")
        scale = module.__dict__.get("logit_scale", 0.0)
        if isinstance(scale, torch.Tensor):
            continue
        if isinstance(scale, bool):
            return (
                "SW",
                f"{name}.logit_scale is {scale!r}: the candidate scores are multiplied by {int(scale)}, a bool's "
                "value, not a trained scale",
            )
        if not _number(scale):
            return (
                "C",
                f"{name}.logit_scale is {scale!r}: the first draft step multiplies the candidate scores by it "
                "(TypeError)",
            )
        if not math.isfinite(scale):
            return (
                "SW",
                f"{name}.logit_scale is {scale!r}: every candidate score the head serves is NaN",
            )
    if bad_eps:
        return (
            "SW",
            f"norms built with an eps that is not a finite positive number ({', '.join(bad_eps[:3])}): they "
            "divide by a norm with no floor (a zero vector, or every vector under a NaN eps, becomes NaN)",
        )
    return None
