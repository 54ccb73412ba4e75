"""The target step's Triton kernels (kernels/step_ops.py) against their torch references, and their batch
invariance: a row's result does not depend on how many rows the call has. Under TRITON_INTERPRET=1 on the CPU
(small shapes, run in CI) and natively on CUDA (marked gpu)."""

from __future__ import annotations

import pytest
import torch
from interpreted_triton import CUDA, DEVICE, fresh, triton  # noqa: F401 (before any kernel module)

from lilicorr_runtime import ops
from lilicorr_runtime.ops import step_triton

step_ops = fresh(step_triton)


def assert_same_row(one: torch.Tensor, many: torch.Tensor) -> None:
    """Bit for bit on CUDA, where batch invariance is the kernels' property. The interpreter runs tl.dot as a
    numpy matmul whose BLAS blocks rows by their position in the tile, so there the rows agree to fp32 round-off."""
    if CUDA:
        assert torch.equal(one, many)
    else:
        torch.testing.assert_close(one, many, rtol=1e-6, atol=1e-5)


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


@pytest.mark.parametrize("rows", [1, 17])
@pytest.mark.parametrize("kind", ["plain", "norm", "norm_bias", "gated", "residual"])
def test_step_linear_matches_the_reference(rows, kind):
    k, n = 80, 40  # neither a multiple of the tiles: every mask is exercised
    x = _randn(rows, k, seed=rows)
    weight = _randn(2 * n if kind == "gated" else n, k, seed=1, scale=0.1)
    kwargs: dict = {}
    if kind.startswith("norm") or kind == "gated":
        kwargs.update(norm_weight=_randn(k, seed=2) + 1.0, eps=1e-6)
    if kind == "norm_bias":
        kwargs["bias"] = _randn(n, seed=3)
    if kind == "gated":
        kwargs["gated"] = True
    if kind == "residual":
        kwargs["residual"] = _randn(rows, n, seed=4)
    got = step_ops.step_linear_triton(x, weight, **kwargs)
    want = ops.step_linear_reference(x, weight, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_step_linear_writes_a_strided_output_and_reads_strided_rows():
    x_wide = _randn(6, 3 * 48, seed=5)
    x = x_wide[:, 48:96]  # rows with a stride of 144
    weight = _randn(48, 48, seed=6, scale=0.2)
    out_wide = torch.full((6, 2 * 48), float("nan"), device=DEVICE)
    out = out_wide[:, 48:]
    got = step_ops.step_linear_triton(x, weight, residual=x, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, ops.step_linear_reference(x, weight, residual=x), rtol=1e-4, atol=1e-4)
    assert torch.isnan(out_wide[:, :48]).all()  # nothing written outside the slice


def test_step_linear_rows_do_not_depend_on_the_row_count():
    x = _randn(9, 64, seed=7)
    weight = _randn(2 * 32, 64, seed=8, scale=0.2)
    norm = _randn(64, seed=9) + 1.0
    many = step_ops.step_linear_triton(x, weight, norm_weight=norm, eps=1e-6, gated=True)
    for i in (0, 4, 8):
        one = step_ops.step_linear_triton(x[i : i + 1], weight, norm_weight=norm, eps=1e-6, gated=True)
        assert_same_row(one[0], many[i])


def _tables(hd: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    return ops.rope_tables(inv_freq.to(DEVICE), 1.0, positions)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_kv_matches_the_reference(qk_norm):
    b, n, heads, kv_heads, hd, capacity = 2, 3, 4, 2, 16, 24
    qkv = _randn(b, n, (heads + 2 * kv_heads) * hd, seed=10)
    rows = torch.tensor([[4, 5, 6], [10, 11, 12]], device=DEVICE)
    positions = rows - torch.tensor([[0], [3]], device=DEVICE)
    cos, sin = _tables(hd, capacity)
    norms = (_randn(hd, seed=11) + 1.0, _randn(hd, seed=12) + 1.0) if qk_norm else (None, None)
    caches = []
    for _ in range(2):
        caches.append(
            (
                torch.full((b, kv_heads, capacity, hd), -7.0, device=DEVICE),
                torch.full((b, kv_heads, capacity, hd), -7.0, device=DEVICE),
            )
        )
    got = step_ops.rope_kv_triton(qkv, *caches[0], rows, positions, cos, sin, heads, kv_heads, *norms, 1e-6)
    want = ops.rope_kv_reference(qkv, *caches[1], rows, positions, cos, sin, heads, kv_heads, *norms, 1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, c in zip(caches[0], caches[1], strict=True):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    untouched = torch.ones(capacity, dtype=torch.bool)
    untouched[4:7] = False
    assert (caches[0][0][0, :, untouched] == -7.0).all()  # only the rows written


# Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so bf16 runs on CUDA only; its
# fp16 casts round to nearest as the GPU's do
HALF_DTYPES = [torch.float16] + ([torch.bfloat16] if CUDA else [])


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_kv_in_dtype_is_the_drafters_rotation_bit_for_bit(qk_norm, dtype):
    """rotate_in_dtype: angles in the dtype, every product and sum rounded, as the drafter's eager backbone
    rotates (ops.apply_rope on half-precision q/k with rope_cos_sin's rounded angles): the kernel, the reference
    and that eager rotation agree bit for bit, and differ from the fp32-once rotation."""
    from lilicorr_runtime.ops.core import rope_cos_sin

    b, n, heads, kv_heads, hd, capacity = 2, 3, 4, 2, 16, 24
    qkv = _randn(b, n, (heads + 2 * kv_heads) * hd, seed=20, scale=3.0, dtype=dtype)
    rows = torch.tensor([[4, 5, 6], [10, 11, 12]], device=DEVICE)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32, device=DEVICE) / hd))
    cos, sin = ops.rope_tables(inv_freq, 1.0, capacity)
    norms = (_randn(hd, seed=21, dtype=dtype) + 1.0, _randn(hd, seed=22, dtype=dtype) + 1.0)
    norms = norms if qk_norm else (None, None)
    caches = [
        tuple(torch.zeros(b, kv_heads, capacity, hd, device=DEVICE, dtype=dtype) for _ in range(2))
        for _ in range(3)
    ]
    got = step_ops.rope_kv_triton(qkv, *caches[0], rows, rows, cos, sin, heads, kv_heads, *norms, 1e-6, True)
    want = ops.rope_kv_reference(qkv, *caches[1], rows, rows, cos, sin, heads, kv_heads, *norms, 1e-6, True)
    fp32_once = ops.rope_kv_reference(qkv, *caches[2], rows, rows, cos, sin, heads, kv_heads, *norms, 1e-6)
    # the drafter's eager rotation of the same q heads
    q = qkv[..., : heads * hd].reshape(b, n, heads, hd)
    if qk_norm:
        q = ops.rms_norm_reference(q, norms[0], 1e-6)
    c, s = rope_cos_sin(rows, inv_freq, 1.0, dtype)  # [b, 1, n, hd/2]
    eager = ops.apply_rope(q.transpose(1, 2), c, s).transpose(1, 2)
    assert torch.equal(want, eager)
    assert torch.equal(got, want)
    for a, c2 in zip(caches[0], caches[1], strict=True):
        assert torch.equal(a, c2)
    assert not torch.equal(want, fp32_once)  # the two roundings are different computations


