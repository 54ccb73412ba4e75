"""The ops of a draft step, each a torch reference beside its dispatcher: the norms, the candidates (`topk_lse`),
the LiLiCorr head's kernels and the walks through its lattice.

Each `*_reference` is what CPU runs and the oracle its Triton kernel (draft_triton.py, same signature with
`_triton`) is tested against; the undecorated name dispatches on device (CUDA -> Triton, otherwise -> reference).
Scores are fp32. The dispatching functions check their arguments' shapes first (ValueError stating the expected
shapes): comparisons of sizes only, no device work, so they cost nothing inside a CUDA graph capture.
"""

from __future__ import annotations

import torch

from ..arguments import as_int
from .dispatch import is_integer, shape_error, use_triton

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
