"""The layer kernel: every decoder layer of a small target's step in one persistent launch.

A SmolLM2-sized step is latency-bound, not bandwidth-bound: its 30 layers run five kernels each (step_triton.py),
150 launches a step, each streaming only 0.7-3.5 MB of weights. The layer kernel launches at most one program
per SM once per step; the programs walk the layers' phases in order,

    qkv GEMM (norm prologue) | rope, K/V write, attention | o_proj + residual | gate_up (norm, SiLU·up) | down + residual

taking each phase's work units round-robin. A unit is one program of the standalone kernel (`_linear_unit`,
`_attention_unit`, the very code `_step_linear` and `_attention` run) on the same tiles (those tuned for the
standalone GEMMs), so a row comes out bit for bit as the five-kernel step computes it, whichever path a step of
another row count takes: batch invariance holds across the two paths (tested on an H200 at 1 to 32 rows).

Phases are ordered by counters, not grid barriers: a unit counts itself done (release, GPU scope) on its
phase's counter once its stores are issued, and a program's first unit of the next phase first fetches its first
weight tile, then spins (plain loads, then one acquiring read) until the phase before has all its units done.
A program with no unit in a phase goes straight on. Reads of what other programs wrote go through L2 (cache
modifier ".cg"), and each layer's weights and visible cache rows are prefetched into L2 while the layer before
runs. Every program must be resident at once, hence at most one per SM; a program that spins too long (not all
resident: another process's kernels, a GPU partition) bumps every counter so that no later wait spins and raises
a flag that stays set: a wrong step, never a hang. `LayerKernel.launch` reads the flag after its first launch
(and then runs the step the standalone way, and never the layer kernel again); `problem()` reads it later (smoke
does, after its arms).

Used on CUDA for steps of at most LAYER_ROWS rows (FUSED_ROWS per sequence), for Llama / Qwen2 / Qwen3 targets
whose layer weights fit LAYER_BYTES (they are restacked per kind, one tensor for all layers) and whose tuned tiles
share one warp count and take no stream-K cut; the first step (a prefill, standalone) tunes or reads those tiles.
Off unless LILICORR_LAYER_KERNEL=on. On an H200 (docs/performance.md) it first made the SmolLM2 step 0.83 ms
against 0.93 ms of the five kernels (what is left is each unit's own chain of dependent loads, ~5 us, not launches
or waits: phases that did not wait at all took 0.79 ms). Once the step GEMMs took their norms' sums of squares
from a dot (step_triton.py), the five kernels got faster and this kernel slower: 707 against 831 us of kernel
time per SmolLM2 step, hence off by default.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .. import rows, settings
from . import step_triton as st

LAYER_ROWS = rows.STEP  # a step of at most this many rows (all sequences) runs the layer kernel
LAYER_BYTES = 4 << 30  # restack (and run the layer kernel for) targets whose layer weights fit this
_NO_WAIT = False  # a timing experiment only: phases that do not wait for each other compute garbage
SPIN_LIMIT = 1 << 22  # polls of a phase's counter before a program gives up waiting (the error flag)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def prefetch_enabled() -> bool:
    """LILICORR_LAYER_PREFETCH (on by default): the layer kernel fetches the next layer's weights and cache rows
    into L2."""
    return settings.layer_prefetch()


def enabled() -> bool:
    """LILICORR_LAYER_KERNEL: on, or off (the default)."""
    return settings.layer_kernel()


@triton.jit
def _prefetch_l2(base, elements, pid, P, PREFETCH: tl.constexpr):
    """Program pid's share (1/P, in 128-byte lines) of `elements` bf16 weights at base, fetched into L2 and
    not waited for: the layer's GEMMs then read their weights from L2 instead of from memory."""
    if PREFETCH:
        line = 64  # elements of 2 bytes per 128-byte line
        share = tl.cdiv(tl.cdiv(elements, P), line) * line
        start = pid * share
        end = tl.minimum(elements, start + share)
        offs = tl.arange(0, 128) * line
        for c in range(start, end, 128 * line):
            at = tl.minimum(c + offs, end - 1).to(tl.int64)
            tl.inline_asm_elementwise(
                "mov.u32 $0, 0; prefetch.global.L2 [$1];",
                "=r,l",
                [base + at],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )


