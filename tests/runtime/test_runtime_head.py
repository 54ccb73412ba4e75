"""The LiLiCorr head against a plain float64 re-implementation of its forward (candidate features, lattice
attention, factor heads, start and transition logits) as the LiLiCorr loaders compute it."""

from __future__ import annotations

import math
import os

import pytest
import torch

from lilicorr_ckpt import fixtures
from lilicorr_runtime import LiLiCorrHead


def make_head(M=48, B=6, h=32, L=2, N=4, ratio=1.5, K=4, F=12, eps=1e-6, ve=1e-6, scale=7.5, seed=0):
    head = LiLiCorrHead(
        model_hidden_size=M,
        block_size=B,
        rms_norm_eps=eps,
        hidden_size=h,
        num_layers=L,
        num_heads=N,
        mlp_ratio=ratio,
        candidate_topk=K,
        factor_dim=F,
        vector_eps=ve,
        logit_scale=scale,
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every parameter random, so no term can hide behind a zero init
        for p in head.parameters():
            p.copy_(
                torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 1.0 / math.sqrt(p.shape[-1]))
            )
    return head.eval()


def reference(sd, cfg, E, lp, pas, anc, valid):
    """Scores for one request in float64, written from the spec with explicit loops where it helps."""
    d = {k: v.double() for k, v in sd.items()}
    B, K, N, eps, ve, scale = cfg["B"], cfg["K"], cfg["N"], cfg["eps"], cfg["ve"], cfg["scale"]
    S = lp.shape[0]
    E, lp, pas, anc = E.double(), lp.double(), pas.double(), anc.double()

    def lin(x, name):
        return x @ d[name + ".weight"].T + d[name + ".bias"]

    def rms(x, name):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * d[name + ".weight"]

    def silu(x):
        return x / (1 + torch.exp(-x))

    def unit(v):
        return v / max(float(v.norm()), ve)

    tok = lin(E, "token_proj") if "token_proj.weight" in d else E
    phi = torch.zeros(S, K, 5, dtype=torch.float64)
    for s in range(S):
        for k in range(K):
            phi[s, k] = torch.tensor(
                [
                    lp[s, k],
                    math.exp(lp[s, k]),
                    lp[s, k] - lp[s].max(),
                    k / (K - 1) if K > 1 else 0.0,
                    1.0 if k == 0 else 0.0,
                ]
            )
    mu, var = phi.mean(-1, keepdim=True), phi.var(-1, unbiased=False, keepdim=True)
    phi = (phi - mu) / torch.sqrt(var + 1e-5) * d["feature_norm.weight"] + d["feature_norm.bias"]
    feat = lin(silu(lin(phi, "feature_mlp.up_proj")), "feature_mlp.down_proj")
    x = tok + lin(pas, "pass_hidden_proj")[:, None] + feat
    x = x + d["slot_embedding"][0, 0, :S] + d["rank_embedding"][0, 0, 0]
    h = x.shape[-1]
    x = x.reshape(S * K, h)
    bias = torch.zeros(N, S * K, S * K, dtype=torch.float64)
    for i in range(S * K):
        for j in range(S * K):
            dist = i // K - j // K
            bias[:, i, j] = d["relative_slot_bias"][:, dist + B - 1] + (
                d["same_slot_bias"] if dist == 0 else 0
            )
    layer = 0
    while f"layers.{layer}.attn_norm.weight" in d:
        p = f"layers.{layer}."
        y = rms(x, p + "attn_norm")
        qkv = y @ d[p + "attn.in_proj_weight"].T + d[p + "attn.in_proj_bias"]
        q, k, v = qkv.split(h, dim=-1)
        hd = h // N
        heads = []
        for n in range(N):
            sl = slice(n * hd, (n + 1) * hd)
            att = torch.softmax(q[:, sl] @ k[:, sl].T / math.sqrt(hd) + bias[n], dim=-1)
            heads.append(att @ v[:, sl])
        x = x + lin(torch.cat(heads, -1), p + "attn.out_proj")
        x = x + lin(silu(lin(rms(x, p + "mlp_norm"), p + "mlp.up_proj")), p + "mlp.down_proj")
        layer += 1
    c = rms(x, "output_norm").view(S, K, h)
    a = rms(lin(anc, "context_proj") * (1.0 if valid else 0.0), "anchor_norm")
    start = torch.zeros(K, dtype=torch.float64)
    pairs = torch.zeros(S - 1, K, K, dtype=torch.float64)
    fuse = [
        [silu(lin(torch.cat([c[s, k], a, c[s, k] * a]), "factor_input_proj")) for k in range(K)]
        for s in range(S)
    ]
    aout = unit(lin(a, "anchor_out_head"))
    for j in range(K):
        start[j] = scale * aout @ unit(lin(fuse[0][j], "in_head"))
    for s in range(S - 1):
        for i in range(K):
            for j in range(K):
                pairs[s, i, j] = (
                    scale * unit(lin(fuse[s][i], "out_head")) @ unit(lin(fuse[s + 1][j], "in_head"))
                )
    return start, pairs


