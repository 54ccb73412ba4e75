"""The step GEMMs at many rows: the 16-row tile kernel, the wide-row kernel and cuBLAS on the same shapes.

    python bench/wide_gemm.py [--model qwen3-8b|smollm2] [--rows 16,64,256,1024,2048] [--explore]

For each of the model's layer GEMMs (qkv with the input norm folded in, o_proj with the residual, gate_up with the
post-attention norm and silu(gate) * up, down with the residual; the lm_head to fp32) and each row count it
prints the median time per call (`in_graph`: calls replayed back to back from one CUDA graph, as a decode step
replays its GEMMs, over copies of the weight that L2 cannot hold; single launches timed alone jittered by up to
30 % on an H100) of

    tile      `step_linear_triton(..., wide=False)`: 16 rows a program (what every call ran before the wide kernel)
    grouped   the grouped kernel: the step tile's cut with several 16-row tiles a program (`default_groups` below
              WIDE_ROWS rows; MAX_GROUPS, or fewer where registers run short, from there on, where it does not run
              by default: for choosing the crossover)
    now       the call as it runs now (below WIDE_ROWS rows the grouped kernel, from there the wide-row kernel)
    cuBLAS    torch's bf16 GEMM of the same x and weight (the plain product only: no norm, residual or gating)

with wide / cuBLAS as a share (the issue's goal: at least 50 % of cuBLAS's speed from 64 to 2,048 rows) and
whether the grouped and current kernels' rows equal the tile kernel's bit for bit (they must: batch invariance). `--explore
ROWS` also times a grid of wide tiles per shape at ROWS rows (GRID: the step tile's BLOCK_K, and tiles with a
BLOCK_K of their own) and prints the fastest that keeps the rows equal, for choosing `wide_config`'s defaults.
`--parallel-split ROWS` times, for each GEMM whose step tile splits K, the grouped kernel at ROWS rows with wide
tiles (SPLIT_GRID): the step tile's K slices as parallel programs reduced in slice order, where the wide kernel
sums them one after another in a program; a row stays the 16-row kernel's (the same slices), so it is a choice of
speed only, for the wide kernel's GEMMs that split K (qkv and o_proj on the 8B shape).
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
from triton.runtime.errors import OutOfResources

from lilicorr_runtime.ops import step_triton

SHAPES = {  # (name, N, K, kind): the layer GEMMs of one decoder layer and the lm_head
    "qwen3-8b": [
        ("qkv", (32 + 2 * 8) * 128, 4096, "norm"),
        ("o_proj", 4096, 32 * 128, "residual"),
        ("gate_up", 12288, 4096, "gated"),
        ("down", 4096, 12288, "residual"),
        ("lm_head", 151936, 4096, "lm_head"),
    ],
    "smollm2": [
        ("qkv", (9 + 2 * 3) * 64, 576, "norm"),
        ("o_proj", 576, 576, "residual"),
        ("gate_up", 1536, 576, "gated"),
        ("down", 576, 1536, "residual"),
        ("lm_head", 49152, 576, "lm_head"),
    ],
}


# weight copies an in-graph timing cycles over, so that no call finds its weight in L2 (50 MB on an H100)
GRAPH_BYTES = 256 << 20
GRAPH_CALLS = 16  # calls per timing graph at least


def in_graph(call, weight: torch.Tensor) -> float:
    """Median milliseconds per call of `call(w)` replayed back to back from one CUDA graph (as a decode step
    replays its GEMMs: no launch gaps), cycling over copies of the weight (GRAPH_BYTES in all); five replays."""
    from lilicorr_runtime import graphs

    size = weight.numel() * weight.element_size()
    copies = max(1, min(1024, -(-GRAPH_BYTES // size)))
    weights = [weight] + [weight.clone() for _ in range(copies - 1)]
    calls = max(copies, GRAPH_CALLS)
    call(weight)  # compiles (or tunes) outside the capture
    torch.cuda.synchronize()

    def calls_in_turn() -> None:
        for i in range(calls):
            call(weights[i % copies])

    graph, _ = graphs.capture(calls_in_turn, weight.device)
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def operands(n: int, k: int, kind: str, rows: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    weight = (torch.randn(2 * n if kind == "gated" else n, k, device="cuda", generator=gen) * 0.02).bfloat16()
    x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
    kwargs: dict = {}
    if kind in ("norm", "gated"):
        kwargs.update(norm_weight=torch.ones(k, device="cuda", dtype=torch.bfloat16), eps=1e-6)
    if kind == "gated":
        kwargs["gated"] = True
    if kind == "residual":
        kwargs["residual"] = torch.randn(rows, n, device="cuda", generator=gen).bfloat16()
    if kind == "lm_head":
        kwargs["out_dtype"] = torch.float32
    return x, weight, kwargs


# the grid `--explore` times: the default tiles' neighbours (the step tile's BLOCK_K, one dot or one per group),
# then tiles of a Hopper GEMM's usual shapes with their own BLOCK_K (64 or 128 columns a step, 3-4 stages)
GRID: list[dict] = [
    {"GROUPS": g, "BLOCK_N": n, "num_warps": w, "num_stages": 3, "BATCHED": b}
    for g, n, w, b in itertools.product((4, 8), (64, 128), (4, 8), (0, 1))
] + [
    {"GROUPS": g, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": st, "BATCHED": 0}
    for g, n, k, w, st in (
        (8, 128, 64, 8, 4),
        (8, 256, 64, 8, 3),
        (8, 128, 128, 8, 3),
        (8, 64, 64, 4, 4),
        (8, 128, 64, 4, 4),
        (4, 128, 64, 4, 4),
        (4, 256, 64, 8, 3),
        (4, 128, 128, 4, 3),
        (4, 64, 64, 4, 4),
        (4, 128, 64, 8, 4),
        (4, 128, 64, 4, 5),
        (8, 128, 64, 8, 3),
    )
]


def explore(x, weight, kwargs, own_k: bool = False) -> tuple[float, dict]:
    """The fastest wide tile of GRID (only those with a BLOCK_K of their own when `own_k`; those that compile and
    fit, and keep every row equal), and its time."""
    best: tuple[float, dict] = (float("inf"), {})
    for tile in [t for t in GRID if "BLOCK_K" in t or not own_k]:
        try:
            ms = in_graph(lambda w, t=tile: step_triton.step_linear_triton(x, w, wide=t, **kwargs), weight)
            same = torch.equal(
                step_triton.step_linear_triton(x, weight, wide=tile, **kwargs),
                step_triton.step_linear_triton(x, weight, wide=False, **kwargs),
            )
        except Exception:  # noqa: BLE001 - a tile that does not fit (shared memory, registers) is skipped
            continue
        print(f"|  tile {tile} | | | {ms:.3f} | | | | {'yes' if same else 'NO'} |", flush=True)
        if not same:
            continue
        best = min(best, (ms, tile), key=lambda b: b[0])
    return best


# the wide-like tiles `--parallel-split` times on the grouped kernel (the step tile's SPLIT kept)
SPLIT_GRID: list[dict] = [
    {"groups": g, "BLOCK_N": n, "BLOCK_K": 64, "num_warps": w, "num_stages": st}
    for g, n, w, st in (
        (4, 128, 4, 4),
        (4, 64, 4, 4),
        (4, 128, 8, 4),
        (8, 128, 8, 3),
        (8, 64, 4, 4),
        (2, 128, 4, 4),
    )
]


def explore_split(x, weight, kwargs, config: dict) -> tuple[float, dict]:
    """The fastest SPLIT_GRID tile of the grouped kernel with the step tile `config`'s K slices (those that compile,
    fit, and keep every row equal to the 16-row kernel's), and its time."""
    best: tuple[float, dict] = (float("inf"), {})
    want = step_triton.step_linear_triton(x, weight, wide=False, **kwargs)
    for tile in SPLIT_GRID:
        forced = {k: v for k, v in tile.items() if k != "groups"} | {"SPLIT": config.get("SPLIT", 1)}

        def call(w, forced=forced, groups=tile["groups"]):
            return step_triton.step_linear_triton(x, w, config=forced, groups=groups, wide=False, **kwargs)

        try:
            ms = in_graph(call, weight)
            same = torch.equal(want, call(weight))
        except Exception:  # noqa: BLE001 - a tile that does not fit (shared memory, registers) is skipped
            continue
        print(
            f"|  split {forced} x{tile['groups']} | | | {ms:.3f} | | | | {'yes' if same else 'NO'} |",
            flush=True,
        )
        if same:
            best = min(best, (ms, tile | forced), key=lambda b: b[0])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--rows", default="16,32,64,128,256,1024,2048")
    parser.add_argument("--only", default="", help="GEMM names to time (default: all), e.g. qkv,gate_up")
    parser.add_argument(
        "--explore",
        metavar="ROWS",
        help="also time a grid of wide tiles (one dot or one per group) at ROWS rows",
    )
    parser.add_argument("--own-k", action="store_true", help="explore only tiles with a BLOCK_K of their own")
    parser.add_argument(
        "--parallel-split",
        metavar="ROWS",
        help="also time the grouped kernel with wide tiles at ROWS rows for GEMMs whose step tile splits K",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/wide_gemm.py needs a CUDA device")
    print_table(
        args.model,
        [int(r) for r in args.rows.split(",")],
        args.only,
        args.explore,
        args.own_k,
        args.parallel_split,
    )


def print_table(
    model: str,
    row_counts: list[int],
    only: str = "",
    explore_rows: str | None = None,
    own_k: bool = False,
    split_rows: str | None = None,
) -> None:
    """The table above for `model`'s GEMMs (SHAPES) at each row count (bench/target.py --gemm-rows prints it too)."""
    print(f"# {torch.cuda.get_device_name()} · torch {torch.__version__} · {model}")
    print(
        "| GEMM | rows | tile ms | grouped ms (tiles) | now ms | cuBLAS ms | now / cuBLAS speed | tile / cuBLAS "
        "| grouped / cuBLAS | equal |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, n, k, kind in SHAPES[model]:
        if only and name not in only.split(","):
            continue
        for rows in row_counts:
            x, weight, kwargs = operands(n, k, kind, rows)
            tile = in_graph(lambda w: step_triton.step_linear_triton(x, w, wide=False, **kwargs), weight)
            wide = in_graph(lambda w: step_triton.step_linear_triton(x, w, **kwargs), weight)
            plain = weight[:n] if kind != "gated" else weight
            cublas = in_graph(lambda w: torch.nn.functional.linear(x, w), plain)
            want = step_triton.step_linear_triton(x, weight, wide=False, **kwargs)
            same = torch.equal(want, step_triton.step_linear_triton(x, weight, **kwargs))
            tiles = grouped_tiles(n, k, kind, rows, x.device)
            grouped_cell, grouped_share = "-", "-"
            if tiles > 1:
                try:
                    grouped = in_graph(
                        lambda w: step_triton.step_linear_triton(x, w, groups=tiles, wide=False, **kwargs),
                        weight,
                    )
                    same = same and torch.equal(
                        want, step_triton.step_linear_triton(x, weight, groups=tiles, wide=False, **kwargs)
                    )
                    grouped_cell, grouped_share = f"{grouped:.3f} ({tiles})", f"{cublas / grouped:.0%}"
                except (
                    OutOfResources
                ):  # the step tile at this many rows a program: the runtime falls back too
                    grouped_cell = f"unfit ({tiles})"
            print(
                f"| {name} {n}x{k} | {rows} | {tile:.3f} | {grouped_cell} | {wide:.3f} | {cublas:.3f} "
                f"| {cublas / wide:.0%} | {cublas / tile:.0%} | {grouped_share} | {'yes' if same else 'NO'} |",
                flush=True,
            )
            if explore_rows and rows == int(explore_rows):
                ms, best = explore(x, weight, kwargs, own_k)
                print(
                    f"|  best wide tile {best} | {rows} | | {ms:.3f} | | {cublas / ms:.0%} | | |", flush=True
                )
            config = step_triton.tile_in_use(step_key(n, k, kind), x.device)
            if split_rows and rows == int(split_rows) and config and config.get("SPLIT", 1) > 1:
                ms, best = explore_split(x, weight, kwargs, config)
                print(
                    f"|  best parallel split {best} | {rows} | | {ms:.3f} | | {cublas / ms:.0%} | | |",
                    flush=True,
                )


def step_key(n: int, k: int, kind: str) -> tuple:
    """The step tile's key of one of SHAPES' GEMMs (bf16 weights)."""
    return step_triton.linear_key(
        n,
        k,
        norm=kind in ("norm", "gated"),
        bias=False,
        residual=kind == "residual",
        gated=kind == "gated",
        dtype=torch.bfloat16,
        out_dtype=torch.float32 if kind == "lm_head" else torch.bfloat16,
    )


def grouped_tiles(n: int, k: int, kind: str, rows: int, device: torch.device) -> int:
    """The 16-row tiles a grouped program takes for this GEMM at `rows` rows (1: none, as under a stream-K tile),
    from the step tile in use (the call above tuned or loaded it)."""
    config = step_triton.tile_in_use(step_key(n, k, kind), device)
    if config is None or config.get("STREAM") or rows <= step_triton.BLOCK_M:
        return 1
    return step_triton.default_groups(min(rows, step_triton.WIDE_ROWS - 1), config, kind == "gated", device)


if __name__ == "__main__":
    main()