@triton.jit
def _prefetch_layer(w_qkv, w_o, w_gu, w_dn, layer, NQKV, HID, HQ, INTER, pid, P, PREFETCH: tl.constexpr):
    """Layer `layer`'s four weight matrices into L2 (see `_prefetch_l2`)."""
    lo = tl.full((), 0, tl.int64) + layer
    _prefetch_l2(w_qkv + lo * NQKV * HID, NQKV * HID, pid, P, PREFETCH)
    _prefetch_l2(w_o + lo * HID * HQ, HID * HQ, pid, P, PREFETCH)
    _prefetch_l2(w_gu + lo * 2 * INTER * HID, 2 * INTER * HID, pid, P, PREFETCH)
    _prefetch_l2(w_dn + lo * HID * INTER, HID * INTER, pid, P, PREFETCH)


@triton.jit
def _prefetch_cache(kc, vc, hi, B, KV, s_c_b, s_c_h, s_c_r, pid, P, PREFETCH: tl.constexpr):
    """Cache rows 0..hi-1 of every sequence and KV head of one layer's K and V into L2 (see `_prefetch_l2`)."""
    if PREFETCH:
        for region in range(0, B * KV):
            at = (region // KV).to(tl.int64) * s_c_b + (region % KV).to(tl.int64) * s_c_h
            _prefetch_l2(kc + at, hi * s_c_r, pid, P, PREFETCH)
            _prefetch_l2(vc + at, hi * s_c_r, pid, P, PREFETCH)


@triton.jit
def _gemm_phase(
    x_ptr,
    w_ptr,
    bias_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    K_SPLIT,
    M_PAD,
    eps,
    s_xm,
    s_rm,
    s_ym,
    pid,
    P,
    SPLIT,
    wait_ptr,
    wait_target,
    done_ptr,
    done_base,
    n_done,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    LIMIT: tl.constexpr,
    WAIT: tl.constexpr,
    KT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The units of one GEMM (the standalone grid (row tiles, column tiles, K slices), row tile fastest), this
    program taking every P-th from `pid`: the first waits (after fetching its first weight tile) for the phase
    before to be done (wait_ptr reaching wait_target), each counts itself done at done_ptr."""
    m_tiles = tl.cdiv(M, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    units = m_tiles * n_tiles * SPLIT
    for u in range(pid, units, P):
        pid_m = u % m_tiles
        rest = u // m_tiles
        st._linear_unit(
            x_ptr, w_ptr, bias_ptr, g_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_SPLIT, M_PAD, eps,
            s_xm, K, s_rm, s_ym, pid_m, rest % n_tiles, rest // n_tiles, n_tiles,
            NORM, BIAS, RESIDUAL, GATED, False, UPCAST, PRECISION, SPLIT, 0, ".cg",
            wait_ptr, tl.where(u == pid, wait_target, 0), done_base, n_done, WAIT, LIMIT, KT, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        tl.debug_barrier()  # every thread's stores are issued before the unit counts itself done
        tl.atomic_add(done_ptr, 1, sem="release", scope="gpu")


# fmt: off
# (the bundled kernel table keys this kernel's variants by a hash of its source text: formatting it would make
# them stale)
@triton.jit
def _layer_kernel(
    x_ptr,
    feat_ptr,
    cols_ptr,
    h_ptr,
    qkv_ptr,
    attn_ptr,
    act_ptr,
    w_qkv,
    b_qkv,
    g_in,
    w_o,
    b_o,
    g_post,
    w_gu,
    w_dn,
    qn_ptr,
    kn_ptr,
    kc_ptr,
    vc_ptr,
    rows_ptr,
    pos_ptr,
    first_ptr,
    cos_ptr,
    sin_ptr,
    ws_ptr,
    cnt_ptr,
    done_ptr,
    L,
    M,
    n,
    HID,
    NQKV,
    INTER,
    H,
    G,
    KV,
    D,
    HALF,
    eps,
    sm_scale,
    s_feat,
    s_c_l,
    s_c_b,
    s_c_h,
    s_c_r,
    s_tab,
    capacity,
    M_PAD,
    ks_qkv,
    sp_qkv,
    ks_o,
    sp_o,
    ks_gu,
    sp_gu,
    ks_dn,
    sp_dn,
    QKV_BIAS: tl.constexpr,
    O_BIAS: tl.constexpr,
    QK_NORM: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BN_QKV: tl.constexpr,
    BK_QKV: tl.constexpr,
    BN_O: tl.constexpr,
    BK_O: tl.constexpr,
    BN_GU: tl.constexpr,
    BK_GU: tl.constexpr,
    BN_DN: tl.constexpr,
    BK_DN: tl.constexpr,
    KT_QKV: tl.constexpr,
    KT_O: tl.constexpr,
    KT_GU: tl.constexpr,
    KT_DN: tl.constexpr,
    ATT_BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    LIMIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    MAX_ROWS: tl.constexpr,
    WAIT: tl.constexpr,
):
    """Layers 0..L-1 of a step over M rows (b sequences of n). Layer l's input is x [M, HID] when cols[l] < 0,
    else the columns cols[l].. of the features [M, ·] (row stride s_feat: a tapped layer's output goes straight
    into its slot, as in the five-kernel step); cols[L]: where the last layer writes. h, qkv, attn, act are the
    step's intermediates. Weights are stacked per kind, [L, ...] contiguous."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    query_tiles = tl.cdiv(G * n, BLOCK_M)
    att_units = query_tiles * (M // n) * KV  # M // n: the sequences
    u_dn = m_tiles * tl.cdiv(HID, BN_DN) * sp_dn
    u_qkv = m_tiles * tl.cdiv(NQKV, BN_QKV) * sp_qkv
    u_o = m_tiles * tl.cdiv(HID, BN_O) * sp_o
    u_gu = m_tiles * tl.cdiv(INTER, BN_GU) * sp_gu
    n_done = L * 5
    B = M // n
    last_row = tl.max(tl.load(rows_ptr + tl.arange(0, MAX_ROWS), mask=tl.arange(0, MAX_ROWS) < M, other=0), axis=0)
    hi = tl.minimum(last_row + 1, capacity)  # the cache rows any query of the step sees
    _prefetch_layer(w_qkv, w_o, w_gu, w_dn, 0, NQKV, HID, H * D, INTER, pid, P, PREFETCH)
    _prefetch_cache(kc_ptr, vc_ptr, hi, B, KV, s_c_b, s_c_h, s_c_r, pid, P, PREFETCH)
    for layer in range(0, L):
        lo = tl.full((), 0, tl.int64) + layer
        if layer + 1 < L:  # the next layer's weights and cache rows stream into L2 while this one runs
            _prefetch_layer(w_qkv, w_o, w_gu, w_dn, layer + 1, NQKV, HID, H * D, INTER, pid, P, PREFETCH)
            _prefetch_cache(
                kc_ptr + (lo + 1) * s_c_l, vc_ptr + (lo + 1) * s_c_l, hi, B, KV, s_c_b, s_c_h, s_c_r, pid, P, PREFETCH
            )
        done = done_ptr + layer * 5  # units done per phase: qkv, attention, o, gate_up, down
        c_in = tl.load(cols_ptr + layer)
        c_out = tl.load(cols_ptr + layer + 1)
        x_in = tl.where(c_in < 0, x_ptr, feat_ptr + c_in)
        s_in = tl.where(c_in < 0, HID, s_feat)
        x_out = tl.where(c_out < 0, x_ptr, feat_ptr + c_out)
        s_out = tl.where(c_out < 0, HID, s_feat)
        # qkv = RMSNorm(x) · Wqkv^T (+ bias), once the layer before is done
        _gemm_phase(
            x_in, w_qkv + lo * NQKV * HID, b_qkv + lo * NQKV, g_in + lo * HID, x_in, qkv_ptr, ws_ptr, cnt_ptr,
            M, NQKV, HID, ks_qkv, M_PAD, eps, s_in, 0, NQKV, pid, P, sp_qkv,
            done - 1, tl.where(layer > 0, u_dn, 0), done, done_ptr, n_done,
            True, QKV_BIAS, False, False, UPCAST, PRECISION, LIMIT, WAIT, KT_QKV, BLOCK_M, BN_QKV, BK_QKV,
        )  # fmt: skip
        # (q/k norm,) rope, K/V write at the step's cache rows, attention over the visible rows
        if WAIT and pid < att_units:
            st._wait_for(done, u_qkv, done_ptr, n_done, LIMIT)
        for u in range(pid, att_units, P):
            st._attention_unit(
                qkv_ptr, qkv_ptr, kc_ptr + lo * s_c_l, vc_ptr + lo * s_c_l, rows_ptr, pos_ptr, rows_ptr, first_ptr,
                cos_ptr, sin_ptr, qn_ptr + lo * D, kn_ptr + lo * D, attn_ptr, n, H, G, KV, D, HALF, eps, sm_scale,
                NQKV, 0, 0, s_c_b, s_c_h, s_c_r, H * D, s_tab, capacity, u % query_tiles, u // query_tiles,
                True, False, True, True, QK_NORM, False, UPCAST, PRECISION, 0, ".cg", BLOCK_M, ATT_BLOCK_N, BLOCK_D,
            )  # fmt: skip
            tl.debug_barrier()
            tl.atomic_add(done + 1, 1, sem="release", scope="gpu")
        # h = x + attn · Wo^T (+ bias)
        _gemm_phase(
            attn_ptr, w_o + lo * HID * (H * D), b_o + lo * HID, g_in, x_in, h_ptr, ws_ptr, cnt_ptr,
            M, HID, H * D, ks_o, M_PAD, eps, H * D, s_in, HID, pid, P, sp_o,
            done + 1, att_units, done + 2, done_ptr, n_done,
            False, O_BIAS, True, False, UPCAST, PRECISION, LIMIT, WAIT, KT_O, BLOCK_M, BN_O, BK_O,
        )  # fmt: skip
        # act = silu(RMSNorm(h) · Wgate^T) * (RMSNorm(h) · Wup^T)
        _gemm_phase(
            h_ptr, w_gu + lo * 2 * INTER * HID, w_gu, g_post + lo * HID, h_ptr, act_ptr, ws_ptr, cnt_ptr,
            M, INTER, HID, ks_gu, M_PAD, eps, HID, 0, INTER, pid, P, sp_gu,
            done + 2, u_o, done + 3, done_ptr, n_done,
            True, False, False, True, UPCAST, PRECISION, LIMIT, WAIT, KT_GU, BLOCK_M, BN_GU, BK_GU,
        )  # fmt: skip
        # x' = h + act · Wdown^T, into the next layer's input
        _gemm_phase(
            act_ptr, w_dn + lo * HID * INTER, w_dn, g_in, h_ptr, x_out, ws_ptr, cnt_ptr,
            M, HID, INTER, ks_dn, M_PAD, eps, INTER, HID, s_out, pid, P, sp_dn,
            done + 3, u_gu, done + 4, done_ptr, n_done,
            False, False, True, False, UPCAST, PRECISION, LIMIT, WAIT, KT_DN, BLOCK_M, BN_DN, BK_DN,
        )  # fmt: skip


# fmt: on


def _stacked(groups: Sequence[Sequence[torch.nn.Parameter | torch.Tensor]]) -> torch.Tensor:
    """[L, ...] with layer l the concatenation (dim 0) of groups[l]; each parameter then views its slice of it
    (as target/fast.py's fusing does), so the stacked tensor costs no memory beyond the step of restacking."""
    head = groups[0][0]
    rows = sum(p.shape[0] for p in groups[0])
    out = torch.empty((len(groups), rows, *head.shape[1:]), dtype=head.dtype, device=head.device)
    for index, group in enumerate(groups):
        offset = 0
        for p in group:
            rows = p.shape[0]
            out[index, offset : offset + rows] = p.detach()
            view = out[index, offset : offset + rows]
            if isinstance(p, torch.nn.Parameter):
                p.data = view
            offset += rows
    return out


class LayerKernel:
    """The layer kernel's state for one StaticDecoder: the stacked weights, its tiles once known, its counters."""

    def __init__(self, stacks: dict[str, torch.Tensor | None], *, num_heads: int, num_kv_heads: int, head_dim: int,
                 eps: float) -> None:  # fmt: skip
        self.stacks = stacks
        self.num_heads, self.num_kv_heads, self.head_dim, self.eps = num_heads, num_kv_heads, head_dim, eps
        w_qkv, w_gu = stacks["qkv"], stacks["gate_up"]
        self.num_layers, self.nqkv, self.hidden = w_qkv.shape
        self.inter = w_gu.shape[1] // 2
        self.device = w_qkv.device
        # units done per (layer, phase), zeroed before every launch, then the timed-out flag, which stays set.
        # Counters are made outside inference mode (here and in `launch`), so that a launch zeroes them in place
        # whether or not it runs under inference mode
        with torch.inference_mode(False):
            self.done = torch.zeros(self.num_layers * 5 + 1, dtype=torch.int32, device=self.device)
            self.counters = torch.zeros(0, dtype=torch.int32, device=self.device)
        self.tiles: dict[str, dict[str, int]] | None = None
        self.disabled: str | None = None
        self.checked = False
        self._cols: dict[tuple, torch.Tensor] = {}

    def keys(self) -> dict[str, tuple]:
        """The step GEMMs' tile keys (step_triton.linear_key), by phase."""
        s = self.stacks
        dtype, device = s["qkv"].dtype, self.device
        common = dict(gated_input=False, dtype=dtype, out_dtype=dtype, device=device)
        return {
            "qkv": st.linear_key(self.nqkv, self.hidden, norm=True, bias=s["qkv_bias"] is not None,
                                 residual=False, gated=False, **common),
            "o": st.linear_key(self.hidden, self.num_heads * self.head_dim, norm=False,
                               bias=s["o_bias"] is not None, residual=True, gated=False, **common),
            "gate_up": st.linear_key(self.inter, self.hidden, norm=True, bias=False, residual=False, gated=True,
                                     **common),
            "down": st.linear_key(self.hidden, self.inter, norm=False, bias=False, residual=True, gated=False,
                                  **common),
        }  # fmt: skip

    def _resolve(self) -> bool:
        """The four tiles the standalone GEMMs run (known once a step has run them), if they suit one launch."""
        if self.tiles is not None:
            return True
        found = {}
        for phase, key in self.keys().items():
            tile = st.tile_in_use(key, self.device)
            if tile is None:
                return False  # the first step (standalone) tunes them
            found[phase] = tile
        warps = {t["num_warps"] for t in found.values()}
        if len(warps) != 1 or warps != {4} or any(t.get("STREAM") for t in found.values()):
            self.disabled = "tiles that need their own launch (stream-K or another warp count)"
            return False
        self.tiles = found
        return True

    def usable(self, rows: int, per_sequence: int, mlp_prologue: bool) -> bool:
        if self.disabled is not None or mlp_prologue or st.pdl_mode(self.device) != 0:
            return False
        if rows > LAYER_ROWS or per_sequence > st.FUSED_ROWS or rows == 0:
            return False
        if not self.checked and _capturing():
            return False  # the first launch is checked, which needs a sync
        return self._resolve()

    def columns(self, taps: dict[int, int]) -> torch.Tensor:
        """cols[l]: where layer l's input is (-1: the stream buffer x, else its first column in the features);
        cols[L]: where the last layer writes. taps: layer -> feature slot (the last layer's slot is filled after
        the final norm, outside the kernel)."""
        key = tuple(sorted(taps.items()))
        cols = self._cols.get(key)
        if cols is None:
            values = [-1]
            for layer in range(self.num_layers):
                tapped = layer in taps and layer != self.num_layers - 1
                values.append(taps[layer] * self.hidden if tapped else -1)
            cols = self._cols[key] = torch.tensor(values, dtype=torch.int32, device=self.device)
        return cols

    def launch(
        self,
        x: torch.Tensor,
        features: torch.Tensor | None,
        cols: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
        first: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        n: int,
        programs: int | None = None,
    ) -> bool:
        """All layers over the step's M = b·n rows: x [M, HID] the input, overwritten by the last layer's output
        (features [M, T·HID] receive the tapped layers', see `columns`). keys/values: the cache blocks [L, b, KV,
        capacity, hd]. False when the kernel turned out unusable on its first launch (nothing it wrote counts: the
        caller runs the step again the standalone way)."""
        assert self.tiles is not None
        m, hid, nq, inter = x.shape[0], self.hidden, self.nqkv, self.inter
        hd, heads, kvh = self.head_dim, self.num_heads, self.num_kv_heads
        dtype, device = x.dtype, x.device
        h = torch.empty((m, hid), dtype=dtype, device=device)
        qkv = torch.empty((m, nq), dtype=dtype, device=device)
        attn = torch.empty((m, heads * hd), dtype=dtype, device=device)
        act = torch.empty((m, inter), dtype=dtype, device=device)
        m_tiles = triton.cdiv(m, st.BLOCK_M)
        m_pad = m_tiles * st.BLOCK_M
        shapes = {"qkv": (nq, hid, False), "o": (hid, heads * hd, False), "gate_up": (inter, hid, True),
                  "down": (hid, inter, False)}  # fmt: skip
        splits, space, tiles_n, units = {}, 1, 1, 1
        for phase, (width, depth, gated) in shapes.items():
            tile = self.tiles[phase]
            split = tile.get("SPLIT", 1)
            n_tiles = triton.cdiv(width, tile["BLOCK_N"])
            k_split = triton.cdiv(triton.cdiv(depth, tile["BLOCK_K"]), split) * tile["BLOCK_K"]
            splits[phase] = (k_split, split)
            if split > 1:
                space = max(space, split * m_pad * (2 * width if gated else width) + split * n_tiles * m_pad)
            tiles_n = max(tiles_n, m_tiles * n_tiles)
            units = max(units, m_tiles * n_tiles * split)
        # the K tiles of each GEMM's slice, unrolled (LILICORR_LAYER_UNROLL=off: the loop the standalone runs)
        unroll = settings.layer_unroll()
        kts = {
            f"KT_{name}": triton.cdiv(splits[phase][0], self.tiles[phase]["BLOCK_K"]) if unroll else 0
            for phase, name in (("qkv", "QKV"), ("o", "O"), ("gate_up", "GU"), ("down", "DN"))
        }
        b = m // n
        units = max(units, triton.cdiv((heads // kvh) * n, st.BLOCK_M) * b * kvh)
        workspace = torch.empty(space, dtype=torch.float32, device=device)
        # split-K arrival counters of its own, zeroed at every launch: a timed-out launch, whose phases may then
        # run out of order, can leave them anything, and must not leave the standalone GEMMs' counters so
        if self.counters.numel() < tiles_n:
            with torch.inference_mode(False):
                self.counters = torch.zeros(tiles_n, dtype=torch.int32, device=device)
        counters = self.counters
        if programs is None:
            programs = min(units, st.sm_count(device))
        s = self.stacks
        w_qkv = s["qkv"]
        t = self.tiles
        self.done[:-1].zero_()  # the flag after them stays set once a launch has raised it
        counters.zero_()
        first_launch = not self.checked
        try:
            _layer_kernel[(programs,)](
            x, features if features is not None else x, cols, h, qkv, attn, act,
            w_qkv, s["qkv_bias"] if s["qkv_bias"] is not None else w_qkv, s["input_norm"], s["o"],
            s["o_bias"] if s["o_bias"] is not None else w_qkv, s["post_norm"], s["gate_up"], s["down"],
            s["q_norm"] if s["q_norm"] is not None else cos, s["k_norm"] if s["k_norm"] is not None else cos,
            keys, values, rows, positions, first, cos, sin, workspace, counters, self.done,
            self.num_layers, m, n, hid, nq, inter, heads, heads // kvh, kvh, hd, hd // 2, self.eps, hd**-0.5,
            features.stride(0) if features is not None else hid, keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3), cos.stride(0),
            keys.shape[3], m_pad,
            *splits["qkv"], *splits["o"], *splits["gate_up"], *splits["down"],
            QKV_BIAS=s["qkv_bias"] is not None, O_BIAS=s["o_bias"] is not None, QK_NORM=s["k_norm"] is not None,
            UPCAST=w_qkv.dtype == torch.float32 or st._interpreted(), PRECISION="ieee", BLOCK_M=st.BLOCK_M,
            BN_QKV=t["qkv"]["BLOCK_N"], BK_QKV=t["qkv"]["BLOCK_K"], BN_O=t["o"]["BLOCK_N"], BK_O=t["o"]["BLOCK_K"],
            BN_GU=t["gate_up"]["BLOCK_N"], BK_GU=t["gate_up"]["BLOCK_K"], BN_DN=t["down"]["BLOCK_N"],
            BK_DN=t["down"]["BLOCK_K"], ATT_BLOCK_N=st.ATTENTION_BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(hd)),
            **kts, LIMIT=SPIN_LIMIT, WAIT=not _NO_WAIT, MAX_ROWS=triton.next_power_of_2(LAYER_ROWS), PREFETCH=prefetch_enabled() and w_qkv.element_size() == 2 and not st._interpreted(),
            num_warps=4, num_stages=max(t[p]["num_stages"] for p in t),
        )  # fmt: skip
        except Exception as exc:  # e.g. more shared memory than an SM has: the five kernels then, for good
            if not first_launch:
                raise
            self.checked = True
            self._turn_off(f"it does not compile or launch here ({type(exc).__name__}: {str(exc)[:200]})")
            return False
        if first_launch:  # the first launch: did every wait see its phase done?
            self.checked = True
            problem = self.problem()
            if problem is not None:
                self._turn_off(problem)
                return False
        return True

    def _turn_off(self, reason: str) -> None:
        self.disabled = reason
        warnings.warn(
            f"lilicorr: the layer kernel is off for this target: {reason}", RuntimeWarning, stacklevel=4
        )

    def problem(self) -> str | None:
        """Why a launch so far computed a wrong step (a wait between phases timed out: not every program was
        resident at once), or None. Reads a device flag: a sync."""
        if int(self.done[-1].item()) == 0:
            return None
        return "a wait between its phases timed out (not every program of the launch was resident at once)"
