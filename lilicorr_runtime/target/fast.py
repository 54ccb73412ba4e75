"""The target as the decoder sees it, and its fast path.

`TargetModel` (the adapter): a causal LM (an HF transformers model, or target/native.py's NativeCausalLM, which
only the fast path runs) exposing the logits and the hidden states after chosen layers (HF `hidden_states[i +
1]`), the input embedding table, the lm_head, and a KV cache that is cropped after partial acceptance. Loading one
(and choosing the fast path when it has one) is target/load.py's.

`FastTarget`: the fast path for the Llama, Qwen2 and Qwen3 families: a preallocated KV cache, the tapped hidden
states captured inside the same forward, and the one-token and verify steps replayed from CUDA graphs. The model
is NativeCausalLM (built without transformers) or a transformers model of the same layout (the fallback loader,
and the route for every other architecture: `fast_path_problem` names what keeps a model off this path); either
way the weights are read by their transformers names (q/k/v and gate/up are fused into one GEMM each, and the
model's parameters become views of the fused tensors, so a transformers model still runs, on the same memory) and
the rotary frequencies off `model.model.rotary_emb`.

Cache layout: K and V per layer [b, kv_heads, capacity, head_dim]. Row r of the cache is the r-th token fed
(after `pad[b]` left-padding rows in a batch), at rotary position r - pad[b]. A forward over n rows at cache
index `start` writes rows start..start+n-1 and attends, for query row i, to the rows pad[b]..start+i; rows
past that are masked, so stale rows after a crop never leak. Shapes do not depend on `start` (a device
scalar), which is what lets one captured graph serve every step.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

if (
    TYPE_CHECKING
):  # transformers is imported where its cache is made: a target built without it never needs it
    from transformers import DynamicCache, PreTrainedModel
import time
from collections.abc import Callable

from .. import ops, rows
from ..graphs import WARMUP_RUNS, capture, warm_up

if TYPE_CHECKING:
    from transformers import PreTrainedModel


# -------------------- the target adapter: a causal LM as the decoder sees it


class TargetStep:
    """One target forward: fp32 logits [n, V] and, when asked for, features [n, T·M]."""

    __slots__ = ("features", "logits")

    def __init__(self, logits: torch.Tensor, features: torch.Tensor | None):
        self.logits = logits
        self.features = features


class TargetModel:
    def __init__(
        self, model: PreTrainedModel | Any, tokenizer: Any = None, eos_token_ids: Sequence[int] = ()
    ):
        self.model = model.eval()
        config = model.config.get_text_config()
        self.config = config
        self.hidden_size: int = config.hidden_size
        self.num_layers: int = config.num_hidden_layers
        self.embed_tokens: torch.nn.Module = model.get_input_embeddings()
        self.lm_head: torch.nn.Module = model.get_output_embeddings()
        self.vocab_size: int = self._embedding_table.shape[0]
        self.tokenizer = tokenizer
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        # transformers renamed the cache argument (past_key_values -> cache); take whichever this version has
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        self.cache: DynamicCache | None = None
        self.length = 0  # tokens whose K/V the cache holds
        self.path = (
            "transformers"  # which forward runs: "fast" (target.fast.FastTarget) or transformers' eager one
        )
        self.path_note = "transformers eager forward"
        self.load_note = "transformers"  # how the weights were read (load_target sets it)

    @property
    def _embedding_table(self) -> torch.Tensor:
        """The input embedding's weight (a Module's attribute is `Tensor | Module` to a type checker)."""
        return cast(torch.Tensor, self.embed_tokens.weight)

    @property
    def device(self) -> torch.device:
        return self._embedding_table.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embedding_table.dtype

    def reserve(self, rows: int) -> None:
        """A hint that the next request needs `rows` cached tokens (a static cache allocates them once)."""

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> raw embedding rows [..., M] (no model-specific input scaling)."""
        return self.embed_tokens(ids.to(self.device))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's lm_head on hidden [..., M] of any dtype -> fp32 logits [..., V]."""
        return self.lm_head(hidden.to(self.dtype)).float()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, layer_ids: Sequence[int] | None = None) -> TargetStep:
        """Run ids [n] at the positions after the cached ones and extend the cache."""
        if self.cache is None:
            self.reset()
        kwargs = {self._cache_kwarg: self.cache}
        out = self.model(
            input_ids=ids.to(self.device).view(1, -1),
            use_cache=True,
            output_hidden_states=layer_ids is not None,
            **kwargs,
        )
        self.length += ids.numel()
        features = None
        if layer_ids is not None:
            features = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1)  # [n, T·M]
        return TargetStep(out.logits[0].float(), features)

    def crop(self, length: int) -> None:
        """Keep the first `length` cached tokens (drop the rejected tail of a verified block)."""
        assert self.cache is not None
        drop = self.length - length
        if drop > 0:
            self.cache.crop(
                -drop
            )  # a negative count removes tokens, in every transformers version we support
            self.length = length


