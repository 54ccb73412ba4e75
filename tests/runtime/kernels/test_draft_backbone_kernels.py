"""The drafter's static forward and context append through the step kernels (Drafter._static_kernels,
Drafter._append_kernels: ops.decoder_layer, five kernels a layer) compute what the eager backbone computes.

On the CPU: the same composition over the ops' torch references (fp32: the rows, the visibility, the stacked
weights and the rotation are right), and over the Triton kernels in the interpreter. On CUDA (marked gpu): the
dispatch itself, in bf16, against the eager ops."""

from __future__ import annotations

import pytest
import torch
from interpreted_triton import CUDA, fresh, triton  # noqa: F401 (before any kernel module)

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime.model import drafter as drafter_module
from lilicorr_runtime.ops import core as ops_core
from lilicorr_runtime.ops import step_triton

step_triton = fresh(step_triton)

CAPACITY = 40


def _drafter(tmp_path, dtype=torch.float32, device="cpu", **config):
    cfg = fixtures.draft_config(num_hidden_layers=2, **config)  # GQA: 4 heads over 2 KV heads
    return load_drafter(
        fixtures.write_checkpoint(tmp_path / "d", cfg, dtype="F32"), dtype=dtype, device=device
    )


def _filled_cache(drafter, batch: int, lengths: torch.Tensor, seed: int):
    """A cache whose rows below each length hold context K/V (the eager append) and rows past it garbage."""
    g = drafter.geometry
    gen = torch.Generator().manual_seed(seed)
    device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    cache = drafter.new_cache(batch=batch, capacity=CAPACITY)
    for store in (cache.keys, cache.values):
        for t in store:
            t.copy_(torch.randn(t.shape, generator=gen).to(device, dtype) * 5)  # stale rows: must stay masked
    width = len(g.target_layer_ids) * g.hidden_size
    features = torch.randn(batch, int(lengths.max()), width, generator=gen).to(device, dtype)
    context = drafter.project_context(features)
    drafter.append_context_static(cache, context, torch.zeros(batch, dtype=torch.long, device=device))
    return cache


def _clone(cache):
    return drafter_module.DraftKVCache.over(
        [k.clone() for k in cache.keys], [v.clone() for v in cache.values]
    )


def _check_static_forward(drafter, tol: float) -> None:
    g = drafter.geometry
    device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    lengths = torch.tensor([5, 17], device=device)
    cache = _filled_cache(drafter, 2, lengths, seed=1)
    block = torch.randn(2, g.block_size, g.hidden_size, generator=torch.Generator().manual_seed(2))
    block = block.to(device, dtype)
    eager_cache, kernel_cache = _clone(cache), _clone(cache)
    with torch.inference_mode():
        want = drafter.forward_static(eager_cache, lengths, block)
        got = drafter._static_kernels(kernel_cache, lengths, block)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for layer in range(g.num_layers):
        for b, length in enumerate(lengths.tolist()):
            end = length + g.block_size
            # the context below the length is read, not written; past the block nothing is touched
            assert torch.equal(kernel_cache.keys[layer][b, :, :length], cache.keys[layer][b, :, :length])
            assert torch.equal(kernel_cache.keys[layer][b, :, end:], cache.keys[layer][b, :, end:])
            assert not torch.equal(
                kernel_cache.keys[layer][b, :, length:end], cache.keys[layer][b, :, length:end]
            )


def _check_append(drafter, tol: float) -> None:
    g = drafter.geometry
    device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    lengths = torch.tensor([3, 11], device=device)
    cache = _filled_cache(drafter, 2, lengths, seed=3)
    width = len(g.target_layer_ids) * g.hidden_size
    features = torch.randn(2, g.block_size, width, generator=torch.Generator().manual_seed(4)).to(
        device, dtype
    )
    with torch.inference_mode():
        context = drafter.project_context(features)
        positions = lengths[:, None] + torch.arange(g.block_size, device=device)
        eager_cache, kernel_cache = _clone(cache), _clone(cache)
        # the eager write, whatever path append_context_static takes on this device
        for i, (k, v) in enumerate(drafter._context_kv(context, positions)):
            eager_cache.keys[i][torch.arange(2, device=device)[:, None], :, positions] = k.transpose(1, 2)
            eager_cache.values[i][torch.arange(2, device=device)[:, None], :, positions] = v.transpose(1, 2)
        drafter._append_kernels(kernel_cache, context, positions)
    for a, b in zip(
        kernel_cache.keys + kernel_cache.values, eager_cache.keys + eager_cache.values, strict=True
    ):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.skipif(CUDA, reason="the CPU composition; CUDA runs the kernels below")
