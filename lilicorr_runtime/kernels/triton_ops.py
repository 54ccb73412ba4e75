"""Triton kernels for the LiLiCorr draft step; each mirrors a torch reference in lilicorr_runtime.ops.

Shared conventions (the references implement exactly the same):
  - scores and logits are read in their dtype and compared in fp32;
  - a NaN is ordered as -inf for every selection (a NaN logit is never a candidate ahead of a finite
    one); `topk_lse` reports lse = NaN for a row that holds any NaN, so a broken row stays visible;
  - ties go to the lower index (tl.argmax(tie_break_left) and torch.argmax agree).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tuned on an H200 (bench/kernels.py): V = 151936 bf16 gives 594 tiles, 38 scan programs per row.
TILE = 256  # columns per tile: the scan stores one maximum per tile
TILES_PER_PROGRAM = 16  # tiles one scan program reads in a single load
NUM_WARPS = 4
NEG_INF = float("-inf")


# ---------------------------------------------------------------- topk_lse
#
# Two kernels. The scan reads every logit once: per tile of TILE columns it stores the tile maximum, and
# per program an online-softmax partial (m, s). The select kernel (one program per row) combines the
# partials into the log-partition, picks the k tiles with the largest maxima and orders only their
# k * TILE columns.
#
# Why the tile pre-selection is exact. Order a row by (value descending, column ascending) and let x be
# one of its first k elements. Its tile's maximum is >= x. Select the k tiles with the largest maxima,
# ties to the lower tile. Suppose x's tile were not selected: each of the k selected tiles holds an
# element >= x (its maximum is >= x's tile maximum >= x), and an element equal to x can only sit in a
# selected tile of lower index (the tie on the tile maximum was broken towards it), so at a lower
# column. Either way k elements precede x in the order, contradicting x being among the first k. So the
# first k elements lie inside the k selected tiles. Every comparison breaks ties by column, so the
# result is the stable descending order of the row, exactly what the reference returns.


@triton.jit
def _order_key(x, index):
    """int64 keys whose max is the largest value, ties to the lowest index (x fp32 without NaN)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0 turns -0.0 into +0.0
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # monotone in x as a signed integer
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def _key_value(key):
    ordered = (key >> 32).to(tl.int32)
    return tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _key_index(key):
    return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _tile_scan(logits_ptr, stride_row, n_cols, tile_max_ptr, part_m_ptr, part_s_ptr, n_tiles, n_parts,
               TILE: tl.constexpr, TPP: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    tiles = part * TPP + tl.arange(0, TPP)
    cols = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]  # [TPP, TILE], one load
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < n_cols,
                other=float("-inf")).to(tl.float32)
    tile_max = tl.max(tl.where(x != x, float("-inf"), x), axis=1)  # [TPP]
    tl.store(tile_max_ptr + row * n_tiles + tiles, tile_max, mask=tiles < n_tiles)
    m = tl.max(tile_max, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m) * 1.4426950408889634  # exp(-inf - -inf) would be NaN
    # a NaN logit makes this partial, and so the row's lse, NaN
    s = tl.sum(tl.sum(tl.exp2(x * 1.4426950408889634 - m_ref), axis=1), axis=0)
    tl.store(part_m_ptr + row * n_parts + part, m)
    tl.store(part_s_ptr + row * n_parts + part, s)