# -------------------- the fast target


FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}
# a forward of at most this many rows per sequence is a step (the AR step, every verify block a drafter can ask
# for): it runs the fused step kernels and, on CUDA, replays a captured graph
STEP_ROWS = rows.STEP
GRAPH_MAX_ROWS = rows.STEP
# a request's prefill of at most this many rows runs the step kernels too (FastTarget.forward, the device loop's
# admission), so that every row is computed as the one-token step computes it; longer ones, and other callers of
# StaticDecoder.forward (batched data generation, training), take the torch references (cuBLAS, SDPA) past STEP_ROWS
PREFILL_ROWS = rows.PREFILL


def fast_path_problem(model: PreTrainedModel | Any) -> str | None:
    """None when `model` runs on the fast path, else why not (a phrase for the one-line report note)."""
    config = model.config.get_text_config()
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"model_type {kind!r} has no fast path (Llama, Qwen2 and Qwen3 do)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (the fast path computes SiLU)"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias is set"
    if kind == "qwen2" and getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        return "sliding-window attention layers"
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None or not isinstance(getattr(rotary, "inv_freq", None), torch.Tensor):
        return "no rotary embedding module to read the frequencies from"
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in ("default", "linear", "llama3", "yarn"):
        return f"rope type {rope_type!r} (frequencies that change with the sequence length)"
    return None


def _fuse(*parameters: torch.nn.Parameter) -> torch.Tensor:
    """One tensor stacking the parameters along dim 0; each parameter then views its slice of it, so the
    fused GEMM weight costs no extra memory and the transformers model keeps working on the same storage."""
    fused = torch.cat([p.detach() for p in parameters])
    offset = 0
    for p in parameters:
        p.data = fused[offset : offset + p.shape[0]]
        offset += p.shape[0]
    return fused


class StaticKVCache:
    """Per-layer K/V [b, kv_heads, capacity, head_dim], allocated once: views of one block per kind,
    `key_block` / `value_block` [layers, b, kv_heads, capacity, head_dim], so that a sequence's whole cache is
    copied in one kernel (the device loop's admission)."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (num_layers, batch, kv_heads, capacity, head_dim)
        self.key_block: torch.Tensor | None = torch.zeros(shape, dtype=dtype, device=device)
        self.value_block: torch.Tensor | None = torch.zeros(shape, dtype=dtype, device=device)
        self.keys = list(self.key_block.unbind(0))
        self.values = list(self.value_block.unbind(0))

    @classmethod
    def over(cls, keys: list[torch.Tensor], values: list[torch.Tensor]) -> StaticKVCache:
        """A cache over existing per-layer tensors (e.g. one slot's rows of a batch cache), allocating nothing."""
        cache = cls.__new__(cls)
        cache.keys, cache.values = list(keys), list(values)
        cache.key_block = cache.value_block = None
        return cache

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]