def test_rope_kv_never_writes_past_the_cache():
    b, n, heads, kv_heads, hd, capacity = 1, 3, 2, 1, 16, 8
    qkv = _randn(b, n, (heads + 2 * kv_heads) * hd, seed=23)
    rows = torch.tensor([[6, 7, 8]], device=DEVICE)  # row 8 is past the capacity
    cos, sin = _tables(hd, 16)
    block = torch.full((2, b, kv_heads, capacity + 4, hd), -7.0, device=DEVICE)
    keys, values = (
        block[0, :, :, :capacity],
        block[1, :, :, :capacity],
    )  # views: row 8 would land in the spare
    step_ops.rope_kv_triton(qkv, keys, values, rows, rows, cos, sin, heads, kv_heads, None, None, 1e-6)
    assert (block[:, :, :, capacity:] == -7.0).all()
    assert (keys[0, :, 6:8] != -7.0).all() and (values[0, :, 6:8] != -7.0).all()


def _rope_attention_inputs(b, n, heads, kv_heads, hd, capacity, qk_norm, seed):
    qkv = _randn(b, n, (heads + 2 * kv_heads) * hd, seed=seed)
    start = torch.tensor([2, 7], device=DEVICE)[:b]
    rows = start[:, None] + torch.arange(n, device=DEVICE)
    pad = torch.tensor([0, 3], device=DEVICE)[:b]
    norms = (_randn(hd, seed=seed + 1) + 1.0, _randn(hd, seed=seed + 2) + 1.0) if qk_norm else (None, None)
    context = (
        _randn(b, kv_heads, capacity, hd, seed=seed + 3),
        _randn(b, kv_heads, capacity, hd, seed=seed + 4),
    )
    return qkv, rows, rows - pad[:, None], pad, norms, context


