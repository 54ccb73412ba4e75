"""The drafter as the serving stacks compute it: the DFlash backbone (a Qwen3-style block drafter that attends over
projected target features, the context, and a query block [anchor, mask x n], non-causally) and the optional
LiLiCorr head (one bidirectional pass over the candidate lattice, then fp32 start and pair scores), with the
RMSNorm both use (Qwen3RMSNorm semantics).

Parameter names are the checkpoint's (no `model.` prefix; the head's without `lilicorr.`), so a canonical tensor
dict loads with `load_state_dict(strict=True)`. In file order: RMSNorm, the head (`LiLiCorrHead`,
`head_from_geometry`), the backbone's layers and `Drafter`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import cast

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from lilicorr_ckpt.checkpoint.config import DraftConfig
from lilicorr_ckpt.checkpoint.geometry import Geometry

from .. import ops, rows
from ..arguments import known
from ..ops.core import (
    apply_rope,
    feature_hidden,
    lattice_attention,
    lattice_scores,
    residual_norm,
    rms_norm,
    rope_cos_sin,
    rope_inverse_frequencies,
    use_triton,
)

# -------------------- the RMSNorm module


class RMSNorm(nn.Module):
    """Qwen3RMSNorm semantics (as training and TRT compute it): fp32 reduction, cast back, then x weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


# -------------------- the LiLiCorr head


NUM_FEATURES = 5
FEATURE_NORM_EPS = 1e-5  # nn.LayerNorm's default, as the training module builds it


_SIDE_STREAMS: dict[torch.device, list] = {}


def _fork(device: torch.device, count: int) -> list:
    """`count` side streams that have waited for the current stream on a CUDA device, else Nones."""
    if device.type != "cuda" or torch.is_grad_enabled():  # training: one stream, autograd's simplest case
        return [None] * count
    device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    streams = _SIDE_STREAMS.get(device)
    if streams is None or len(streams) < count:
        streams = _SIDE_STREAMS[device] = [torch.cuda.Stream(device) for _ in range(count)]
    main = torch.cuda.current_stream(device)
    for stream in streams[:count]:
        stream.wait_stream(main)
    return streams[:count]


def _on(stream) -> contextlib.AbstractContextManager:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _mark(stream):
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event, stream.device


def _wait(mark, *produced: torch.Tensor) -> None:
    """Make the current stream of the mark's device wait for it; `produced` (tensors the side stream
    allocated) are then in use on that stream too."""
    if mark is not None:
        event, device = mark
        main = torch.cuda.current_stream(device)
        main.wait_event(event)
        _in_use_on(main, produced)


def _join(stream, *produced: torch.Tensor) -> None:
    """Make the current stream wait for a side stream (every branch joins before forward returns)."""
    if stream is not None:
        main = torch.cuda.current_stream(stream.device)
        main.wait_stream(stream)
        _in_use_on(main, produced)


def _in_use_on(stream, tensors) -> None:
    # Tell the caching allocator that tensors allocated on a side stream are read on `stream`, so their
    # memory is not handed out again before that stream is done with it. (Inside a graph capture, memory
    # comes from the graph's private pool and this bookkeeping does not apply.)
    if not torch.cuda.is_current_stream_capturing():
        for t in tensors:
            t.record_stream(stream)


class SiluMLP(nn.Module):
    """down(SiLU(up(x))), both Linears with bias: the feature MLP (5 -> h -> h) and the lattice MLP (h -> R -> h)."""

    def __init__(self, in_features: int, width: int, out_features: int):
        super().__init__()
        self.up_proj = nn.Linear(in_features, width)
        self.down_proj = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(x)))


