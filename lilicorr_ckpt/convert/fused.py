"""One NVFP4 global scale per fused linear: the q/k/v and gate/up shards a runtime fuses into one linear.

SGLang and vLLM build a layer's q/k/v as one QKVParallelLinear and gate/up as one MergedColumnParallelLinear, and
serve the fused weight with the largest of its shards' `weight_scale_2` (and `input_scale`); a shard quantized
against a smaller one is then served multiplied by the ratio (validate's LC327). ModelOpt's fusion pass, which
unifies them for a target model, never reaches a drafter, so its drafter exports come out with shards that differ.

convert gives each such group the largest of its shards' weight_scale_2 (so no block scale has to grow: nothing
clips) and re-quantizes every other shard against it (repair.requantize_blocks: its stored weights dequantized
exactly, then quantized as ModelOpt quantizes with that global scale); a shard already at the largest is copied
byte for byte. `input_scale` is set to the group's largest too: the runtimes quantize the fused linear's one input
with it already, so the served function does not change. This module plans it (4 bytes read per shard); the
writer streams the re-quantized shards a block of rows at a time.
"""

from __future__ import annotations

import msgspec
import numpy as np

from lilicorr_ckpt.checkpoint.numerics import bf16_bits, decode
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.convert.naming import natural_key
from lilicorr_ckpt.convert.repair import Reader
from lilicorr_ckpt.errors import ConversionRefused
from lilicorr_ckpt.runtimes import fused_name

SCALAR_DTYPES = ("F32", "F16", "BF16", "F64")


class FusedGroup(msgspec.Struct, frozen=True, kw_only=True):
    """A fused linear whose NVFP4 shards are stored with different global scales."""

    module: str  # the fused linear as the runtimes build it: layers.0.mlp.gate_up_proj
    shards: tuple[str, ...]  # its parts, in the runtimes' order (q, k, v / gate, up)
    weight_scale_2: dict[str, float]  # shard -> as stored
    shared: float  # the largest: every shard's weight_scale_2 in the output
    input_scale: dict[str, float] = {}  # shard -> as stored (empty: not every shard carries one)
    shared_input: float | None = None  # the largest input_scale, when they differ

    @property
    def requantized(self) -> tuple[str, ...]:
        """The shards re-quantized against the shared scale (the others are at it already: copied)."""
        return tuple(s for s in self.shards if self.weight_scale_2[s] != self.shared)

    def record(self) -> dict[str, object]:
        """The group as conversion.json records it (the writer adds each re-quantized shard's errors)."""
        return {
            "module": self.module,
            "shards": list(self.shards),
            "weight_scale_2": {"before": dict(self.weight_scale_2), "after": self.shared},
            "input_scale": (
                {"before": dict(self.input_scale), "after": self.shared_input}
                if self.shared_input is not None
                else None
            ),
            "kept": [s for s in self.shards if s not in self.requantized],
            "requantized": [
                {
                    "module": s,
                    "ratio": self.shared / self.weight_scale_2[s] if self.weight_scale_2[s] else None,
                    "max_abs_weight": None,
                    "max_abs_error": None,
                    "max_abs_error_if_kept": None,
                }
                for s in self.requantized
            ],
        }


def scalar_bytes(value: float, info: TensorInfo) -> bytes:
    """`value` stored as `info` stores its scalar (dtype and shape kept): exact, as `value` is one of the group's
    stored values."""
    count = max(1, int(np.prod(info.shape)))
    dtype = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}.get(info.dtype)
    if dtype is not None:
        return np.full(count, value, dtype=dtype).tobytes()
    return bf16_bits(np.full(count, value, dtype=np.float32)).tobytes()


def fused_groups(quantized_out: dict[str, str]) -> list[tuple[str, tuple[str, ...]]]:
    """(fused linear, its shards) for every group whose shards all stay NVFP4 in the output, in layer order."""
    groups: dict[str, tuple[str, ...]] = {}
    for module, kind in quantized_out.items():
        fused = fused_name(module)
        if kind == "nvfp4" and fused is not None and all(quantized_out.get(s) == "nvfp4" for s in fused[1]):
            groups[fused[0]] = fused[1]
    return sorted(groups.items(), key=lambda kv: natural_key(kv[0]))


def plan_fused_scales(
    quantized_out: dict[str, str],
    canonical: dict[str, TensorInfo],
    read: Reader,
    keep_input_scales: bool,
) -> list[FusedGroup]:
    """The fused groups whose shards' weight_scale_2 (or input_scale) differ, with the values that unify them.
    Refused when a shard's global scale is corrupt (NaN, infinite, negative): nothing sound can be derived."""

    def read_scalar(info: TensorInfo) -> float:
        return float(decode(read(info, 0, info.nbytes), info.dtype)[0])

    out: list[FusedGroup] = []
    corrupt: list[str] = []
    for module, shards in fused_groups(quantized_out):
        infos = {s: canonical.get(f"{s}.weight_scale_2") for s in shards}
        if any(i is None or i.dtype not in SCALAR_DTYPES or i.nbytes > 8 for i in infos.values()):
            continue  # not laid out as NVFP4: validate names it (a missing or misshapen scale)
        scales = {s: read_scalar(i) for s, i in infos.items() if i is not None}
        bad = [s for s, v in scales.items() if not np.isfinite(v) or v < 0]
        if bad:
            corrupt += [f"{s}.weight_scale_2 is {scales[s]:g}" for s in bad]
            continue
        inputs: dict[str, float] = {}
        if keep_input_scales:
            input_infos = {s: canonical.get(f"{s}.input_scale") for s in shards}
            if all(
                i is not None and i.dtype in SCALAR_DTYPES and i.nbytes <= 8 for i in input_infos.values()
            ):
                inputs = {s: read_scalar(i) for s, i in input_infos.items() if i is not None}
                if any(not np.isfinite(v) or v < 0 for v in inputs.values()):
                    inputs = {}  # validate judges a corrupt activation scale; nothing to unify
        shared_input = max(inputs.values()) if inputs and len(set(inputs.values())) > 1 else None
        if len(set(scales.values())) == 1 and shared_input is None:
            continue
        out.append(
            FusedGroup(
                module=module,
                shards=shards,
                weight_scale_2=scales,
                shared=max(scales.values()),
                input_scale=inputs if shared_input is not None else {},
                shared_input=shared_input,
            )
        )
    if corrupt:
        raise ConversionRefused(
            "a fused linear's NVFP4 global scale is corrupt (it is amax / (6 * 448): finite and >= 0)",
            corrupt + ["re-export the checkpoint"],
        )
    return out


def describe_groups(groups: list[FusedGroup]) -> list[str]:
    """One line per group for a refusal: its shards' weight_scale_2."""
    return [
        f"{g.module}: the shards' weight_scale_2 differ ("
        + ", ".join(f"{s.rsplit('.', 1)[-1]} {g.weight_scale_2[s]:.6g}" for s in g.shards)
        + "); SGLang and vLLM serve the fused linear with the largest"
        for g in groups
        if g.requantized
    ]