@pytest.mark.parametrize("n", [1, 5, step_ops.FUSED_ROWS, step_ops.FUSED_ROWS + 9])  # fused, and two launches
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_attention_matches_the_reference(n, qk_norm):
    b, heads, kv_heads, hd, capacity = 2, 6, 2, 16, 64
    qkv, rows, positions, pad, norms, (k0, v0) = _rope_attention_inputs(
        b, n, heads, kv_heads, hd, capacity, qk_norm, 30
    )
    cos, sin = _tables(hd, capacity)
    caches = [(k0.clone(), v0.clone()) for _ in range(2)]
    args = (rows, positions, rows, pad, cos, sin, heads, kv_heads, *norms, 1e-6)
    got = step_ops.rope_attention_triton(qkv, *caches[0], *args)
    want = ops.rope_attention_reference(qkv, *caches[1], *args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, c in zip(caches[0], caches[1], strict=True):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_attention_rows_do_not_depend_on_the_step_length_or_the_launch(qk_norm):
    """A prefill of many rows (two launches), then a one-row step (one fused launch), computes the last row and
    its K/V as one prefill covering it does, and as rope_kv writes them: batch invariance across the modes."""
    b, heads, kv_heads, hd, capacity = 2, 6, 2, 16, 96
    n = step_ops.FUSED_ROWS + 8
    qkv, rows, positions, pad, norms, (k0, v0) = _rope_attention_inputs(
        b, n, heads, kv_heads, hd, capacity, qk_norm, 40
    )
    cos, sin = _tables(hd, capacity)
    whole = (k0.clone(), v0.clone())
    all_rows = step_ops.rope_attention_triton(
        qkv, *whole, rows, positions, rows, pad, cos, sin, heads, kv_heads, *norms, 1e-6
    )
    split = (k0.clone(), v0.clone())
    head = step_ops.rope_attention_triton(
        qkv[:, :-1],
        *split,
        rows[:, :-1],
        positions[:, :-1],
        rows[:, :-1],
        pad,
        cos,
        sin,
        heads,
        kv_heads,
        *norms,
        1e-6,
    )
    last = step_ops.rope_attention_triton(
        qkv[:, -1:],
        *split,
        rows[:, -1:],
        positions[:, -1:],
        rows[:, -1:],
        pad,
        cos,
        sin,
        heads,
        kv_heads,
        *norms,
        1e-6,
    )
    assert_same_row(last, all_rows[:, -1:])
    assert_same_row(head, all_rows[:, :-1])
    for a, c in zip(split, whole, strict=True):
        assert_same_row(a, c)
    written = (k0.clone(), v0.clone())  # rope_kv writes the same K/V
    step_ops.rope_kv_triton(qkv, *written, rows, positions, cos, sin, heads, kv_heads, *norms, 1e-6)
    for a, c in zip(written, whole, strict=True):
        assert_same_row(a, c)


def test_rope_attention_refuses_half_a_qk_norm_and_no_query_heads():
    b, n, heads, kv_heads, hd, capacity = 1, 2, 2, 1, 16, 8
    qkv, rows, positions, pad, _, (k0, v0) = _rope_attention_inputs(
        b, n, heads, kv_heads, hd, capacity, False, 50
    )
    cos, sin = _tables(hd, capacity)
    with pytest.raises(ValueError, match="both given or both None"):
        ops.rope_attention(
            qkv, k0, v0, rows, positions, rows, pad, cos, sin, heads, kv_heads, cos[0].repeat(2), None
        )
    with pytest.raises(ValueError, match="needs query heads"):
        ops.rope_attention(qkv[..., hd:], k0, v0, rows, positions, rows, pad, cos, sin, 0, kv_heads)


def test_step_attention_matches_the_reference_and_reads_only_visible_rows():
    b, n, heads, kv_heads, hd, capacity = 2, 4, 6, 2, 16, 160
    q = _randn(b, n, heads, hd, seed=13)
    keys, values = _randn(b, kv_heads, capacity, hd, seed=14), _randn(b, kv_heads, capacity, hd, seed=15)
    last = torch.tensor([[70, 71, 72, 73], [5, 6, 7, 8]], device=DEVICE)
    first = torch.tensor([0, 3], device=DEVICE)
    want = ops.step_attention_reference(q, keys, values, last, first)
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    poisoned_k[0, :, 74:] = float("nan")  # rows no query sees: never read
    poisoned_v[0, :, 74:] = float("nan")
    poisoned_k[1, :, :3] = float("nan")
    poisoned_v[1, :, 9:] = float("nan")
    got = step_ops.step_attention_triton(q, poisoned_k, poisoned_v, last, first)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_step_attention_rows_do_not_depend_on_the_step_length():
    heads, kv_heads, hd, capacity = 4, 2, 16, 200
    keys, values = _randn(1, kv_heads, capacity, hd, seed=16), _randn(1, kv_heads, capacity, hd, seed=17)
    q = _randn(1, 8, heads, hd, seed=18)
    last = torch.arange(120, 128, device=DEVICE)[None]  # the verify block crosses a 64-key block boundary
    first = torch.zeros(1, dtype=torch.long, device=DEVICE)
    block = step_ops.step_attention_triton(q, keys, values, last, first)
    for i in range(8):
        one = step_ops.step_attention_triton(q[:, i : i + 1], keys, values, last[:, i : i + 1], first)
        assert_same_row(one[0, 0], block[0, i])


def test_step_attention_left_padding_rows_stay_finite_and_garbage_before_the_first_row_is_never_read():
    heads, kv_heads, hd, capacity = 2, 1, 16, 80
    keys, values = _randn(1, kv_heads, capacity, hd, seed=19), _randn(1, kv_heads, capacity, hd, seed=20)
    q = _randn(1, 6, heads, hd, seed=21)
    last = torch.arange(0, 6, device=DEVICE)[None]  # rows 0..2 are padding (before first = 3)
    first = torch.tensor([3], device=DEVICE)
    want = ops.step_attention_reference(q, keys, values, last, first)
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    poisoned_k[:, :, :3] = float(
        "nan"
    )  # the padding rows: never read (SDPA, the reference, would be poisoned)
    poisoned_v[:, :, :3] = float("nan")
    got = step_ops.step_attention_triton(q, poisoned_k, poisoned_v, last, first)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


SPLIT_TILE = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("split", [2, 3, 8])
@pytest.mark.parametrize("kind", ["plain", "norm_bias", "gated", "residual"])
def test_split_k_matches_the_reference_and_resets_its_counters(split, kind):
    rows, k, n = 19, 200, 40  # 7 K tiles: slices of unequal depth, and with 8 slices an empty one
    x = _randn(rows, k, seed=11)
    weight = _randn(2 * n if kind == "gated" else n, k, seed=12, scale=0.1)
    kwargs: dict = {}
    if kind in ("norm_bias", "gated"):
        kwargs.update(norm_weight=_randn(k, seed=13) + 1.0, eps=1e-6)
    if kind == "norm_bias":
        kwargs["bias"] = _randn(n, seed=14)
    if kind == "gated":
        kwargs["gated"] = True
    if kind == "residual":
        kwargs["residual"] = _randn(rows, n, seed=15)
    config = {**SPLIT_TILE, "SPLIT": split}
    first = step_ops.step_linear_triton(x, weight, config=config, **kwargs)
    torch.testing.assert_close(first, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)
    again = step_ops.step_linear_triton(x, weight, config=config, **kwargs)  # counters were reset by the last
    assert torch.equal(first, again)
    counters = step_ops._counters(x.device, 1)
    assert int(counters.abs().sum()) == 0


def test_split_k_rows_do_not_depend_on_the_row_count():
    x = _randn(9, 256, seed=16)
    weight = _randn(2 * 32, 256, seed=17, scale=0.2)
    norm = _randn(256, seed=18) + 1.0
    config = {**SPLIT_TILE, "SPLIT": 4}
    many = step_ops.step_linear_triton(x, weight, norm_weight=norm, eps=1e-6, gated=True, config=config)
    for i in (0, 5, 8):
        one = step_ops.step_linear_triton(
            x[i : i + 1], weight, norm_weight=norm, eps=1e-6, gated=True, config=config
        )
        assert_same_row(one[0], many[i])


STREAM_TILE = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize(
    ("sms", "stream", "kind"),
    [
        (1, 1, "plain"),  # one program: every tile whole, no partial sums
        (3, 1, "norm_bias"),  # tiles shared by two programs
        (5, 2, "gated"),  # ten programs over 21 units: tiles shared by up to three, some programs inside one
        (7, 3, "residual"),  # 21 programs, one unit each: every tile cut into seven
    ],
)
def test_stream_k_matches_the_reference_and_resets_its_counters(monkeypatch, sms, stream, kind):
    monkeypatch.setattr(step_ops, "sm_count", lambda device: sms)  # the cuts differ, the result must not
    rows, k, n = 19, 200, 40  # 3 column tiles x 7 K tiles = 21 units
    x = _randn(rows, k, seed=31)
    weight = _randn(2 * n if kind == "gated" else n, k, seed=32, scale=0.1)
    kwargs: dict = {}
    if kind in ("norm_bias", "gated"):
        kwargs.update(norm_weight=_randn(k, seed=33) + 1.0, eps=1e-6)
    if kind == "norm_bias":
        kwargs["bias"] = _randn(n, seed=34)
    if kind == "gated":
        kwargs["gated"] = True
    if kind == "residual":
        kwargs["residual"] = _randn(rows, n, seed=36)
    config = {**STREAM_TILE, "STREAM": stream}
    first = step_ops.step_linear_triton(x, weight, config=config, **kwargs)
    torch.testing.assert_close(first, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)
    again = step_ops.step_linear_triton(x, weight, config=config, **kwargs)
    assert torch.equal(first, again)  # deterministic: the partials are added in one order
    assert int(step_ops._counters(x.device, 1).abs().sum()) == 0


def test_stream_k_rows_do_not_depend_on_the_row_count(monkeypatch):
    monkeypatch.setattr(step_ops, "sm_count", lambda device: 5)
    x = _randn(9, 256, seed=37)
    weight = _randn(2 * 48, 256, seed=38, scale=0.2)
    norm = _randn(256, seed=39) + 1.0
    config = {**STREAM_TILE, "STREAM": 1}
    many = step_ops.step_linear_triton(x, weight, norm_weight=norm, eps=1e-6, gated=True, config=config)
    for i in (0, 8):
        one = step_ops.step_linear_triton(
            x[i : i + 1], weight, norm_weight=norm, eps=1e-6, gated=True, config=config
        )
        assert_same_row(one[0], many[i])


def test_stream_owner_matches_the_ranges_it_inverts():
    # program p's range is [p * total // programs, (p + 1) * total // programs); the owner formula inverts it
    for programs, total in ((1, 1), (3, 21), (10, 21), (132, 6144), (264, 180), (7, 7)):
        starts = [p * total // programs for p in range(programs + 1)]
        for unit in range(total):
            owner = ((unit + 1) * programs + total - 1) // total - 1
            assert starts[owner] <= unit < starts[owner + 1]


def test_stream_candidates_give_every_program_work_and_can_be_turned_off(monkeypatch):
    tile = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
    # a Qwen3-8B gate_up: 192 column tiles x 32 K tiles; every count of programs per SM fits
    every = step_ops.stream_candidates(12288, 4096, 132, (tile,))
    assert [c["STREAM"] for c in every] == list(step_ops.STREAMS)
    # SmolLM2's qkv at 16 columns: 60 x 3 units, enough for one program per SM only
    small = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}
    assert [c["STREAM"] for c in step_ops.stream_candidates(960, 576, 132, (small,))] == [1]
    monkeypatch.setenv("LILICORR_STREAM_K", "on")
    on = step_ops.divided_candidates(12288, 4096, 132, (tile,))
    assert any("STREAM" in c for c in on)
    monkeypatch.setenv("LILICORR_STREAM_K", "off")
    off = step_ops.divided_candidates(12288, 4096, 132, (tile,))
    assert off == step_ops.split_candidates(12288, 4096, 132, (tile,))
    assert all(step_ops.is_divided(c) for c in on + off)
    assert not step_ops.is_divided(tile)


def test_split_candidates_only_for_matrices_too_narrow_to_fill_the_device():
    wide = step_ops.split_candidates(n=1 << 20, k=4096, sm_count=132)
    assert wide == []  # every tile shape already gives each SM many column tiles
    narrow = step_ops.split_candidates(n=4096, k=4096, sm_count=132)
    assert {c["SPLIT"] for c in narrow} == set(step_ops.SPLITS)
    for config in narrow:  # each slice is at least two K tiles deep
        assert 4096 // config["BLOCK_K"] >= 2 * config["SPLIT"]
    shallow = step_ops.split_candidates(n=4096, k=256, sm_count=132)
    assert all(256 // c["BLOCK_K"] >= 2 * c["SPLIT"] for c in shallow)


def test_the_tile_key_keeps_the_stored_tables_format():
    """The retired MLP-prologue flag and PDL mode keep their fields in the key, constant, so the tiles stored before
    (the bundled table, a machine's own) are still found."""
    import json

    from lilicorr_runtime.ops import tiles

    key = step_ops.linear_key(
        1536,
        576,
        norm=True,
        bias=False,
        residual=False,
        gated=True,
        dtype=torch.bfloat16,
        out_dtype=torch.bfloat16,
    )
    assert tiles.shape_key(key) == "1536|576|True|False|False|True|False|torch.bfloat16|torch.bfloat16|0"
    bundled = json.loads(tiles.BUNDLED.read_text())["devices"]
    assert all(tiles.shape_key(key) in shapes for shapes in bundled.values())
    for shapes in bundled.values():
        for shape in shapes:
            assert shape.split("|")[6] == "False" and shape.split("|")[9] == "0", shape


def test_choose_tile_retimes_the_finalists_so_a_ramping_clock_does_not_pick_the_last_timed():
    fastest = step_ops.CANDIDATES[2]
    calls: list[dict] = []

    def intrinsic(config) -> float:
        if config.get("SPLIT", 1) > 1:
            return 75.0
        return 70.0 if config == fastest else 100.0

    def timer(config) -> float:  # the first eight timings run on a slow clock (+30%)
        calls.append(config)
        return intrinsic(config) * (1.3 if len(calls) <= 8 else 1.0)

    def splits_of(leaders):
        return [{**c, "SPLIT": 2} for c in leaders]

    chosen = step_ops.choose_tile(step_ops.linear_config(4096, 4096), splits_of, timer)
    assert chosen == fastest  # first timed at 91 against the split tiles' 75, retimed at 70
    assert sum(1 for c in calls if c == fastest) == 2


def test_choose_tile_retimes_the_best_unsplit_tile_even_when_split_tiles_fill_the_top_four():
    """The H200 case: the first pass timed the unsplit tiles slow; then more than four split tiles all timed
    between the true best unsplit tile and its first (slow) reading."""
    fastest = step_ops.CANDIDATES[2]
    calls: list[dict] = []

    def intrinsic(config) -> float:
        if config.get("SPLIT", 1) > 1:
            return 80.0 + config["SPLIT"] * 0.1
        return 70.0 if config == fastest else 100.0

    def timer(config) -> float:  # the unsplit pass runs on a slow clock (+30%)
        calls.append(config)
        return intrinsic(config) * (1.3 if len(calls) <= len(step_ops.CANDIDATES) else 1.0)

    def splits_of(leaders):
        return [{**c, "SPLIT": s} for c in leaders for s in (2, 3, 4)]

    chosen = step_ops.choose_tile(step_ops.linear_config(4096, 4096), splits_of, timer)
    assert chosen == fastest  # 91 at first, under six split tiles at 80.2-80.4; retimed at 70


def test_choose_tile_compiles_each_batch_of_candidates_before_timing_it():
    events: list[tuple[str, object]] = []

    def compile_all(configs):
        events.append(("compile", [tuple(sorted(c.items())) for c in configs]))

    def timer(config):
        events.append(("time", tuple(sorted(config.items()))))
        return 100.0 - config.get("SPLIT", 1)

    def splits_of(leaders):
        return [{**c, "SPLIT": 2} for c in leaders]

    default = step_ops.linear_config(4096, 4096)
    step_ops.choose_tile(default, splits_of, timer, compile_all)
    compiles = [i for i, (kind, _) in enumerate(events) if kind == "compile"]
    first, second = events[compiles[0]][1], events[compiles[1]][1]
    every = {tuple(sorted(c.items())) for c in (default, *step_ops.CANDIDATES)}
    assert len(first) == len({*first}) and set(first) == every
    assert all(kind == "time" for kind, _ in events[compiles[0] + 1 : compiles[1]])
    timed_first = [name for kind, name in events[compiles[0] + 1 : compiles[1]]]
    assert timed_first == first  # every tile of the batch compiled before the first is timed
    assert len(second) == 2 and all(dict(c)["SPLIT"] == 2 for c in second)
    assert len(compiles) == 2 or events[compiles[2]][1] == []  # the finalists were compiled already


def test_compile_in_parallel_compiles_candidates_at_once_and_survives_failures():
    import threading

    together = threading.Barrier(3, timeout=20)
    done: list[int] = []

    def compile_one(config):
        together.wait()  # only returns once three compiles run at the same time
        if config["BLOCK_N"] == 32:
            raise RuntimeError("out of shared memory")
        done.append(config["BLOCK_N"])

    configs = [{"BLOCK_N": b} for b in (16, 32, 64)]
    step_ops.compile_in_parallel(compile_one, configs)
    assert sorted(done) == [16, 64]
    assert not together.broken


def test_choose_tile_skips_tiles_that_cannot_run_and_falls_back_to_the_default():
    default = step_ops.linear_config(64, 64)

    def timer(config):
        raise RuntimeError("out of shared memory")

    assert step_ops.choose_tile(default, lambda leaders: [], timer) == default
    runs_one = step_ops.CANDIDATES[1]
    assert (
        step_ops.choose_tile(default, lambda leaders: [], lambda c: 1.0 if c == runs_one else timer(c))
        == runs_one
    )


def test_a_weight_without_columns_of_k_takes_the_reference_and_the_kernel_refuses_it():
    x = torch.empty(3, 0, device=DEVICE)
    weight = torch.empty(8, 0, device=DEVICE)
    bias, residual = _randn(8, seed=1), _randn(3, 8, seed=2)
    torch.testing.assert_close(ops.step_linear(x, weight, bias=bias, residual=residual), residual + bias)
    stream = {"BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "STREAM": 2}
    with pytest.raises(ValueError, match="K >= 1"):  # a forced stream-K tile would divide by zero
        step_ops.step_linear_triton(x, weight, bias=bias, residual=residual, config=stream)


@pytest.mark.parametrize(
    "config",
    [
        {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
        {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 3},
        {**STREAM_TILE, "STREAM": 2},
    ],
    ids=["plain", "split", "stream"],
)
def test_each_rows_norm_comes_from_its_own_row(monkeypatch, config):
    """The sums of squares are the diagonal of a small x·xᵀ dot per K tile: rows of one tile whose scales differ
    by 10^4 each get their own rstd (a row reading another's would be off by that factor), in every tiling."""
    monkeypatch.setattr(step_ops, "sm_count", lambda device: 3)
    k, n = 200, 40
    scales = torch.tensor([1e-2, 1e2, 1.0, 3e1, 5e-2], device=DEVICE)[:, None]
    x = _randn(5, k, seed=41) * scales
    weight = _randn(n, k, seed=42, scale=0.1)
    norm = _randn(k, seed=43) + 1.0
    got = step_ops.step_linear_triton(x, weight, norm_weight=norm, eps=1e-6, config=config)
    want = ops.step_linear_reference(x, weight, norm_weight=norm, eps=1e-6)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert float(got.abs().amax(1).min()) > 0.05  # every row normalized to unit scale, none to ~0


WIDE_CASES = [
    ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}, "norm_bias"),
    ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 3}, "gated"),
    # 7 K tiles in 6 slices of 2: slices 4 and 5 start past K (empty, added as zeros by both kernels)
    ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 6}, "residual_out"),
    ({**STREAM_TILE, "STREAM": 2}, "residual"),
    ({**STREAM_TILE, "STREAM": 1}, "gated"),
]


