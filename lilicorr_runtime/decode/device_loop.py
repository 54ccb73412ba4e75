"""The device-resident decode loop: a whole block (draft, verify, accept, commit, the next block's context) is
one CUDA-graph replay over static state, for up to `batch` requests at once.

Every per-request quantity lives on the device, one row per slot: the anchor token and its context row, the
committed length (target rows = draft context rows, since context row r is target row r), the emitted tokens
and their count, the accepted count of every block, and whether the request is still running. A block reads
and writes only that state, so one captured graph serves every block of every request; the host launches it
and reads back one flag per slot (one sync per block) to see which requests ended, copies a finished
request's tokens out once, and prefills a waiting request into the freed slot (rows of different lengths sit
side by side: each row attends to its own first `length` rows and rotates at its own positions).

A block, per slot (inactive slots compute too, static shapes, but commit nothing):

    draft    [anchor, mask x n] through the drafter over the slot's context -> draft tokens d_1..d_n
    verify   one target step over [anchor, d_1..d_n] at the slot's rows length..length+n
    accept   a = accepted prefix, bonus = the target's token after it (greedy, or exact rejection sampling)
    commit   tokens d_1..d_a, bonus -> the output at out_len..; a -> the block log; eos / max_new_tokens end it
    context  the verify rows' features -> context rows; K/V of all n+1 rows written at length..length+n; the
             first a+1 are kept by advancing length by a+1 (the rest are beyond it, masked, overwritten later)

`mode="ar"` is the same loop with n = 0: one target step per block, nothing drafted.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence

import msgspec
import torch

from ..model.dflash import Drafter, DraftKVCache
from ..ops.draft import control_walk, greedy_walk, sample_walk
from ..target.fast import StaticKVCache
from .draft_step import propose
from .verify import categorical, verify_greedy, verify_sampled


class LoopOutput(msgspec.Struct, frozen=True):
    """One finished request: its emitted tokens (the prefill's first included, truncated at max_new_tokens and
    the first eos) and each block's accepted count."""

    slot: int
    tokens: list[int]
    accepted: list[int]
    wall_time_s: float


def _views(cache_keys: Sequence[torch.Tensor], cache_values: Sequence[torch.Tensor], slot: int):
    return [k[slot : slot + 1] for k in cache_keys], [v[slot : slot + 1] for v in cache_values]