def assert_matches_reference(head, cfg, args, start, pairs):
    """Every request's scores against the float64 spec implementation."""
    E, lp, pas, anc, valid = args
    sd = head.state_dict()
    for r in range(E.shape[0]):
        ref_start, ref_pairs = reference(sd, cfg, E[r], lp[r], pas[r], anc[r], bool(valid[r]))
        torch.testing.assert_close(start[r].double(), ref_start, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pairs[r].double(), ref_pairs, rtol=1e-4, atol=1e-4)


def inputs(b, S, K, M, seed=1):
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(b, S, K, M, generator=g)
    lp = torch.log_softmax(torch.randn(b, S, 50, generator=g) * 2, -1).topk(K, -1).values
    return E, lp, torch.randn(b, S, M, generator=g), torch.randn(b, M, generator=g) * 3


@pytest.mark.parametrize("K,S,h", [(4, 5, 32), (1, 5, 32), (3, 2, 32), (4, 3, 48), (2, 1, 32)])
def test_head_matches_float64_reference(K, S, h):
    cfg = dict(B=6, K=K, N=4, eps=1e-6, ve=1e-6, scale=7.5)
    head = make_head(K=K, h=h, M=48)
    assert isinstance(head.token_proj, torch.nn.Linear) == (h != 48)  # h == M: identity, no tensors
    E, lp, pas, anc = inputs(2, S, K, 48)
    valid = torch.tensor([True, False])
    with torch.no_grad():
        start, pairs = head(E, lp, pas, anc, valid)
    assert start.dtype == pairs.dtype == torch.float32
    assert start.shape == (2, K) and pairs.shape == (2, S - 1, K, K)
    assert_matches_reference(head, cfg, (E, lp, pas, anc, valid), start, pairs)


def test_a_no_grad_pass_under_autocast_scores_as_the_float_head():
    """The held-out tau (lilicorr_train.heldout) scores an fp32 head under bf16 autocast without gradients: the
    head's in-place GEMM, whose operands autocast leaves in two dtypes, must not run there (it raised a dtype error
    on the first GPU training piece)."""
    head = make_head(K=4, h=32, M=48)
    E, lp, pas, anc = inputs(2, 5, 4, 48)
    valid = torch.tensor([True, True])
    with torch.no_grad():
        want_start, want_pairs = head(E, lp, pas, anc, valid)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            start, pairs = head(E, lp, pas, anc, valid)
    torch.testing.assert_close(start.float(), want_start, rtol=0.05, atol=0.05)
    torch.testing.assert_close(pairs.float(), want_pairs, rtol=0.05, atol=0.05)


def test_invalid_anchor_scores_with_the_normalized_anchor_out_bias():
    head = make_head()
    E, lp, pas, anc = inputs(1, 5, 4, 48)
    with torch.no_grad():
        start, _ = head(E, lp, pas, anc, torch.tensor([False]))
        start_other, _ = head(E, lp, pas, anc * 100, torch.tensor([False]))
        start_valid, _ = head(E, lp, pas, anc, torch.tensor([True]))
    assert torch.equal(start, start_other)  # the anchor row does not leak through when invalid
    assert not torch.allclose(start, start_valid)


def test_shorter_draft_reuses_the_trained_distance_offsets():
    # scoring the first n slots of a lattice is not the same function as cropping the full one
    # (attention sees fewer nodes), but a relative_slot_bias entry that only a distance of
    # B-1 would read must not matter for n < B-1 slots
    head = make_head(B=6)
    E, lp, pas, anc = inputs(1, 3, 4, 48)
    with torch.no_grad():
        start, pairs = head(E, lp, pas, anc)
        head.relative_slot_bias[:, 0] += 50.0  # distance -(B-1)
        head.relative_slot_bias[:, -1] += 50.0  # distance +(B-1)
        head.slot_embedding[:, :, 3:] += 10.0  # slots the short draft does not use
        start2, pairs2 = head(E, lp, pas, anc)
        head.relative_slot_bias[:, 6] += 5.0  # distance +1: used
        start3, _ = head(E, lp, pas, anc)
    assert torch.equal(start, start2) and torch.equal(pairs, pairs2)
    assert not torch.allclose(start, start3)


def test_head_refuses_a_lattice_that_does_not_fit():
    head = make_head(B=6, K=4)
    E, lp, pas, anc = inputs(1, 6, 4, 48)
    with pytest.raises(ValueError, match="at most 5 slots"):
        head(E, lp, pas, anc)
    E, lp, pas, anc = inputs(1, 3, 2, 48)
    with pytest.raises(ValueError, match="exactly 4 candidates"):
        head(E, lp, pas, anc)


