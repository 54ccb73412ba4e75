"""The DFlash backbone (as SGLang, vLLM and TensorRT-LLM compute it): a Qwen3-style block drafter that attends over
projected target features (the context) and a query block [anchor, mask x n], non-causally.

Parameter names are the checkpoint's (no `model.` prefix), so a canonical tensor dict loads with
`load_state_dict(strict=True)`.
"""

from __future__ import annotations

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
from ..ops.dispatch import use_triton
from ..ops.rope import apply_rope, rope_cos_sin, rope_inverse_frequencies
from .head import LiLiCorrHead, head_from_geometry
from .layers import RMSNorm

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

    @property
    def block_size(self) -> int:
        return known(self.geometry.block_size, "block_size")

    @property
    def mask_token_id(self) -> int:
        return known(self.geometry.mask_token_id, "mask_token_id")

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return known(self.geometry.target_layer_ids, "target_layer_ids")

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

    def forward_blocks(
        self, context: torch.Tensor, block_embeddings: torch.Tensor, anchors: torch.Tensor
    ) -> torch.Tensor:
        """Many blocks of each sequence in one pass, as training runs them: context [b, L, M] (the projected
        target features of every position), block_embeddings [b, m, B, M] of [x_a, mask x (B-1)], anchors [b, m]
        -> final-normed hidden [b, m, B, M]. Block j attends to the context rows before its anchor and to its own
        B rows, at rotary positions anchor.., exactly as `forward` drafts it after anchor context rows."""
        if any(
            layer.attention_conv is not None or layer.self_attn.window is not None
            for layer in self.draft_layers
        ):
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