class DecodeLoop:
    """Static state and the captured block for `batch` slots; see the module docstring.

    target: a FastTarget (static cache, `core.forward`); drafter: None for mode "ar". `capacity`: rows per slot
    (prompt + max_new_tokens + one block, at least). `max_new_tokens`: the largest a request may ask for.
    """

    def __init__(
        self,
        target,
        drafter: Drafter | None,
        *,
        mode: str,
        num_tokens: int,
        temperature: float,
        batch: int,
        capacity: int,
        max_new_tokens: int,
        eos_token_ids: Sequence[int],
        generator: torch.Generator,
        use_graph: bool = True,
    ):
        self.target, self.drafter, self.mode = target, drafter, mode
        self.n = 0 if mode == "ar" else num_tokens
        self.temperature = float(temperature)
        self.batch, self.capacity, self.max_new_tokens = batch, capacity, max_new_tokens
        self.generator = generator
        device = target.device
        self.device = device
        self.walk = (
            None
            if mode == "ar"
            else "control"
            if mode == "control"
            else "sample"
            if self.temperature > 0
            else "greedy"
        )
        self.taps = () if drafter is None else tuple(drafter.target_layer_ids)
        self.target_cache: StaticKVCache = target.core.new_cache(batch, capacity)
        self.draft_cache: DraftKVCache | None = (
            None if drafter is None else drafter.new_cache(batch, capacity)
        )
        m = target.hidden_size
        long = {"dtype": torch.long, "device": device}
        out_width = max_new_tokens + self.n + 1  # a block may run past max_new_tokens by n tokens
        blocks_width = max_new_tokens + 1
        self.state: dict[str, torch.Tensor] = {
            "anchor": torch.zeros(batch, **long),
            "anchor_hidden": torch.zeros(
                batch, m, dtype=target.dtype if drafter is None else drafter.fc.weight.dtype, device=device
            ),
            "length": torch.zeros(batch, **long),
            "active": torch.zeros(batch, dtype=torch.bool, device=device),
            "out": torch.zeros(batch, out_width + 1, **long),  # the last column takes the writes of no token
            "out_len": torch.zeros(batch, **long),
            "limit": torch.ones(batch, **long),
            "blocks": torch.zeros(batch, **long),
            "accepted": torch.zeros(batch, blocks_width + 1, **long),
        }
        eos = list(eos_token_ids) or [-1]
        self.eos = torch.tensor(eos, **long)
        self.pad = torch.zeros(batch, **long)
        n = max(self.n, 1)
        self.uniforms = {  # drawn on the host from the decoder's generator each block, as the eager loop draws them
            "walk": torch.zeros(batch, n, device=device),
            "accept": torch.zeros(batch, n, device=device),
            "residual": torch.zeros(batch, device=device),
        }
        self.temperatures = torch.full((batch,), max(self.temperature, 1e-5), device=device)
        self.no_greedy = torch.zeros(batch, dtype=torch.bool, device=device)
        if drafter is not None:
            self.masks = torch.full((batch, self.n), drafter.mask_token_id, **long)
        self.use_graph = use_graph and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self._captured = False
        self.started: dict[int, float] = {}
        self.steps = 0  # blocks run, and the wall time spent in step() (bench/decode.py reads both)
        self.step_seconds = 0.0
        self._host_active = torch.zeros(batch, dtype=torch.bool, pin_memory=device.type == "cuda")

    # -- one block ------------------------------------------------------------------------------------------

    def _body(self) -> None:
        self._accept(self._verify(self._draft()))

    def _draft(self) -> dict[str, torch.Tensor]:
        """The draft step for every slot: ids [b, n+1] = [anchor, d_1..d_n] (the anchor alone in "ar"), and for
        sampled verification the proposal q_cand / candidate_ids."""
        st, target, drafter = self.state, self.target, self.drafter
        anchor = st["anchor"]
        if drafter is None:
            return {"ids": anchor[:, None]}
        block = torch.cat([anchor[:, None], self.masks], dim=1)  # [b, n+1]
        hidden = drafter.forward_static(self.draft_cache, st["length"], target.embed(block))
        out = propose(
            drafter, hidden, st["anchor_hidden"], target.embed, target.logits, score=self.walk != "control"
        )
        drafted = {}
        if self.walk == "control":
            draft = control_walk(out["logits"])
        elif self.walk == "greedy":
            draft = greedy_walk(out["start"], out["pairs"], out["candidate_ids"])
        else:
            draft, drafted["q_cand"] = sample_walk(
                out["start"],
                out["pairs"],
                out["candidate_ids"],
                self.uniforms["walk"],
                self.temperatures,
                self.no_greedy,
            )
            drafted["candidate_ids"] = out["candidate_ids"]
        drafted["ids"] = torch.cat([anchor[:, None], draft], dim=1)
        return drafted

    def _verify(self, drafted: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One target step over every slot's [anchor, d_1..d_n] at its rows length..length+n."""
        logits, features = self.target._eager(
            self.target_cache, drafted["ids"], self.state["length"], self.pad, self.taps, False
        )
        return {**drafted, "logits": logits, **({} if features is None else {"features": features})}

    def _accept(self, verified: dict[str, torch.Tensor]) -> None:
        """Acceptance, then the commit (see `_commit`)."""
        b, n = self.batch, self.n
        logits, ids = verified["logits"], verified["ids"]
        sampled = self.temperature > 0
        if self.drafter is None:  # ar: the target's own token
            if sampled:
                probs = torch.softmax(logits[:, 0] / self.temperature, dim=-1)
                bonus = categorical(probs, self.uniforms["residual"])
            else:
                bonus = logits[:, 0].argmax(dim=-1)
            accepted = torch.zeros(b, dtype=torch.long, device=self.device)
            emitted = bonus[:, None]
        else:
            draft = ids[:, 1:]
            if not sampled:
                accepted, bonus = verify_greedy(logits, draft)
            else:
                q = torch.zeros(b, n, logits.shape[-1], device=self.device)
                if "q_cand" not in verified:  # a greedy proposal is a point mass on the drafted token
                    q.scatter_(2, draft[..., None], 1.0)
                else:
                    q.scatter_(2, verified["candidate_ids"], verified["q_cand"])
                probs = torch.softmax(logits / self.temperature, dim=-1)
                accepted, bonus = verify_sampled(
                    probs, draft, q, self.uniforms["accept"], self.uniforms["residual"]
                )
            # emitted[j] = d_{j+1} for j < a, the bonus at j = a (positions past a are not written)
            j = torch.arange(n + 1, device=self.device)[None, :]
            emitted = torch.where(
                j < accepted[:, None], torch.cat([draft, draft[:, :1]], dim=1), bonus[:, None]
            )
        accepted = torch.where(self.state["active"], accepted, 0)
        self._commit(emitted, accepted, bonus, verified.get("features"))

    def _commit(
        self,
        emitted: torch.Tensor,
        accepted: torch.Tensor,
        bonus: torch.Tensor,
        features: torch.Tensor | None,
    ) -> None:
        st = self.state
        active = st["active"]
        width = emitted.shape[1]
        j = torch.arange(width, device=self.device)[None, :]
        written = active[:, None] & (j <= accepted[:, None])  # [b, n+1]
        trash = st["out"].shape[1] - 1
        st["out"].scatter_(1, torch.where(written, st["out_len"][:, None] + j, trash), emitted)
        hit_eos = ((emitted[:, :, None] == self.eos).any(dim=2) & written).any(dim=1)
        out_len = st["out_len"] + torch.where(active, accepted + 1, 0)
        done = hit_eos | (out_len >= st["limit"])
        log_trash = st["accepted"].shape[1] - 1
        st["accepted"].scatter_(1, torch.where(active, st["blocks"], log_trash)[:, None], accepted[:, None])
        st["blocks"].add_(active.long())
        if self.drafter is not None:
            context = self.drafter.project_context(features)  # [b, n+1, M]
            self.drafter.append_context_static(self.draft_cache, context, st["length"])
            kept = context.gather(1, accepted[:, None, None].expand(-1, 1, context.shape[2]))[:, 0]
            st["anchor_hidden"].copy_(torch.where(active[:, None], kept, st["anchor_hidden"]))
        st["anchor"].copy_(torch.where(active, bonus, st["anchor"]))
        st["length"].add_(torch.where(active, accepted + 1, 0))
        st["out_len"].copy_(out_len)
        st["active"].copy_(active & ~done)

    def _capture(self) -> None:
        """Capture the block once; warm-up runs (which advance the state) are undone before it."""
        self._captured = True
        saved = {k: v.clone() for k, v in self.state.items()}
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # compiles the kernels and settles the allocator before capture
                    self._body()
            torch.cuda.current_stream().wait_stream(stream)
            for k, v in self.state.items():
                v.copy_(saved[k])
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._body()
            self.graph = graph
        except Exception as exc:  # a capture failure must not stop decoding; it costs speed only
            self.graph = None
            warnings.warn(
                f"CUDA graph capture of the decode block failed ({type(exc).__name__}: {exc}); blocks run "
                "eagerly, hundreds of kernel launches each",
                RuntimeWarning,
                stacklevel=3,
            )
        for k, v in self.state.items():
            v.copy_(saved[k])

    def _draw_uniforms(self) -> None:
        # the eager loop's order per block: the walk's (sampled head only), then verification's accept and residual
        if self.temperature <= 0:
            return
        b, n = self.batch, max(self.n, 1)
        if self.walk == "sample":
            self.uniforms["walk"].copy_(torch.rand(b, n, generator=self.generator))
        if self.drafter is not None:
            self.uniforms["accept"].copy_(torch.rand(b, n, generator=self.generator))
        self.uniforms["residual"].copy_(torch.rand(b, generator=self.generator))

    @torch.inference_mode()
    def step(self) -> list[int]:
        """Run one block for every slot; returns the slots whose request ended in it (one host sync)."""
        begin = time.perf_counter()
        before = self._host_active.clone()
        self._draw_uniforms()
        if self.use_graph and not self._captured:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        self._host_active.copy_(self.state["active"], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        ended = torch.nonzero(before & ~self._host_active).flatten().tolist()
        self.steps += 1
        self.step_seconds += time.perf_counter() - begin
        return ended

    # -- requests ---------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, slot: int, prompt: torch.Tensor, max_new_tokens: int) -> bool:
        """Prefill `prompt` (1-D int64) into `slot` and emit its first token; False when the request ended there
        (its first token is an eos, or max_new_tokens is 1): `take` it at once."""
        self.started[slot] = time.perf_counter()
        target, drafter, st = self.target, self.drafter, self.state
        p = prompt.numel()
        if p + max_new_tokens + self.n + 1 > self.capacity or max_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"a request of {p} prompt tokens and {max_new_tokens} new ones does not fit this loop "
                f"(capacity {self.capacity} rows, at most {self.max_new_tokens} new tokens)"
            )
        keys, values = _views(self.target_cache.keys, self.target_cache.values, slot)
        row_cache = StaticKVCache.over(keys, values)
        ids = prompt.to(self.device)[None]
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        logits, features = target._eager(row_cache, ids, zero, zero, self.taps, True)  # last row's logits
        last = logits[0, -1]
        if self.temperature == 0:
            first = last.argmax()
        else:
            probs = torch.softmax(last / self.temperature, dim=-1)[None]
            first = categorical(probs, torch.rand(1, generator=self.generator).to(self.device))[0]
        if drafter is not None:
            context = drafter.project_context(features)  # [1, P, M]
            dk, dv = _views(self.draft_cache.keys, self.draft_cache.values, slot)
            drafter.append_context_static(DraftKVCache.over(dk, dv), context, zero)
            st["anchor_hidden"][slot] = context[0, -1]
        st["anchor"][slot] = first
        st["length"][slot] = p
        st["out"][slot, 0] = first
        st["out_len"][slot] = 1
        st["limit"][slot] = max_new_tokens
        st["blocks"][slot] = 0
        running = bool((first != self.eos).all()) and max_new_tokens > 1  # one sync per request
        st["active"][slot] = running
        self._host_active[slot] = running
        return running

    def take(self, slot: int) -> LoopOutput:
        """The finished request in `slot` (one copy back)."""
        st = self.state
        count, blocks = int(st["out_len"][slot]), int(st["blocks"][slot])
        tokens = st["out"][slot, :count].tolist()
        accepted = st["accepted"][slot, :blocks].tolist()
        limit = int(st["limit"][slot])
        eos = set(self.eos.tolist())
        cut = next((i + 1 for i, t in enumerate(tokens[:limit]) if t in eos), min(len(tokens), limit))
        self._host_active[slot] = False
        return LoopOutput(
            slot=slot,
            tokens=tokens[:cut],
            accepted=accepted,
            wall_time_s=time.perf_counter() - self.started.pop(slot, time.perf_counter()),
        )

    def run(
        self,
        prompts: Sequence[torch.Tensor],
        max_new_tokens: int,
        progress: Callable[[int, float], None] | None = None,
    ) -> list[LoopOutput]:
        """Decode every prompt, `batch` at a time, refilling a slot as soon as its request ends. Outputs in
        prompt order. `progress(ended, seconds)`, if given, is called after every block with the number of requests
        that ended in it (0 when none did: a batch of long requests still reports each block) and the block's wall
        time (admissions not included), and as progress(1, 0.0) for a request that ended at its admission."""
        results: list[LoopOutput | None] = [None] * len(prompts)
        owner: dict[int, int] = {}
        waiting = list(range(len(prompts)))[::-1]
        free = list(range(self.batch))[::-1]

        def fill() -> None:
            while free and waiting:
                slot, index = free.pop(), waiting.pop()
                owner[slot] = index
                if not self.admit(slot, prompts[index], max_new_tokens):
                    results[index] = self.take(slot)
                    del owner[slot]
                    free.append(slot)
                    if progress is not None:
                        progress(1, 0.0)

        fill()
        while owner:
            before = self.step_seconds
            ended = self.step()
            for slot in ended:
                results[owner.pop(slot)] = self.take(slot)
                free.append(slot)
            if progress is not None:
                progress(len(ended), self.step_seconds - before)
            fill()
        return [r for r in results if r is not None]