@pytest.mark.parametrize(
    ("config", "kind"), WIDE_CASES, ids=["plain", "split", "split_empty_slices", "stream", "stream_gated"]
)
def test_wide_rows_equal_the_tile_kernels_rows_bit_for_bit(monkeypatch, config, kind):
    """The wide-row kernel (a call of WIDE_ROWS rows or more) computes every row exactly as the 16-row kernel of
    the same tile does: the same K pieces added in the same order, the squares from the same per-16-row dots, in
    every cut (one piece, split-K slices, stream-K ranges, some of them cutting a column tile). One group of 16
    rows a program, so that the interpreter's numpy dots have the 16-row kernel's shapes and the rows are equal bit
    for bit on the CPU too (test_wide_groups_... checks several groups)."""
    monkeypatch.setattr(step_ops, "sm_count", lambda device: 5)
    rows, k, n = 70, 200, 40  # rows: four wide programs and a part; 7 K tiles
    x = _randn(rows, k, seed=51)
    weight = _randn(2 * n if kind == "gated" else n, k, seed=52, scale=0.1)
    kwargs: dict = {}
    if kind in ("norm_bias", "gated"):
        kwargs.update(norm_weight=_randn(k, seed=53) + 1.0, eps=1e-6)
    if kind == "norm_bias":
        kwargs["bias"] = _randn(n, seed=54)
    if kind == "gated":
        kwargs["gated"] = True
    if kind.startswith("residual"):
        kwargs["residual"] = _randn(rows, n, seed=55)
    tile = {"GROUPS": 1, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}  # columns: stream-K keeps its own 16
    narrow = step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs)
    tiles = [tile]
    if CUDA:  # several groups a program, per-group dots and the form this GPU checked (wide_form)
        form = step_ops.wide_form(x.device)
        tiles += [{**tile, "GROUPS": 4, "BATCHED": 1}, {**tile, "GROUPS": 4, "BATCHED": form}]
    for tile in tiles:
        if kind == "residual_out":  # rows written into a column slice of a wider buffer
            wide_out = torch.full((rows, 3 * n), float("nan"), device=DEVICE)
            out = wide_out[:, n : 2 * n]
            step_ops.step_linear_triton(x, weight, config=config, wide=tile, out=out, **kwargs)
            assert torch.isnan(wide_out[:, :n]).all() and torch.isnan(wide_out[:, 2 * n :]).all()
            wide = wide_out[:, n : 2 * n]
        else:
            wide = step_ops.step_linear_triton(x, weight, config=config, wide=tile, **kwargs)
        assert torch.equal(wide, narrow), tile
    torch.testing.assert_close(wide, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batched", [0, 1], ids=["one_dot", "dot_per_group"])
def test_wide_groups_each_take_their_own_rows_squares(monkeypatch, batched):
    """Several groups of 16 rows a program: each row's norm from its own sum of squares (rows scaled 10^4 apart,
    so a row reading another group's would be far off), and the rows those of the 16-row kernel (bit for bit on
    CUDA; on the CPU the interpreter's numpy dots of more rows round differently)."""
    monkeypatch.setattr(step_ops, "sm_count", lambda device: 3)
    k, n = 200, 40
    scales = torch.tensor([1e-2, 1e2, 1.0, 3e1, 5e-2] * 14, device=DEVICE)[:, None]
    x = _randn(70, k, seed=58) * scales
    weight = _randn(2 * n, k, seed=59, scale=0.1)
    kwargs = {"norm_weight": _randn(k, seed=60) + 1.0, "eps": 1e-6, "gated": True}
    config = {**STREAM_TILE, "STREAM": 2}
    tile = {"GROUPS": 4, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "BATCHED": batched}
    narrow = step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs)
    wide = step_ops.step_linear_triton(x, weight, config=config, wide=tile, **kwargs)
    for i in range(70):
        assert_same_row(narrow[i], wide[i])
    torch.testing.assert_close(wide, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)