class LatticeAttention(nn.Module):
    """nn.MultiheadAttention's parameter layout (q, k, v stacked in in_proj), with an additive bias."""

    def __init__(self, hidden: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * hidden, hidden))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * hidden))
        self.out_proj = nn.Linear(hidden, hidden)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def mixed(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The heads' outputs before out_proj: x [b, n, h], bias [N, n, n] -> [b, n, h]."""
        return lattice_attention(F.linear(x, self.in_proj_weight, self.in_proj_bias), bias, self.num_heads)


class LatticeLayer(nn.Module):
    """x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)). The forward takes attn_norm(x) ready-made and
    returns the next norm of its output, so each residual add runs fused with the norm that follows it."""

    def __init__(self, hidden: int, num_heads: int, mlp_width: int, eps: float):
        super().__init__()
        self.attn_norm = RMSNorm(hidden, eps)
        self.attn = LatticeAttention(hidden, num_heads)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.mlp = SiluMLP(hidden, mlp_width, hidden)

    def forward(
        self,
        x: torch.Tensor,
        x_normed: torch.Tensor,
        bias: torch.Tensor,
        next_norm: RMSNorm,
        anchor: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [b, n, h] and attn_norm(x) -> (the layer's output x', next_norm(x')), or with anchor [b, h]
        the factor input [x'', a, x'' ⊙ a] (x'' = next_norm(x')) in place of next_norm(x')."""
        out_proj, down = self.attn.out_proj, self.mlp.down_proj
        x, y = residual_norm(
            x,
            F.linear(self.attn.mixed(x_normed, bias), out_proj.weight),
            out_proj.bias,
            self.mlp_norm.weight,
            self.mlp_norm.eps,
        )
        hidden = F.silu(self.mlp.up_proj(y))
        return residual_norm(
            x, F.linear(hidden, down.weight), down.bias, next_norm.weight, next_norm.eps, anchor
        )


class LiLiCorrHead(nn.Module):
    def __init__(
        self,
        *,
        model_hidden_size: int,
        block_size: int,
        rms_norm_eps: float,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        mlp_ratio: float,
        candidate_topk: int,
        factor_dim: int,
        vector_eps: float,
        logit_scale: float,
    ):
        super().__init__()
        M, h, K, B = model_hidden_size, hidden_size, candidate_topk, block_size
        if B < 2 or K < 1 or h % num_heads:
            raise ValueError(
                f"invalid LiLiCorr geometry: block_size {B} (needs >= 2), candidate_topk {K} "
                f"(needs >= 1), hidden_size {h} must be divisible by num_heads {num_heads}"
            )
        self.block_size, self.candidate_topk = B, K
        self.vector_eps, self.logit_scale = vector_eps, logit_scale
        # the identity when the head is as wide as the draft: then the checkpoint has no token_proj tensors
        self.token_proj = nn.Linear(M, h) if h != M else nn.Identity()
        self.pass_hidden_proj = nn.Linear(M, h)
        self.feature_norm = nn.LayerNorm(NUM_FEATURES, eps=FEATURE_NORM_EPS)
        self.feature_mlp = SiluMLP(NUM_FEATURES, h, h)
        self.slot_embedding = nn.Parameter(torch.randn(1, 1, B - 1, 1, h) * 0.02)
        self.rank_embedding = nn.Parameter(torch.randn(1, 1, 1, K, h) * 0.02)
        self.relative_slot_bias = nn.Parameter(torch.zeros(num_heads, 2 * B - 1))
        self.same_slot_bias = nn.Parameter(torch.zeros(num_heads))
        self.context_proj = nn.Linear(M, h)
        self.layers = nn.ModuleList(
            LatticeLayer(h, num_heads, int(h * mlp_ratio), rms_norm_eps) for _ in range(num_layers)
        )
        self.output_norm = RMSNorm(h, rms_norm_eps)
        self.anchor_norm = RMSNorm(h, rms_norm_eps)
        self.factor_input_proj = nn.Linear(3 * h, h)
        self.out_head = nn.Linear(h, factor_dim)
        self.in_head = nn.Linear(h, factor_dim)
        self.anchor_out_head = nn.Linear(h, factor_dim)
        self._derived_cache: dict[tuple, tuple[tuple | None, torch.Tensor]] = {}
        self.register_load_state_dict_post_hook(lambda module, incompatible: module.invalidate_derived())

    def _derived(
        self, name: str, args: tuple, params: tuple[torch.Tensor, ...], build: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """A tensor derived from parameters only (constant per geometry), cached: rebuilding it every block
        would cost kernels. It is rebuilt when a parameter changes through torch (in-place ops bump its
        version; load_state_dict invalidates; .to() and friends clear). Writes through `.data` are invisible
        to both: call `invalidate_derived()` after them. A rebuild writes into the cached tensor when shape,
        dtype and device still match, so a captured CUDA graph keeps reading valid memory (it sees the new
        values once one forward has run outside the graph). While autograd records and a parameter requires
        grad, the tensor is built fresh, so gradients reach the parameters."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return build()
        stamp = tuple((p.data_ptr(), p.device, p.dtype, p._version) for p in params)
        key = (name, *args)
        hit = self._derived_cache.get(key)
        if hit is None or hit[0] != stamp:
            value = build().detach()
            if hit is not None and (hit[1].shape, hit[1].dtype, hit[1].device) == (
                value.shape,
                value.dtype,
                value.device,
            ):
                value = hit[1].copy_(value)
            self._derived_cache[key] = hit = (stamp, value)
        return hit[1]

    def invalidate_derived(self) -> None:
        """Rebuild every cached parameter-derived tensor on the next forward (in place; see `_derived`)."""
        for key, (_, value) in self._derived_cache.items():
            self._derived_cache[key] = (None, value)

    def _apply(self, fn, *args, **kwargs):  # .to(), .cuda(), .half(), ...: the cached tensors would be stale
        self._derived_cache.clear()
        return super()._apply(fn, *args, **kwargs)

    def attention_bias(self, slots: int, topk: int) -> torch.Tensor:
        """[N, S·K, S·K]: relative_slot_bias by signed slot distance (trained offset B-1) + same_slot_bias."""
        slot = torch.arange(slots, device=self.same_slot_bias.device).repeat_interleave(topk)  # slot-major
        distance = (slot[:, None] - slot[None, :]).clamp(-(self.block_size - 1), self.block_size - 1)
        bias = self.relative_slot_bias[:, distance + self.block_size - 1]  # [N, SK, SK]
        same = (distance == 0).to(bias.dtype)
        return bias + self.same_slot_bias[:, None, None] * same

    def forward(
        self,
        candidate_embeddings: torch.Tensor,
        candidate_log_probs: torch.Tensor,
        pass_hidden: torch.Tensor,
        anchor_hidden: torch.Tensor,
        anchor_valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """candidate_embeddings [b, S, K, M], candidate_log_probs [b, S, K], pass_hidden [b, S, M],
        anchor_hidden [b, M], anchor_valid [b] (None: all valid) -> start [b, K], pairs [b, S-1, K, K] fp32.
        S may be shorter than the trained B-1 (a shorter draft uses the first S slot embeddings)."""
        m = self.pass_hidden_proj.weight.shape[1]
        if candidate_embeddings.dim() != 4:
            raise ValueError(
                f"candidate_embeddings must be [b, S, K, M = {m}], got {list(candidate_embeddings.shape)}"
            )
        b, slots, k, _ = candidate_embeddings.shape
        if not 1 <= slots <= self.block_size - 1 or k != self.candidate_topk:
            raise ValueError(
                f"lattice [{slots} slots x {k} candidates] does not fit the head "
                f"(at least 1 and at most {self.block_size - 1} slots, exactly {self.candidate_topk} "
                "candidates)"
            )
        if (
            candidate_embeddings.shape[3] != m
            or candidate_log_probs.shape != (b, slots, k)
            or pass_hidden.shape != (b, slots, m)
            or anchor_hidden.shape != (b, m)
            or (anchor_valid is not None and anchor_valid.shape != (b,))
        ):
            got = ", ".join(
                f"{name} {list(t.shape)}"
                for name, t in (
                    ("candidate_embeddings", candidate_embeddings),
                    ("candidate_log_probs", candidate_log_probs),
                    ("pass_hidden", pass_hidden),
                    ("anchor_hidden", anchor_hidden),
                    ("anchor_valid", anchor_valid),
                )
                if t is not None
            )
            raise ValueError(
                f"the head expects candidate_embeddings [b, S, K, M], candidate_log_probs [b, S, K], "
                f"pass_hidden [b, S, M], anchor_hidden [b, M], anchor_valid [b] or None (M = {m}); "
                f"got {got}"
            )
        dtype = self.pass_hidden_proj.weight.dtype
        rows, h = b * slots * k, self.pass_hidden_proj.weight.shape[0]
        # token_proj: a Linear, or None for the identity (a head as wide as the draft)
        token = self.token_proj if isinstance(self.token_proj, nn.Linear) else None
        passing, down = self.pass_hidden_proj, self.feature_mlp.down_proj
        # Two branches that only meet later run on side streams on CUDA (parallel branches of a captured
        # graph; in order on the CPU): the anchor path, and the per-slot and feature terms of the node inputs.
        anchor_branch, input_branch = _fork(candidate_embeddings.device, 2)

        with _on(anchor_branch):
            anchor = self.context_proj(anchor_hidden.to(dtype))  # [b, h]
            if anchor_valid is not None:
                # branch-free: an invalid anchor becomes exactly zero, and RMSNorm keeps it zero
                anchor = anchor * anchor_valid.to(dtype)[:, None]
            a = self.anchor_norm(anchor)
            anchor_vector = self.anchor_out_head(a)

        # node inputs: token_proj(E) + pass_hidden_proj(P) + feature_mlp(φ) + slot and rank embeddings, with
        # the three biases and the embeddings folded into one cached constant
        with _on(input_branch):
            up = self.feature_mlp.up_proj
            features = feature_hidden(
                candidate_log_probs,
                self.feature_norm.weight,
                self.feature_norm.bias,
                self.feature_norm.eps,
                up.weight,
                up.bias,
            )  # [b, S, K, h]
            features_ready = _mark(input_branch)
            constant = self._derived(
                "inputs",
                (slots,),
                (self.slot_embedding, self.rank_embedding, passing.bias, down.bias)
                + ((token.bias,) if token is not None else ()),
                lambda: (
                    self.slot_embedding[0, 0, :slots]
                    + self.rank_embedding[0, 0, 0]
                    + passing.bias
                    + down.bias
                    + (token.bias if token is not None else 0)
                ),
            )  # [S, K, h]
            x = F.linear(pass_hidden.to(dtype), passing.weight)[:, :, None] + constant  # [b, S, K, h]
        embeddings = candidate_embeddings.to(dtype).reshape(rows, -1)
        terms = F.linear(embeddings, token.weight) if token is not None else embeddings.clone()
        _wait(features_ready, features)
        # training, or autocast (the held-out tau's no-grad pass): there the in-place GEMM would mix dtypes
        if torch.is_grad_enabled() or terms.dtype != down.weight.dtype:
            terms = terms + F.linear(features.view(rows, h), down.weight)
        else:
            terms.addmm_(
                features.view(rows, h), down.weight.t()
            )  # a GEMM accumulating in place: no add kernel
        _join(input_branch, x)
        x = x.view(b, slots * k, h)
        terms = terms.view(b, slots * k, h)

        bias = self._derived(
            "bias",
            (slots, k),
            (self.relative_slot_bias, self.same_slot_bias),
            lambda: self.attention_bias(slots, k),
        )
        layers = cast("list[LatticeLayer]", list(self.layers))
        first_norm = layers[0].attn_norm if layers else self.output_norm
        if not layers:
            _join(anchor_branch, a, anchor_vector)
        x, x_normed = residual_norm(x, terms, None, first_norm.weight, first_norm.eps, None if layers else a)
        for i, layer in enumerate(layers):
            last = i + 1 == len(layers)
            if last:
                _join(anchor_branch, a, anchor_vector)
            x, x_normed = layer(
                x, x_normed, bias, self.output_norm if last else layers[i + 1].attn_norm, a if last else None
            )
        f = F.silu(
            self.factor_input_proj(x_normed)
        )  # [b, S·K, h]: SiLU(W [c, a, c ⊙ a] + b), x_normed the factor input

        # out_head and in_head read the same f: one GEMM over their stacked weights
        fd = self.out_head.weight.shape[0]
        pair = (self.out_head.weight, self.out_head.bias, self.in_head.weight, self.in_head.bias)
        weight = self._derived("vector_weight", (), pair, lambda: torch.cat([pair[0], pair[2]]))
        vector_bias = self._derived("vector_bias", (), pair, lambda: torch.cat([pair[1], pair[3]]))
        vectors = F.linear(f, weight, vector_bias).view(b, slots, k, 2 * fd)
        # unit out/in/anchor vectors and their scaled dot products, fp32: start [b, K], pairs [b, S-1, K, K]
        return lattice_scores(
            vectors[..., :fd], vectors[..., fd:], anchor_vector, self.vector_eps, self.logit_scale
        )


def head_from_geometry(g: Geometry) -> LiLiCorrHead:
    assert g.head_complete() and g.head_vector_eps is not None and g.head_logit_scale is not None
    return LiLiCorrHead(
        model_hidden_size=known(g.hidden_size, "hidden_size"),
        block_size=known(g.block_size, "block_size"),
        rms_norm_eps=g.rms_norm_eps,
        hidden_size=known(g.head_hidden_size, "head hidden_size"),
        num_layers=known(g.head_num_layers, "head num_layers"),
        num_heads=known(g.head_num_heads, "head num_heads"),
        mlp_ratio=known(g.head_mlp_ratio, "head mlp_ratio"),
        candidate_topk=known(g.candidate_topk, "candidate_topk"),
        factor_dim=known(g.head_factor_dim, "head factor_dim"),
        vector_eps=g.head_vector_eps,
        logit_scale=g.head_logit_scale,
    )


# -------------------- the DFlash backbone and the drafter


DEFAULT_MAX_POSITIONS = 32768
# a static draft step, or context append, of at most this many rows (batch x block) runs the backbone through the
# step kernels on CUDA (ops.decoder_layer: five kernels a layer instead of ~40); past it the eager ops, whose
# cuBLAS and SDPA tiles are faster for many rows
KERNEL_ROWS = rows.DRAFT_KERNEL


class BackboneSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the backbone needs beyond the manifest geometry, read from config.json."""

    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    windows: tuple[int | None, ...]  # per draft layer: sliding window w, or None for full attention


def backbone_spec(config: DraftConfig, num_layers: int) -> BackboneSpec:
    layer_types = config.layer_types or ["full_attention"] * num_layers
    d = config.dflash
    window = config.sliding_window or (d.swa_window_size if d.use_swa else None)
    windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    return BackboneSpec(
        rope_theta=float(config.rope_theta or 10000.0),
        rope_scaling=config.rope_scaling,
        max_position_embeddings=config.max_position_embeddings or DEFAULT_MAX_POSITIONS,
        windows=windows,
    )


class DraftKVCache:
    """Per-layer K/V of the projected context rows, [b, kv_heads, capacity, head_dim], grown by doubling.

    Context row r sits at absolute position r, so the cache length is also the next block's start.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        capacity: int = 256,
    ):
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0

    @classmethod
    def over(cls, keys: list[torch.Tensor], values: list[torch.Tensor]) -> DraftKVCache:
        """A cache over existing per-layer tensors (e.g. one slot's rows of a batch cache), allocating nothing."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.length = list(keys), list(values), 0
        return cache

    def _reserve(self, extra: int) -> None:
        capacity = self.keys[0].shape[2]
        if self.length + extra <= capacity:
            return
        while capacity < self.length + extra:
            capacity *= 2
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                store[i] = new

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        # keys/values [b, kv_heads, n, hd] at positions length..length+n-1; commit() advances length
        n = keys.shape[2]
        self._reserve(n)
        self.keys[layer][:, :, self.length : self.length + n] = keys
        self.values[layer][:, :, self.length : self.length + n] = values

    def commit(self, n: int) -> None:
        self.length += n

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[i][:, :, : self.length], self.values[i][:, :, : self.length]


class Attention(nn.Module):
    def __init__(self, g: Geometry, window: int | None):
        super().__init__()
        M, hd = known(g.hidden_size, "hidden_size"), known(g.head_dim, "head_dim")
        self.num_heads, self.num_kv_heads = (
            known(g.num_heads, "num_heads"),
            known(g.num_kv_heads, "num_kv_heads"),
        )
        self.head_dim = hd
        self.window = window
        self.q_proj = nn.Linear(M, self.num_heads * hd, bias=g.attention_bias)
        self.k_proj = nn.Linear(M, self.num_kv_heads * hd, bias=g.attention_bias)
        self.v_proj = nn.Linear(M, self.num_kv_heads * hd, bias=g.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, M, bias=g.attention_bias)
        self.q_norm = RMSNorm(hd, g.rms_norm_eps)
        self.k_norm = RMSNorm(hd, g.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)  # [b, heads, n, hd]

    def context_kv(
        self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Context rows [b, n, M] -> K, V [b, kv_heads, n, hd]: k_norm and RoPE, no input_layernorm."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(ctx), self.num_kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(ctx), self.num_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        # x [b, Q, M] (normed block rows); keys/values span [context ; block]; no causal mask
        b, n, _ = x.shape
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        k = torch.cat([ctx_k, k], dim=2)  # [b, kv_heads, C+Q, hd]
        v = torch.cat([ctx_v, v], dim=2)
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [b, heads, Q, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GroupedDynamicConv(nn.Module):
    """Block-local causal convolution with per-row kernels, wrapped around one sublayer.

    Row t's kernels are base_kernel + δ(t), δ = kernel_projection(normed sublayer input at t), one
    coefficient per group of G consecutive channels. Side 0 convolves the sublayer's input, side 1
    its output: y_t = Σ_i k_{t,i} ⊙ x_{t-i}, with rows before the block start contributing 0.
    """

    def __init__(self, hidden: int, taps: int, group: int):
        super().__init__()
        self.taps, self.group = taps, group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * (hidden // group), bias=False)
        with torch.no_grad():
            self.base_kernel[:, 0] = 1.0  # identity at tap 0, as training initialises it

    def kernels(self, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """normed [b, Q, M] -> (input kernel, output kernel), each [b, Q, taps, M]."""
        b, n, m = normed.shape
        delta = self.kernel_projection(normed).view(b, n, 2, self.taps, m // self.group)
        delta = delta.repeat_interleave(self.group, dim=-1)  # channel c uses group c // G
        kernel = self.base_kernel[None, None] + delta  # [b, Q, 2, taps, M]
        return kernel[:, :, 0], kernel[:, :, 1]

    @staticmethod
    def convolve(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        # x [b, Q, M], kernel [b, Q, taps, M] -> y [b, Q, M]
        taps = kernel.shape[2]
        padded = F.pad(x, (0, 0, taps - 1, 0))  # zeros stand for rows before the block start
        n = x.shape[1]
        y = torch.zeros_like(x)
        for i in range(taps):
            y = y + kernel[:, :, i] * padded[:, taps - 1 - i : taps - 1 - i + n]  # x_{t-i}
        return y


class DraftLayer(nn.Module):
    def __init__(self, g: Geometry, window: int | None):
        super().__init__()
        M = known(g.hidden_size, "hidden_size")
        self.input_layernorm = RMSNorm(M, g.rms_norm_eps)
        self.self_attn = Attention(g, window)
        self.post_attention_layernorm = RMSNorm(M, g.rms_norm_eps)
        self.mlp = MLP(M, known(g.intermediate_size, "intermediate_size"))
        conv = g.has_conv
        self.attention_conv = GroupedDynamicConv(M, g.conv_kernel_size, g.conv_group_size) if conv else None
        self.mlp_conv = GroupedDynamicConv(M, g.conv_kernel_size, g.conv_group_size) if conv else None

    @staticmethod
    def _sublayer(
        x: torch.Tensor,
        normed: torch.Tensor,
        conv: GroupedDynamicConv | None,
        body: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        if conv is None:
            return x + body(normed)
        k_in, k_out = conv.kernels(normed)
        return x + conv.convolve(body(conv.convolve(normed, k_in)), k_out)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = self._sublayer(
            x,
            self.input_layernorm(x),
            self.attention_conv,
            lambda h: self.self_attn(h, cos, sin, ctx_k, ctx_v, mask),
        )
        return self._sublayer(x, self.post_attention_layernorm(x), self.mlp_conv, self.mlp)


class Drafter(nn.Module):
    """DFlash backbone + optional LiLiCorr head (`lilicorr`) + optional owned `lm_head`."""

    def __init__(self, geometry: Geometry, spec: BackboneSpec):
        super().__init__()
        g = geometry
        assert g.hidden_size and g.num_layers and g.target_layer_ids and g.block_size
        assert g.mask_token_id is not None
        self.geometry, self.spec = g, spec
        # read every block: resolved once (the geometry is immutable)
        self.block_size: int = g.block_size
        self.mask_token_id: int = g.mask_token_id
        self.target_layer_ids: tuple[int, ...] = tuple(g.target_layer_ids)
        M = g.hidden_size
        self.fc = nn.Linear(len(g.target_layer_ids) * M, M, bias=False)
        self.hidden_norm = RMSNorm(M, g.rms_norm_eps)
        self.layers = nn.ModuleList(
            DraftLayer(g, spec.windows[i] if i < len(spec.windows) else None) for i in range(g.num_layers)
        )
        self.norm = RMSNorm(M, g.rms_norm_eps)
        self.lilicorr: LiLiCorrHead | None = head_from_geometry(g) if g.lilicorr_enabled else None
        self.lm_head: nn.Linear | None = (
            nn.Linear(M, known(g.vocab_size, "vocab_size"), bias=False) if g.has_own_lm_head else None
        )
        inv_freq, self.rope_scale = rope_inverse_frequencies(
            known(g.head_dim, "head_dim"), spec.rope_theta, spec.rope_scaling, spec.max_position_embeddings
        )
        self._inv_freq_fp32 = inv_freq
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)
        self._step_weights: tuple[tuple, list[dict[str, torch.Tensor | None]]] | None = None
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def place(self, dtype: torch.dtype, device: torch.device | str) -> Drafter:
        """Move to `device` and cast the weights to `dtype`; rotary frequencies stay fp32."""
        self.to(device=device, dtype=dtype)
        self.inv_freq = self._inv_freq_fp32.to(device)
        return self

    @property
    def draft_layers(self) -> list[DraftLayer]:
        """`layers`, typed (an nn.ModuleList yields plain Modules to a type checker)."""
        return cast("list[DraftLayer]", list(self.layers))

    def new_cache(self, batch: int = 1, capacity: int = 256) -> DraftKVCache:
        g, w = self.geometry, self.fc.weight
        return DraftKVCache(
            known(g.num_layers, "num_layers"),
            batch,
            known(g.num_kv_heads, "num_kv_heads"),
            known(g.head_dim, "head_dim"),
            w.dtype,
            w.device,
            capacity,
        )

    def project_context(self, target_features: torch.Tensor) -> torch.Tensor:
        """[b, n, T·M] target hidden states (concatenated in target_layer_ids order) -> context [b, n, M]."""
        width = self.fc.weight.shape[1]
        if target_features.dim() != 3 or target_features.shape[2] != width:
            raise ValueError(
                f"project_context expects target features [b, n, {width}] (the hidden states of the "
                f"{len(self.target_layer_ids)} target layers {list(self.target_layer_ids)}, concatenated); "
                f"got {list(target_features.shape)}"
            )
        return self.hidden_norm(self.fc(target_features.to(self.fc.weight.dtype)))

    def _check_block(self, cache: DraftKVCache, block_embeddings: torch.Tensor) -> None:
        """A query block is [b, Q, M] with 1 <= Q <= block_size and the cache's batch (shapes only: no sync)."""
        m, b = self.fc.weight.shape[0], cache.keys[0].shape[0]
        if (
            block_embeddings.dim() != 3
            or block_embeddings.shape[0] != b
            or block_embeddings.shape[2] != m
            or not 1 <= block_embeddings.shape[1] <= self.block_size
        ):
            raise ValueError(
                f"the drafter expects block embeddings [{b}, Q, {m}] with 1 <= Q <= block_size "
                f"{self.block_size} (the cache holds {b} rows); got {list(block_embeddings.shape)}"
            )

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq, self.rope_scale, self.fc.weight.dtype)

    def _context_kv(
        self, context: torch.Tensor, positions: torch.Tensor
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Context rows [b, n, M] at rotary positions [n] or [b, n] -> per draft layer, K, V [b, kv_heads, n, hd]."""
        cos, sin = self._rope(positions)
        for layer in self.draft_layers:
            yield layer.self_attn.context_kv(context, cos, sin)

    def _backbone(
        self,
        block_embeddings: torch.Tensor,
        positions: torch.Tensor,
        context_kv: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        mask: Callable[[int | None], torch.Tensor | None],
    ) -> torch.Tensor:
        """The drafter's one forward, which decoding (eager and captured) and training all run: query rows
        block_embeddings [b, Q, M] at rotary positions [Q] or [b, Q], each layer attending over its context K/V
        (`context_kv(layer index)`, [b, kv_heads, C, hd]) and the query rows, under `mask(the layer's window)`
        ([.., Q, C+Q] bool, True = visible, or None: all) -> final-normed hidden [b, Q, M]."""
        cos, sin = self._rope(positions)
        x = block_embeddings.to(self.fc.weight.dtype)
        for i, layer in enumerate(self.draft_layers):
            ctx_k, ctx_v = context_kv(i)
            x = layer(x, cos, sin, ctx_k, ctx_v, mask(layer.self_attn.window))
        return self.norm(x)

    def append_context(self, cache: DraftKVCache, context: torch.Tensor) -> None:
        """Write K/V of new context rows [b, n, M] at the positions after the cached ones."""
        n = context.shape[1]
        positions = torch.arange(cache.length, cache.length + n, device=context.device)
        for i, (k, v) in enumerate(self._context_kv(context, positions)):
            cache.write(i, k, v)
        cache.commit(n)

    def forward(self, cache: DraftKVCache, block_embeddings: torch.Tensor) -> torch.Tensor:
        """block_embeddings [b, Q, M] of [anchor, mask x (Q-1)] at positions cache.length.. -> final-normed
        hidden [b, Q, M]."""
        self._check_block(cache, block_embeddings)
        q_len = block_embeddings.shape[1]
        start = cache.length
        device = block_embeddings.device
        q_pos = torch.arange(start, start + q_len, device=device)
        k_pos = torch.arange(start + q_len, device=device)

        def window_mask(window: int | None) -> torch.Tensor | None:
            # symmetric window (w-1 each side) around the query, non-causal inside it (TRT's reading)
            return None if window is None else (q_pos[:, None] - k_pos[None, :]).abs() <= window - 1

        return self._backbone(block_embeddings, q_pos, cache.layer, window_mask)

    # the step-kernel path of the static forward and append ------------------------------------------------

    def kernel_path(self, rows: int, *tensors: torch.Tensor) -> bool:
        """Whether a static step of `rows` rows runs through the step kernels: on CUDA without autograd, at
        most KERNEL_ROWS rows, every layer full-attention without convolution (what ops.decoder_layer
        computes)."""
        return (
            rows <= KERNEL_ROWS
            and use_triton(self.fc.weight, *tensors)
            and all(
                layer.attention_conv is None and layer.mlp_conv is None and layer.self_attn.window is None
                for layer in self.draft_layers
            )
        )

    def step_weights(self) -> list[dict[str, torch.Tensor | None]]:
        """Per layer, the weights as ops.decoder_layer takes them: q/k/v and gate/up stacked into one matrix
        each (copies, so the parameters keep their own storage and still save as they load). Rebuilt when a
        parameter is replaced or changed in place."""
        params = [p for layer in self.draft_layers for p in layer.parameters()]
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._step_weights is None or self._step_weights[0] != key:
            built = []
            for layer in self.draft_layers:
                attn, mlp = layer.self_attn, layer.mlp
                projections = (attn.q_proj, attn.k_proj, attn.v_proj)
                biased = all(p.bias is not None for p in projections)
                qkv = torch.cat([p.weight.detach() for p in projections])
                qkv_bias = torch.cat([p.bias.detach() for p in projections]) if biased else None
                q_rows = attn.q_proj.weight.shape[0]
                built.append(
                    {
                        "input_norm": layer.input_layernorm.weight.detach(),
                        "qkv": qkv,
                        "qkv_bias": qkv_bias,
                        "kv": qkv[q_rows:],  # the k and v rows, for the context append (a view)
                        "kv_bias": None if qkv_bias is None else qkv_bias[q_rows:],
                        "q_norm": attn.q_norm.weight.detach(),
                        "k_norm": attn.k_norm.weight.detach(),
                        "o": attn.o_proj.weight.detach(),
                        "o_bias": None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
                        "post_norm": layer.post_attention_layernorm.weight.detach(),
                        "gate_up": torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()]),
                        "down": mlp.down_proj.weight.detach(),
                    }
                )
            self._step_weights = (key, built)
        return self._step_weights[1]

    def rope_tables(self, capacity: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos/sin [capacity + block_size, hd/2] for a cache of `capacity` rows (ops.rope_tables; a block's
        position past the cache's last row stays in the table), kept: graphs captured over them read them by
        address."""
        key = (capacity, str(device))
        if key not in self._tables:
            positions = capacity + self.block_size
            self._tables[key] = ops.rope_tables(self.inv_freq.to(device), self.rope_scale, positions)
        return self._tables[key]

    def _static_kernels(
        self, cache: DraftKVCache, length: torch.Tensor, block_embeddings: torch.Tensor
    ) -> torch.Tensor:
        """forward_static through the step kernels: the block's K/V are written into the cache at rows
        length..length+Q-1 (past the context, where the next append writes anyway) and every query row
        attends to cache rows 0..length+Q-1: the context and the whole block, as the eager forward's
        [context ; block] keys. The same layer math as `_backbone` (the rotation in the weights' dtype), in
        five kernels a layer."""
        b, q_len, m = block_embeddings.shape
        device = block_embeddings.device
        capacity = cache.keys[0].shape[2]
        rows = length[:, None] + torch.arange(q_len, device=device)  # [b, Q]
        last = (length + q_len - 1).clamp(max=capacity - 1)[:, None].expand(b, q_len)
        first = torch.zeros(b, dtype=torch.long, device=device)
        cos, sin = self.rope_tables(capacity, device)
        g = self.geometry
        flat = block_embeddings.to(self.fc.weight.dtype).reshape(b * q_len, m)
        for weights, keys, values in zip(self.step_weights(), cache.keys, cache.values, strict=True):
            flat = ops.decoder_layer(
                flat,
                weights,
                keys,
                values,
                rows=rows,
                positions=rows,
                last=last,
                first=first,
                cos=cos,
                sin=sin,
                num_heads=known(g.num_heads, "num_heads"),
                num_kv_heads=known(g.num_kv_heads, "num_kv_heads"),
                eps=g.rms_norm_eps,
                rotate_in_dtype=True,
            )
        return self.norm(flat).view(b, q_len, m)

    def _append_kernels(self, cache: DraftKVCache, context: torch.Tensor, positions: torch.Tensor) -> None:
        """append_context_static through the step kernels, two a layer: k and v in one GEMM (no input norm: the
        context is already normed by project_context), then k_norm, the rotation in the weights' dtype and the
        write of k and v at `positions` [b, q]."""
        b, q = positions.shape
        cos, sin = self.rope_tables(cache.keys[0].shape[2], context.device)
        g = self.geometry
        flat = context.to(self.fc.weight.dtype).reshape(b * q, -1)
        for weights, keys, values in zip(self.step_weights(), cache.keys, cache.values, strict=True):
            kv = ops.step_linear(flat, cast(torch.Tensor, weights["kv"]), bias=weights["kv_bias"])
            ops.rope_kv(  # no q heads
                kv.view(b, q, -1),
                keys,
                values,
                positions,
                positions,
                cos,
                sin,
                0,
                known(g.num_kv_heads, "num_kv_heads"),
                None,
                weights["k_norm"],
                g.rms_norm_eps,
                True,
            )

    def forward_static(
        self, cache: DraftKVCache, length: torch.Tensor, block_embeddings: torch.Tensor
    ) -> torch.Tensor:
        """`forward` with shapes that do not depend on the context length, for CUDA-graph capture.

        Attends over the cache's whole capacity and masks rows >= `length` (an int64 device scalar, or [b]: one
        context length per row), so the same captured graph serves every block; the cache must not grow while a
        graph uses it, and must hold length + Q rows. On the CPU, where no graph is captured, it reads only the
        rows below the longest length (the rest are masked anyway). On CUDA, at most KERNEL_ROWS rows run the
        step kernels, which also write the block's K/V into the cache past `length` (rows the next append
        overwrites).
        """
        self._check_block(cache, block_embeddings)
        b, q_len = block_embeddings.shape[:2]
        if self.kernel_path(b * q_len, block_embeddings, length, cache.keys[0]):
            return self._static_kernels(cache, length.reshape(-1).expand(b), block_embeddings)
        capacity = cache.keys[0].shape[2]
        device = block_embeddings.device
        length = length.reshape(-1).expand(b)
        if device.type == "cpu":
            capacity = min(capacity, int(length.max()))
        ctx_pos = torch.arange(capacity, device=device)
        q_pos = length[:, None] + torch.arange(q_len, device=device)  # [b, Q]
        k_pos = torch.cat([ctx_pos.expand(b, -1), q_pos], dim=1)  # [b, C+Q]
        valid = torch.cat(
            [ctx_pos[None, :] < length[:, None], torch.ones(b, q_len, dtype=torch.bool, device=device)], dim=1
        )  # [b, C+Q]

        def length_mask(window: int | None) -> torch.Tensor:
            mask = valid[:, None, None, :].expand(b, 1, q_len, -1)
            if window is not None:  # the symmetric window, per row
                mask = mask & ((q_pos[:, :, None] - k_pos[:, None, :]).abs() <= window - 1)[:, None]
            return mask

        return self._backbone(
            block_embeddings,
            q_pos,
            lambda i: (cache.keys[i][:, :, :capacity], cache.values[i][:, :, :capacity]),
            length_mask,
        )

    def append_context_static(self, cache: DraftKVCache, context: torch.Tensor, length: torch.Tensor) -> None:
        """Write K/V of context rows [b, q, M] at positions length[b]..length[b]+q-1 (`length` [b] on the device;
        the cache's own `length` is not used): the device-resident loop writes a whole block's rows and commits
        the accepted ones by advancing `length`, so the rest stay beyond it, masked, until overwritten."""
        b, q = context.shape[:2]
        positions = length[:, None] + torch.arange(q, device=context.device)  # [b, q]
        if self.kernel_path(b * q, context, length, cache.keys[0]):
            self._append_kernels(cache, context, positions)
            return
        batch_index = torch.arange(b, device=context.device)[:, None]  # [b, 1], broadcast against positions
        for i, (k, v) in enumerate(self._context_kv(context, positions)):  # each [b, kv_heads, q, hd]
            # cache[i, :, positions[i, j]] = k[i, :, j]: an index_put (a scatter_ is 30x slower on the CPU in bf16)
            cache.keys[i][batch_index, :, positions] = k.transpose(1, 2)
            cache.values[i][batch_index, :, positions] = v.transpose(1, 2)

    @property
    def trains_on_blocks(self) -> bool:
        """Whether `forward_blocks` (training's many-blocks pass) supports this drafter: full attention, no
        convolution."""
        return all(
            layer.attention_conv is None and layer.self_attn.window is None for layer in self.draft_layers
        )

    def forward_blocks(
        self, context: torch.Tensor, block_embeddings: torch.Tensor, anchors: torch.Tensor
    ) -> torch.Tensor:
        """Many blocks of each sequence in one pass, as training runs them: context [b, L, M] (the projected
        target features of every position), block_embeddings [b, m, B, M] of [x_a, mask x (B-1)], anchors [b, m]
        -> final-normed hidden [b, m, B, M]. Block j attends to the context rows before its anchor and to its own
        B rows, at rotary positions anchor.., exactly as `forward` drafts it after anchor context rows."""
        if not self.trains_on_blocks:
            raise ValueError("training supports full-attention drafters without convolution")
        b, m, block, width = block_embeddings.shape
        length = context.shape[1]
        device = context.device
        ctx_positions = torch.arange(length, device=device)
        q_positions = (anchors[:, :, None] + torch.arange(block, device=device)).reshape(
            b, m * block
        )  # [b, n]
        # block j sees the context rows before its anchor and its own B rows: [b, 1, n, L + n]
        sees_context = ctx_positions[None, None, :] < anchors.repeat_interleave(block, dim=1)[:, :, None]
        block_of = torch.arange(m, device=device).repeat_interleave(block)
        same_block = (block_of[:, None] == block_of[None, :]).expand(b, -1, -1)
        mask = torch.cat([sees_context, same_block], dim=2)[:, None]
        context_kv = list(self._context_kv(context, ctx_positions))  # autograd keeps every layer's anyway
        hidden = self._backbone(
            block_embeddings.reshape(b, m * block, width),
            q_positions,
            context_kv.__getitem__,
            lambda window: mask,
        )
        return hidden.view(b, m, block, width)

    def logits(
        self, hidden: torch.Tensor, target_lm_head: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """hidden [b, S, M] -> fp32 logits [b, S, V] through the owned head, else the target's."""
        if self.lm_head is not None:
            return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
        return target_lm_head(hidden).float()