@triton.jit
def _tile_select(logits_ptr, stride_row, n_cols, tile_max_ptr, part_m_ptr, part_s_ptr,
                 values_ptr, ids_ptr, lse_ptr, n_tiles, n_parts, k,
                 TILE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    NONE: tl.constexpr = -9223372036854775808  # below every key
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    p_offs = tl.arange(0, BLOCK_P)
    pm = tl.load(part_m_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=float("-inf"))
    ps = tl.load(part_s_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=0.0)
    gm = tl.max(pm, axis=0)
    total = tl.sum(ps * tl.exp(pm - tl.where(gm == float("-inf"), 0.0, gm)), axis=0)
    lse = tl.where((gm == float("-inf")) & (total == total), float("-inf"), gm + tl.log(total))
    tl.store(lse_ptr + row, lse)

    # the k tiles with the largest maxima
    k_offs = tl.arange(0, BLOCK_K)
    t_offs = tl.arange(0, BLOCK_T)
    tmax = tl.load(tile_max_ptr + row * n_tiles + t_offs, mask=t_offs < n_tiles, other=float("-inf"))
    keys = tl.where(t_offs < n_tiles, _order_key(tmax, t_offs), NONE)
    tiles = tl.zeros((BLOCK_K,), tl.int32)
    kt = tl.minimum(k, n_tiles)
    for r in range(kt):
        best = tl.max(keys, axis=0)
        keys = tl.where(keys == best, NONE, keys)
        tiles = tl.where(k_offs == r, _key_index(best), tiles)

    # order their columns
    cols = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]  # [BLOCK_K, TILE]
    valid = (k_offs[:, None] < kt) & (cols < n_cols)
    y = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
    ykeys = tl.where(valid, _order_key(tl.where(y != y, float("-inf"), y), cols), NONE)
    out_v = tl.full((BLOCK_K,), float("-inf"), tl.float32)
    out_i = tl.zeros((BLOCK_K,), tl.int64)
    for j in range(k):
        best = tl.max(tl.max(ykeys, axis=1), axis=0)
        ykeys = tl.where(ykeys == best, NONE, ykeys)
        out_v = tl.where(k_offs == j, _key_value(best), out_v)
        out_i = tl.where(k_offs == j, _key_index(best).to(tl.int64), out_i)
    tl.store(values_ptr + row * k + k_offs, out_v, mask=k_offs < k)
    tl.store(ids_ptr + row * k + k_offs, out_i, mask=k_offs < k)