def test_a_call_takes_the_wide_kernel_from_wide_rows_on(monkeypatch):
    launched: list[int] = []
    real = step_ops._step_linear_wide

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid[0])
            return real[grid]

    monkeypatch.setattr(step_ops, "_step_linear_wide", Spy())
    weight = _randn(24, 40, seed=56, scale=0.1)
    x = _randn(step_ops.WIDE_ROWS, 40, seed=57)
    step_ops.step_linear_triton(x[:-1], weight)
    assert launched == []
    got = step_ops.step_linear_triton(x, weight)
    assert launched == [step_ops.WIDE_ROWS // 64]  # programs of GROUPS 4 x 16 rows
    for i in (0, 31, 62):
        assert_same_row(got[i], step_ops.step_linear_triton(x[:-1], weight)[i])


def test_a_wide_tile_the_gpu_cannot_fit_falls_back_to_the_tile_kernel(monkeypatch):
    """A default wide tile whose compile runs out of shared memory or registers leaves the call to the 16-row
    kernel (the same rows), once: later calls of that GEMM do not try it again. A forced tile raises."""
    from triton.runtime.errors import OutOfResources

    tried: list[int] = []

    class Unfit:
        def __getitem__(self, grid):
            tried.append(grid[0])
            raise OutOfResources(300_000, 232_448, "shared memory")

    monkeypatch.setattr(step_ops, "_step_linear_wide", Unfit())
    monkeypatch.setattr(step_ops, "_WIDE_UNFIT", set())
    weight = _randn(24, 40, seed=65, scale=0.1)
    x = _randn(step_ops.WIDE_ROWS, 40, seed=66)
    want = step_ops.step_linear_triton(x, weight, wide=False)
    assert torch.equal(step_ops.step_linear_triton(x, weight), want)
    assert torch.equal(step_ops.step_linear_triton(x, weight), want)
    assert tried == [step_ops.WIDE_ROWS // 64]  # tried once (its grid), then remembered
    with pytest.raises(OutOfResources):
        step_ops.step_linear_triton(
            x, weight, wide={"GROUPS": 4, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
        )


def test_a_malformed_wide_argument_is_refused():
    x, weight = _randn(64, 40, seed=67), _randn(24, 40, seed=68)
    with pytest.raises(TypeError, match="wide must be"):
        step_ops.step_linear_triton(x, weight, wide=0)
    with pytest.raises(ValueError, match="GROUPS"):
        step_ops.step_linear_triton(x, weight, wide={})


def test_off_cuda_the_wide_kernel_dots_per_group():
    assert step_ops.wide_form(torch.device("cpu")) == 1


@pytest.mark.parametrize("block_k", [64, 128, 256, 512])
@pytest.mark.parametrize("gated", [False, True])
def test_the_wide_tile_fits_its_shared_memory_stage(block_k, gated):
    config = {"BLOCK_N": 32, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 3}
    tile = step_ops.wide_config(config, 1, 0, gated, 4096, torch.bfloat16)
    stage = (tile["GROUPS"] * 16 + (2 if gated else 1) * tile["BLOCK_N"]) * block_k * 2
    assert stage <= step_ops.WIDE_STAGE_BYTES and tile["num_stages"] >= 1
    assert tile["GROUPS"] * 16 >= 64 and tile["BLOCK_N"] >= 16
    streamed = step_ops.wide_config(config, 1, 2, gated, 4096, torch.bfloat16)
    assert streamed["BLOCK_N"] == 32  # stream-K's cuts are per column tile: its own width


@pytest.mark.parametrize("block_k", [64, 256])
@pytest.mark.parametrize("gated", [False, True])
def test_a_wide_tile_free_to_step_its_own_k_takes_the_wide_step(block_k, gated):
    config = {"BLOCK_N": 32, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 3}
    tile = step_ops.wide_config(config, 1, 0, gated, 4096, torch.bfloat16, norm=True, free_k=True)
    assert tile["BLOCK_K"] == step_ops.WIDE_BLOCK_K
    stage = (tile["GROUPS"] * 16 * 2 + (2 if gated else 1) * tile["BLOCK_N"]) * tile["BLOCK_K"] * 2
    assert stage <= step_ops.WIDE_STAGE_BYTES and 1 <= tile["num_stages"] <= 4
    assert "BLOCK_K" not in step_ops.wide_config(config, 1, 0, gated, 4096, torch.bfloat16)  # the step tile's


def test_off_cuda_the_wide_kernel_steps_the_step_tiles_k():
    cpu = torch.device("cpu")
    assert step_ops.wide_free_k(cpu) is False
    config = {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3}
    tile = step_ops.default_wide_tile(
        config, 1, 0, False, 4096, torch.bfloat16, norm=True, rows=2048, device=cpu
    )
    assert "BLOCK_K" not in tile and tile["BATCHED"] == 1  # per-group dots at the step tile's K step
    assert tile["GROUPS"] == 4  # the 128-row tile comes only with the own K step


def test_a_wide_tile_with_its_own_k_step_keeps_every_row_under_split_k():
    # split-K pieces of 64 columns (the step tile's) walked by the wide loop in steps of 32: the piece boundaries
    # stay the step tile's, and each piece is summed from zero (one group a program: bit for bit in the interpreter,
    # whose numpy dot of 32 columns then sums like the step kernel's only where the columns agree, so a K step equal
    # to the step tile's is the interpreter's exact case and a smaller one is held to fp32 round-off)
    x, weight = _randn(step_ops.WIDE_ROWS + 12, 200, seed=91), _randn(48, 200, seed=92)
    config = {"BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "SPLIT": 2}
    step = step_ops.step_linear_triton(x, weight, config=config, wide=False)
    for k in (64, 32):
        tile = {"GROUPS": 1, "BLOCK_N": 16, "BLOCK_K": k, "num_warps": 4, "num_stages": 2, "BATCHED": 1}
        got = step_ops.step_linear_triton(x, weight, config=config, wide=tile)
        if k == 64:
            assert torch.equal(got, step)
        else:
            torch.testing.assert_close(got, step, rtol=1e-5, atol=1e-5)


def _gpu_case(kind: str, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """bf16 operands of a real width (K 1,024, N 1,536) for a GEMM of `kind`: x [rows, K], the weight, kwargs."""
    k, n = 1024, 1536
    weight = _randn(2 * n if kind == "gated" else n, k, seed=seed, scale=0.05, dtype=torch.bfloat16)
    x = _randn(rows, k, seed=seed + 1, dtype=torch.bfloat16)
    kwargs: dict = {}
    if kind in ("norm", "gated"):
        kwargs.update(norm_weight=_randn(k, seed=seed + 2, dtype=torch.bfloat16) + 1.0, eps=1e-6)
    if kind == "gated":
        kwargs["gated"] = True
    if kind == "residual":
        kwargs["residual"] = _randn(rows, n, seed=seed + 3, dtype=torch.bfloat16)
    if kind == "lm_head":
        kwargs["out_dtype"] = torch.float32
    return x, weight, kwargs


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="CUDA")
@pytest.mark.parametrize("kind", ["norm", "gated", "residual", "lm_head"])
def test_wide_rows_on_the_gpu_equal_the_one_row_step_bit_for_bit(kind):
    """bf16 weights of a real width, the tuned tile: a 2,048-row call's rows equal a one-row call's."""
    x, weight, kwargs = _gpu_case(kind, 2048, seed=61)
    many = step_ops.step_linear_triton(x, weight, **kwargs)
    for i in (0, 77, 2047):
        one_kwargs = {**kwargs, "residual": kwargs["residual"][i : i + 1]} if kind == "residual" else kwargs
        one = step_ops.step_linear_triton(x[i : i + 1], weight, **one_kwargs)
        assert torch.equal(one[0], many[i])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="CUDA")
@pytest.mark.parametrize("rows", [17, 32, 48, 64, 127])
@pytest.mark.parametrize("kind", ["norm", "gated", "residual"])
def test_grouped_rows_on_the_gpu_equal_the_one_row_step_bit_for_bit(rows, kind):
    """A call of a few 16-row tiles (the one-token step of 17 to 127 sequences) runs the grouped kernel with the
    tuned tile and this GPU's checked form; its rows equal a one-row call's."""
    assert step_ops.group_form(torch.device("cuda")) is not None
    x, weight, kwargs = _gpu_case(kind, rows, seed=71)
    many = step_ops.step_linear_triton(x, weight, **kwargs)
    assert torch.equal(many, step_ops.step_linear_triton(x, weight, wide=False, **kwargs))
    for i in (0, rows // 2, rows - 1):
        one_kwargs = {**kwargs, "residual": kwargs["residual"][i : i + 1]} if kind == "residual" else kwargs
        assert torch.equal(step_ops.step_linear_triton(x[i : i + 1], weight, **one_kwargs)[0], many[i])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="CUDA")
@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("split", [3, 6])
def test_grouped_split_k_on_the_gpu_equals_the_tile_kernel_call_after_call(monkeypatch, split, warps):
    """Split-K slices as parallel programs, reduced by the last to arrive (a race the interpreter, which runs
    programs one after another, cannot show): forced 2 and 4 tiles a program under a forced split tile, many calls
    in a row, each bit for bit the 16-row kernel's; the grouped kernel really ran (a spy on its launches)."""
    launched = _spy_grouped(monkeypatch)
    k, n = 1024, 384
    weight = _randn(2 * n, k, seed=95, scale=0.05, dtype=torch.bfloat16)
    x = _randn(100, k, seed=96, dtype=torch.bfloat16)
    kwargs = {"norm_weight": _randn(k, seed=97, dtype=torch.bfloat16) + 1.0, "eps": 1e-6, "gated": True}
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": warps, "num_stages": 2, "SPLIT": split}
    assert step_ops.group_form(x.device, warps) is not None
    launched.clear()  # the form check's own launches (the first time a warp count is checked on this device)
    for rows in (17, 64, 100):
        want = step_ops.step_linear_triton(x[:rows], weight, config=config, wide=False, **kwargs)
        for groups in (2, 4):
            for _ in range(20):
                got = step_ops.step_linear_triton(x[:rows], weight, config=config, groups=groups, **kwargs)
                assert torch.equal(got, want), (rows, groups)
    assert len(launched) == 3 * 2 * 20


GROUPED_CASES = [
    ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}, "norm_bias"),
    ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 3}, "gated"),
    # 7 K tiles in 6 slices of 2: slices 4 and 5 start past K (empty, added as zeros by both kernels)
    ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 6}, "residual_out"),
    ({"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "SPLIT": 2}, "norm_residual"),
]


@pytest.mark.parametrize(
    ("config", "kind"), GROUPED_CASES, ids=["plain", "split", "split_empty", "split_norm"]
)
def test_grouped_rows_equal_the_tile_kernels_rows_bit_for_bit(config, kind):
    """The grouped kernel (2 or 4 tiles of 16 rows a program, split-K slices as parallel programs reduced in slice
    order) computes every row as the 16-row kernel does, bit for bit (per-group dots: the interpreter's numpy
    dots then have the 16-row kernel's shapes), twice in a row (the split counters reset), into a column slice."""
    rows, k, n = 53, 200, 40  # rows: a partial last tile; 7 K tiles at BLOCK_K 32
    x = _randn(rows, k, seed=75)
    weight = _randn(2 * n if kind == "gated" else n, k, seed=76, scale=0.1)
    kwargs: dict = {}
    if kind in ("norm_bias", "gated", "norm_residual"):
        kwargs.update(norm_weight=_randn(k, seed=77) + 1.0, eps=1e-6)
    if kind == "norm_bias":
        kwargs["bias"] = _randn(n, seed=78)
    if kind == "gated":
        kwargs["gated"] = True
    if kind in ("residual_out", "norm_residual"):
        kwargs["residual"] = _randn(rows, n, seed=79)
    tile = step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs)
    for groups in (2, 4, 4):
        if kind == "residual_out":
            wide_out = torch.full((rows, 3 * n), float("nan"), device=DEVICE)
            step_ops.step_linear_triton(
                x, weight, config=config, groups=groups, out=wide_out[:, n : 2 * n], **kwargs
            )
            assert torch.isnan(wide_out[:, :n]).all() and torch.isnan(wide_out[:, 2 * n :]).all()
            got = wide_out[:, n : 2 * n]
        else:
            got = step_ops.step_linear_triton(x, weight, config=config, groups=groups, **kwargs)
        assert torch.equal(got, tile), groups
    torch.testing.assert_close(tile, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)


