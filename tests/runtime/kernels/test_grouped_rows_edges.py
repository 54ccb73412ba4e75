"""Edge cases of the grouped step GEMM (`_step_linear_rows`: 2 or 4 tiles of 16 rows a program, for calls of more
than one tile and fewer than WIDE_ROWS rows): row counts at and just past the tile boundaries, ragged N and K
under split-K, strided inputs and outputs, other dtypes, split-K counters across calls of different row counts,
and the choice of the grouped path itself. Every row must equal the 16-row kernel's bit for bit (on the CPU the
interpreter's per-group dots are numpy matmuls of 16 rows, the 16-row kernel's own shapes), and be close to the
torch reference."""

from __future__ import annotations

import pytest
import torch
from interpreted_triton import CUDA, DEVICE, fresh, triton  # noqa: F401 (before any kernel module)

from lilicorr_runtime import ops
from lilicorr_runtime.ops import step_triton

step_ops = fresh(step_triton)

TILE = step_ops.BLOCK_M  # rows of the 16-row kernel's program
SMALL_TILE = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


def _spy_grouped(monkeypatch) -> list[tuple[int, int, int]]:
    """Records the grid of every `_step_linear_rows` launch (the real kernel still runs)."""
    launched: list[tuple[int, int, int]] = []
    real = step_ops._step_linear_rows

    class Spy:
        def __getitem__(self, grid):
            launched.append(tuple(grid))
            return real[grid]

    monkeypatch.setattr(step_ops, "_step_linear_rows", Spy())
    return launched


def _inputs(kind: str, rows: int, n: int, k: int, seed: int, dtype: torch.dtype = torch.float32):
    """x [rows, k], the weight, and the call's keyword arguments for one of the epilogue kinds."""
    gated = "gated" in kind
    x = _randn(rows, k, seed=seed, dtype=dtype)
    weight = _randn(2 * n if gated else n, k, seed=seed + 1, scale=0.1, dtype=dtype)
    kwargs: dict = {}
    if "norm" in kind:
        kwargs.update(norm_weight=_randn(k, seed=seed + 2, dtype=dtype) + 1.0, eps=1e-6)
    if "bias" in kind:
        kwargs["bias"] = _randn(n, seed=seed + 3, dtype=dtype)
    if gated:
        kwargs["gated"] = True
    if "residual" in kind:
        kwargs["residual"] = _randn(rows, n, seed=seed + 4, dtype=dtype)
    return x, weight, kwargs


def _rows_of(kwargs: dict, lo: int, hi: int) -> dict:
    """The call's keyword arguments for rows lo..hi of x (the residual sliced along)."""
    if kwargs.get("residual") is None:
        return kwargs
    return {**kwargs, "residual": kwargs["residual"][lo:hi]}


# ---------------------------------------------------------------- (1) row counts at the tile boundaries

BOUNDARY_ROWS = [17, 32, 33, 64, 65, 127]
# rows checked against a one-row call: the first and last of each 16-row tile and of each 2- or 4-tile program
CHECKED_ROWS = sorted(
    {0, 1, 14, 15, 16, 17, 30, 31, 32, 33, 47, 48, 62, 63, 64, 65, 79, 95, 111, 112, 125, 126}
)
EDGE_N, EDGE_K = 24, 72  # default tile: BLOCK_N 16 (a partial column tile), K not a multiple of BLOCK_K


@pytest.fixture(scope="module", params=["norm_gated", "bias_residual"])
def boundary_case(request):
    """The inputs of `step_ops.WIDE_ROWS - 1` rows and the one-row calls' results for CHECKED_ROWS (a row's
    result does not depend on the call's row count, so they serve every row count)."""
    kind = request.param
    x, weight, kwargs = _inputs(kind, step_ops.WIDE_ROWS - 1, EDGE_N, EDGE_K, seed=100)
    ones = {
        i: step_ops.step_linear_triton(x[i : i + 1], weight, **_rows_of(kwargs, i, i + 1))[0]
        for i in CHECKED_ROWS
    }
    return x, weight, kwargs, ones


