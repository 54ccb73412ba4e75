"""The DFlash backbone against a float64 re-implementation of its forward (attention over the target context and
the block, RoPE, gated MLP) as the DFlash loaders compute it."""

from __future__ import annotations

import math

import pytest
import torch

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime.ops.core import rope_inverse_frequencies


def rope(x, positions, theta):
    # x [heads, n, hd]: rotate the pair (j, j + hd/2) by position * theta^(-2j/hd)
    hd = x.shape[-1]
    half = hd // 2
    out = x.clone()
    for j in range(half):
        angle = positions.double() * theta ** (-2 * j / hd)
        c, s = torch.cos(angle)[None], torch.sin(angle)[None]
        out[..., j] = x[..., j] * c - x[..., j + half] * s
        out[..., j + half] = x[..., j + half] * c + x[..., j] * s
    return out


def reference_block(drafter, features, block_embeddings, theta):
    """Final-normed draft hidden [Q, M] for one request, float64, from the spec."""
    g = drafter.geometry
    d = {k: v.double() for k, v in drafter.state_dict().items()}
    eps, nh, nkv, hd = g.rms_norm_eps, g.num_heads, g.num_kv_heads, g.head_dim
    M = g.hidden_size

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * d[w]

    def lin(x, name):
        y = x @ d[name + ".weight"].T
        return y + d[name + ".bias"] if name + ".bias" in d else y

    def conv(x, kernel):
        # y_t = Σ_i k[t, i] ⊙ x[t - i], nothing before the block start
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for i in range(kernel.shape[1]):
                if t - i >= 0:
                    y[t] += kernel[t, i] * x[t - i]
        return y

    def kernels(prefix, normed):
        taps, G = g.conv_kernel_size, g.conv_group_size
        delta = (normed @ d[prefix + ".kernel_projection.weight"].T).view(-1, 2, taps, M // G)
        full = torch.zeros(normed.shape[0], 2, taps, M, dtype=torch.float64)
        for c in range(M):
            full[..., c] = d[prefix + ".base_kernel"][None, :, :, c] + delta[..., c // G]
        return full[:, 0], full[:, 1]

    ctx = rms(features.double() @ d["fc.weight"].T, "hidden_norm.weight")  # [P, M]
    P, Q = ctx.shape[0], block_embeddings.shape[0]
    ctx_pos, blk_pos = torch.arange(P), torch.arange(P, P + Q)
    x = block_embeddings.double()
    for i, layer in enumerate(drafter.layers):
        p = f"layers.{i}."
        window = layer.self_attn.window

        def attention(h, p=p, window=window):
            q = rms(
                lin(h, p + "self_attn.q_proj").view(Q, nh, hd).transpose(0, 1), p + "self_attn.q_norm.weight"
            )
            q = rope(q, blk_pos, theta)
            keys, values = [], []
            for rows, pos in ((ctx, ctx_pos), (h, blk_pos)):  # no input_layernorm on the context rows
                k = rms(
                    lin(rows, p + "self_attn.k_proj").view(-1, nkv, hd).transpose(0, 1),
                    p + "self_attn.k_norm.weight",
                )
                keys.append(rope(k, pos, theta))
                values.append(lin(rows, p + "self_attn.v_proj").view(-1, nkv, hd).transpose(0, 1))
            k, v = torch.cat(keys, 1), torch.cat(values, 1)
            all_pos = torch.cat([ctx_pos, blk_pos])
            out = torch.zeros(Q, nh * hd, dtype=torch.float64)
            for n in range(nh):
                kv = n // (nh // nkv)
                scores = q[n] @ k[kv].T / math.sqrt(hd)  # [Q, P+Q]: no causal mask
                if window is not None:
                    far = (blk_pos[:, None] - all_pos[None, :]).abs() > window - 1
                    scores = scores.masked_fill(far, float("-inf"))
                out[:, n * hd : (n + 1) * hd] = torch.softmax(scores, -1) @ v[kv]
            return lin(out, p + "self_attn.o_proj")

        def mlp(h, p=p):
            gate = lin(h, p + "mlp.gate_proj")
            return lin(gate / (1 + torch.exp(-gate)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")

        for norm, body, conv_name in (
            (p + "input_layernorm.weight", attention, p + "attention_conv"),
            (p + "post_attention_layernorm.weight", mlp, p + "mlp_conv"),
        ):
            h = rms(x, norm)
            if g.has_conv:
                k_in, k_out = kernels(conv_name, h)
                x = x + conv(body(conv(h, k_in)), k_out)
            else:
                x = x + body(h)
    return rms(x, "norm.weight")


CASES = {
    "plain": fixtures.draft_config(),
    "conv": fixtures.draft_config(conv=(3, 16)),
    "conv-g1-bias": fixtures.draft_config(conv=(2, 1), attention_bias=True),
    "swa": fixtures.draft_config(
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        use_sliding_window=True,
    ),
    "gqa4": fixtures.draft_config(num_key_value_heads=1, rope_theta=500.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_backbone_matches_float64_reference(case, drafter):
    config = CASES[case]
    d = drafter(config, dtype="F32")
    g = d.geometry
    gen = torch.Generator().manual_seed(7)
    features = torch.randn(9, len(g.target_layer_ids) * g.hidden_size, generator=gen)
    block = torch.randn(g.block_size, g.hidden_size, generator=gen)
    cache = d.new_cache(capacity=4)  # small, so appending grows it
    with torch.no_grad():
        context = d.project_context(features[None])
        d.append_context(cache, context[:, :5])
        d.append_context(cache, context[:, 5:])
        hidden = d(cache, block[None])[0]
    ref = reference_block(d, features, block, float(config["rope_theta"]))
    torch.testing.assert_close(hidden.double(), ref, rtol=2e-4, atol=2e-4)


def test_sliding_window_hides_far_context(drafter):
    d = drafter(CASES["swa"], dtype="F32")  # layer 0 slides with a window of 4, layer 1 is full
    gen = torch.Generator().manual_seed(8)
    features = torch.randn(1, 12, 128, generator=gen)
    changed = features.clone()
    changed[:, 0] += 5.0  # context row 0 is 12 positions before the block
    block = torch.randn(1, 3, 64, generator=gen)

    def run(feats):
        cache = d.new_cache()
        d.append_context(cache, d.project_context(feats))
        return d(cache, block)

    with torch.no_grad():
        assert not torch.equal(run(features), run(changed))  # the full layer sees row 0
        d.layers[1].self_attn.window = 4
        assert torch.equal(run(features), run(changed))  # no layer does any more


def test_block_attention_is_not_causal(drafter):
    d = drafter(dtype="F32")
    g = d.geometry
    gen = torch.Generator().manual_seed(9)
    cache = d.new_cache()
    with torch.no_grad():
        d.append_context(cache, d.project_context(torch.randn(1, 4, 2 * g.hidden_size, generator=gen)))
        block = torch.randn(1, g.block_size, g.hidden_size, generator=gen)
        later = block.clone()
        later[:, -1] += 1.0
        assert not torch.allclose(d(cache, block)[:, 0], d(cache, later)[:, 0])  # row 0 sees the last row


def test_identity_convolution_is_the_convolution_free_drafter(drafter_dir):
    # training initialises base_kernel to identity at tap 0 and kernel_projection to zero
    def identity(tensors):
        for name, (_, shape, _) in list(tensors.items()):
            if name.endswith("kernel_projection.weight"):
                tensors[name] = ("F32", shape, torch.zeros(shape).numpy().tobytes())
            elif name.endswith("base_kernel"):
                k = torch.zeros(shape)
                k[:, 0] = 1.0
                tensors[name] = ("F32", shape, k.numpy().tobytes())

    with_conv = load_drafter(drafter_dir(fixtures.draft_config(conv=(4, 16)), dtype="F32", mutate=identity))
    without = load_drafter(drafter_dir(fixtures.draft_config(), dtype="F32"))
    gen = torch.Generator().manual_seed(10)
    features = torch.randn(1, 6, 128, generator=gen)
    block = torch.randn(1, 8, 64, generator=gen)
    outs = []
    with torch.no_grad():
        for d in (with_conv, without):
            cache = d.new_cache()
            d.append_context(cache, d.project_context(features))
            outs.append(d(cache, block))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)


def test_yarn_rope_matches_transformers():
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import Qwen3Config

    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    config = Qwen3Config(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=32,
        max_position_embeddings=16384,
        rope_parameters={**scaling, "rope_theta": 1e6},
    )
    expected, scale = rope_utils.ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    inv_freq, mine = rope_inverse_frequencies(32, 1e6, scaling, 16384)
    torch.testing.assert_close(inv_freq, expected.float())
    assert mine == pytest.approx(scale)