def test_grouped_rows_each_take_their_own_rows_squares():
    """Rows of one program scaled 10^4 apart each get their own rstd: a row reading another group's (or another
    row's) sum of squares would be off by that factor."""
    k, n = 200, 40
    scales = torch.tensor([1e-2, 1e2, 1.0, 3e1, 5e-2] * 12, device=DEVICE)[:, None]
    x = _randn(60, k, seed=80) * scales
    weight = _randn(2 * n, k, seed=81, scale=0.1)
    kwargs = {"norm_weight": _randn(k, seed=82) + 1.0, "eps": 1e-6, "gated": True}
    config = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 2}
    got = step_ops.step_linear_triton(x, weight, config=config, groups=4, **kwargs)
    torch.testing.assert_close(got, ops.step_linear_reference(x, weight, **kwargs), rtol=1e-4, atol=1e-4)
    assert torch.equal(got, step_ops.step_linear_triton(x, weight, config=config, wide=False, **kwargs))


def _spy_grouped(monkeypatch) -> list[tuple[int, int, int]]:
    launched: list[tuple[int, int, int]] = []
    real = step_ops._step_linear_rows

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(step_ops, "_step_linear_rows", Spy())
    return launched


def test_a_call_of_a_few_tiles_takes_the_grouped_kernel(monkeypatch):
    """One tile: the 16-row kernel. 17 to WIDE_ROWS - 1 rows: the grouped kernel, as many tiles a program as the rows
    need (a power of two, at most MAX_GROUPS); `wide=False` and `groups=1` keep the 16-row kernel."""
    launched = _spy_grouped(monkeypatch)
    config = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 2}
    weight = _randn(40, 64, seed=83, scale=0.1)
    x = _randn(step_ops.WIDE_ROWS - 1, 64, seed=84)
    one = step_ops.step_linear_triton(x[:16], weight, config=config)
    assert launched == []
    for rows, grid in ((17, (1, 3, 2)), (32, (1, 3, 2)), (33, (1, 3, 2)), (64, (1, 3, 2)), (65, (2, 3, 2))):
        got = step_ops.step_linear_triton(x[:rows], weight, config=config)
        assert launched[-1] == grid, rows
        assert torch.equal(got[:16], one)
    assert step_ops.default_groups(17, config, False, x.device) == 2
    assert step_ops.default_groups(33, config, False, x.device) == 4
    count = len(launched)
    step_ops.step_linear_triton(x[:40], weight, config=config, wide=False)
    step_ops.step_linear_triton(x[:40], weight, config=config, groups=1)
    assert len(launched) == count