@pytest.mark.parametrize("rows", BOUNDARY_ROWS)
def test_grouped_rows_at_tile_boundaries_equal_the_tile_kernel_and_one_row_calls(
    monkeypatch, boundary_case, rows
):
    """A call of 17..127 rows takes the grouped kernel by default (2 tiles a program up to 32 rows, 4 from 33, the
    last program partial), and every row equals the 16-row kernel's row and a one-row call's, bit for bit."""
    monkeypatch.setattr(step_ops, "TUNED", {})  # the default tile: linear_config
    x, weight, kwargs, ones = boundary_case
    x = x[:rows]
    kwargs = _rows_of(kwargs, 0, rows)
    gated = bool(kwargs.get("gated"))
    config = step_ops.linear_config(EDGE_N, EDGE_K)
    assert "STREAM" not in config and config.get("SPLIT", 1) == 1
    groups = step_ops.default_groups(rows, config, gated, x.device)
    assert groups == (2 if rows <= 2 * TILE else 4)
    launched = _spy_grouped(monkeypatch)
    many = step_ops.step_linear_triton(x, weight, **kwargs)
    assert launched == [(triton.cdiv(rows, groups * TILE), triton.cdiv(EDGE_N, config["BLOCK_N"]), 1)]
    tile = step_ops.step_linear_triton(x, weight, wide=False, **kwargs)
    assert len(launched) == 1  # wide=False: the 16-row kernel
    assert many.shape == (rows, EDGE_N)
    assert torch.equal(many, tile)
    for i in CHECKED_ROWS:
        if i < rows:
            assert torch.equal(many[i], ones[i]), i
    assert torch.equal(
        many[rows - 1], step_ops.step_linear_triton(x[-1:], weight, **_rows_of(kwargs, rows - 1, rows))[0]
    )
    torch.testing.assert_close(many, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- (2) N and K off the tile grid, split-K


@pytest.mark.parametrize(("kind", "split"), [("norm_bias", 1), ("norm_gated", 5), ("residual", 2)])
def test_grouped_rows_with_ragged_n_and_k_under_split_k(monkeypatch, split, kind):
    """N = 37 (three column tiles of 16, the last of 5 columns) and K = 150 (five K tiles of 32, the last of 22),
    in 1, 2 (96 + 54 columns) or 5 (32 each, the last 22) slices: the grouped kernel, by default (4) and forced
    to 2 and 8 tiles a program, writes every row as the 16-row kernel does, and nothing past N."""
    rows, n, k = 36, 37, 150  # default grouping: 4 tiles a program (one program, the last tile of 4 rows)
    x, weight, kwargs = _inputs(kind, rows, n, k, seed=200)
    config = {**SMALL_TILE, "SPLIT": split}
    tile = step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs)
    torch.testing.assert_close(tile, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)
    assert step_ops.default_groups(rows, config, "gated" in kind, x.device) == 4
    launched = _spy_grouped(monkeypatch)
    for groups in (None, 2, 8):
        out_wide = torch.full((rows + 3, n + 7), float("nan"), device=DEVICE)  # rows and columns to spare
        got = step_ops.step_linear_triton(
            x, weight, config=config, groups=groups, out=out_wide[:rows, :n], **kwargs
        )
        g = groups or step_ops.default_groups(rows, config, "gated" in kind, x.device)
        assert launched[-1] == (triton.cdiv(rows, g * TILE), 3, split), groups
        assert torch.equal(got, tile), groups
        assert torch.isnan(out_wide[:, n:]).all(), groups  # columns past N never written
        assert torch.isnan(out_wide[rows:]).all(), groups  # nor rows past M (the last program's masked rows)
    assert int(step_ops._counters(x.device, 1).abs().sum()) == 0