@pytest.mark.parametrize("h", [32, 64])
def test_parameter_names_are_the_manifest_head_names(h):
    config = fixtures.draft_config(dflash={"lilicorr_hidden_size": h})
    manifest = fixtures.manifest_for(config)
    g = manifest.geometry
    head = LiLiCorrHead(
        model_hidden_size=g.hidden_size,
        block_size=g.block_size,
        rms_norm_eps=g.rms_norm_eps,
        hidden_size=g.head_hidden_size,
        num_layers=g.head_num_layers,
        num_heads=g.head_num_heads,
        mlp_ratio=g.head_mlp_ratio,
        candidate_topk=g.candidate_topk,
        factor_dim=g.head_factor_dim,
        vector_eps=g.head_vector_eps,
        logit_scale=g.head_logit_scale,
    )
    expected = {
        n[len("lilicorr.") :]: t.shape for n, t in manifest.tensors.items() if n.startswith("lilicorr.")
    }
    assert {n: tuple(p.shape) for n, p in head.state_dict().items()} == expected
    head.load_state_dict({n: torch.zeros(s) for n, s in expected.items()}, strict=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("h,N", [(32, 4), (256, 2)])
def test_gpu_head_matches_the_cpu_head(h, N):
    # the CUDA path runs the Triton kernels (features, attention, residual norms, scores); fp32 must agree
    # with the CPU references to round-off, bf16 to its own precision
    head = make_head(M=48, B=9, h=h, N=N, K=8)
    E, lp, pas, anc = inputs(3, 8, 8, 48)
    valid = torch.tensor([True, False, True])
    with torch.no_grad():
        start, pairs = head(E, lp, pas, anc, valid)
        gpu = head.cuda()
        args = [t.cuda() for t in (E, lp, pas, anc, valid)]
        g_start, g_pairs = gpu(*args)
        torch.testing.assert_close(g_start.cpu(), start, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(g_pairs.cpu(), pairs, rtol=1e-4, atol=1e-4)
        b_start, b_pairs = gpu.to(torch.bfloat16)(*args)
        assert b_start.dtype == torch.float32
        torch.testing.assert_close(b_start.cpu(), start, rtol=0, atol=0.15)
        torch.testing.assert_close(b_pairs.cpu(), pairs, rtol=0, atol=0.15)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA test above runs these kernels natively")
@pytest.mark.parametrize("L", [0, 1, 2])
@pytest.mark.parametrize("h", [32, 48])
def test_head_through_the_triton_kernels_matches_float64_reference(monkeypatch, L, h):
    # the head's CUDA path (feature_hidden, residual_norm + factor input, lattice_attention, lattice_scores)
    # run on the CPU in Triton's interpreter; h = 48 = M makes token_proj the identity
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter")
    from lilicorr_runtime.ops import core

    monkeypatch.setattr(core, "use_triton", lambda *tensors: True)  # the draft ops' dispatchers read it
    cfg = dict(B=6, K=4, N=4, eps=1e-6, ve=1e-6, scale=7.5)
    head = make_head(K=4, h=h, M=48, L=L)
    E, lp, pas, anc = inputs(2, 4, 4, 48)
    valid = torch.tensor([True, False])
    with torch.no_grad():
        start, pairs = head(E, lp, pas, anc, valid)
    assert_matches_reference(head, cfg, (E, lp, pas, anc, valid), start, pairs)


def test_cached_constants_follow_weight_changes():
    # the folded biases/embeddings and the stacked out/in weights are cached; every way of changing a
    # parameter must reach the scores (in-place ops, load_state_dict, and .data writes + invalidate_derived)
    head = make_head(K=4)
    E, lp, pas, anc = inputs(1, 5, 4, 48)

    def scores():
        with torch.no_grad():
            return head(E, lp, pas, anc)

    def fresh():
        other = make_head(K=4)
        other.load_state_dict(head.state_dict())
        with torch.no_grad():
            return other(E, lp, pas, anc)

    base = scores()
    with torch.no_grad():
        head.in_head.bias.add_(0.5)  # in place: bumps the version
    after = scores()
    assert not torch.allclose(after[1], base[1])
    torch.testing.assert_close(after, fresh(), rtol=0, atol=0)
    state = head.state_dict()
    state["rank_embedding"] = state["rank_embedding"] + 1.0
    head.load_state_dict(state)
    torch.testing.assert_close(scores(), fresh(), rtol=0, atol=0)
    head.pass_hidden_proj.bias.data.copy_(torch.randn(head.pass_hidden_proj.bias.shape))  # bypasses versions
    head.invalidate_derived()
    torch.testing.assert_close(scores(), fresh(), rtol=0, atol=0)


def test_gradients_reach_the_parameters_behind_cached_constants():
    head = make_head(K=4).train()
    E, lp, pas, anc = inputs(1, 5, 4, 48)
    start, pairs = head(E, lp, pas, anc)
    (start.sum() + pairs.sum()).backward()
    for name in (
        "slot_embedding",
        "rank_embedding",
        "pass_hidden_proj.bias",
        "feature_mlp.down_proj.bias",
        "token_proj.bias",
        "out_head.weight",
        "in_head.bias",
        "relative_slot_bias",
    ):
        grad = head.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
