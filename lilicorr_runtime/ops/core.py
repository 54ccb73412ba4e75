"""The runtime's ops, each a torch reference (`*_reference`: what the CPU runs, and the oracle its Triton kernel is
tested against) beside a dispatcher of the undecorated name that runs the kernel on CUDA (draft_triton.py and
step_triton.py hold the kernels, same signatures with `_triton`). In the order a reader meets them:

- how an op picks its implementation (`use_triton`: the Triton kernel on CUDA, the torch reference everywhere
  else and under autograd, since the kernels have no backward) and the one shape error every dispatcher raises;
- the rotary embedding, one implementation for the drafter and the target: the frequencies a drafter's rope
  config gives, the cos/sin angles at positions and the NeoX rotation (the two halves of each head rotated as
  pairs). The tables are half a head wide ([..., hd/2]), as the step kernel reads them (step_triton.py
  `_rotate_rows`). The drafter rotates in its weights' dtype with the angles rounded to it (as SGLang, vLLM and
  TensorRT-LLM compute the DFlash backbone); the fast target rotates in fp32 and rounds once
  (`rope_kv_reference`); both call `apply_rope`;
- the draft step's ops: the norms, the candidates (`topk_lse`), the LiLiCorr head's kernels and the walks through
  its lattice. Scores are fp32. The dispatchers check their arguments' shapes first (ValueError stating the
  expected shapes): comparisons of sizes only, no device work, so they cost nothing inside a CUDA graph capture;
- the target step's ops on the fast path (target/fast.py): the linear layers with their norm and epilogue, RoPE
  with the K/V write, and attention over the visible cache rows. Their kernels compute each row independently of
  the others (batch invariance); the references are what the CPU and a long prefill run.
"""

from __future__ import annotations

import math
import operator
from typing import Any, SupportsIndex, cast

import torch

from .. import rows

# -------------------- how an op picks its implementation


def shape_error(op: str, expected: str, **tensors: torch.Tensor | None) -> ValueError:
    got = ", ".join(f"{name} {list(t.shape)}" for name, t in tensors.items() if t is not None)
    return ValueError(f"{op} expects {expected}; got {got}")


