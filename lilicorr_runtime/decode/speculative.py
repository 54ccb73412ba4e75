"""Exact speculative decoding with a DFlash drafter and the LiLiCorr head.

One block, start to finish:
    draft     target-embedded [anchor, mask x n] through the backbone over the cached context
    candidates top-K of the full-vocabulary log-softmax at block positions 1..n
    score     the LiLiCorr head -> start [K], pairs [n-1, K, K]
    walk      greedy (T = 0) or sampled (T > 0) commit, or the per-slot argmax (control)
    verify    one target forward over [anchor, d_1..d_n]; longest accepted prefix + the target's token
    accept    crop the target cache, append the accepted rows to the drafter's context
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Literal, cast

import msgspec
import torch

from ..arguments import as_int
from ..model.drafter import Drafter, DraftKVCache
from ..target.fast import FastTarget, TargetModel, TargetStep
from .block import Walk, accept, draft, target_token, verify
from .device_loop import DecodeLoop
from .draft_step import DraftStep

Mode = Literal["head", "control", "ar"]
Loop = Literal["device", "eager"]


class BlockRecord(msgspec.Struct, frozen=True):
    drafted: int  # speculative tokens proposed (0 in "ar" mode)
    accepted: int  # drafted tokens the target accepted
    committed: int  # accepted + the target's own token


class Proposal(msgspec.Struct, frozen=True):
    """One drafted block, every intermediate kept for inspection (b = 1 in the decoder)."""

    hidden: torch.Tensor  # [b, n+1, M] final-normed draft hidden of [anchor, masks]
    logits: torch.Tensor  # [b, n, V] fp32
    candidate_ids: torch.Tensor | None  # [b, n, K] int64
    candidate_log_probs: torch.Tensor | None  # [b, n, K] fp32
    start: torch.Tensor | None  # [b, K] fp32
    pairs: torch.Tensor | None  # [b, n-1, K, K] fp32


class GenerationResult(msgspec.Struct, kw_only=True):
    mode: str
    prompt_tokens: int
    tokens: list[int]  # emitted tokens (at most max_new_tokens, ending at the first eos)
    blocks: list[BlockRecord]  # one per verification forward; the prefill's token is in no block
    wall_time_s: float  # prefill + decoding
    block_size: int  # the drafter's trained B (1 in "ar" mode)
    proposals: list[Proposal] = []  # per block, only when the decoder keeps them (keep_proposals=True)


def draft_block(
    drafter: Drafter,
    cache: DraftKVCache,
    anchor_tokens: torch.Tensor,
    anchor_hidden: torch.Tensor,
    num_tokens: int,
    embed: Callable[[torch.Tensor], torch.Tensor],
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    score: bool,
) -> Proposal:
    """Draft n tokens after the anchor and, with `score`, run candidates and the head: `block.draft` over the
    eager cache, without a walk (every loop's draft step runs the same `block.draft`).

    anchor_tokens [b], anchor_hidden [b, M] (the context row that predicted the anchor).
    """
    masks = _masks(drafter, anchor_tokens.shape[0], num_tokens, anchor_tokens.device)
    hidden, proposed = draft(
        drafter, embed, lm_head, cache, None, anchor_tokens, anchor_hidden, masks, None, score=score
    )
    return _proposal(hidden, proposed)


def _masks(drafter: Drafter, b: int, n: int, device: torch.device) -> torch.Tensor:
    """The block's mask tokens [b, n] (the eager draft's; a captured draft keeps them in a static buffer)."""
    return torch.full((b, n), drafter.mask_token_id, dtype=torch.long, device=device)


def _proposal(hidden: torch.Tensor, proposed: dict[str, torch.Tensor]) -> Proposal:
    return Proposal(
        hidden,
        proposed["logits"],
        proposed.get("candidate_ids"),
        proposed.get("candidate_log_probs"),
        proposed.get("start"),
        proposed.get("pairs"),
    )


class SpeculativeDecoder:
    """The decoder; `mode="ar"` is plain target decoding through the same adapter.

    Two loops compute the same tokens. `loop="device"` (the default on CUDA with a fast-path target) runs each
    block as one CUDA-graph replay over device-resident state (decode/device_loop.py), `batch` requests at once
    in `generate_many`; `loop="eager"` (the default otherwise, and the CPU reference) runs one block at a time in
    Python, with the draft step replayed from a graph on CUDA. `keep_proposals` needs the eager loop.
    """

    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter | None = None,
        *,
        mode: Mode = "head",
        num_speculative_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        keep_proposals: bool = False,
        cuda_graph: bool = True,
        loop: Loop | None = None,
    ):
        if mode not in ("head", "control", "ar"):
            raise ValueError(f"mode must be head, control or ar, not {mode!r}")
        if loop not in (None, "device", "eager"):
            raise ValueError(f"loop must be 'device', 'eager' or None (pick by device), not {loop!r}")
        if not isinstance(target, TargetModel):
            raise TypeError(f"target must be a TargetModel (load_target), got {type(target).__name__}")
        if drafter is not None and not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must be a Drafter (load_drafter) or None, got {type(drafter).__name__}")
        temperature = _temperature(temperature)
        self.target, self.drafter, self.mode, self.temperature = target, drafter, mode, temperature
        self.generator = torch.Generator().manual_seed(seed)
        self.keep_proposals = keep_proposals
        self.num_tokens = 0
        # on CUDA the draft step replays a captured graph over a fixed-capacity cache, reused across requests
        self.use_graph = cuda_graph and target.device.type == "cuda"
        self._static_cache: DraftKVCache | None = None
        self._steps: dict[str, DraftStep] = {}
        fast = isinstance(target, FastTarget)  # a static cache and the step forward the device loop captures
        if loop == "device" and not fast:
            raise ValueError(
                f"loop='device' needs a fast-path target (Llama, Qwen2, Qwen3): {target.path_note}"
            )
        if loop == "device" and keep_proposals:
            raise ValueError(
                "keep_proposals needs loop='eager' (the device loop keeps no per-block intermediates)"
            )
        if loop is None:
            loop = "device" if fast and self.use_graph and not keep_proposals else "eager"
        self.loop: Loop = loop
        self._loops: dict[tuple, DecodeLoop] = {}
        if mode == "ar":
            return
        if drafter is None:
            raise ValueError(f"mode {mode!r} needs a drafter")
        if mode == "head" and drafter.lilicorr is None:
            raise ValueError("mode 'head' needs a LiLiCorr head; this drafter has none (use mode='control')")
        g = drafter.geometry
        slots = drafter.block_size - 1
        n = slots if num_speculative_tokens is None else num_speculative_tokens
        if as_int(n) is None or not 1 <= n <= slots:
            raise ValueError(
                f"num_speculative_tokens must be in [1, {slots}] (block_size {g.block_size}), got {n}"
            )
        self.num_tokens = int(n)
        problems = []
        if g.hidden_size != target.hidden_size:
            problems.append(f"draft hidden_size {g.hidden_size} != target hidden_size {target.hidden_size}")
        if max(drafter.target_layer_ids) >= target.num_layers:
            problems.append(
                f"target_layer_ids {list(drafter.target_layer_ids)} reach past the target's "
                f"{target.num_layers} layers"
            )
        # the drafter's candidates are embedded with the target's table and scored with its lm_head (or an owned
        # one of the draft vocabulary), and verification compares them with the target's logits: one vocabulary
        vocab_differs = g.vocab_size is not None and g.vocab_size != target.vocab_size
        if vocab_differs:
            problems.append(f"draft vocab_size {g.vocab_size} != target vocab_size {target.vocab_size}")
        head_rows = _rows(target.lm_head)
        if head_rows is not None and head_rows != target.vocab_size:
            problems.append(
                f"the target's lm_head has {head_rows} rows but its embedding table {target.vocab_size}"
            )
        if drafter.mask_token_id >= target.vocab_size:
            problems.append(
                f"mask_token_id {g.mask_token_id} is outside the target vocabulary ({target.vocab_size})"
            )
        if drafter.lilicorr is not None and drafter.lilicorr.candidate_topk > target.vocab_size:
            problems.append(
                f"candidate_topk {drafter.lilicorr.candidate_topk} exceeds the target vocabulary "
                f"({target.vocab_size})"
            )
        if (
            not vocab_differs
            and drafter.lm_head is not None
            and drafter.lm_head.weight.shape[0] != target.vocab_size
        ):
            problems.append(
                f"the drafter's lm_head has {drafter.lm_head.weight.shape[0]} rows, "
                f"the target vocabulary {target.vocab_size}"
            )
        if problems:
            raise ValueError("drafter and target do not match: " + "; ".join(problems))

    def _uniforms(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator).to(self.target.device)

    def _first_token(self, logits: torch.Tensor) -> int:
        # logits [V] -> the target's token at the current position
        uniforms = self._uniforms(1) if self.temperature > 0 else None
        return int(target_token(logits[None], self.temperature, uniforms)[0])

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Sequence[int] | int = (),
    ) -> GenerationResult:
        """Decode one request. prompt_ids: one non-empty sequence of integer token ids in [0, vocab): a list or
        tuple of ints, or a 1-D integer tensor ([1, n], one tokenizer row, is accepted too). eos_token_ids: the ids
        that end the output (inclusive), a sequence or a single int."""
        prompt = _prompt_ids(prompt_ids, self.target.vocab_size)
        max_new_tokens, eos = _limits(max_new_tokens, eos_token_ids)
        if self.loop == "device":
            return self._generate_device([prompt], max_new_tokens, eos, 1)[0]
        started = time.perf_counter()
        target = self.target
        block = 1 if self.drafter is None else self.drafter.block_size
        target.reserve(prompt.numel() + max_new_tokens + block + 1)
        target.reset()
        layer_ids = None if self.mode == "ar" else self._drafter.target_layer_ids
        step = target.forward(prompt, layer_ids)
        tokens = [self._first_token(step.logits[-1])]
        blocks: list[BlockRecord] = []
        stopped = tokens[-1] in eos
        if self.mode == "ar":
            while len(tokens) < max_new_tokens and tokens[-1] not in eos:
                step = target.forward(torch.tensor([tokens[-1]]))
                tokens.append(self._first_token(step.logits[-1]))
                blocks.append(BlockRecord(0, 0, 1))
            return GenerationResult(
                mode=self.mode,
                prompt_tokens=prompt.numel(),
                tokens=tokens,
                blocks=blocks,
                wall_time_s=time.perf_counter() - started,
                block_size=1,
            )

        drafter = self._drafter
        cache = self._cache(prompt.numel() + max_new_tokens + drafter.block_size)
        context = drafter.project_context(_features(step)[None])  # [1, P, M]
        drafter.append_context(cache, context)
        anchor_hidden = context[:, -1]  # [1, M]: the row that predicted the anchor
        proposals: list[Proposal] = []
        while len(tokens) < max_new_tokens and not stopped:
            accepted_tokens, next_token, record, features, proposal = self._block(
                cache, tokens[-1], anchor_hidden
            )
            blocks.append(record)
            if self.keep_proposals:
                proposals.append(proposal)
            tokens.extend(accepted_tokens + [next_token])
            # an eos anywhere in the block ends the request (as dflash_generate stops), not only a last-token one
            stopped = any(t in eos for t in accepted_tokens) or next_token in eos
            context = drafter.project_context(features[None])  # [1, a+1, M]
            drafter.append_context(cache, context)
            anchor_hidden = context[:, -1]
        tokens = _truncate(tokens, max_new_tokens, eos)
        return GenerationResult(
            mode=self.mode,
            prompt_tokens=prompt.numel(),
            tokens=tokens,
            blocks=blocks,
            wall_time_s=time.perf_counter() - started,
            block_size=drafter.block_size,
            proposals=proposals,
        )

    @torch.inference_mode()
    def generate_many(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        max_new_tokens: int,
        eos_token_ids: Sequence[int] | int = (),
        *,
        batch: int = 1,
        progress: Callable[[int, float], None] | None = None,
    ) -> list[GenerationResult]:
        """Decode many requests, results in prompt order. On the device loop, `batch` of them run side by side
        (a finished request's slot is refilled with the next waiting one), each block one graph replay for all;
        each result's wall_time_s then spans its own prefill to its end, overlapping the others'. On the eager
        loop they run one after another. `progress(ended, seconds)`, if given, hears how many requests ended and in
        how long: after every block of the device loop (0 when none did; DecodeLoop.run), after every request of
        the eager one (1, its wall time)."""
        checked = [_prompt_ids(p, self.target.vocab_size) for p in prompts]
        max_new_tokens, eos = _limits(max_new_tokens, eos_token_ids)
        if as_int(batch) is None or batch < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        if self.loop == "eager":
            results = []
            for p in checked:
                results.append(self.generate(p, max_new_tokens, sorted(eos)))
                if progress is not None:
                    progress(1, results[-1].wall_time_s)
            return results
        return self._generate_device(checked, max_new_tokens, eos, int(batch), progress)

    def device_loop(self, batch: int, rows: int, max_new_tokens: int, eos: set[int]) -> DecodeLoop:
        """The device loop for `batch` slots that holds `rows` rows per slot and `max_new_tokens` (built, and its
        graph captured, once; reused while requests fit)."""
        key = (batch, tuple(sorted(eos)))
        loop = self._loops.get(key)
        if loop is None or loop.capacity < rows or loop.max_new_tokens < max_new_tokens:
            capacity = max(256, 1 << (rows - 1).bit_length())
            if loop is not None:
                max_new_tokens = max(max_new_tokens, loop.max_new_tokens)
            self._loops.pop(key, None)
            loop = self._loops[key] = DecodeLoop(
                self.target,
                self.drafter,
                mode=self.mode,
                num_tokens=self.num_tokens,
                temperature=self.temperature,
                batch=batch,
                capacity=capacity,
                max_new_tokens=max_new_tokens,
                eos_token_ids=sorted(eos),
                generator=self.generator,
                use_graph=self.use_graph,
            )
        return loop

    def _generate_device(
        self,
        prompts: list[torch.Tensor],
        max_new_tokens: int,
        eos: set[int],
        batch: int,
        progress: Callable[[int, float], None] | None = None,
    ) -> list[GenerationResult]:
        rows = max(p.numel() for p in prompts) + max_new_tokens + self.num_tokens + 2
        loop = self.device_loop(min(batch, len(prompts)), rows, max_new_tokens, eos)
        block = 1 if self.drafter is None else self.drafter.block_size
        n = self.num_tokens
        return [
            GenerationResult(
                mode=self.mode,
                prompt_tokens=p.numel(),
                tokens=out.tokens,
                blocks=[BlockRecord(drafted=n, accepted=a, committed=a + 1) for a in out.accepted],
                wall_time_s=out.wall_time_s,
                block_size=block,
            )
            for p, out in zip(prompts, loop.run(prompts, max_new_tokens, progress), strict=True)
        ]

    @property
    def _drafter(self) -> Drafter:
        """The drafter of a drafting mode (__init__ refuses every mode but "ar" without one)."""
        drafter = self.drafter
        assert drafter is not None
        return drafter

    def _cache(self, rows: int) -> DraftKVCache:
        capacity = max(256, 1 << (rows - 1).bit_length())
        if not self.use_graph:
            return self._drafter.new_cache(batch=1, capacity=capacity)
        cache = self._static_cache
        if cache is None or cache.keys[0].shape[2] < capacity:  # graphs hold the buffers: recapture on growth
            cache = self._static_cache = self._drafter.new_cache(batch=1, capacity=capacity)
            self._steps = {}
        cache.length = 0  # stale rows beyond the length are masked out
        return cache

    def _draft(
        self,
        cache: DraftKVCache,
        anchor_t: torch.Tensor,
        anchor_hidden: torch.Tensor,
        how: Walk,
        uniforms: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], Proposal]:
        """The draft step (`block.draft`): the proposal walked (tokens [1, n], and q [1, n, K] when sampled), and
        the same as a Proposal. On CUDA replayed from the step's graph (copied out of its static buffers)."""
        target, drafter, n = self.target, self._drafter, self.num_tokens
        if self.use_graph:
            step = self._steps.get(how)
            if step is None:
                step = self._steps[how] = DraftStep(
                    drafter, cache, target.embed, target.logits, num_tokens=n, walk=how
                )
            proposed = {
                k: v.clone()
                for k, v in step.run(
                    anchor_t,
                    anchor_hidden,
                    cache.length,
                    uniforms,
                    self.temperature if how == "sample" else None,
                ).items()
            }
            return proposed, _proposal(torch.empty(0), proposed)
        device = anchor_t.device
        sampled = how == "sample"
        hidden, proposed = draft(
            drafter,
            target.embed,
            target.logits,
            cache,
            None,
            anchor_t,
            anchor_hidden,
            _masks(drafter, 1, n, device),
            how,
            uniforms=uniforms,
            temperatures=torch.full((1,), self.temperature, device=device) if sampled else None,
            greedy=torch.zeros(1, dtype=torch.bool, device=device) if sampled else None,
        )
        return proposed, _proposal(hidden, proposed)

    def _block(
        self, cache: DraftKVCache, anchor: int, anchor_hidden: torch.Tensor
    ) -> tuple[list[int], int, BlockRecord, torch.Tensor, Proposal]:
        """One block (decode/block.py's draft, verify and accept); the commit is the caller's (host lists)."""
        target, drafter, n = self.target, self._drafter, self.num_tokens
        anchor_t = torch.tensor([anchor], device=target.device)
        sampled = self.temperature > 0
        how: Walk = "control" if self.mode == "control" else "sample" if sampled else "greedy"
        uniforms = self._uniforms(1, n) if how == "sample" else None
        proposed, proposal = self._draft(cache, anchor_t, anchor_hidden, how, uniforms)
        draft_tokens = proposed["tokens"]  # [1, n]

        base = target.length
        layer_ids = drafter.target_layer_ids

        def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            step = target.forward(ids[0], layer_ids)  # n+1 rows at the target's length
            return step.logits[None], _features(step)  # [1, n+1, V]

        _, logits, features = verify(forward, anchor_t, draft_tokens)
        assert features is not None  # the drafter's taps
        # the uniforms in the order the loops draw them: the walk's (above), then acceptance's and the residual's
        draws = (self._uniforms(1, n), self._uniforms(1)) if sampled else (None, None)
        accepted, next_token = accept(logits, draft_tokens, self.temperature, proposed, *draws)
        a = int(accepted[0])
        target.crop(base + a + 1)
        record = BlockRecord(drafted=n, accepted=a, committed=a + 1)
        return draft_tokens[0, :a].tolist(), int(next_token[0]), record, features[: a + 1], proposal


def _features(step: TargetStep) -> torch.Tensor:
    """The tapped features of a target forward that was given layer ids."""
    assert step.features is not None
    return step.features


def _temperature(value: float) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"temperature must be a number, got {value!r}")
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"temperature must be a number, got {value!r}") from None
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 decodes greedily), got {value!r}")
    return t


