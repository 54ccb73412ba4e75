"""The LiLiCorr head (the scoring head as the serving stacks compute it): one bidirectional pass over the candidate lattice,
then fp32 start and pair scores. Parameter names are the checkpoint's, minus `lilicorr.`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from lilicorr_ckpt.checkpoint.geometry import Geometry

from ..arguments import known
from ..ops.draft import feature_hidden, lattice_attention, lattice_scores, residual_norm
from .layers import RMSNorm

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
