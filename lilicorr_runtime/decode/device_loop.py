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

from ..graphs import capture, warm_up
from ..model.drafter import Drafter, DraftKVCache
from ..target.fast import PREFILL_ROWS, StaticKVCache
from .block import Walk, accept, categorical, commit, draft, emitted, target_token, verify
from .draft_step import warn_once


class LoopOutput(msgspec.Struct, frozen=True):
    """One finished request: its emitted tokens (the prefill's first included, truncated at max_new_tokens and
    the first eos) and each block's accepted count."""

    slot: int
    tokens: list[int]
    accepted: list[int]
    wall_time_s: float


def _views(cache_keys: Sequence[torch.Tensor], cache_values: Sequence[torch.Tensor], slot: int):
    return [k[slot : slot + 1] for k in cache_keys], [v[slot : slot + 1] for v in cache_values]


def prefill_bucket(rows: int) -> int:
    """The row count a captured prefill of `rows` prompt tokens runs: `rows` rounded up to 16 (to 64 rows), to 32
    (to 256) or to 64 (to PREFILL_ROWS), so that a few graphs serve every prompt length. The padding rows are
    computed and ignored: each step-kernel row is computed from its own row and the rows before it alone."""
    for grain, top in ((16, 64), (32, 256), (64, PREFILL_ROWS)):
        if rows <= top:
            return -(-rows // grain) * grain
    return rows


REPORTS = 3  # pinned report buffers (and events) a loop cycles through


class _Launched:
    """A block in flight: the host's active slots when it was launched, its report (pinned: active flags and
    output lengths after it), and the event that marks its end."""

    __slots__ = ("before", "event", "report")

    def __init__(self, before: list[bool], report: torch.Tensor, event: torch.cuda.Event | None):
        self.before, self.report, self.event = before, report, event


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
        self.walk: Walk | None = (
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
        # blocks run, the wall time spent in step(), and the part of it the host was not waiting for the GPU
        # (bench/decode.py reads them)
        self.steps = 0
        self.step_seconds = 0.0
        self.host_seconds = 0.0
        self._host_active = [False] * batch  # the host's view: admitted and not yet reported ended
        # what the host knows of each slot from the last report: output length and limit (the pipelining rule)
        self._host_out_len = [0] * batch
        self._host_limit = [0] * batch
        self._inflight: _Launched | None = None
        # the host's copies of the reports, reused in turn: at most two blocks are pending (the one waited for and
        # the one launched ahead), and a report is read before the block after the next is launched
        self._reports: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        self._launches = 0
        # the report a block leaves for the host: row 0 the active flags, row 1 the output lengths
        self.report = torch.zeros(2, batch, **long)
        # admission: the prompt ids (padded to a bucket), and slot, prompt length, last row, limit
        self.admission = {
            "ids": torch.zeros(1, capacity, **long),
            "scalars": torch.zeros(4, **long),
            "uniform": torch.zeros(1, device=device),
            "zero": torch.zeros(1, **long),
            "one": torch.ones(1, **long),
        }
        # a batch of one prefills its only slot in place; a wider one prefills into a one-row staging cache and
        # copies it into the slot (one kernel per K and V), so one captured prefill serves every slot
        self.stage_cache: StaticKVCache = (
            self.target_cache if batch == 1 else target.core.new_cache(1, capacity)
        )
        self._admit_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor | None]] = {}
        self._admit_eager = False  # set when a capture failed: admissions run eagerly from then on

    # -- one block ------------------------------------------------------------------------------------------

    def _body(self) -> None:
        self._accept(self._verify(self._draft()))
        self.report[0].copy_(self.state["active"])
        self.report[1].copy_(self.state["out_len"])

    @property
    def _draft_cache(self) -> DraftKVCache:
        """The drafter's cache (allocated whenever there is a drafter)."""
        cache = self.draft_cache
        assert cache is not None
        return cache

    def _draft(self) -> dict[str, torch.Tensor]:
        """`block.draft` for every slot over its context: the draft tokens [b, n] and, for sampled verification,
        the walk's q [b, n, K] and candidate_ids [b, n, K]; nothing in "ar"."""
        st, target, drafter = self.state, self.target, self.drafter
        if drafter is None:
            return {}
        _, proposed = draft(
            drafter,
            target.embed,
            target.logits,
            self._draft_cache,
            st["length"],
            st["anchor"],
            st["anchor_hidden"],
            self.masks,
            self.walk,
            uniforms=self.uniforms["walk"],
            temperatures=self.temperatures,
            greedy=self.no_greedy,
        )
        # only what acceptance reads outlives the draft (the logits and scores are freed for the verify forward)
        kept = ("tokens", "q", "candidate_ids") if "q" in proposed else ("tokens",)
        return {k: proposed[k] for k in kept}

    def _verify(self, drafted: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`block.verify`: one target step over every slot's [anchor, d_1..d_n] at its rows length..length+n."""
        length = self.state["length"]

        def forward(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            return self.target._eager(self.target_cache, ids, length, self.pad, self.taps, False)

        ids, logits, features = verify(forward, self.state["anchor"], drafted.get("tokens"))
        return {
            **drafted,
            "ids": ids,
            "logits": logits,
            **({} if features is None else {"features": features}),
        }

    def _accept(self, verified: dict[str, torch.Tensor]) -> None:
        """`block.accept` (in "ar", `block.target_token`), then `block.commit` of the active slots."""
        logits, ids = verified["logits"], verified["ids"]
        if self.drafter is None:  # ar: the target's own token
            bonus = target_token(logits[:, 0], self.temperature, self.uniforms["residual"])
            accepted = torch.zeros(self.batch, dtype=torch.long, device=self.device)
            tokens = bonus[:, None]
        else:
            draft_tokens = ids[:, 1:]
            accepted, bonus = accept(
                logits,
                draft_tokens,
                self.temperature,
                verified,
                self.uniforms["accept"],
                self.uniforms["residual"],
            )
            tokens = emitted(draft_tokens, accepted, bonus)
        accepted = torch.where(self.state["active"], accepted, 0)
        commit(
            self.state,
            tokens,
            accepted,
            bonus,
            self.eos,
            self.drafter,
            self.draft_cache,
            verified.get("features"),
        )

    def _capture(self) -> None:
        """Capture the block once; warm-up runs (which advance the state) are undone before it."""
        self._captured = True
        saved = {k: v.clone() for k, v in self.state.items()}
        try:
            warm_up(self._body)
            for k, v in self.state.items():
                v.copy_(saved[k])
            self.graph, _ = capture(self._body)
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
            self._upload(self.uniforms["walk"], torch.rand(b, n, generator=self.generator))
        if self.drafter is not None:
            self._upload(self.uniforms["accept"], torch.rand(b, n, generator=self.generator))
        self._upload(self.uniforms["residual"], torch.rand(b, generator=self.generator))

    def _upload(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Host -> device in stream order without waiting for the GPU (pinned, so the copy is asynchronous; the
        pinned allocator keeps the block until the copy has run)."""
        if self.device.type == "cuda":
            dst.copy_(src.pin_memory(), non_blocking=True)
        else:
            dst.copy_(src)

    def _launch(self) -> _Launched:
        """Enqueue one block (the graph, or the eager body) and the copy of its report to the host."""
        self._draw_uniforms()
        if self.use_graph and not self._captured:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        before = list(self._host_active)
        if self.device.type != "cuda":
            return _Launched(before, self.report.clone(), None)
        if not self._reports:  # allocated once: a pinned buffer and an event per block that can be pending
            self._reports = [
                (torch.empty(self.report.shape, dtype=self.report.dtype, pin_memory=True), torch.cuda.Event())
                for _ in range(REPORTS)
            ]
        report, event = self._reports[self._launches % REPORTS]
        self._launches += 1
        report.copy_(self.report, non_blocking=True)
        event.record()
        return _Launched(before, report, event)

    def _pipelined(self) -> bool:
        """Whether the next block is launched before the current one is waited for: on CUDA, where launching is
        asynchronous (on the CPU a block runs as it is launched, so there is nothing to overlap)."""
        return self.device.type == "cuda"

    def _may_end(self) -> bool:
        """Whether a running request may end in the block in flight, as far as the host can tell before it
        ends: always possible by an eos; by its limit when its last known output length is within a block of
        it. A batch of one then does not launch the next block ahead (it would run for nothing)."""
        if self.batch > 1:  # the other slots use the block
            return False
        if self.temperature > 0:  # the next block would draw its uniforms: keep the eager loop's draws
            return True
        reach = self.n + 1  # the last report is the block's before the one in flight
        return any(
            active and out_len + reach >= limit
            for active, out_len, limit in zip(
                self._host_active, self._host_out_len, self._host_limit, strict=True
            )
        )

    @torch.inference_mode()
    def step(self) -> list[int]:
        """Run one block for every slot; returns the slots whose request ended in it (one host sync).

        On CUDA the next block is launched before this one is waited for (the state lives on the device, and a
        slot that ended commits nothing in it), so the GPU never waits for the host between blocks; a batch of
        one does so only while its request cannot end in the block in flight (`_may_end`). A request admitted
        after this call joins at the next block launched."""
        begin = time.perf_counter()
        current = self._inflight if self._inflight is not None else self._launch()
        self._inflight = None
        if self._pipelined() and not self._may_end():
            self._inflight = self._launch()
        waited = time.perf_counter()
        if current.event is not None:
            current.event.synchronize()
        waited = time.perf_counter() - waited
        active, out_len = current.report.tolist()
        before = current.before
        ended = [s for s in range(self.batch) if before[s] and not active[s]]
        for s in range(self.batch):
            if before[s]:
                self._host_out_len[s] = out_len[s]
        for s in ended:
            self._host_active[s] = False
            if self._inflight is not None:  # the block launched ahead ran without it: a new request there is
                self._inflight.before[s] = False  # not that block's to end
        self.steps += 1
        elapsed = time.perf_counter() - begin
        self.step_seconds += elapsed
        self.host_seconds += elapsed - waited
        return ended

    def drain(self) -> None:
        """Wait for the block in flight, if any (its slots' state is final once it has run)."""
        if self._inflight is not None and self._inflight.event is not None:
            self._inflight.event.synchronize()

    # -- requests ---------------------------------------------------------------------------------------------

    def _admit_body(self, rows: int, p: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The target's part of an admission over the first `rows` rows of the staged ids (`p` of them the
        prompt's): the prefill into the staging cache, the first token, the slot's state and, for a batch of
        more than one, the copy of the staged cache into the slot. Shapes depend on `rows` only, so a captured
        replay serves every prompt that rounds to it; returns (features [1, rows, T·M] or None, the first token
        [1])."""
        target, st, a = self.target, self.state, self.admission
        scalars = a["scalars"]
        slot, length, last, limit = scalars[0:1], scalars[1:2], scalars[2:3], scalars[3:4]
        zero = a["zero"]
        hidden, features = target.core.forward(
            self.stage_cache,
            target.embed_tokens(a["ids"][:, :rows]),
            zero,
            zero,
            self.taps,
            step_kernels=True if p <= PREFILL_ROWS else None,
        )
        logits = target.step_logits(hidden.index_select(1, last))[0, 0]  # the last prompt row's [V]
        if self.temperature == 0:
            first = logits.argmax()[None]
        else:
            probs = torch.softmax(logits / self.temperature, dim=-1)[None]
            first = categorical(probs, a["uniform"])
        if self.stage_cache is not self.target_cache:
            for block, staged in (
                (self.target_cache.key_block, self.stage_cache.key_block),
                (self.target_cache.value_block, self.stage_cache.value_block),
            ):
                assert block is not None and staged is not None  # both caches allocated their blocks
                block.index_copy_(1, slot, staged)
        running = (first != self.eos).all(dim=0, keepdim=True) & (limit > 1)
        st["anchor"].index_copy_(0, slot, first)
        st["length"].index_copy_(0, slot, length)
        st["out"][:, 0].index_copy_(0, slot, first)
        st["out_len"].index_copy_(0, slot, a["one"])
        st["limit"].index_copy_(0, slot, limit)
        st["blocks"].index_copy_(0, slot, zero)
        st["active"].index_copy_(0, slot, running)
        return features, first

    def _admit_target(self, p: int) -> torch.Tensor | None:
        """Run the target's part of an admission: a captured replay over the prompt's bucket where one fits
        the cache, else eagerly over the prompt's rows. Returns the prompt rows' features (None in "ar")."""
        rows = prefill_bucket(p)
        if not self.use_graph or self._admit_eager or rows > min(self.capacity, PREFILL_ROWS):
            features, _ = self._admit_body(p, p)
            return None if features is None else features[:, :p]
        entry = self._admit_graphs.get(rows)
        if entry is None:
            try:  # warm-ups admit this very request (an admission is idempotent), then the capture
                warm_up(lambda: self._admit_body(rows, p))
                graph, (features, _) = capture(lambda: self._admit_body(rows, p))
                entry = self._admit_graphs[rows] = (graph, features)
            except Exception as exc:  # speed only: admissions then run eagerly
                self._admit_eager = True
                warn_once(
                    "admission",
                    f"CUDA graph capture of the prefill failed ({type(exc).__name__}: {exc}); requests are "
                    "admitted eagerly",
                )
                features, _ = self._admit_body(p, p)
                return None if features is None else features[:, :p]
        graph, features = entry
        graph.replay()
        return None if features is None else features[:, :p]

    @torch.inference_mode()
    def admit(self, slot: int, prompt: torch.Tensor, max_new_tokens: int) -> bool:
        """Prefill `prompt` (1-D int64) into `slot` and emit its first token, without waiting for the GPU.
        False when the request ends there by its limit (max_new_tokens 1): `take` it at once. A request whose
        first token is an eos is reported ended by the next `step()` (the block commits nothing for it).

        The prefill runs the step kernels (each row as the one-token step computes it) from a graph captured
        per row bucket (`prefill_bucket`); the drafter's context of the prompt rows runs eagerly, on exactly
        those rows, as the eager loop computes it."""
        self.started[slot] = time.perf_counter()
        drafter, st, a = self.drafter, self.state, self.admission
        p = prompt.numel()
        if p + max_new_tokens + self.n + 1 > self.capacity or max_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"a request of {p} prompt tokens and {max_new_tokens} new ones does not fit this loop "
                f"(capacity {self.capacity} rows, at most {self.max_new_tokens} new tokens)"
            )
        if not 0 <= slot < self.batch:
            raise ValueError(f"slot {slot} is outside this loop's {self.batch} slots")
        rows = prefill_bucket(p)
        ids = torch.zeros(1, rows if rows <= self.capacity else p, dtype=torch.long)
        ids[0, :p] = prompt.reshape(-1).cpu()
        self._upload(a["ids"][:, : ids.shape[1]], ids)
        self._upload(a["scalars"], torch.tensor([slot, p, p - 1, max_new_tokens], dtype=torch.long))
        if self.temperature > 0:
            self._upload(a["uniform"], torch.rand(1, generator=self.generator))
        features = self._admit_target(p)
        if drafter is not None:  # exactly the eager loop's context computation, on the prompt's rows
            assert features is not None  # the drafter's taps
            context = drafter.project_context(features)  # [1, P, M]
            dk, dv = _views(self._draft_cache.keys, self._draft_cache.values, slot)
            drafter.append_context_static(DraftKVCache.over(dk, dv), context, a["zero"])
            st["anchor_hidden"][slot] = context[0, -1]
        running = max_new_tokens > 1
        self._host_active[slot] = running
        self._host_out_len[slot], self._host_limit[slot] = 1, max_new_tokens
        return running

    def take(self, slot: int) -> LoopOutput:
        """The finished request in `slot` (one copy back)."""
        st = self.state
        row = torch.cat(
            [st["out_len"][slot, None], st["blocks"][slot, None], st["out"][slot], st["accepted"][slot]]
        ).tolist()
        count, blocks = row[0], row[1]
        tokens = row[2 : 2 + count]
        accepted = row[2 + st["out"].shape[1] :][:blocks]
        limit = self._host_limit[slot]
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