@pytest.mark.parametrize(("groups", "rows"), [(2, 1), (4, 5), (4, 16)])
def test_forced_groups_on_fewer_rows_than_a_program_holds(rows, groups):
    """`groups` forces the grouped kernel even on a call of one tile or less: the program's missing rows are masked,
    and the rows it has equal the 16-row kernel's."""
    x, weight, kwargs = _inputs("norm_residual", rows, 37, 150, seed=250)
    config = {**SMALL_TILE, "SPLIT": 2}
    tile = step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs)
    got = step_ops.step_linear_triton(x, weight, config=config, groups=groups, **kwargs)
    assert torch.equal(got, tile)


# ---------------------------------------------------------------- (3) strided rows in and out


@pytest.mark.parametrize(("kind", "split"), [("norm_residual", 3), ("gated", 1)])
def test_grouped_rows_read_strided_rows_and_write_a_column_slice(split, kind):
    """x a column slice of a wider tensor (rows strided), the residual too, both surrounded by NaN (read a column
    or row outside them and the result is NaN), and `out` a column slice of a wider NaN buffer with rows to spare:
    the grouped kernel reads the right rows, writes only its slice, and matches the 16-row kernel."""
    rows, n, k = 45, 40, 100
    x_wide = torch.full((rows + 2, 3 * k), float("nan"), device=DEVICE)
    x = x_wide[:rows, k : 2 * k]
    x.copy_(_randn(rows, k, seed=300))
    _, weight, kwargs = _inputs(kind, rows, n, k, seed=301)
    if "residual" in kwargs:
        r_wide = torch.full((rows + 2, 2 * n + 3), float("nan"), device=DEVICE)
        r_wide[:rows, 3 : n + 3] = kwargs["residual"]
        kwargs["residual"] = r_wide[:rows, 3 : n + 3]
        assert kwargs["residual"].stride(0) == 2 * n + 3
    assert x.stride(0) == 3 * k
    config = {**SMALL_TILE, "SPLIT": split}
    results = {}
    for name, extra in (("tile", {"wide": False}), ("default", {}), ("two", {"groups": 2})):
        out_wide = torch.full((rows + 2, 3 * n), float("nan"), device=DEVICE)
        out = out_wide[:rows, n : 2 * n]
        got = step_ops.step_linear_triton(x, weight, config=config, out=out, **extra, **kwargs)
        assert got.data_ptr() == out.data_ptr()
        assert torch.isnan(out_wide[:, :n]).all() and torch.isnan(out_wide[:, 2 * n :]).all(), name
        assert torch.isnan(out_wide[rows:]).all(), name
        assert not torch.isnan(out).any(), name
        results[name] = out.clone()
    assert torch.equal(results["default"], results["tile"])
    assert torch.equal(results["two"], results["tile"])
    want = ops.step_linear_reference(x.contiguous(), weight, **kwargs)
    torch.testing.assert_close(results["default"], want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- (4) output and input dtypes


@pytest.mark.parametrize("split", [2])
def test_grouped_rows_with_an_fp32_out_dtype(split):
    x, weight, kwargs = _inputs("norm_bias", 50, 40, 100, seed=400)
    config = {**SMALL_TILE, "SPLIT": split}
    tile = step_ops.step_linear_triton(
        x, weight, config=config, wide=False, out_dtype=torch.float32, **kwargs
    )
    got = step_ops.step_linear_triton(x, weight, config=config, out_dtype=torch.float32, **kwargs)
    assert got.dtype == torch.float32
    assert torch.equal(got, tile)
    want = ops.step_linear_reference(x, weight, out_dtype=torch.float32, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "kind", "split"),
    [
        (torch.bfloat16, None, "norm_gated", 1),
        (torch.float16, torch.float32, "norm_gated", 1),
        (torch.bfloat16, torch.float32, "bias_residual", 3),
    ],
)
def test_grouped_rows_in_half_precision(dtype, out_dtype, kind, split):
    """Half-precision inputs and weights (the output in their dtype or in fp32, as an lm_head's): the grouped rows
    equal the 16-row kernel's bit for bit, and the fp32 reference of the same values loosely."""
    rows, n, k = 40, 40, 64
    x, weight, kwargs = _inputs(kind, rows, n, k, seed=410, dtype=dtype)
    config = {**SMALL_TILE, "SPLIT": split}
    tile = step_ops.step_linear_triton(x, weight, config=config, wide=False, out_dtype=out_dtype, **kwargs)
    got = step_ops.step_linear_triton(x, weight, config=config, out_dtype=out_dtype, **kwargs)
    forced = step_ops.step_linear_triton(x, weight, config=config, groups=2, out_dtype=out_dtype, **kwargs)
    assert got.dtype == (out_dtype or dtype)
    assert torch.equal(got, tile)
    assert torch.equal(forced, tile)
    up = {key: value.float() if isinstance(value, torch.Tensor) else value for key, value in kwargs.items()}
    want = ops.step_linear_reference(x.float(), weight.float(), **up)
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