def as_int(value: object) -> int | None:
    """An integer argument (a Python or numpy int, not a bool) as int, else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(cast(SupportsIndex, value))  # TypeError for what has no __index__
    except TypeError:
        return None


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


# -------------------- the rotary embedding, for the drafter and the target


class RopeUnsupported(ValueError):
    pass


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] fp32, attention scaling applied to cos/sin) for the draft's rope config.

    Supports the default rope, `linear` and `yarn` scaling; other types are refused rather than guessed.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    base = 1.0 / (theta**exponents)  # [head_dim/2]
    kind = None if not scaling else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return base.float(), 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    if kind == "linear":
        return (base / factor).float(), 1.0
    if kind == "yarn":
        return _yarn(base, head_dim, theta, factor, scaling, max_position_embeddings)
    raise RopeUnsupported(
        f"rope_scaling type {kind!r} is not supported by the reference runtime "
        "(supported: default, linear, yarn)"
    )


def _yarn(
    base: torch.Tensor,
    dim: int,
    theta: float,
    factor: float,
    scaling: dict[str, Any],
    max_position_embeddings: int,
) -> tuple[torch.Tensor, float]:
    # YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, ramp in between.
    original = int(scaling.get("original_max_position_embeddings") or max_position_embeddings)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1 = extrapolate (keep the original frequency)
    inv_freq = (base / factor) * (1 - keep) + base * keep
    return inv_freq.float(), float(attention)


def rope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] (integer) -> fp32 cos, sin [..., hd/2], the attention scaling folded in."""
    freqs = positions.float()[..., None] * inv_freq.float()  # [..., hd/2]
    return freqs.cos() * scale, freqs.sin() * scale


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's angles: positions [n] (or [b, n], one row of positions per sequence) -> cos, sin [n, hd/2]
    ([b, 1, n, hd/2], broadcasting over the heads of x [b, heads, n, hd]), rounded to `dtype`."""
    cos, sin = rope_angles(positions, inv_freq, scale)
    if positions.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    return cos.to(dtype), sin.to(dtype)


def rope_tables(inv_freq: torch.Tensor, scale: float, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's tables: fp32 cos and sin [positions, hd/2] of positions 0..positions-1, read by row (rope_kv)."""
    cos, sin = rope_angles(torch.arange(positions, device=inv_freq.device), inv_freq, scale)
    return cos.contiguous(), sin.contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., hd] rotated by cos/sin [..., hd/2] (broadcast against x's leading dimensions): NeoX halves, each
    pair (x_i, x_{i + hd/2}) turned by its angle, computed in the dtype of the inputs."""
    lo, hi = x.chunk(2, dim=-1)
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)


# -------------------- the draft step's ops


MIN_TEMPERATURE = 1e-5

# Conventions shared with the Triton kernels (draft_triton.py), so both paths return identical results: scores
# are compared in fp32; a NaN is ordered as -inf for every selection; ties go to the lower index; `topk_lse`
# reports lse = NaN for a row holding any NaN.


def topk_lse_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k of each row (stable: equal values in column order) and the row's full-vocabulary log-partition.

    logits [n, V] -> values [n, k] fp32 descending, ids [n, k] int64, lse [n] fp32.
    `values - lse[:, None]` are the candidates' full-vocabulary log-probs.
    """
    x = logits.float()
    if x.device.type == "cpu" and x.shape[-1] > k:
        fast = _topk_lse_cpu(
            x, k
        )  # the same results in fewer passes over the logits, when no row holds a NaN
        if fast is not None:
            return fast
    nan = torch.isnan(x)
    x = torch.where(nan, float("-inf"), x)
    values, ids = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    # torch.topk leaves the order of equal values unspecified: restore column order among them, and at the
    # k-th value keep the lowest columns holding it
    kth = values[:, -1:]  # [n, 1]
    boundary_ties = (x == kth).sum(dim=-1) != (values == kth).sum(dim=-1)
    return _ordered(x, values, ids, boundary_ties, k, nan.any(dim=-1))


def _ordered(
    x: torch.Tensor,
    values: torch.Tensor,
    ids: torch.Tensor,
    boundary_ties: torch.Tensor,
    k: int,
    nan_rows: torch.Tensor | None,
    row_max: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_lse_reference's tail: the lowest columns among the k-th value's ties, equal values in column order,
    and the log-partition (NaN for the rows in `nan_rows`)."""
    kth = values[:, -1:]  # [n, 1]
    for row in torch.nonzero(boundary_ties).flatten().tolist():
        above = torch.nonzero(x[row] > kth[row]).flatten()
        equal = torch.nonzero(x[row] == kth[row]).flatten()[: k - above.numel()]
        ids[row] = torch.cat([above, equal])
    order = torch.argsort(ids, dim=-1)
    ids = ids.gather(1, order)
    values = x.gather(1, ids)
    resort = torch.sort(
        values, dim=-1, descending=True, stable=True
    ).indices  # stable: columns stay ascending
    values, ids = values.gather(1, resort), ids.gather(1, resort)
    row_max = x.amax(dim=-1, keepdim=True) if row_max is None else row_max  # [n, 1]
    safe_max = torch.where(torch.isinf(row_max), 0.0, row_max)
    lse = (safe_max + torch.log((x - safe_max).exp_().sum(dim=-1, keepdim=True))).squeeze(-1)
    if nan_rows is not None:
        lse = torch.where(nan_rows, float("nan"), lse)
    return values, ids.long(), lse


def _topk_lse_cpu(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """topk_lse_reference's results for CPU logits [n, V > k] with no NaN (None otherwise: the general path runs),
    bit for bit, in four passes over the logits instead of ten: the row max (NaN when the row holds one) doubles
    as the log-partition's shift, and a top-(k+1) tells the boundary ties (a (k+1)-th value equal to the k-th)
    without counting every column equal to it."""
    row_max = x.amax(dim=-1, keepdim=True)  # [n, 1]; amax propagates NaN
    if bool(torch.isnan(row_max).any()):
        return None
    values, ids = torch.topk(x, k + 1, dim=-1, largest=True, sorted=True)
    boundary_ties = values[:, k] == values[:, k - 1]
    return _ordered(x, values[:, :k], ids[:, :k], boundary_ties, k, None, row_max)


def topk_lse(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`topk_lse_reference`, as one Triton pass over the logits on CUDA (k a power of two <= 16)."""
    if logits.dim() != 2:
        raise shape_error("topk_lse", "logits [n, V]", logits=logits)
    k_int = as_int(k)
    if k_int is None or not 1 <= k_int <= logits.shape[1]:
        raise ValueError(f"topk_lse needs an integer k in [1, V = {logits.shape[1]}], got k={k!r}")
    k = k_int
    if 1 <= k <= 16 and k & (k - 1) == 0 and k <= logits.shape[-1] and use_triton(logits):
        from .draft_triton import topk_lse_triton

        return topk_lse_triton(logits, k)
    return topk_lse_reference(logits, k)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm semantics (as training and TRT compute it): fp32 reduction, cast back, then x weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm_reference`, as one Triton kernel on CUDA (one launch instead of seven)."""
    if weight.dim() != 1 or x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise shape_error("rms_norm", "x [..., D], weight [D]", x=x, weight=weight)
    if use_triton(x, weight):
        from .draft_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def lattice_scores_reference(
    out_vectors: torch.Tensor,
    in_vectors: torch.Tensor,
    anchor_vector: torch.Tensor,
    vector_eps: float,
    logit_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's last step (the unit out/in/anchor vectors and their scaled dot products), in fp32: n(v) = v / max(|v|, eps),
    start[b, j] = s·<n(anchor[b]), n(in[b, 0, j])>, pairs[b, t, i, j] = s·<n(out[b, t, i]), n(in[b, t+1, j])>.

    out_vectors, in_vectors [b, S, K, F], anchor_vector [b, F] -> start [b, K], pairs [b, S-1, K, K].
    """
    out_vec = torch.nn.functional.normalize(out_vectors.float(), dim=-1, eps=vector_eps)
    in_vec = torch.nn.functional.normalize(in_vectors.float(), dim=-1, eps=vector_eps)
    anchor_vec = torch.nn.functional.normalize(anchor_vector.float(), dim=-1, eps=vector_eps)
    start = logit_scale * torch.einsum("bf,bkf->bk", anchor_vec, in_vec[:, 0])
    pairs = logit_scale * torch.einsum("bsif,bsjf->bsij", out_vec[:, :-1], in_vec[:, 1:])
    return start, pairs


def lattice_scores(
    out_vectors: torch.Tensor,
    in_vectors: torch.Tensor,
    anchor_vector: torch.Tensor,
    vector_eps: float,
    logit_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`lattice_scores_reference`, as one Triton kernel on CUDA (normalisation, dots and scale fused)."""
    if (
        out_vectors.dim() != 4
        or in_vectors.shape != out_vectors.shape
        or out_vectors.shape[1] < 1
        or anchor_vector.shape != (out_vectors.shape[0], out_vectors.shape[3])
    ):
        raise shape_error(
            "lattice_scores",
            "out_vectors and in_vectors [b, S, K, F] (S >= 1), anchor_vector [b, F]",
            out_vectors=out_vectors,
            in_vectors=in_vectors,
            anchor_vector=anchor_vector,
        )
    if use_triton(out_vectors, in_vectors, anchor_vector):
        from .draft_triton import lattice_scores_triton

        return lattice_scores_triton(out_vectors, in_vectors, anchor_vector, vector_eps, logit_scale)
    return lattice_scores_reference(out_vectors, in_vectors, anchor_vector, vector_eps, logit_scale)


def candidate_features_reference(
    log_probs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """The head's per-candidate features, normalised: LayerNorm(5)(φ) with
    φ = [ℓ, e^ℓ, ℓ - max ℓ, k/(K-1) (0 when K = 1), 1{k = 0}] computed in fp32 and cast to `dtype` first.

    log_probs [..., K] -> [..., K, 5] in `dtype`.
    """
    lp = log_probs.float()
    k = lp.shape[-1]
    rank = torch.arange(k, device=lp.device, dtype=torch.float32)
    rank_frac = (rank / (k - 1) if k > 1 else torch.zeros_like(rank)).expand_as(lp)
    is_top = (rank == 0).float().expand_as(lp)
    phi = torch.stack([lp, lp.exp(), lp - lp.amax(dim=-1, keepdim=True), rank_frac, is_top], dim=-1)
    return torch.nn.functional.layer_norm(phi.to(dtype), (5,), weight, bias, eps)


def feature_hidden_reference(
    log_probs: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    eps: float,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor,
) -> torch.Tensor:
    """The feature MLP's hidden layer: SiLU(up(LayerNorm(5)(φ))). log_probs [..., K] -> [..., K, H] in
    up_weight's dtype."""
    features = candidate_features_reference(log_probs, norm_weight, norm_bias, eps, up_weight.dtype)
    return torch.nn.functional.silu(torch.nn.functional.linear(features, up_weight, up_bias))


def feature_hidden(
    log_probs: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    eps: float,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor,
) -> torch.Tensor:
    """`feature_hidden_reference`, as one Triton kernel on CUDA (features, LayerNorm, the 5-input Linear, SiLU)."""
    if (
        log_probs.dim() < 1
        or log_probs.shape[-1] < 1
        or norm_weight.shape != (5,)
        or norm_bias.shape != (5,)
        or up_weight.dim() != 2
        or up_weight.shape[1] != 5
        or up_bias.shape != up_weight.shape[:1]
    ):
        raise shape_error(
            "feature_hidden",
            "log_probs [..., K] (K >= 1), norm_weight [5], norm_bias [5], up_weight [H, 5], up_bias [H]",
            log_probs=log_probs,
            norm_weight=norm_weight,
            norm_bias=norm_bias,
            up_weight=up_weight,
            up_bias=up_bias,
        )
    if use_triton(log_probs, up_weight):
        from .draft_triton import feature_hidden_triton

        return feature_hidden_triton(log_probs, norm_weight, norm_bias, eps, up_weight, up_bias)
    return feature_hidden_reference(log_probs, norm_weight, norm_bias, eps, up_weight, up_bias)


def residual_norm_reference(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    anchor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual update and the next RMSNorm: x [b, n, H] += delta + bias (None: no update), y = RMSNorm(x).

    With anchor [b, H] (the normalised anchor), y is the factor input [b, n, 3H] = [y, a, y ⊙ a] instead.
    Returns (x, y). Each sum is rounded to x's dtype as the unfused module computes it.
    """
    if delta is not None:
        x = x + (delta if bias is None else delta + bias)
    y = rms_norm_reference(x, weight, eps)
    if anchor is not None:
        a = anchor[:, None].expand_as(y).to(y.dtype)
        y = torch.cat([y, a, y * a], dim=-1)
    return x, y


def residual_norm(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    anchor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual_norm_reference`, as one Triton kernel per row on CUDA."""
    if (
        x.dim() != 3
        or weight.shape != x.shape[2:]
        or (delta is not None and delta.shape != x.shape)
        or (bias is not None and bias.shape != x.shape[2:])
        or (anchor is not None and anchor.shape != (x.shape[0], x.shape[2]))
    ):
        raise shape_error(
            "residual_norm",
            "x [b, n, H], delta [b, n, H] or None, bias [H] or None, weight [H], anchor [b, H] or None",
            x=x,
            delta=delta,
            bias=bias,
            weight=weight,
            anchor=anchor,
        )
    same_dtype = all(t is None or t.dtype == x.dtype for t in (delta, bias))  # the kernel keeps x's dtype
    if same_dtype and use_triton(x, weight):
        from .draft_triton import residual_norm_triton

        return residual_norm_triton(x, delta, bias, weight, eps, anchor)
    return residual_norm_reference(x, delta, bias, weight, eps, anchor)


def lattice_attention_reference(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Bidirectional multi-head attention over the lattice nodes with an additive bias.

    qkv [b, n, 3h] (q, k, v stacked, as nn.MultiheadAttention's in_proj), bias [N, n, n] -> [b, n, h]:
    softmax(q kᵀ / sqrt(h/N) + bias) v per head.
    """
    b, n, three_h = qkv.shape
    h = three_h // 3
    q, k, v = qkv.view(b, n, 3, num_heads, h // num_heads).permute(2, 0, 3, 1, 4)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype)[None])
    return out.transpose(1, 2).reshape(b, n, h)


def lattice_attention(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """`lattice_attention_reference`, as one Triton kernel on CUDA (reads q, k, v in place, writes [b, n, h])."""
    heads = as_int(num_heads)
    if (
        heads is None
        or heads < 1
        or qkv.dim() != 3
        or qkv.shape[2] % (3 * heads)
        or bias.shape != (heads, qkv.shape[1], qkv.shape[1])
    ):
        raise shape_error(
            "lattice_attention",
            f"qkv [b, n, 3h] with h divisible by num_heads = {num_heads!r}, bias [num_heads, n, n]",
            qkv=qkv,
            bias=bias,
        )
    if use_triton(qkv, bias):
        from .draft_triton import lattice_attention_triton

        return lattice_attention_triton(qkv, bias, num_heads)
    return lattice_attention_reference(qkv, bias, num_heads)


def _clean(scores: torch.Tensor) -> torch.Tensor:
    x = scores.float()
    return torch.where(torch.isnan(x), float("-inf"), x)


def _pick_rows(pairs_s: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    # pairs_s [b, K, K], prev [b] -> the row of the previous pick [b, K]
    index = prev[:, None, None].expand(-1, 1, pairs_s.shape[-1])
    return pairs_s.gather(1, index).squeeze(1)


def greedy_walk_reference(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Left-to-right greedy commit through the lattice (ties go to the lower candidate index).

    start [b, K], pairs [b, S-1, K, K], ids [b, S, K] -> tokens [b, S].
    """
    slots = ids.shape[1]
    row = _clean(start)
    picks = []
    for s in range(slots):
        pick = row.argmax(dim=-1)  # [b]; torch.argmax returns the first maximum
        picks.append(pick)
        if s + 1 < slots:
            row = _clean(_pick_rows(pairs[:, s], pick))
    chosen = torch.stack(picks, dim=1)  # [b, S]
    return ids.gather(2, chosen[..., None]).squeeze(-1)


WALK_SHAPES = "start [b, K], pairs [b, S-1, K, K], ids [b, S, K] (integer ids; S, K >= 1)"


def _walk_fits_shapes(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> bool:
    if ids.dim() != 3 or start.dim() != 2 or pairs.dim() != 4 or not is_integer(ids):
        return False
    b, s, k = ids.shape
    return s >= 1 and k >= 1 and start.shape == (b, k) and pairs.shape == (b, s - 1, k, k)


def greedy_walk(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`greedy_walk_reference`, as one Triton program per row on CUDA."""
    if not _walk_fits_shapes(start, pairs, ids):
        raise shape_error("greedy_walk", WALK_SHAPES, start=start, pairs=pairs, ids=ids)
    if use_triton(start, pairs, ids):
        from .draft_triton import greedy_walk_triton, walk_fits

        if walk_fits(*ids.shape[1:]):
            return greedy_walk_triton(start, pairs, ids)
    return greedy_walk_reference(start, pairs, ids)


def sample_walk_reference(
    start: torch.Tensor,
    pairs: torch.Tensor,
    ids: torch.Tensor,
    uniforms: torch.Tensor,
    temperatures: torch.Tensor,
    greedy_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled commit: each slot draws from softmax(row / T) over its K candidates by inverse CDF.

    start [b, K], pairs [b, S-1, K, K], ids [b, S, K], uniforms [b, S] in [0, 1), temperatures [b],
    greedy_mask [b] bool -> tokens [b, S], q [b, S, K] (the distribution each slot was drawn from).
    The pick is the number of CDF entries <= u (at most K-1); if round-off lands it on a zero-probability
    entry, the last candidate in the support is taken instead. Greedy rows, and rows without a finite
    score, walk the argmax path of greedy_walk and report a one-hot q, so verification treats them as
    the point mass they are.
    """
    slots, k = ids.shape[1], ids.shape[2]
    temperature = temperatures.float().clamp_min(MIN_TEMPERATURE)[:, None]  # [b, 1]
    greedy = greedy_mask.bool()  # [b]
    columns = torch.arange(k, device=start.device)
    row = _clean(start)
    picks, proposals = [], []
    for s in range(slots):
        argmax = row.argmax(dim=-1)  # [b]
        best = row.amax(dim=-1)
        scaled = row / temperature
        top = scaled.amax(dim=-1, keepdim=True)
        weights = torch.exp(scaled - torch.where(torch.isinf(top), 0.0, top))
        probs = weights / weights.sum(dim=-1, keepdim=True)  # [b, K]
        cdf = probs.cumsum(dim=-1)
        pick = (cdf <= uniforms[:, s, None].float()).sum(dim=-1).clamp_max(k - 1)
        in_support = probs.gather(1, pick[:, None]).squeeze(1) > 0
        last_support = torch.where(probs > 0, columns, -1).amax(dim=-1)
        pick = torch.where(in_support, pick, last_support)
        point_mass = greedy | torch.isinf(best)
        pick = torch.where(point_mass, argmax, pick)
        one_hot = torch.nn.functional.one_hot(argmax, k).float()
        proposals.append(torch.where(point_mass[:, None], one_hot, probs))
        picks.append(pick)
        if s + 1 < slots:
            row = _clean(_pick_rows(pairs[:, s], pick))
    chosen = torch.stack(picks, dim=1)  # [b, S]
    return ids.gather(2, chosen[..., None]).squeeze(-1), torch.stack(proposals, dim=1)


def sample_walk(
    start: torch.Tensor,
    pairs: torch.Tensor,
    ids: torch.Tensor,
    uniforms: torch.Tensor,
    temperatures: torch.Tensor,
    greedy_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_walk_reference`, as one Triton program per row on CUDA."""
    if (
        not _walk_fits_shapes(start, pairs, ids)
        or uniforms.shape != ids.shape[:2]
        or temperatures.shape != ids.shape[:1]
        or greedy_mask.shape != ids.shape[:1]
    ):
        raise shape_error(
            "sample_walk",
            WALK_SHAPES + ", uniforms [b, S], temperatures [b], greedy_mask [b]",
            start=start,
            pairs=pairs,
            ids=ids,
            uniforms=uniforms,
            temperatures=temperatures,
            greedy_mask=greedy_mask,
        )
    if use_triton(start, pairs, ids, uniforms):
        from .draft_triton import sample_walk_triton, walk_fits

        if walk_fits(*ids.shape[1:]):
            return sample_walk_triton(
                start, pairs, ids, uniforms, temperatures.to(start.device), greedy_mask.to(start.device)
            )
    return sample_walk_reference(start, pairs, ids, uniforms, temperatures, greedy_mask)


def control_walk(logits: torch.Tensor) -> torch.Tensor:
    """DFlash without a head: the per-slot argmax of the draft logits. logits [b, S, V] -> tokens [b, S]."""
    if logits.dim() != 3 or logits.shape[2] < 1:
        raise shape_error("control_walk", "logits [b, S, V] (V >= 1)", logits=logits)
    return logits.float().argmax(dim=-1)


# -------------------- the target step's ops


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
    rounded (the drafter's rounding, as the engines compute the DFlash backbone: `apply_rope`), instead of in
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
    elsewhere the whole capacity, so the shapes stay static (no host sync, as a CUDA graph needs), and with GQA the
    KV heads expanded to the query heads (`_attend_heads_expanded`). They agree to the dtype's round-off, not bit
    for bit: SDPA's reductions follow the number of rows it is given."""
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
    if cpu or heads == kv_heads:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=visible[:, None], enable_gqa=heads != kv_heads
        )
    else:
        out = _attend_heads_expanded(q.transpose(1, 2), keys, values, visible[:, None])
    return out.transpose(1, 2).reshape(b, n, heads * hd)


def _attend_heads_expanded(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """SDPA of q [b, H, n, hd] over keys/values [b, KV, rows, hd] (KV divides H; query head h reads KV head
    h // (H / KV)) under a boolean mask, with each KV head copied out to its query heads first. On CUDA SDPA's
    fused kernels do not take a mask together with `enable_gqa`: that call runs the math backend, which
    materialises the scores in fp32 ([b, H, n, rows] a layer: most of the fit's target pass over 32 x 320
    tokens); with the heads expanded, one of SDPA's fused kernels takes the mask (cuDNN's on an H100 with torch
    2.11, in the fit's profile)."""
    b, kv_heads, rows, hd = keys.shape
    groups = q.shape[1] // kv_heads
    keys = keys[:, :, None].expand(b, kv_heads, groups, rows, hd).reshape(b, kv_heads * groups, rows, hd)
    values = values[:, :, None].expand(b, kv_heads, groups, rows, hd).reshape(b, kv_heads * groups, rows, hd)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


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