class StaticDecoder:
    """The decoder stack of a Llama / Qwen2 / Qwen3 model as plain tensors, forward over a StaticKVCache."""

    def __init__(self, model: PreTrainedModel | Any):
        problem = fast_path_problem(model)
        if problem is not None:
            raise ValueError(f"no fast path: {problem}")
        config = model.config.get_text_config()
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        self.eps = float(config.rms_norm_eps)
        inner = model.model
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float().clone()  # [hd/2]
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0) or 1.0)
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.splits = (q, kv, kv)
        self.layers: list[dict[str, torch.Tensor | None]] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            biases = [p.bias for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # Qwen3 only
            qkv = _fuse(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
            qkv_bias = _fuse(*biases) if all(b is not None for b in biases) else None
            self.layers.append(
                {
                    "input_norm": layer.input_layernorm.weight.detach(),
                    "qkv": qkv,
                    "qkv_bias": qkv_bias,
                    "q_norm": None if q_norm is None else q_norm.weight.detach(),
                    "k_norm": None if k_norm is None else k_norm.weight.detach(),
                    "o": attn.o_proj.weight.detach(),
                    "o_bias": None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
                    "post_norm": layer.post_attention_layernorm.weight.detach(),
                    "gate_up": _fuse(mlp.gate_proj.weight, mlp.up_proj.weight),
                    "down": mlp.down_proj.weight.detach(),
                }
            )
        self.norm = inner.norm.weight.detach()
        self.intermediate = cast(torch.Tensor, self.layers[0]["down"]).shape[1] if self.layers else 0
        self.device, self.dtype = self.norm.device, self.norm.dtype
        self.inv_freq = self.inv_freq.to(self.device)
        self.cos = self.sin = torch.empty(0, self.head_dim // 2, device=self.device)
        self._retired_tables: list[torch.Tensor] = []
        self._ensure_tables(int(getattr(config, "max_position_embeddings", 0) or 0))

    def _ensure_tables(self, positions: int) -> None:
        """Rotary cos/sin tables for positions 0..positions-1. A larger table replaces the old one, which is kept
        alive: graphs captured earlier read it by address."""
        if self.cos.shape[0] >= positions:
            return
        self._retired_tables += [self.cos, self.sin]
        self.cos, self.sin = ops.rope_tables(self.inv_freq, self.rope_scale, max(positions, 256))

    def new_cache(self, batch: int, capacity: int) -> StaticKVCache:
        self._ensure_tables(capacity)  # a position is below the cache's capacity
        return StaticKVCache(
            self.num_layers, batch, self.num_kv_heads, self.head_dim, capacity, self.dtype, self.device
        )

    def forward(
        self,
        cache: StaticKVCache,
        x: torch.Tensor,
        start: torch.Tensor,
        pad: torch.Tensor,
        taps: Sequence[int] = (),
        step_kernels: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [b, n, M] input embeddings at cache rows start..start+n-1 (start: an int64 device scalar, or [b] for
        rows at different lengths; pad [b] int64) -> (final-normed hidden [b, n, M], the hidden after each layer in
        `taps`, concatenated [b, n, T·M], or None). The tap after the last layer is taken after the final norm, as
        transformers' `hidden_states[-1]` is.

        A forward of at most STEP_ROWS rows per sequence (a decode or verify step), or any forward with
        `step_kernels`, runs the fused step ops (five kernels per layer on CUDA, each row computed independently
        of the others and of the row count); a longer one (a prefill) runs the same ops' torch references
        (cuBLAS GEMMs, SDPA) unless `step_kernels` is True."""
        b, n, m = x.shape
        start = start.reshape(-1).expand(b) if start.numel() == 1 else start
        rows = start[:, None] + torch.arange(n, device=x.device)  # [b, n] cache rows written
        positions = rows - pad[:, None]
        self._ensure_tables(cache.capacity)
        step = n <= STEP_ROWS if step_kernels is None else step_kernels
        slots = {t: i for i, t in enumerate(taps)}
        features = torch.empty(b * n, len(taps) * m, device=x.device, dtype=x.dtype) if taps else None
        eps = self.eps
        last = self.num_layers - 1
        flat = x.reshape(b * n, m)
        for index, (layer, keys, values) in enumerate(
            zip(self.layers, cache.keys, cache.values, strict=True)
        ):
            tap = None
            if index in slots and index != last:  # written straight into its slice of the features
                assert features is not None  # there are taps
                tap = features[:, slots[index] * m : (slots[index] + 1) * m]
            flat = ops.decoder_layer(
                flat,
                layer,
                keys,
                values,
                rows=rows,
                positions=positions,
                last=rows,  # causal: row i sees the cache up to itself
                first=pad,
                cos=self.cos,
                sin=self.sin,
                num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                eps=eps,
                kernels=step,
                out=tap,
            )
        out = ops.rms_norm(flat, self.norm, eps)
        if last in slots:
            assert features is not None  # there are taps
            features[:, slots[last] * m : (slots[last] + 1) * m] = out
        return out.view(b, n, m), None if features is None else features.view(b, n, -1)


class _Graph:
    """One captured target step of fixed (batch, rows, taps): static inputs in, static outputs out."""

    def __init__(
        self, run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]], warmup: int = WARMUP_RUNS
    ):
        warm_up(run, warmup)
        self.graph, self.outputs = capture(run)

    def replay(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.graph.replay()
        return self.outputs


class FastTarget(TargetModel):
    """`TargetModel` on the fast path: same interface, a static cache, graph replay on CUDA."""

    def __init__(
        self,
        model: PreTrainedModel | Any,
        tokenizer=None,
        eos_token_ids: Sequence[int] = (),
        *,
        cuda_graphs: bool = True,
    ):
        super().__init__(model, tokenizer, eos_token_ids)
        self.core = StaticDecoder(model)
        self.path = "fast"
        self.path_note = "fast path (static KV cache" + (
            ", CUDA graphs)" if cuda_graphs and self.device.type == "cuda" else ")"
        )
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.static_cache: StaticKVCache | None = None
        self._zero_pad = torch.zeros(1, dtype=torch.long, device=self.device)
        self._graphs: dict[tuple, tuple[_Graph, dict[str, torch.Tensor]]] = {}

    # the decoder's single-request interface -------------------------------------------------------------

    def reserve(self, rows: int) -> None:
        """Make the cache hold at least `rows` tokens (prompt + output + one block); graphs are recaptured
        only when it grows."""
        capacity = max(256, 1 << max(rows - 1, 1).bit_length())
        cache = self.static_cache
        if cache is None or cache.batch != 1 or cache.capacity < capacity:
            self.static_cache = self.core.new_cache(1, capacity)
            self._graphs = {}  # captured over the old cache

    def reset(self) -> None:
        if self.static_cache is None:
            self.reserve(256)
        self.length = 0

    @property
    def _cache(self) -> StaticKVCache:
        """The single-request cache, which reset() / reserve() allocate before any forward reads it."""
        cache = self.static_cache
        assert cache is not None
        return cache

    def crop(self, length: int) -> None:
        # rows past `length` stay in the cache but are never visible: the next forward overwrites them
        self.length = min(self.length, length)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, layer_ids: Sequence[int] | None = None) -> TargetStep:
        if self.static_cache is None:
            self.reset()
        ids = ids.to(self.device).view(1, -1)
        n = ids.shape[1]
        if self.length + n > self._cache.capacity:
            self._grow(self.length + n)
        taps = tuple(layer_ids) if layer_ids is not None else ()
        # a prefill runs the step kernels too (up to PREFILL_ROWS): each row as the one-token step computes it
        logits, features = self._step(
            self._cache, ids, self.length, self._zero_pad, taps, step_kernels=n <= PREFILL_ROWS or None
        )
        self.length += n
        return TargetStep(logits[0], None if features is None else features[0])

    def _grow(self, rows: int) -> None:
        old, length = self._cache, self.length
        self.reserve(rows)
        new = self._cache
        for store_old, store_new in ((old.keys, new.keys), (old.values, new.values)):
            for a, b in zip(store_old, store_new, strict=True):
                b[:, :, :length] = a[:, :, :length]

    def _step(
        self,
        cache: StaticKVCache,
        ids: torch.Tensor,
        start: int,
        pad: torch.Tensor,
        taps: tuple[int, ...],
        graphs: dict | None = None,
        step_kernels: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [b, n] at cache row `start` -> fp32 logits [b, n, V], features [b, n, T·M] or None. Steps of at
        most GRAPH_MAX_ROWS rows replay a graph captured over `cache` (kept in `graphs`); longer forwards run
        eagerly (`step_kernels`: see StaticDecoder.forward)."""
        b, n = ids.shape
        graphs = self._graphs if graphs is None else graphs
        if self.use_graphs and n <= GRAPH_MAX_ROWS:
            key = (b, n, taps)
            entry = graphs.get(key)
            if entry is None:
                # the real inputs go in before capture: warm-up runs write their K/V rows, which must be right
                static = {
                    "ids": ids.clone(),
                    "start": torch.tensor(start, device=self.device),
                    "pad": pad.clone(),
                }
                graph = _Graph(
                    lambda: self._eager(cache, static["ids"], static["start"], static["pad"], taps, False)
                )
                entry = graphs[key] = (graph, static)
            graph, static = entry
            static["ids"].copy_(ids)
            static["start"].fill_(start)
            static["pad"].copy_(pad)
            logits, features = graph.replay()
            return logits.clone(), None if features is None else features.clone()
        start_t = torch.tensor(start, device=self.device)
        return self._eager(cache, ids, start_t, pad, taps, False, step_kernels=step_kernels)

    def _eager(
        self,
        cache: StaticKVCache,
        ids: torch.Tensor,
        start: torch.Tensor,
        pad: torch.Tensor,
        taps: tuple[int, ...],
        last_only: bool,
        step_kernels: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden, features = self.core.forward(
            cache, self.embed_tokens(ids), start, pad, taps, step_kernels=step_kernels
        )
        if last_only:
            hidden = hidden[:, -1:]
        return self.step_logits(hidden), features

    def step_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [b, n, M] -> fp32 logits [b, n, V]; up to PREFILL_ROWS rows per sequence through
        the row-invariant step GEMM (so a prefill's logits are the one-token step's)."""
        b, n, m = hidden.shape
        if n <= PREFILL_ROWS and self.lm_head.bias is None:
            return ops.step_linear(
                hidden.reshape(b * n, m), self.lm_head.weight, out_dtype=torch.float32
            ).view(b, n, -1)
        return self.lm_head(hidden).float()

    # batched greedy generation (data generation) -----------------------------------------------------------

    @torch.inference_mode()
    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        eos_token_ids: Sequence[int] | None = None,
        batch_size: int = 256,
        progress: Callable[[int, int], None] | None = None,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> list[list[int]]:
        """Greedy continuations of many prompts, `batch_size` at a time (left-padded, one graph per batch
        shape). Each output ends at its first eos (inclusive) or after max_new_tokens. `temperature` > 0
        samples instead (seeded; the training recipe uses it to let the target write its own requests)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        generator = torch.Generator(device=self.device).manual_seed(seed) if temperature > 0 else None
        eos = tuple(self.eos_token_ids if eos_token_ids is None else eos_token_ids)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        results: list[list[int]] = [[] for _ in prompts]
        done_count = 0
        for first in range(0, len(order), batch_size):
            chunk = order[first : first + batch_size]
            batch = self._generate_batch(
                [prompts[i] for i in chunk], max_new_tokens, eos, temperature, generator
            )
            for index, tokens in zip(chunk, batch, strict=True):
                results[index] = tokens
            done_count += len(chunk)
            if progress is not None:
                progress(done_count, len(prompts))
        return results

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        eos: tuple[int, ...],
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> list[list[int]]:
        def pick(logits: torch.Tensor) -> torch.Tensor:  # [b, V] -> [b]
            if temperature == 0:
                return logits.argmax(-1)
            return torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]

        b = len(prompts)
        width = max(len(p) for p in prompts)
        if min(len(p) for p in prompts) < 1:
            raise ValueError("every prompt needs at least one token")
        capacity = width + max_new_tokens
        capacity = 1 << (capacity - 1).bit_length()
        cache = self.core.new_cache(b, capacity)
        ids = torch.zeros(b, width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        pad = torch.tensor([width - len(p) for p in prompts], dtype=torch.long, device=self.device)
        logits, _ = self._eager(
            cache, ids.to(self.device), torch.tensor(0, device=self.device), pad, (), True
        )
        token = pick(logits[:, -1])  # [b]
        out = torch.empty(b, max_new_tokens, dtype=torch.long, device=self.device)
        out[:, 0] = token
        eos_t = torch.tensor(eos or (-1,), device=self.device)
        finished = torch.isin(token, eos_t)
        graphs: dict = {}  # captured over this batch's cache
        for step in range(1, max_new_tokens):
            logits, _ = self._step(cache, token[:, None], width + step - 1, pad, (), graphs)
            token = pick(logits[:, -1])
            out[:, step] = token
            finished |= torch.isin(token, eos_t)
            if step % 16 == 0 and bool(finished.all()):
                out = out[:, : step + 1]
                break
        rows = out.tolist()
        results = []
        for row in rows:
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            results.append(row[:cut])
        return results


def tokens_per_second(target: TargetModel, prompt: Sequence[int], new_tokens: int) -> float:
    """Target-only greedy decoding speed (after one warm-up run), tokens per second."""

    def decode() -> float:
        target.reserve(len(prompt) + new_tokens + 1)
        target.reset()
        begin = time.perf_counter()
        token = int(target.forward(torch.tensor(list(prompt))).logits[-1].argmax())
        for _ in range(new_tokens - 1):
            token = int(target.forward(torch.tensor([token])).logits[-1].argmax())
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - begin

    decode()  # warm-up: graph capture, allocator
    return new_tokens / decode()
