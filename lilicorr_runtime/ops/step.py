"""The ops of a target step on the fast path (target/fast.py), each a torch reference beside its dispatcher: the
linear layers with their norm and epilogue, RoPE with the K/V write, and attention over the visible cache rows.
The Triton kernels (step_triton.py, same signatures with `_triton`) compute each row independently of the others
(batch invariance); the references are what CPU and a long prefill run.
"""

from __future__ import annotations

from typing import cast

import torch

from .. import rows
from .dispatch import shape_error, use_triton
from .draft import rms_norm_reference
from .rope import apply_rope

# the most query rows per sequence that step_attention_reference attends as one block per KV head on the CPU (a
# step: the AR step or a verify block; a prefill's many rows run SDPA's GQA path, which is faster there)
CPU_GROUPED_ROWS = rows.STEP


def step_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One linear layer of a target step with what surrounds it: y = residual + act(RMSNorm(x) · Wᵀ + bias).

    x [M, K]; weight [N, K], or [2N, K] with `gated` (gate rows then up rows: y = silu(gate) · up); norm_weight
    [K] or None (no norm); residual [M, N] or None. Returns y [M, N] in out_dtype (default x's), written into
    `out` [M, N] when given."""
    h = x if norm_weight is None else rms_norm_reference(x, norm_weight, eps)
    y = torch.nn.functional.linear(h, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    if residual is not None:
        y = residual + y
    if out is not None:
        return out.copy_(y)
    return y if out_dtype is None else y.to(out_dtype)


def step_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`step_linear_reference`, as one Triton kernel on CUDA (norm prologue, bias / SiLU·up / residual epilogue),
    computing each row independently of the others (step_triton.py: batch invariance)."""
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    k = weight.shape[1] if weight.dim() == 2 else -1
    if (
        x.dim() != 2
        or weight.dim() != 2
        or k != x.shape[1]
        or (gated and weight.shape[0] % 2)
        or (norm_weight is not None and norm_weight.shape != (x.shape[1],))
        or (bias is not None and bias.shape != (n,))
        or (residual is not None and residual.shape != (x.shape[0], n))
        or (out is not None and out.shape != (x.shape[0], n))
    ):
        raise shape_error(
            "step_linear",
            "x [M, K], weight [N, K] ([2N, K] gated), norm_weight [K], bias [N], residual and out [M, N]",
            x=x,
            weight=weight,
            norm_weight=norm_weight,
            bias=bias,
            residual=residual,
            out=out,
        )
    if k > 0 and use_triton(x, weight):  # K = 0: nothing to stream, the reference's values
        from .step_triton import step_linear_triton

        return step_linear_triton(
            x,
            weight,
            norm_weight=norm_weight,
            eps=eps,
            bias=bias,
            residual=residual,
            gated=gated,
            out=out,
            out_dtype=out_dtype,
        )
    return step_linear_reference(
        x,
        weight,
        norm_weight=norm_weight,
        eps=eps,
        bias=bias,
        residual=residual,
        gated=gated,
        out=out,
        out_dtype=out_dtype,
    )


def rope_kv_reference(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
    rotate_in_dtype: bool = False,
) -> torch.Tensor:
    """The attention inputs of a step: q and k (each RMSNormed per head first when q_norm / k_norm are given, as
    Qwen3 does) rotated at their positions (NeoX halves, in fp32, rounded once), k and v written into the cache.

    qkv [b, n, (H + 2 KV)·hd] (q, k, v side by side), keys/values [b, KV, capacity, hd] (written in place at
    cache rows `rows` [b, n]), positions [b, n], cos/sin [>= max position + 1, hd/2] (rope.rope_tables)
    -> q [b, n, H, hd].

    `rotate_in_dtype`: the rotation runs in qkv's dtype with the angles rounded to it, every product and sum
    rounded (the drafter's rounding, as the engines compute the DFlash backbone: ops/rope.py), instead of in
    fp32 rounded once (the target's)."""
    b, n, width = qkv.shape
    hd = width // (num_heads + 2 * num_kv_heads)
    q, k, v = qkv.split((num_heads * hd, num_kv_heads * hd, num_kv_heads * hd), dim=-1)
    q, k = q.reshape(b, n, num_heads, hd), k.reshape(b, n, num_kv_heads, hd)
    if q_norm is not None:
        q = rms_norm_reference(q, q_norm, eps)
    if k_norm is not None:
        k = rms_norm_reference(k, k_norm, eps)
    c, s = cos[positions][:, :, None], sin[positions][:, :, None]  # [b, n, 1, hd/2]
    if rotate_in_dtype:  # in the dtype, rounded at every step
        c, s = c.to(q.dtype), s.to(q.dtype)
        q, k = apply_rope(q, c, s), apply_rope(k, c, s)
    else:  # in fp32, rounded once
        q, k = apply_rope(q.float(), c, s).to(q.dtype), apply_rope(k.float(), c, s).to(k.dtype)
    # keys[i, :, rows[i, j]] = k[i, j]: an index_put over [b, n] row pairs (a scatter_ along the capacity with an
    # expanded index costs 30x more on the CPU in bfloat16, and writes the same values)
    batch_index = torch.arange(b, device=rows.device)[:, None]  # [b, 1], broadcast against rows [b, n]
    keys[batch_index, :, rows] = k.to(keys.dtype)  # the indexed view is [b, n, KV, hd], k's own layout
    values[batch_index, :, rows] = v.reshape(b, n, num_kv_heads, hd).to(values.dtype)
    return q


def _check_rope_kv(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
) -> None:
    """The shapes rope_kv and rope_attention take (raises their shape error)."""
    heads = num_heads + 2 * num_kv_heads
    if (
        qkv.dim() != 3
        or qkv.shape[2] % heads
        or keys.dim() != 4
        or values.shape != keys.shape
        or keys.shape[:2] != (qkv.shape[0], num_kv_heads)
        or keys.shape[3] * heads != qkv.shape[2]
        or rows.shape != qkv.shape[:2]
        or positions.shape != qkv.shape[:2]
        or cos.shape != sin.shape
        or cos.dim() != 2
        or 2 * cos.shape[1] != keys.shape[3]
    ):
        raise shape_error(
            "rope_kv",
            f"qkv [b, n, (H + 2 KV)·hd] with H = {num_heads}, KV = {num_kv_heads}, "
            "keys and values [b, KV, capacity, hd], rows and positions [b, n], cos and sin [P, hd/2]",
            qkv=qkv,
            keys=keys,
            values=values,
            rows=rows,
            positions=positions,
            cos=cos,
        )


def rope_kv(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
    rotate_in_dtype: bool = False,
) -> torch.Tensor:
    """`rope_kv_reference`, as one Triton kernel on CUDA (one program per 16 rows and KV head, which also rotates
    that head's group of q heads). Rows at or past the cache's capacity are not written."""
    _check_rope_kv(qkv, keys, values, rows, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
    if use_triton(qkv, keys):
        from .step_triton import rope_kv_triton

        return rope_kv_triton(
            qkv,
            keys,
            values,
            rows,
            positions,
            cos,
            sin,
            num_heads,
            num_kv_heads,
            q_norm,
            k_norm,
            eps,
            rotate_in_dtype,
        )
    return rope_kv_reference(
        qkv,
        keys,
        values,
        rows,
        positions,
        cos,
        sin,
        num_heads,
        num_kv_heads,
        q_norm,
        k_norm,
        eps,
        rotate_in_dtype,
    )


def step_attention_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, last: torch.Tensor, first: torch.Tensor
) -> torch.Tensor:
    """Causal attention of a step over the cache: query (b, i) attends to cache rows first[b]..last[b, i],
    softmax scale 1/sqrt(hd), GQA. A left-padding query row (last < first) attends to row first[b] alone, so no
    softmax row is empty (an empty one is NaN, and NaN K/V rows would poison later queries through 0 x NaN).

    q [b, n, H, hd], keys/values [b, KV, capacity, hd], last [b, n], first [b] -> [b, n, H·hd].

    On the CPU only the rows up to the last visible one of the batch are read (the rest are masked anyway, and a
    static cache is mostly empty), and a verify block's queries (1 < n <= CPU_GROUPED_ROWS) attend as one
    [groups·n]-row block per KV head (SDPA's CPU kernel pays per (row, head) block: 30% less time at 32 x 8 rows);
    elsewhere the whole capacity, so the shapes stay static (no host sync, as a CUDA graph needs). They agree to
    the dtype's round-off, not bit for bit: SDPA's reductions follow the number of rows it is given."""
    b, n, heads, hd = q.shape
    kv_heads = keys.shape[1]
    last = torch.maximum(last, first[:, None])
    cpu = keys.device.type == "cpu"
    if cpu and last.numel():
        end = int(last.max()) + 1
        keys, values = keys[:, :, :end], values[:, :, :end]
    key_rows = torch.arange(keys.shape[2], device=q.device)[None, None, :]
    visible = (key_rows >= first[:, None, None]) & (key_rows <= last[:, :, None])  # [b, n, rows]
    if cpu and 1 < n <= CPU_GROUPED_ROWS and heads != kv_heads:
        groups, rows = heads // kv_heads, keys.shape[2]
        # head h = kv * groups + g reads KV head kv: its n queries join the block of KV head kv as rows g·n..
        grouped = (
            q.view(b, n, kv_heads, groups, hd).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, groups * n, hd)
        )
        mask = visible[:, None, None].expand(b, 1, groups, n, rows).reshape(b, 1, groups * n, rows)
        out = torch.nn.functional.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)
        return out.view(b, kv_heads, groups, n, hd).permute(0, 3, 1, 2, 4).reshape(b, n, heads * hd)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys, values, attn_mask=visible[:, None], enable_gqa=heads != kv_heads
    )
    return out.transpose(1, 2).reshape(b, n, heads * hd)


