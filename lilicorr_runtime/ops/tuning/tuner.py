"""The step GEMMs' tuner: which tile shapes a weight shape is timed with, how, and which one it keeps.

The first CUDA call of each GEMM (weight shape, epilogue, dtypes: `linear_key`) times the CANDIDATES and the
shape's default (`linear_config`), then split-K and stream-K variants of the best two (`divided_candidates`),
back to back in a CUDA graph over cold copies of the weight on one row tile (`time_in_graph`), re-times the
finalists (`choose_tile`) and keeps the fastest: in this process (`TUNED`) and in the tile table (tables.py), so a
later process on the same GPU and Triton version looks it up instead (`stored`). The choice depends on the shape
only, never on the row count, so results stay batch invariant. The kernels and their launch are step_triton's: it
hands `tune` its launch, its kernels and its SM count; the candidates compile and time on a copy of each kernel
(`tuning_copy`), so the kernel table (kernels.py) notes only the tile that runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ... import graphs, rows, settings
from . import kernels, tables


def cdiv(a: int, b: int) -> int:
    """Ceiling division (triton.cdiv's, without importing Triton here)."""
    return -(-a // b)


# Tile shapes the first CUDA call of each (weight shape, epilogue) times (`tune`: back to back in a CUDA graph,
# over cold weights), keeping the fastest for every later call (whatever its row count, so results stay batch
# invariant). An H200 run of the default alone streamed a Qwen3-8B step's weights at 41% of the copy bandwidth.
CANDIDATES = (
    {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},
    {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
    {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 8, "num_stages": 3},
    {"BLOCK_N": 32, "BLOCK_K": 512, "num_warps": 8, "num_stages": 2},
    {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
    {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 4, "num_stages": 3},
    # three programs per SM fit in shared memory (one 64-column tile per SM leaves a Qwen3-8B gate_up's 192 tiles
    # in two waves on 132 SMs, the second half empty)
    {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
)
# slices of K a narrow matrix's split-K candidates take (SPLIT is a runtime argument: no recompile per count)
SPLITS = (2, 3, 4, 6, 8)
# programs per SM a stream-K candidate runs (STREAM; the program count is the grid: no recompile per count)
STREAMS = (1, 2, 3)
TUNED: dict[tuple, dict[str, int]] = {}  # linear_key(...) -> the tile in use (step_triton.TUNED is this dict)
_clock = time.perf_counter
_TUNING = [0, 0.0]  # shapes this process tuned (`tune` that timed candidates) and the seconds it took


# called once, with a line for people, before the first shape this process tunes (smoke shows it as a progress
# note: a first run on a GPU and Triton version tunes each step GEMM shape, which reads as a long warm-up)
announce: Callable[[str], None] | None = None
_announced = False


def tuning_done() -> tuple[int, float]:
    """How many GEMM shapes this process tuned (no stored tile served them) and the seconds tuning took: the
    candidates' compiles and their timing, on the thread that first called each shape."""
    return int(_TUNING[0]), float(_TUNING[1])


def linear_config(n: int, k: int) -> dict[str, int]:
    """Tile sizes by the weight's shape only (never the row count, so results stay batch invariant). Narrow
    column tiles when the matrix is small, so that a one-row GEMV still spreads over many programs."""
    block_k = 128 if k >= 1024 else 64
    block_n = 16
    for candidate in (64, 32):
        if cdiv(n, candidate) >= 256:
            block_n = candidate
            break
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 3}


def linear_key(
    n: int,
    k: int,
    *,
    norm: bool,
    bias: bool,
    residual: bool,
    gated: bool,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
) -> tuple:
    """The key a step GEMM's tile is tuned, stored and looked up under (TUNED, the tile table). Its seventh and
    tenth fields are constant: they held the MLP-prologue input and the programmatic-dependent-launch mode, both
    retired (always False and 0 in the tiles stored before), and stay so that stored tile tables keep matching."""
    return (n, k, norm, bias, residual, gated, False, dtype, out_dtype, 0)


def tile_in_use(
    key: tuple, device: torch.device, sms: int, tuned: dict[tuple, dict[str, int]] = TUNED
) -> dict[str, int] | None:
    """The tile `step_linear_triton` runs for `key` in this process (tuned or stored), or None when none is
    known yet (the first call tunes it). sms: the device's SM count (step_triton.sm_count)."""
    return tuned.get(key) or stored(key, device, sms, tuned)


_TUNING_COPIES: dict[int, Any] = {}


def tuning_copy(fn: Any) -> Any:
    """The copy of a step kernel the tuner compiles and times its candidates on (kernels.shadow: kernel tables of
    its own, not noted by the kernel table). Only the tile a launch then uses is compiled into (or loaded from
    Triton's disk cache for) the kernel itself, so the kernel table stores what runs, not every candidate: a later
    process on an empty Triton cache compiles those ahead, and compiling the candidates too slowed its loading."""
    copy = _TUNING_COPIES.get(id(fn))
    if copy is None:
        copy = _TUNING_COPIES[id(fn)] = kernels.shadow(fn)
    return copy


def stream_enabled() -> bool:
    """Whether the tuner tries stream-K tiles (LILICORR_STREAM_K=off: it does not, and the tiles stored before
    stream-K existed stay valid)."""
    return settings.stream_k()


def stream_candidates(n: int, k: int, sm_count: int, shapes=CANDIDATES) -> list[dict[str, int]]:
    """Stream-K variants of `shapes`: STREAMS programs per SM, each with at least one unit of work."""
    extra = []
    for config in shapes:
        units = cdiv(n, config["BLOCK_N"]) * cdiv(k, config["BLOCK_K"])
        for stream in STREAMS:
            if units >= stream * sm_count:
                extra.append({**config, "STREAM": stream})
    return extra


def divided_candidates(n: int, k: int, sm_count: int, shapes=CANDIDATES) -> list[dict[str, int]]:
    """The split-K and (unless turned off) stream-K variants of `shapes` the tuner times after the plain tiles."""
    streams = stream_candidates(n, k, sm_count, shapes) if stream_enabled() else []
    return split_candidates(n, k, sm_count, shapes) + streams


def is_divided(config: dict[str, int]) -> bool:
    """A split-K or stream-K tile (the tuner's second family of candidates)."""
    return config.get("SPLIT", 1) > 1 or "STREAM" in config


def tile_key(device: torch.device) -> str:
    """The stored-tile table's key for this device and the candidate set the tuner now draws from."""
    splits: Any = (SPLITS, STREAMS) if stream_enabled() else SPLITS
    return tables.device_key(device, CANDIDATES, splits, TUNE_ROWS)


def split_candidates(n: int, k: int, sm_count: int, shapes=CANDIDATES) -> list[dict[str, int]]:
    """Split-K variants of `shapes` for a matrix with too few column tiles to fill the device at one row: SPLITS
    slices of K, each at least two BLOCK_K tiles deep."""
    extra = []
    for config in shapes:
        if cdiv(n, config["BLOCK_N"]) >= 2 * sm_count:
            continue
        for split in SPLITS:
            if cdiv(k, config["BLOCK_K"]) >= 2 * split:
                extra.append({**config, "SPLIT": split})
    return extra


# the weights a tuning graph cycles through: several times an H200's L2, so that reads are cold
TUNE_BYTES = 256 << 20
TUNE_CALLS = 16  # calls per tuning graph at least
# Rows a tile is timed at: one row tile, which costs the same for a one-token step and a batch-1 verify (both fit
# in it), the decode steps that dominate. Timing at the first call's own row count, usually a prompt's prefill of
# tens of rows, chose tiles (and split-K) that suited two or more row tiles and were slower at one row: the 8B
# gate_up's 3-slice split at 82 us against 72 us unsplit at one row.
TUNE_ROWS = rows.TILE  # step_triton.BLOCK_M: one row tile


def time_in_graph(launch, config: dict[str, int], scratch: torch.Tensor, weight: torch.Tensor) -> float:
    """Microseconds per call of `launch(config, ...)` replayed back to back from one CUDA graph, as a step replays
    its kernels, cycling over copies of the weight (TUNE_BYTES in all) so that no call finds its weights in L2.
    Raises what the launch raises (a tile needing more shared memory than the device has)."""
    size = weight.numel() * weight.element_size()
    copies = max(1, min(64, -(-TUNE_BYTES // size)))
    weights = [weight] + [weight.clone() for _ in range(copies - 1)]
    calls = max(copies, TUNE_CALLS)
    launch(config, scratch)  # compiles outside the capture

    def calls_in_turn() -> None:
        for i in range(calls):
            launch(config, scratch, weights[i % copies])

    graph, _ = graphs.capture(calls_in_turn, weight.device)
    graph.replay()  # warm
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(3):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e3 / (3 * calls)


def allowed(n: int, k: int, sm_count: int) -> Callable[[dict[str, int]], bool]:
    """Whether a stored tile is one the tuner could have chosen for an [n, k] weight."""
    default = linear_config(n, k)
    divided = {tuple(sorted(c.items())) for c in divided_candidates(n, k, sm_count, (*CANDIDATES, default))}
    plain = {tuple(sorted(c.items())) for c in (*CANDIDATES, default)}

    def check(tile: dict[str, int]) -> bool:
        return tuple(sorted(tile.items())) in (divided if is_divided(tile) else plain)

    return check


def stored(
    key: tuple, device: torch.device, sms: int, tuned: dict[tuple, dict[str, int]] = TUNED
) -> dict[str, int] | None:
    """The tile a previous process (or the bundled table) chose for this GEMM on this GPU (tables.py), noted in
    `tuned`. sms: the device's SM count."""
    if torch.cuda.is_current_stream_capturing():
        return None
    tile = tables.lookup(tile_key(device), tables.shape_key(key), allowed(key[0], key[1], sms))
    if tile is not None:
        tuned[key] = tile
    return tile


def tune(
    key: tuple,
    launch: Callable[..., None],
    out: torch.Tensor,
    weight: torch.Tensor,
    step_kernels: tuple[Any, ...],
    sms: int,
    timer: Callable[..., float] | None = None,
    tuned: dict[tuple, dict[str, int]] = TUNED,
) -> dict[str, int]:
    """The fastest tile shape for this GEMM (`choose_tile`, each candidate timed by `timer`, `time_in_graph` by
    default, into a scratch output) on the first TUNE_ROWS rows of this call, whatever its row count: the tile then
    serves every later call, noted in `tuned` and stored in the tile table. Never inside a graph capture (the
    warm-up runs before it), where the default serves. `launch(config, y, w, rows, compile_only=, tuning=)` is
    step_triton's call; `step_kernels` the Triton kernels it may launch; sms the device's SM count."""
    default = linear_config(key[0], key[1])
    if torch.cuda.is_current_stream_capturing():
        return default
    global _announced
    if not _announced and announce is not None:
        _announced = True
        with contextlib.suppress(Exception):  # a line for people: never the tuning's failure
            announce(
                "tuning the step GEMMs' tiles for this GPU and Triton version (its first run here; the tiles are "
                "kept for the next)"
            )
    begin = _clock()
    timer = time_in_graph if timer is None else timer
    scratch = torch.empty_like(out)
    rows = min(out.shape[0], TUNE_ROWS)
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    for fn in step_kernels:  # the copies and their binders, before the compile threads
        tuning_copy(fn).device_caches[index]

    def launch_rows(config: dict[str, int], y: torch.Tensor, w: torch.Tensor = weight) -> None:
        launch(config, y, w, rows, tuning=True)

    def compile_all(configs: list[dict[str, int]]) -> None:
        # split and program counts are runtime arguments: every SPLIT > 1 of a tile is one kernel, every STREAM
        # another
        variants: dict[tuple, dict[str, int]] = {}
        for config in configs:
            tile = {k: v for k, v in config.items() if k not in ("SPLIT", "STREAM")}
            kind = ("STREAM" in config, config.get("SPLIT", 1) > 1)
            variants.setdefault((tuple(sorted(tile.items())), kind), config)
        compile_in_parallel(
            lambda config: launch(config, scratch, weight, rows, compile_only=True, tuning=True),
            list(variants.values()),
        )

    best = choose_tile(
        default,
        lambda leaders: divided_candidates(key[0], key[1], sms, leaders),
        lambda config: timer(launch_rows, config, scratch, weight),
        compile_all,
    )
    tuned[key] = best
    tables.remember(tile_key(weight.device), tables.shape_key(key), best)
    _TUNING[0] += 1
    _TUNING[1] += _clock() - begin
    return best


COMPILE_THREADS = 8  # candidate tiles compiled at once before they are timed


def compile_in_parallel(compile_one: Callable[[dict[str, int]], Any], configs: list[dict[str, int]]) -> None:
    """Compile every candidate tile at once (Triton's compiler leaves the interpreter lock while it works), so
    that timing them finds each compiled: a fresh machine tuning a weight shape compiled its ~10 candidates one
    after another. A candidate that fails to compile is left to the timer, which skips what cannot run."""
    if len(configs) < 2:
        return

    device = torch.cuda.current_device() if torch.cuda.is_available() else None

    def one(config: dict[str, int]) -> None:
        with contextlib.suppress(Exception):
            if device is None:
                compile_one(config)
            else:
                with torch.cuda.device(device):  # a thread's CUDA device is its own
                    compile_one(config)

    with ThreadPoolExecutor(min(COMPILE_THREADS, len(configs)), thread_name_prefix="lilicorr-tile") as pool:
        list(pool.map(one, configs))


def choose_tile(default: dict[str, int], splits_of, timer, compile_all=None) -> dict[str, int]:
    """The tile with the least time by `timer` (a config -> its time; raising when the config cannot run): every
    tile of CANDIDATES and `default` without split-K, then `splits_of(the best two)`, then again, in the reverse
    order, the finalists: the best two overall, the best two unsplit and the best two split, each keeping its
    lesser time. The second pass is there because the first is ordered: unsplit tiles timed first, while the
    clock may still ramp up, read slower than split ones timed after them. (An H200 picked a 3-slice split for
    the 8B gate_up at 82 us that the bench times at 71.5 us unsplit, also when the second pass re-timed only the
    best four overall, all split by then: the best unsplit tile is now always re-timed.)"""
    times: dict[tuple, tuple[dict[str, int], float]] = {}

    def measure(configs) -> None:
        configs = list(configs)
        if compile_all is not None:
            compile_all([c for c in configs if tuple(sorted(c.items())) not in times])
        for config in configs:
            try:
                elapsed = timer(config)
            except Exception:  # e.g. a tile needing more shared memory than the device has: not a candidate
                continue
            name = tuple(sorted(config.items()))
            previous = times.get(name)
            times[name] = (config, elapsed if previous is None else min(previous[1], elapsed))

    def ranked() -> list[dict[str, int]]:
        return [config for config, _ in sorted(times.values(), key=lambda t: t[1])]

    measure([default, *(c for c in CANDIDATES if c != default)])
    measure(splits_of(ranked()[:2]))
    order = ranked()
    finalists: list[dict[str, int]] = []
    for config in (
        order[:2] + [c for c in order if not is_divided(c)][:2] + [c for c in order if is_divided(c)][:2]
    ):
        if config not in finalists:
            finalists.append(config)
    measure(list(reversed(finalists)))
    return ranked()[0] if times else default