def test_static_kernel_forward_is_the_eager_backbone_over_the_references(tmp_path):
    drafter = _drafter(tmp_path)
    assert not drafter.kernel_path(9, drafter.fc.weight)  # the CPU keeps the eager backbone
    _check_static_forward(drafter, 1e-5)
    _check_append(drafter, 1e-5)


@pytest.mark.skipif(CUDA, reason="the interpreter; CUDA runs the kernels natively below")
def test_static_kernel_forward_through_the_interpreted_kernels(tmp_path, monkeypatch):
    monkeypatch.setattr(ops_core, "use_triton", lambda *tensors: True)  # the dispatchers take the kernels
    launched = []
    for name in ("step_linear_triton", "rope_kv_triton", "rope_attention_triton"):
        kernel = getattr(step_triton, name)
        monkeypatch.setattr(
            step_triton, name, lambda *a, _k=kernel, _n=name, **kw: launched.append(_n) or _k(*a, **kw)
        )
    drafter = _drafter(tmp_path, attention_bias=True)  # the stacked q/k/v biases too
    _check_static_forward(drafter, 1e-4)
    # per layer: qkv, o, gate_up and down GEMMs, and the rotation fused into the attention
    assert sorted(set(launched)) == ["rope_attention_triton", "step_linear_triton"]
    assert launched.count("rope_attention_triton") == drafter.geometry.num_layers
    assert launched.count("step_linear_triton") == 4 * drafter.geometry.num_layers
    launched.clear()
    _check_append(drafter, 1e-4)
    assert launched == ["step_linear_triton", "rope_kv_triton"] * drafter.geometry.num_layers


def test_step_weights_follow_the_parameters(tmp_path):
    drafter = _drafter(tmp_path)
    first = drafter.step_weights()
    assert drafter.step_weights() is first  # cached while nothing changes
    attn = drafter.layers[0].self_attn
    with torch.no_grad():
        attn.k_proj.weight.add_(1.0)  # an in-place update (an optimizer step)
    rebuilt = drafter.step_weights()
    assert rebuilt is not first
    q, kv = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
    assert torch.equal(rebuilt[0]["qkv"][q : q + kv], attn.k_proj.weight)
    assert torch.equal(rebuilt[0]["kv"][:kv], attn.k_proj.weight)
    # copies: the parameters keep their own storage (a checkpoint saves as it loads)
    assert attn.k_proj.weight.data_ptr() != rebuilt[0]["qkv"].data_ptr()


def test_kernel_path_is_refused_for_windows_convolution_and_many_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(drafter_module, "use_triton", lambda *tensors: True)  # as on CUDA without autograd
    plain = _drafter(tmp_path / "p")
    assert plain.kernel_path(9) and plain.kernel_path(drafter_module.KERNEL_ROWS)
    assert not plain.kernel_path(drafter_module.KERNEL_ROWS + 1)
    windowed = _drafter(
        tmp_path / "w",
        layer_types=["sliding_attention", "full_attention"],
        use_sliding_window=True,
        sliding_window=4,
    )
    assert any(layer.self_attn.window is not None for layer in windowed.layers)
    assert not windowed.kernel_path(9)
    convolved = _drafter(tmp_path / "c", conv=(3, 8))
    assert convolved.layers[0].attention_conv is not None
    assert not convolved.kernel_path(9)
    monkeypatch.setattr(drafter_module, "use_triton", lambda *tensors: False)  # the CPU, or autograd
    assert not plain.kernel_path(9)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_static_kernel_forward_on_cuda_matches_the_eager_ops(tmp_path, monkeypatch):
    drafter = _drafter(tmp_path, dtype=torch.bfloat16, device="cuda")
    with torch.inference_mode():  # as decoding runs it (autograd keeps the eager ops)
        assert drafter.kernel_path(9, drafter.fc.weight)
    assert not drafter.kernel_path(9, drafter.fc.weight)
    _check_static_forward(drafter, 3e-2)
    _check_append(drafter, 3e-2)
    # the dispatch: forward_static takes the kernels at a small batch, the eager ops past KERNEL_ROWS
    g = drafter.geometry
    lengths = torch.tensor([5, 17], device="cuda")
    cache = _filled_cache(drafter, 2, lengths, seed=5)
    block = torch.randn(2, g.block_size, g.hidden_size, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        fast = drafter.forward_static(_clone(cache), lengths, block)
        monkeypatch.setattr(drafter_module, "KERNEL_ROWS", 0)
        eager = drafter.forward_static(_clone(cache), lengths, block)
    torch.testing.assert_close(fast, eager, rtol=3e-2, atol=3e-2)
    assert not torch.equal(fast, eager)  # two different computations (GEMM order), agreeing to bf16 round-off