def step_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, last: torch.Tensor, first: torch.Tensor
) -> torch.Tensor:
    """`step_attention_reference`, as one Triton kernel on CUDA that reads only the visible cache rows."""
    if (
        q.dim() != 4
        or keys.dim() != 4
        or values.shape != keys.shape
        or keys.shape[0] != q.shape[0]
        or keys.shape[3] != q.shape[3]
        or q.shape[2] % keys.shape[1]
        or last.shape != q.shape[:2]
        or first.shape != q.shape[:1]
    ):
        raise shape_error(
            "step_attention",
            "q [b, n, H, hd], keys and values [b, KV, capacity, hd] (KV divides H), last [b, n], first [b]",
            q=q,
            keys=keys,
            values=values,
            last=last,
            first=first,
        )
    if use_triton(q, keys):
        from .step_triton import step_attention_triton

        return step_attention_triton(q, keys, values, last, first)
    return step_attention_reference(q, keys, values, last, first)


def rope_attention_reference(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    last: torch.Tensor,
    first: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
    rotate_in_dtype: bool = False,
) -> torch.Tensor:
    """`rope_kv_reference` then `step_attention_reference`: q and k (normed and) rotated, k and v written at cache
    rows `rows` [b, n], then query (b, i) attends to cache rows first[b]..last[b, i] -> [b, n, H·hd]."""
    q = rope_kv_reference(
        qkv,
        keys,
        values,
        rows,
        positions,
        cos,
        sin,
        num_heads,
        num_kv_heads,
        q_norm,
        k_norm,
        eps,
        rotate_in_dtype,
    )
    return step_attention_reference(q, keys, values, last, first)