# ---------------------------------------------------------------- (5) split-K counters across calls


@pytest.mark.parametrize("kind", ["norm_gated"])
def test_split_k_grouped_calls_back_to_back_reset_their_counters(kind):
    """Split-K calls of different row counts (so different grids over the shared arrival counters), grouped and
    16-row, one after another and repeated: each call's last program resets its counters, so every repeat
    gives the same rows, each as the 16-row kernel's, and the counters end at zero."""
    n, k = 20, 96
    x, weight, kwargs = _inputs(kind, 65, n, k, seed=500)
    config = {**SMALL_TILE, "SPLIT": 3}
    sequence = [(40, None), (17, None), (65, 4), (17, "tile"), (40, 2)]
    want: dict[int, torch.Tensor] = {}
    for rows, _ in sequence:
        if rows not in want:
            want[rows] = step_ops.step_linear_triton(
                x[:rows], weight, config=config, wide=False, **_rows_of(kwargs, 0, rows)
            )
    for _ in range(2):
        for rows, groups in sequence:
            extra = {"wide": False} if groups == "tile" else {"groups": groups}
            out = torch.full((rows, n), float("nan"), device=DEVICE)
            step_ops.step_linear_triton(
                x[:rows], weight, config=config, out=out, **extra, **_rows_of(kwargs, 0, rows)
            )
            assert torch.equal(out, want[rows]), (rows, groups)
        assert int(step_ops._counters(x.device, 1).abs().sum()) == 0
    torch.testing.assert_close(want[65], ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- (6) the grouped path's choice


@pytest.mark.parametrize("split", [2])
def test_max_groups_two_still_keeps_every_row(monkeypatch, split):
    """With MAX_GROUPS 2, a 100-row call runs 2 tiles a program (4 programs down the rows) and equals the 16-row
    kernel's result."""
    monkeypatch.setattr(step_ops, "MAX_GROUPS", 2)
    x, weight, kwargs = _inputs("norm_gated", 100, 40, 100, seed=600)
    config = {**SMALL_TILE, "SPLIT": split}
    assert step_ops.default_groups(100, config, True, x.device) == 2
    launched = _spy_grouped(monkeypatch)
    got = step_ops.step_linear_triton(x, weight, config=config, **kwargs)
    assert launched == [(4, 3, split)]
    assert torch.equal(got, step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs))
    torch.testing.assert_close(got, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)


def test_max_groups_one_never_launches_the_grouped_kernel(monkeypatch):
    """With MAX_GROUPS 1 the default grouping is one tile a program: no call of any row count launches
    `_step_linear_rows`, and the rows are the 16-row kernel's."""
    monkeypatch.setattr(step_ops, "MAX_GROUPS", 1)
    x, weight, kwargs = _inputs("norm_bias", 100, 24, 64, seed=610)
    launched = _spy_grouped(monkeypatch)
    for split in (1, 2):
        config = {**SMALL_TILE, "SPLIT": split}
        for rows in (17, 100):
            assert step_ops.default_groups(rows, config, False, x.device) == 1
            got = step_ops.step_linear_triton(x[:rows], weight, config=config, **kwargs)
            tile = step_ops.step_linear_triton(x[:rows], weight, config=config, wide=False, **kwargs)
            assert torch.equal(got, tile), (split, rows)
    assert launched == []
