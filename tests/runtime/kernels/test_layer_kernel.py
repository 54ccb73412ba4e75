"""The layer kernel (ops/layer_triton.py): every layer of a step in one launch, against the five-kernel step it
must reproduce (the same units on the same tiles), its timed-out waits (a wrong step, never a hang, and never
used again), and the restacked weights under the transformers model. Under TRITON_INTERPRET=1 on the CPU (one
program, or programs run one after another) and natively on CUDA (marked gpu: bit for bit)."""

from __future__ import annotations

import warnings

import pytest
import torch
from interpreted_triton import CUDA, DEVICE, fresh, triton  # before any kernel module
from runtime_helpers import ARCHS

from lilicorr_runtime import ops
from lilicorr_runtime.ops import layer_triton, step_triton
from lilicorr_runtime.target import fast

step_ops = fresh(step_triton)
layer_triton = fresh(layer_triton)
TILES = {  # small tiles, one GEMM split in two and one in three along K: every unit path runs
    "qkv": {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
    "o": {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 2},
    "gate_up": {"BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 3},
    "down": {"BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2},
}


@pytest.fixture(autouse=True)
def _own_tiles():
    """The tiles these tests plant stay theirs."""
    saved = dict(step_ops.TUNED)
    yield
    step_ops.TUNED.clear()
    step_ops.TUNED.update(saved)


def _model(arch: str, layers: int = 3, dtype: torch.dtype = torch.float32):
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=32,
        max_position_embeddings=256,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    return model_cls(config).eval().to(DEVICE, dtype)


def _decoder(model) -> tuple[fast.StaticDecoder, layer_triton.LayerKernel]:
    """A decoder whose layers are views of restacked weights, and its layer kernel on TILES (the interpreter
    has no tuner: the tiles the standalone GEMMs then run too)."""
    decoder = fast.StaticDecoder(model)
    stacks = fast._layer_stacks(model.model.layers)
    decoder.layers = [
        {k: None if t is None else t[i] for k, t in stacks.items()} for i in range(len(model.model.layers))
    ]
    kernel = layer_triton.LayerKernel(
        stacks, num_heads=decoder.num_heads, num_kv_heads=decoder.num_kv_heads, head_dim=decoder.head_dim,
        eps=decoder.eps,
    )  # fmt: skip
    for phase, key in kernel.keys().items():
        step_ops.TUNED[key] = TILES[phase]
    assert kernel._resolve() and kernel.tiles == TILES
    return decoder, kernel


def _layer_step(decoder, kernel, cache, x, start, pad, taps, programs):
    """The step's hidden (final-normed) and features through the layer kernel, as StaticDecoder.forward runs it."""
    b, n, m = x.shape
    rows = (start + torch.arange(n, device=x.device))[None].expand(b, n).contiguous()
    positions = rows - pad[:, None]
    slots = {t: i for i, t in enumerate(taps)}
    features = torch.zeros(b * n, len(taps) * m, device=x.device, dtype=x.dtype)
    stream = x.reshape(b * n, m).clone()
    ok = kernel.launch(
        stream, features, kernel.columns(slots), cache.key_block, cache.value_block, rows.reshape(-1),
        positions.reshape(-1), pad, decoder.cos, decoder.sin, n, programs=programs,
    )  # fmt: skip
    out = ops.rms_norm(stream, decoder.norm, decoder.eps)
    last = decoder.num_layers - 1
    if last in slots:
        features[:, slots[last] * m : (slots[last] + 1) * m] = out
    return ok, out.view(b, n, m), features.view(b, n, -1)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit for bit on CUDA; under the interpreter (tl.dot as numpy matmuls) to fp32 round-off."""
    if CUDA:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # plain, q/k/v biases, q/k norms
@pytest.mark.parametrize("b, n", [(1, 1), (2, 3)])
def test_layer_kernel_computes_the_five_kernel_step(arch, b, n):
    model = _model(arch)
    decoder, kernel = _decoder(model)
    kernel.checked = True
    taps = (0, 2)  # a middle layer's tap is the next layer's input; the last layer's is taken after the norm
    prefill = torch.randn(b, 9, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    x = torch.randn(b, n, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    pad = torch.tensor([0, 2][:b], device=DEVICE)  # the second sequence left-padded: negative positions too
    zero, start = torch.tensor(0, device=DEVICE), 9
    caches = []
    for _ in range(2):
        cache = decoder.new_cache(b, 64)
        decoder.forward(cache, prefill, zero, pad, (), step_kernels=True)
        caches.append(cache)
    want, want_features = decoder.forward(caches[0], x, torch.tensor(start, device=DEVICE), pad, taps, True)
    ok, got, got_features = _layer_step(decoder, kernel, caches[1], x, start, pad, taps, programs=1)
    assert ok
    _same(got, want)
    _same(got_features, want_features)
    _same(caches[1].key_block, caches[0].key_block)
    _same(caches[1].value_block, caches[0].value_block)
    counted = kernel.done[:-1].view(-1, 5)  # every unit of every phase counted itself done, once
    assert bool((counted == counted[0]).all()) and int(kernel.done[-1]) == 0
    units_qkv = triton.cdiv(b * n, 16) * triton.cdiv(kernel.nqkv, 16)
    assert counted[0].tolist()[0] == units_qkv
    assert counted[0].tolist()[2] == triton.cdiv(b * n, 16) * triton.cdiv(64, 16) * 2  # o split in two


def test_a_kernel_made_under_inference_mode_launches_outside_it():
    """Its counters are zeroed in place at every launch: made while a forward ran under inference mode (as
    FastTarget's do), they must still be writable by a launch outside it (a bench driving the kernel directly)."""
    with torch.inference_mode():
        decoder, kernel = _decoder(_model("llama", layers=2))
        cache = decoder.new_cache(1, 32)
    kernel.checked = True
    x, pad = torch.randn(1, 1, 64, device=DEVICE), torch.zeros(1, dtype=torch.long, device=DEVICE)
    with torch.inference_mode():
        assert _layer_step(decoder, kernel, cache, x, 3, pad, (), programs=1)[0]
    assert not kernel.done.is_inference() and not kernel.counters.is_inference()
    cache = decoder.new_cache(1, 32)  # not an inference tensor: written in place by the launch
    ok, got, _ = _layer_step(decoder, kernel, cache, x, 3, pad, (), programs=1)
    assert ok and bool(torch.isfinite(got).all())


def test_columns_route_tapped_layers_through_their_feature_slots():
    decoder, kernel = _decoder(_model("llama", layers=4))
    # layer 1 -> slot 0, layer 3 (the last) -> slot 1, filled after the final norm: the stream buffer (-1) for it
    assert kernel.columns({1: 0, 3: 1}).tolist() == [-1, -1, 0, -1, -1]
    assert kernel.columns({}).tolist() == [-1] * 5
    assert kernel.columns({0: 1, 2: 0}).tolist() == [-1, 64, -1, 0, -1]


@pytest.mark.skipif(
    CUDA, reason="the interpreter runs programs one after another: a wait for a later one times out"
)
@pytest.mark.filterwarnings("ignore:overflow encountered")  # the step it computes is garbage, as it says
def test_a_wait_that_times_out_is_a_wrong_step_not_a_hang_and_turns_the_kernel_off(monkeypatch):
    monkeypatch.setattr(layer_triton, "SPIN_LIMIT", 8)
    decoder, kernel = _decoder(_model("llama", layers=2))
    cache = decoder.new_cache(1, 32)
    x = torch.randn(1, 1, 64)
    pad = torch.zeros(1, dtype=torch.long)
    # two programs, run in turn: the first waits for units of the second, gives up after 8 polls, and bumps every
    # counter, so the launch ends
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok, _, _ = _layer_step(decoder, kernel, cache, x, 3, pad, (), programs=2)
    assert not ok
    assert kernel.disabled is not None and "timed out" in kernel.disabled
    assert any("layer kernel is off" in str(w.message) for w in caught)
    assert int(kernel.done[-1]) == 1 and kernel.problem() is not None
    assert not kernel.usable(1, 1, False)  # never again for this target
    # the flag stays set across launches (only the counters are zeroed per launch): a later check still sees it
    kernel.checked = True
    kernel.disabled = None
    assert kernel.launch(
        x.reshape(1, 64).clone(), None, kernel.columns({}), cache.key_block, cache.value_block,
        torch.tensor([4]), torch.tensor([4]), pad, decoder.cos, decoder.sin, 1, programs=1,
    )  # fmt: skip
    assert kernel.problem() is not None
    # the launch that gave up ran its phases out of order on split-K counters of its own: the standalone GEMMs'
    # are untouched, and a split-K GEMM still computes its reference
    x = torch.randn(3, 64)
    weight = torch.randn(96, 64) * 0.1
    split = {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2, "SPLIT": 3}
    got = step_ops.step_linear_triton(x, weight, config=split)
    torch.testing.assert_close(got, ops.step_linear_reference(x, weight), rtol=1e-4, atol=1e-4)
    assert all(int(c.abs().sum()) == 0 for held in step_ops._COUNTERS.values() for c in held)


def test_a_first_launch_that_cannot_compile_turns_the_kernel_off(monkeypatch):
    decoder, kernel = _decoder(_model("llama", layers=2))
    cache = decoder.new_cache(1, 32)

    class Unlaunchable:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("out of resources: shared memory")

            return launch

    monkeypatch.setattr(layer_triton, "_layer_kernel", Unlaunchable())
    with pytest.warns(RuntimeWarning, match="does not compile or launch"):
        ok, _, _ = _layer_step(
            decoder, kernel, cache, torch.randn(1, 1, 64), 3, torch.zeros(1, dtype=torch.long), (), 1
        )
    assert not ok and "shared memory" in kernel.disabled and not kernel.usable(1, 1, False)


def test_layers_that_differ_in_a_kind_of_weight_are_not_restacked():
    model = _model("qwen2", layers=2)
    model.model.layers[1].self_attn.o_proj.bias = torch.nn.Parameter(torch.zeros(64, device=DEVICE))
    before = [p.data_ptr() for p in model.parameters()]
    assert fast._layer_stacks(model.model.layers) is None
    assert [p.data_ptr() for p in model.parameters()] == before  # nothing moved
    partial = _model("qwen2", layers=2)
    partial.model.layers[0].self_attn.k_proj.bias = None  # q and v biased, k not
    assert fast._layer_stacks(partial.model.layers) is None


def test_usable_only_for_few_rows_and_the_fitting_tiles():
    decoder, kernel = _decoder(_model("llama", layers=2))
    kernel.checked = True
    assert kernel.usable(1, 1, False) and kernel.usable(32, 8, False)
    assert not kernel.usable(33, 1, False)  # more rows than LAYER_ROWS
    assert not kernel.usable(1, 1, True)  # the MLP prologue variant
    other = layer_triton.LayerKernel(kernel.stacks, num_heads=4, num_kv_heads=2, head_dim=16, eps=decoder.eps)
    step_ops.TUNED[other.keys()["down"]] = dict(TILES["down"], num_warps=8)
    try:
        assert not other.usable(1, 1, False)
        assert other.disabled is not None and "warp" in other.disabled
    finally:
        step_ops.TUNED[other.keys()["down"]] = TILES["down"]


def test_restacked_weights_keep_the_transformers_model_and_memory():
    model = _model("qwen2", layers=3)
    ids = torch.tensor([[1, 5, 7, 2]], device=DEVICE)
    with torch.no_grad():
        before = model(ids).logits
    stacks = fast._layer_stacks(model.model.layers)
    assert stacks["qkv"].shape == (3, 64 + 2 * 32, 64) and stacks["qkv_bias"].shape == (3, 128)
    assert stacks["gate_up"].shape == (3, 192, 64) and stacks["q_norm"] is None
    layer = model.model.layers[1]
    # the parameters are views of the stacks: one copy of the weights
    assert layer.self_attn.k_proj.weight.data_ptr() == stacks["qkv"][1, 64].data_ptr()
    assert layer.mlp.up_proj.weight.data_ptr() == stacks["gate_up"][1, 96].data_ptr()
    assert layer.post_attention_layernorm.weight.data_ptr() == stacks["post_norm"][1].data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


def test_layer_kernel_is_off_by_default_and_can_be_turned_on(monkeypatch):
    monkeypatch.delenv("LILICORR_LAYER_KERNEL", raising=False)
    assert not layer_triton.enabled()
    monkeypatch.setenv("LILICORR_LAYER_KERNEL", "")
    assert not layer_triton.enabled()
    monkeypatch.setenv("LILICORR_LAYER_KERNEL", "on")
    assert layer_triton.enabled()
    monkeypatch.setenv("LILICORR_LAYER_KERNEL", "off")
    assert not layer_triton.enabled()
    monkeypatch.setenv("LILICORR_LAYER_KERNEL", "sometimes")
    with pytest.raises(ValueError, match="LILICORR_LAYER_KERNEL"):
        layer_triton.enabled()


@pytest.mark.skipif(CUDA, reason="checks the CPU path")
def test_no_restacking_off_cuda():
    model = _model("llama", layers=2)
    assert not fast._wants_layer_kernel(model)
    assert fast.StaticDecoder(model).layer_kernel is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fast_target_steps_equal_bit_for_bit_with_and_without_the_layer_kernel_on_gpu(arch, monkeypatch):
    monkeypatch.setenv("LILICORR_LAYER_KERNEL", "on")
    target = fast.FastTarget(_model(arch, layers=4, dtype=torch.bfloat16))
    kernel = target.core.layer_kernel
    assert kernel is not None
    prompt = torch.tensor(
        [3, 9, 27, 17, 5, 2, 8, 11] * 5
    )  # 40 rows: the prefill runs the five kernels (tunes)
    results = {}
    for use in (False, True):
        kernel.disabled = None if use else "test: the five kernels"
        target._graphs = {}
        target.reserve(128)
        target.reset()
        target.forward(prompt, [1, 3])
        steps = [
            target.forward(torch.tensor(block), [1, 3]) for block in ([4], [5, 6, 7, 8, 9, 10, 11, 12], [13])
        ]
        results[use] = steps
    assert kernel.tiles is not None and kernel.checked and kernel.problem() is None
    for a, b in zip(results[False], results[True], strict=True):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