def _limits(max_new_tokens: int, eos_token_ids: Sequence[int] | int) -> tuple[int, set[int]]:
    if as_int(max_new_tokens) is None or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    single = as_int(eos_token_ids)
    return int(max_new_tokens), ({single} if single is not None else set(cast(Sequence[int], eos_token_ids)))


def _rows(module: torch.nn.Module | None) -> int | None:
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _prompt_ids(prompt_ids: Sequence[int] | torch.Tensor, vocab: int) -> torch.Tensor:
    """One request's prompt as a 1-D int64 tensor, or ValueError: a 1-D sequence of integer ids in [0, vocab)."""
    one = "a prompt is one sequence of token ids (a list or tuple of ints, or a 1-D integer tensor)"
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids
        if ids.dim() == 2 and ids.shape[0] == 1:  # a tokenizer's return_tensors="pt" row
            ids = ids[0]
        if ids.dim() != 1:
            raise ValueError(
                f"{one}; got a tensor of shape {list(prompt_ids.shape)} (the decoder serves one "
                "request: decode the rows of a batch one at a time)"
            )
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{one}; got a {ids.dtype} tensor, and token ids are integers")
        ids = ids.to(torch.long)
    else:
        if isinstance(prompt_ids, (str, bytes)):
            raise ValueError(f"{one}, not text; tokenize it first (target.tokenizer)")
        try:
            items = list(prompt_ids)
        except TypeError:
            raise ValueError(f"{one}; got {type(prompt_ids).__name__}") from None
        values = [as_int(item) for item in items]
        if None in values:
            i = values.index(None)
            raise ValueError(f"{one}; prompt_ids[{i}] is {items[i]!r}, not an integer token id")
        ids = torch.tensor(values, dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("generate needs a non-empty prompt")
    outside = (ids < 0) | (ids >= vocab)
    if bool(outside.any()):
        i = int(outside.nonzero()[0, 0])
        raise ValueError(
            f"prompt id {int(ids[i])} (position {i}) is outside the target vocabulary [0, {vocab})"
        )
    return ids


def _truncate(tokens: list[int], limit: int, eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens[:limit]):
        if t in eos:
            return tokens[: i + 1]
    return tokens[:limit]