def topk_lse_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """values [n, k] fp32 descending, ids [n, k] int64, lse [n] fp32, in one pass over [n, V] logits."""
    n, v = logits.shape
    if not 1 <= k <= 16 or k > v:
        raise ValueError(f"topk_lse_triton supports 1 <= k <= min(16, V), got k={k}, V={v}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    n_tiles = triton.cdiv(v, TILE)
    tpp = min(TILES_PER_PROGRAM, triton.next_power_of_2(n_tiles))
    n_parts = triton.cdiv(n_tiles, tpp)
    dev = logits.device
    tile_max = torch.empty((n, n_tiles), device=dev, dtype=torch.float32)
    part_m = torch.empty((n, n_parts), device=dev, dtype=torch.float32)
    part_s = torch.empty((n, n_parts), device=dev, dtype=torch.float32)
    values = torch.empty((n, k), device=dev, dtype=torch.float32)
    ids = torch.empty((n, k), device=dev, dtype=torch.int64)
    lse = torch.empty((n,), device=dev, dtype=torch.float32)
    if n == 0:
        return values, ids, lse
    _tile_scan[(n, n_parts)](logits, logits.stride(0), v, tile_max, part_m, part_s, n_tiles, n_parts,
                             TILE=TILE, TPP=tpp, num_warps=NUM_WARPS)
    _tile_select[(n,)](logits, logits.stride(0), v, tile_max, part_m, part_s, values, ids, lse, n_tiles, n_parts, k,
                       TILE=TILE, BLOCK_T=triton.next_power_of_2(n_tiles), BLOCK_P=triton.next_power_of_2(n_parts),
                       BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS)
    return values, ids, lse


# ---------------------------------------------------------------- lattice walks


@triton.jit
def _row_argmax(x, offs, K):
    x = tl.where((x != x) | (offs >= K), float("-inf"), x)
    best = tl.max(x, axis=0)
    return tl.min(tl.where((x == best) & (offs < K), offs, 1 << 30), axis=0)


@triton.jit
def _greedy_walk(start_ptr, pairs_ptr, ids_ptr, tokens_ptr, S, K,
                 s_start_b, s_pairs_b, s_pairs_s, s_pairs_i, s_pairs_j, s_ids_b, s_ids_s, s_ids_k, s_tok_b,
                 BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    row = tl.load(start_ptr + b * s_start_b + offs, mask=offs < K, other=float("-inf")).to(tl.float32)
    c = _row_argmax(row, offs, K)
    tl.store(tokens_ptr + b * s_tok_b, tl.load(ids_ptr + b * s_ids_b + c * s_ids_k))
    for s in range(1, S):
        ptr = pairs_ptr + b * s_pairs_b + (s - 1) * s_pairs_s + c * s_pairs_i + offs * s_pairs_j
        row = tl.load(ptr, mask=offs < K, other=float("-inf")).to(tl.float32)
        c = _row_argmax(row, offs, K)
        tl.store(tokens_ptr + b * s_tok_b + s, tl.load(ids_ptr + b * s_ids_b + s * s_ids_s + c * s_ids_k))


def greedy_walk_triton(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    b, k = start.shape
    s = ids.shape[1]
    tokens = torch.empty((b, s), device=start.device, dtype=ids.dtype)
    if b == 0 or s == 0:
        return tokens
    _greedy_walk[(b,)](start, pairs, ids, tokens, s, k, start.stride(0), *pairs.stride(), *ids.stride(),
                       tokens.stride(0), BLOCK_K=max(16, triton.next_power_of_2(k)), num_warps=1)
    return tokens


@triton.jit
def _sample_slot(row, offs, K, u, t, greedy):
    """One slot of the sampled walk: (pick, q) for a row of K scores."""
    valid = offs < K
    row = tl.where((row != row) | (~valid), float("-inf"), row)
    best = tl.max(row, axis=0)
    arg = tl.min(tl.where((row == best) & valid, offs, 1 << 30), axis=0)
    onehot = tl.where(offs == arg, 1.0, 0.0)
    scaled = row / t
    smax = tl.max(scaled, axis=0)
    e = tl.where(valid, tl.exp(scaled - tl.where(smax == float("-inf"), 0.0, smax)), 0.0)
    p = e / tl.sum(e, axis=0)
    cdf = tl.cumsum(p, axis=0)
    pick = tl.sum(tl.where(valid & (cdf <= u), 1, 0), axis=0)
    pick = tl.minimum(pick, K - 1)
    p_pick = tl.sum(tl.where(offs == pick, p, 0.0), axis=0)
    last_in_support = tl.max(tl.where(valid & (p > 0), offs, -1), axis=0)
    pick = tl.where(p_pick > 0, pick, last_in_support)
    no_support = (best == float("-inf")) | greedy
    pick = tl.where(no_support, arg, pick)
    q = tl.where(no_support, onehot, p)
    return pick, q


@triton.jit
def _sample_walk(start_ptr, pairs_ptr, ids_ptr, u_ptr, temp_ptr, greedy_ptr, tokens_ptr, q_ptr, S, K,
                 s_start_b, s_pairs_b, s_pairs_s, s_pairs_i, s_pairs_j, s_ids_b, s_ids_s, s_ids_k,
                 s_u_b, s_u_s, s_tok_b, s_q_b, s_q_s, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    t = tl.maximum(tl.load(temp_ptr + b).to(tl.float32), 1e-5)
    greedy = tl.load(greedy_ptr + b) != 0
    row = tl.load(start_ptr + b * s_start_b + offs, mask=offs < K, other=float("-inf")).to(tl.float32)
    c, q = _sample_slot(row, offs, K, tl.load(u_ptr + b * s_u_b).to(tl.float32), t, greedy)
    tl.store(q_ptr + b * s_q_b + offs, q, mask=offs < K)
    tl.store(tokens_ptr + b * s_tok_b, tl.load(ids_ptr + b * s_ids_b + c * s_ids_k))
    for s in range(1, S):
        ptr = pairs_ptr + b * s_pairs_b + (s - 1) * s_pairs_s + c * s_pairs_i + offs * s_pairs_j
        row = tl.load(ptr, mask=offs < K, other=float("-inf")).to(tl.float32)
        c, q = _sample_slot(row, offs, K, tl.load(u_ptr + b * s_u_b + s * s_u_s).to(tl.float32), t, greedy)
        tl.store(q_ptr + b * s_q_b + s * s_q_s + offs, q, mask=offs < K)
        tl.store(tokens_ptr + b * s_tok_b + s, tl.load(ids_ptr + b * s_ids_b + s * s_ids_s + c * s_ids_k))


def sample_walk_triton(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor,
                       temperatures: torch.Tensor, greedy_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, k = start.shape
    s = ids.shape[1]
    tokens = torch.empty((b, s), device=start.device, dtype=ids.dtype)
    q = torch.empty((b, s, k), device=start.device, dtype=torch.float32)
    if b == 0 or s == 0:
        return tokens, q
    greedy = greedy_mask.to(torch.int8)
    _sample_walk[(b,)](start, pairs, ids, uniforms, temperatures, greedy, tokens, q, s, k, start.stride(0),
                       *pairs.stride(), *ids.stride(), *uniforms.stride(), tokens.stride(0), q.stride(0), q.stride(1),
                       BLOCK_K=max(16, triton.next_power_of_2(k)), num_warps=1)
    return tokens, q


# ---------------------------------------------------------------- RMSNorm (Qwen3 semantics)


@triton.jit
def _rms_norm(x_ptr, w_ptr, y_ptr, n_cols, eps, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps))).to(y_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # Qwen3RMSNorm: normalise in fp32, cast back to the input dtype, then multiply by the weight
    tl.store(y_ptr + row * stride_y + offs, (w * y.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D], weight [D] -> [..., D] in torch.result_type(weight, x), one program per row."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, device=x.device, dtype=torch.result_type(weight, x))
    if rows.shape[0]:
        block = triton.next_power_of_2(d)
        _rms_norm[(rows.shape[0],)](rows, weight, out, d, eps, rows.stride(0), out.stride(0), BLOCK=block,
                                    num_warps=4 if block <= 1024 else 8)
    return out.view(x.shape)


# ---------------------------------------------------------------- lattice scores
#
# start[b, j] = s * <n(anchor[b]), n(in[b, 0, j])>, pairs[b, t, i, j] = s * <n(out[b, t, i]), n(in[b, t+1, j])>
# with n(v) = v / max(|v|, eps): normalisation, dot products and scale in one program per (row, slot).


@triton.jit
def _lattice_scores(out_ptr, in_ptr, anchor_ptr, start_ptr, pairs_ptr, S, K, F, eps, scale,
                    s_out_b, s_out_s, s_out_k, s_in_b, s_in_s, s_in_k, s_anchor_b,
                    BLOCK_K: tl.constexpr, BLOCK_F: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // S).to(tl.int64)
    s = pid % S  # 0: the anchor against slot 0; t >= 1: slot t-1 against slot t
    rows = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, BLOCK_F)
    row_ok = rows < K
    from_anchor = (rows * 0 + s) == 0  # [BLOCK_K], the same flag in every lane
    from_slot = (rows * 0 + s) > 0
    acc = tl.zeros((BLOCK_K, BLOCK_K), tl.float32)
    out_sq = tl.zeros((BLOCK_K,), tl.float32)
    in_sq = tl.zeros((BLOCK_K,), tl.float32)
    for f0 in range(0, F, BLOCK_F):
        f_ok = (f0 + cols) < F
        prev = tl.load(out_ptr + b * s_out_b + (s - 1) * s_out_s + rows[:, None] * s_out_k + (f0 + cols)[None, :],
                       mask=from_slot[:, None] & row_ok[:, None] & f_ok[None, :], other=0.0).to(tl.float32)
        anchor = tl.load(anchor_ptr + b * s_anchor_b + (f0 + cols)[None, :] + rows[:, None] * 0,
                         mask=from_anchor[:, None] & (rows[:, None] == 0) & f_ok[None, :], other=0.0).to(tl.float32)
        left = prev + anchor  # [BLOCK_K, BLOCK_F]
        right = tl.load(in_ptr + b * s_in_b + s * s_in_s + rows[:, None] * s_in_k + (f0 + cols)[None, :],
                        mask=row_ok[:, None] & f_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(left[:, None, :] * right[None, :, :], axis=2)
        out_sq += tl.sum(left * left, axis=1)
        in_sq += tl.sum(right * right, axis=1)
    scores = acc / (tl.maximum(tl.sqrt(out_sq), eps)[:, None] * tl.maximum(tl.sqrt(in_sq), eps)[None, :]) * scale
    ok = row_ok[:, None] & row_ok[None, :]
    pair_ptr = pairs_ptr + (b * (S - 1) + s - 1) * K * K + rows[:, None] * K + rows[None, :]
    tl.store(pair_ptr, scores, mask=ok & from_slot[:, None])
    start_ptr_row = start_ptr + b * K + rows[None, :] + rows[:, None] * 0
    tl.store(start_ptr_row, scores, mask=ok & from_anchor[:, None] & (rows[:, None] == 0))


def lattice_scores_triton(out_vectors: torch.Tensor, in_vectors: torch.Tensor, anchor_vector: torch.Tensor,
                          vector_eps: float, logit_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """out/in [b, S, K, F] and anchor [b, F] (unnormalised) -> start [b, K], pairs [b, S-1, K, K] fp32."""
    b, s, k, f = in_vectors.shape
    start = torch.empty((b, k), device=in_vectors.device, dtype=torch.float32)
    pairs = torch.empty((b, max(s - 1, 0), k, k), device=in_vectors.device, dtype=torch.float32)
    if b and s:
        out_vectors = out_vectors if out_vectors.stride(-1) == 1 else out_vectors.contiguous()
        in_vectors = in_vectors if in_vectors.stride(-1) == 1 else in_vectors.contiguous()
        anchor_vector = anchor_vector if anchor_vector.stride(-1) == 1 else anchor_vector.contiguous()
        _lattice_scores[(b * s,)](out_vectors, in_vectors, anchor_vector, start, pairs, s, k, f, vector_eps,
                                  logit_scale, out_vectors.stride(0), out_vectors.stride(1), out_vectors.stride(2),
                                  in_vectors.stride(0), in_vectors.stride(1), in_vectors.stride(2),
                                  anchor_vector.stride(0), BLOCK_K=triton.next_power_of_2(k),
                                  BLOCK_F=max(16, min(128, 4096 // triton.next_power_of_2(k) ** 2)), num_warps=4)
    return start, pairs


# ---------------------------------------------------------------- candidate features + LayerNorm(5)


@triton.jit
def _candidate_features(lp_ptr, w_ptr, b_ptr, out_ptr, K, eps, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one (batch, slot) row of K candidates
    offs = tl.arange(0, BLOCK_K)
    ok = offs < K
    lp = tl.load(lp_ptr + row * K + offs, mask=ok, other=0.0).to(tl.float32)
    top = tl.max(tl.where(ok, lp, float("-inf")), axis=0)
    rank = offs.to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # φ = [ℓ, e^ℓ, ℓ - max ℓ, k/(K-1) (0 when K = 1), 1{k = 0}], rounded to the model dtype as the reference
    f0 = lp.to(dtype).to(tl.float32)
    f1 = tl.exp(lp).to(dtype).to(tl.float32)
    f2 = (lp - top).to(dtype).to(tl.float32)
    f3 = (rank / tl.maximum(K - 1, 1).to(tl.float32)).to(dtype).to(tl.float32)
    f4 = tl.where(offs == 0, 1.0, 0.0)
    mean = (f0 + f1 + f2 + f3 + f4) / 5.0
    var = ((f0 - mean) * (f0 - mean) + (f1 - mean) * (f1 - mean) + (f2 - mean) * (f2 - mean)
           + (f3 - mean) * (f3 - mean) + (f4 - mean) * (f4 - mean)) / 5.0
    inv = 1.0 / tl.sqrt(var + eps)
    base = out_ptr + (row * K + offs) * 5
    tl.store(base + 0, ((f0 - mean) * inv * tl.load(w_ptr + 0).to(tl.float32) + tl.load(b_ptr + 0).to(tl.float32)).to(dtype), mask=ok)
    tl.store(base + 1, ((f1 - mean) * inv * tl.load(w_ptr + 1).to(tl.float32) + tl.load(b_ptr + 1).to(tl.float32)).to(dtype), mask=ok)
    tl.store(base + 2, ((f2 - mean) * inv * tl.load(w_ptr + 2).to(tl.float32) + tl.load(b_ptr + 2).to(tl.float32)).to(dtype), mask=ok)
    tl.store(base + 3, ((f3 - mean) * inv * tl.load(w_ptr + 3).to(tl.float32) + tl.load(b_ptr + 3).to(tl.float32)).to(dtype), mask=ok)
    tl.store(base + 4, ((f4 - mean) * inv * tl.load(w_ptr + 4).to(tl.float32) + tl.load(b_ptr + 4).to(tl.float32)).to(dtype), mask=ok)


def candidate_features_triton(log_probs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                              dtype: torch.dtype) -> torch.Tensor:
    """log_probs [..., K] -> LayerNorm(5)(φ) [..., K, 5] in `dtype`, one program per row of K candidates."""
    k = log_probs.shape[-1]
    rows = log_probs.reshape(-1, k).contiguous()
    out = torch.empty((*log_probs.shape, 5), device=log_probs.device, dtype=dtype)
    if rows.shape[0]:
        _candidate_features[(rows.shape[0],)](rows, weight, bias, out, k, eps,
                                              BLOCK_K=max(16, triton.next_power_of_2(k)), num_warps=1)
    return out