def test_the_grouped_tiles_keep_their_sums_within_a_threads_registers():
    cpu = torch.device("cpu")
    narrow = {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    assert step_ops.default_groups(100, narrow, True, cpu) == 4  # 64 x 32 x 2 sums over 128 threads: 32 each
    wide = {**narrow, "BLOCK_N": 128}
    assert step_ops.default_groups(100, wide, False, cpu) == 4  # 64 a thread
    assert step_ops.default_groups(100, wide, True, cpu) == 2  # halved: 2 x 64 would be 128 a thread
    assert step_ops.default_groups(100, {**wide, "num_warps": 8}, True, cpu) == 4
    assert step_ops.default_groups(100, {**wide, "BLOCK_N": 512}, True, cpu) == 1


def test_on_cuda_only_bf16_weights_are_grouped(monkeypatch):
    """The GPU's form check multiplies bf16: other weights keep the 16-row kernel there (the interpreter groups
    any dtype: its per-group dots are the 16-row kernel's own numpy shapes)."""
    monkeypatch.setattr(step_ops, "group_form", lambda device, warps=4: 0)
    config = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(step_ops, "_interpreted", lambda: False)
    assert step_ops.default_groups(40, config, False, cuda, torch.bfloat16) == 4
    assert step_ops.default_groups(40, config, False, cuda, torch.float16) == 1
    assert step_ops.default_groups(40, config, False, cuda, torch.float32) == 1
    assert step_ops.default_groups(40, config, False, torch.device("cpu"), torch.float32) == 4


def test_no_grouped_kernel_where_the_gpu_has_no_form_that_keeps_the_rows(monkeypatch):
    monkeypatch.setattr(step_ops, "group_form", lambda device, warps=4: None)
    launched = _spy_grouped(monkeypatch)
    weight, x = _randn(24, 40, seed=85, scale=0.1), _randn(40, 40, seed=86)
    assert step_ops.default_groups(40, step_ops.linear_config(24, 40), False, x.device) == 1
    step_ops.step_linear_triton(x, weight)
    assert launched == []


def test_a_grouped_tile_the_gpu_cannot_fit_falls_back_to_the_tile_kernel(monkeypatch):
    from triton.runtime.errors import OutOfResources

    tried: list[tuple] = []

    class Unfit:
        def __getitem__(self, grid):
            tried.append(grid)
            raise OutOfResources(300_000, 232_448, "shared memory")

    monkeypatch.setattr(step_ops, "_step_linear_rows", Unfit())
    monkeypatch.setattr(step_ops, "_GROUPS_UNFIT", set())
    weight, x = _randn(24, 40, seed=87, scale=0.1), _randn(40, 40, seed=88)
    want = step_ops.step_linear_triton(x, weight, wide=False)
    assert torch.equal(step_ops.step_linear_triton(x, weight), want)
    assert torch.equal(step_ops.step_linear_triton(x, weight), want)
    assert len(tried) == 1  # tried once, then remembered
    with pytest.raises(OutOfResources):
        step_ops.step_linear_triton(x, weight, groups=4)


def test_a_malformed_groups_argument_is_refused():
    x, weight = _randn(40, 40, seed=89), _randn(24, 40, seed=90)
    for bad in (0, 3, -2, 2.0):
        with pytest.raises(ValueError, match="power of two"):
            step_ops.step_linear_triton(x, weight, groups=bad)
    with pytest.raises(ValueError, match="stream-K"):
        step_ops.step_linear_triton(x, weight, config={**STREAM_TILE, "STREAM": 2}, groups=2)