def rope_attention(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    last: torch.Tensor,
    first: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
    rotate_in_dtype: bool = False,
) -> torch.Tensor:
    """`rope_attention_reference`; on CUDA one Triton kernel for a step of at most FUSED_ROWS rows per sequence
    (the rotation and the K/V write fused into the attention), two for more."""
    if (q_norm is None) != (k_norm is None) or last.shape != rows.shape or first.shape != rows.shape[:1]:
        raise shape_error(
            "rope_attention",
            "rows, positions and last [b, n], first [b], and q_norm and k_norm both given or both None",
            rows=rows,
            last=last,
            first=first,
            q_norm=q_norm,
            k_norm=k_norm,
        )
    if num_heads == 0 or num_heads % max(num_kv_heads, 1):
        raise ValueError(f"rope_attention needs query heads, a multiple of the {num_kv_heads} KV heads")
    args = (qkv, keys, values, rows, positions, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps)
    _check_rope_kv(*args)
    if use_triton(qkv, keys):
        from .step_triton import rope_attention_triton

        return rope_attention_triton(
            qkv, keys, values, rows, positions, last, first, cos, sin, num_heads, num_kv_heads, q_norm, k_norm,
            eps, rotate_in_dtype,
        )  # fmt: skip
    return rope_attention_reference(
        qkv, keys, values, rows, positions, last, first, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps,
        rotate_in_dtype,
    )  # fmt: skip


def decoder_layer(
    flat: torch.Tensor,
    layer: dict[str, torch.Tensor | None],
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    rows: torch.Tensor,
    positions: torch.Tensor,
    last: torch.Tensor,
    first: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
    kernels: bool = True,
    rotate_in_dtype: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One pre-norm decoder layer over a static K/V cache, as the fast target's layers and the drafter's
    backbone layers both run it: RMSNorm -> qkv (+bias) -> per-head q/k norm and RoPE, k and v written at cache
    rows `rows` -> attention over cache rows first[b]..last[b, i] -> o_proj + residual -> RMSNorm -> silu(gate) ·
    up -> down + residual.

    flat [b·n, M] (the residual stream of b sequences of n rows), keys/values [b, KV, capacity, hd] -> [b·n, M]
    (written into `out` when given). `layer` holds input_norm, qkv ([q; k; v] rows), qkv_bias, q_norm, k_norm,
    o, o_bias, post_norm, gate_up ([gate; up] rows) and down. `kernels`: the step ops (their Triton kernels on
    CUDA), else their torch references."""
    b, n = rows.shape
    linear = step_linear if kernels else step_linear_reference
    attend = rope_attention if kernels else rope_attention_reference

    def weight(name: str) -> torch.Tensor:  # a matrix every layer has (the norms and biases may be None)
        return cast(torch.Tensor, layer[name])

    qkv = linear(flat, weight("qkv"), norm_weight=layer["input_norm"], eps=eps, bias=layer["qkv_bias"])
    attn = attend(
        qkv.view(b, n, -1),
        keys,
        values,
        rows,
        positions,
        last,
        first,
        cos,
        sin,
        num_heads,
        num_kv_heads,
        layer["q_norm"],
        layer["k_norm"],
        eps,
        rotate_in_dtype,
    )  # [b, n, heads * hd]; k, v written at `rows`
    flat = linear(attn.view(b * n, -1), weight("o"), bias=layer["o_bias"], residual=flat)
    h = linear(flat, weight("gate_up"), norm_weight=layer["post_norm"], eps=eps, gated=True)
    return linear(h, weight("down"), residual=flat, out=out)
