"""Wrong inputs to the runtime's public entry points raise ValueError/TypeError naming the value and what was
expected, instead of running silently or failing deep inside torch."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from runtime_helpers import small_config, tiny_target
from safetensors.torch import load_file, save_file

from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import LiLiCorrHead, SpeculativeDecoder, load_target, ops
from lilicorr_runtime.arguments import resolve_dtype
from lilicorr_runtime.decode import block as verify_ops

PROMPT = [3, 1, 4, 1, 5]


# -- the drafter must share the target's vocabulary ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["head", "control"])
def test_decoder_refuses_a_target_with_another_vocabulary(drafter, mode):
    # mask token 15 and candidate_topk fit both vocabularies: only the vocabulary check can catch this
    with pytest.raises(ValueError, match=r"do not match: draft vocab_size 16 != target vocab_size 32"):
        SpeculativeDecoder(tiny_target("llama", vocab=32), drafter(small_config()), mode=mode)
    with pytest.raises(ValueError, match=r"draft vocab_size 32 != target vocab_size 16"):
        SpeculativeDecoder(tiny_target("llama", vocab=16), drafter(small_config(vocab_size=32)), mode=mode)


def test_a_target_padded_beyond_its_tokenizer_takes_a_drafter_of_its_padded_vocabulary(drafter):
    # the embedding table and lm_head have 32 rows (say a tokenizer of 20 tokens, padded): what the drafter is
    # trained against, and what it must declare, is the 32-row vocabulary
    target = tiny_target("llama", vocab=32)
    decoder = SpeculativeDecoder(target, drafter(small_config(vocab_size=32)))
    assert len(decoder.generate(PROMPT, 8).tokens) == 8


def test_an_owned_lm_head_of_another_vocabulary_is_reported_once(drafter):
    d = drafter(small_config(vocab_size=32, own_lm_head=True), runtime="vllm")  # SGLang drops an owned head
    with pytest.raises(ValueError) as info:
        SpeculativeDecoder(tiny_target("llama", vocab=16), d)
    assert str(info.value).count("32") == 1, str(info.value)


# -- load_target refuses a checkpoint without the weights its config describes ------------------------------------


@pytest.fixture(scope="module")
def saved_target(tmp_path_factory):
    path = tmp_path_factory.mktemp("target") / "llama"
    tiny_target("llama").model.save_pretrained(path)
    return path


def test_load_target_refuses_a_missing_lm_head(saved_target, tmp_path):
    broken = tmp_path / "no-lm-head"
    shutil.copytree(saved_target, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"does not hold the weights its config describes: missing lm_head\.weight"
    ):
        load_target(broken)


def test_load_target_refuses_a_tensor_of_another_shape(saved_target, tmp_path):
    broken = tmp_path / "short-up-proj"
    shutil.copytree(saved_target, broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(100, 64)
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError,
        match=r"model\.layers\.0\.mlp\.up_proj\.weight has shape \[100, 64\] in the "
        r"checkpoint, the config needs \[128, 64\]",
    ):
        load_target(broken)


def test_load_target_refuses_a_drafter_checkpoint(drafter_dir):
    with pytest.raises(ValueError, match="looks like a drafter checkpoint") as info:
        load_target(drafter_dir())
    assert "model.embed_tokens.weight" in str(info.value) and "lm_head.weight" in str(info.value)


def test_load_target_takes_a_tied_lm_head_as_present(tmp_path):
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=16,
        tie_word_embeddings=True,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "tied")
    assert "lm_head.weight" not in load_file(tmp_path / "tied" / "model.safetensors")
    target = load_target(tmp_path / "tied")
    assert target.lm_head.weight.data_ptr() == target.embed_tokens.weight.data_ptr()


# -- prompts: one request of integer ids within the vocabulary ----------------------------------------------------


@pytest.fixture(scope="module")
def decoders():
    target = tiny_target("llama")  # vocabulary 16
    return {"ar": SpeculativeDecoder(target, mode="ar")}


@pytest.mark.parametrize(
    "prompt,message",
    [
        (torch.tensor([PROMPT, PROMPT]), r"got a tensor of shape \[2, 5\] \(the decoder serves one request"),
        (torch.tensor(PROMPT)[None, None], r"got a tensor of shape \[1, 1, 5\]"),
        (
            torch.tensor(PROMPT, dtype=torch.float32) + 0.5,
            "got a torch.float32 tensor, and token ids are integers",
        ),
        (torch.tensor([True, False]), "got a torch.bool tensor"),
        ([3, 1.5, 4], r"prompt_ids\[1\] is 1.5, not an integer token id"),
        ([3, True], r"prompt_ids\[1\] is True, not an integer token id"),
        ([PROMPT, PROMPT], r"prompt_ids\[0\] is \[3, 1, 4, 1, 5\], not an integer token id"),
        ("hello", "not text; tokenize it first"),
        ([3, 16, 1], r"prompt id 16 \(position 1\) is outside the target vocabulary \[0, 16\)"),
        (torch.tensor([3, -1]), r"prompt id -1 \(position 1\) is outside the target vocabulary \[0, 16\)"),
        ([], "non-empty prompt"),
    ],
)
def test_generate_refuses_a_prompt_that_is_not_one_sequence_of_ids(decoders, prompt, message):
    with pytest.raises(ValueError, match=message):
        decoders["ar"].generate(prompt, 4)


def test_generate_takes_lists_tuples_and_integer_tensors_alike(decoders):
    decoder = decoders["ar"]
    expected = decoder.generate(PROMPT, 6).tokens
    for prompt in (
        tuple(PROMPT),
        torch.tensor(PROMPT),
        torch.tensor(PROMPT, dtype=torch.int32),
        torch.tensor([PROMPT]),
        [torch.tensor(i) for i in PROMPT],
    ):
        assert decoder.generate(prompt, 6).tokens == expected


def test_generate_refuses_a_bad_token_budget(decoders):
    for budget in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            decoders["ar"].generate(PROMPT, budget)


def test_generate_takes_a_single_eos_id(decoders):
    decoder = decoders["ar"]
    full = decoder.generate(PROMPT, 12).tokens
    assert decoder.generate(PROMPT, 12, eos_token_ids=full[3]).tokens == full[: full.index(full[3]) + 1]


def test_decoder_refuses_swapped_or_foreign_models(drafter):
    target, d = tiny_target("llama"), drafter(small_config())
    with pytest.raises(TypeError, match="target must be a TargetModel"):
        SpeculativeDecoder(d, target)
    with pytest.raises(TypeError, match="drafter must be a Drafter"):
        SpeculativeDecoder(target, target)


# -- temperature ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -float("inf"), -0.5])
def test_decoder_refuses_a_temperature_that_is_not_finite_and_non_negative(temperature):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        SpeculativeDecoder(tiny_target("llama"), mode="ar", temperature=temperature)


def test_decoder_refuses_a_temperature_that_is_not_a_number():
    with pytest.raises(TypeError, match="temperature must be a number, got '0.5'"):
        SpeculativeDecoder(tiny_target("llama"), mode="ar", temperature="0.5")
    assert SpeculativeDecoder(tiny_target("llama"), mode="ar", temperature=1).temperature == 1.0


# -- load_drafter's runtime and dtype; load_target's dtype ---------------------------------------------------------


@pytest.mark.parametrize(
    "scale_2, defect",
    [
        (float("nan"), "NaN or infinite"),
        (float("inf"), "NaN or infinite"),
        (-1e-3, "negative"),
        (0.0, "all zero"),
    ],
)
def test_load_drafter_refuses_scales_numerics_policy_refuses(drafter_dir, scale_2, defect):
    import numpy as np

    from lilicorr_ckpt import fixtures
    from lilicorr_ckpt.checkpoint import load_checkpoint
    from lilicorr_runtime import CheckpointRefused, build_drafter

    def mutate(t):
        t["layers.0.self_attn.o_proj.weight_scale_2"] = ("F32", (), np.float32(scale_2).tobytes())

    path = drafter_dir(fixtures.draft_config(), quant="NVFP4", mutate=mutate)
    # built without validation (validate header-only does not read the scale's value): the loader's own refusal
    with pytest.raises(
        CheckpointRefused, match=rf"layers\.0\.self_attn\.o_proj\.weight_scale_2 \({defect}\)"
    ):
        build_drafter(load_checkpoint(str(path)))


def test_load_drafter_refuses_an_unknown_runtime(drafter_dir):
    with pytest.raises(
        UsageError, match=r"'tensorrt' is not an engine this tool models\. Supported: sglang "
    ):
        load_drafter(drafter_dir(), runtime="tensorrt")


@pytest.mark.parametrize(
    "spelling,dtype",
    [
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("torch.bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_dtype_spellings(spelling, dtype):
    assert resolve_dtype(spelling) is dtype


def test_load_drafter_and_load_target_take_the_same_dtype_names(drafter_dir, saved_target):
    d = load_drafter(drafter_dir(), dtype="bf16")
    assert d.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert load_target(saved_target, dtype="bfloat16").dtype == torch.bfloat16
    assert load_target(saved_target, dtype=torch.float16).dtype == torch.float16


@pytest.mark.parametrize("dtype", ["int8", "auto", "", torch.int64, torch.float64, 16, None])
def test_load_drafter_and_load_target_refuse_other_dtypes(drafter_dir, saved_target, dtype):
    with pytest.raises(ValueError, match="dtype"):
        load_drafter(drafter_dir(), dtype=dtype)
    with pytest.raises(ValueError, match="dtype"):
        load_target(saved_target, dtype=dtype)


@pytest.mark.parametrize("device, needle", [("gpu", "device must be"), ("cuda:7", "CUDA")])
def test_load_drafter_and_load_target_refuse_a_device_this_machine_lacks(
    drafter_dir, saved_target, device, needle
):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(ValueError, match=needle):
        load_drafter(drafter_dir(), device=device)
    with pytest.raises(ValueError, match=needle):
        load_target(saved_target, device=device)


# -- the head: K is the trained candidate_topk ---------------------------------------------------------------------


def small_head() -> LiLiCorrHead:
    return LiLiCorrHead(
        model_hidden_size=64,
        block_size=8,
        rms_norm_eps=1e-6,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        mlp_ratio=2.0,
        candidate_topk=4,
        factor_dim=16,
        vector_eps=1e-6,
        logit_scale=10.0,
    ).eval()


def test_head_refuses_inputs_of_other_shapes():
    head = small_head()
    b, S, K, M = 1, 7, 4, 64
    good = (torch.randn(b, S, K, M), torch.randn(b, S, K), torch.randn(b, S, M), torch.randn(b, M))
    start, pairs = head(*good)
    assert start.shape == (b, K) and pairs.shape == (b, S - 1, K, K)
    with pytest.raises(ValueError, match="exactly 4 candidates"):
        head(torch.randn(b, S, 2, M), torch.randn(b, S, 2), good[2], good[3])
    with pytest.raises(
        ValueError, match=r"candidate_embeddings must be \[b, S, K, M = 64\], got \[7, 4, 64\]"
    ):
        head(*(t[0] for t in good))
    with pytest.raises(ValueError, match=r"got candidate_embeddings \[1, 7, 4, 32\]"):
        head(torch.randn(b, S, K, 32), *good[1:])
    with pytest.raises(ValueError, match=r"pass_hidden \[1, 6, 64\]"):
        head(good[0], good[1], good[2][:, :6], good[3])
    with pytest.raises(ValueError, match=r"anchor_valid \[2\]"):
        head(*good, anchor_valid=torch.ones(2, dtype=torch.bool))


# -- ops: the dispatchers check shapes before any kernel or reference runs ----------------------------------------


def lattice(b=1, S=7, K=4, device="cpu"):
    return (
        torch.randn(b, K, device=device),
        torch.randn(b, S - 1, K, K, device=device),
        torch.randint(0, 100, (b, S, K), device=device),
    )


def test_greedy_walk_refuses_inconsistent_lattice_shapes():
    start, pairs, ids = lattice()
    assert ops.greedy_walk(start, pairs, ids).shape == (1, 7)
    bad = {
        "ids for 3 slots": (start, pairs, ids[:, :3]),
        "pairs for 3 slots": (start, pairs[:, :2], ids),
        "start of another K": (start[:, :2], pairs, ids),
        "pairs of another K": (start, pairs[..., :2], ids),
        "another batch": (start.expand(2, -1), pairs, ids),
        "no batch dimension": (start[0], pairs[0], ids[0]),
        "float ids": (start, pairs, ids.float()),
        "no slot": (start, pairs[:, :0], ids[:, :0]),
    }
    for what, args in bad.items():
        with pytest.raises(
            ValueError,
            match=r"greedy_walk expects start \[b, K\], pairs \[b, S-1, K, K\], ids "
            r"\[b, S, K\]",
        ):
            ops.greedy_walk(*args)
            pytest.fail(what)


def test_sample_walk_refuses_inconsistent_shapes():
    start, pairs, ids = lattice()
    u, t, g = torch.rand(1, 7), torch.ones(1), torch.zeros(1, dtype=torch.bool)
    assert ops.sample_walk(start, pairs, ids, u, t, g)[0].shape == (1, 7)
    for args in (
        (start, pairs, ids[:, :3], u, t, g),
        (start, pairs, ids, u[:, :3], t, g),
        (start, pairs, ids, u, torch.ones(()), g),
        (start, pairs, ids, u, t, torch.zeros(2, dtype=torch.bool)),
    ):
        with pytest.raises(
            ValueError,
            match=r"sample_walk expects .* uniforms \[b, S\], temperatures \[b\], "
            r"greedy_mask \[b\]; got start \[1, 4\]",
        ):
            ops.sample_walk(*args)


def test_shape_checks_read_no_tensor_data():
    # on the meta device any read of the data raises: the checks only compare sizes (no sync on CUDA, and safe
    # inside a graph capture)
    start, pairs, ids = lattice(device="meta")
    with pytest.raises(ValueError, match="greedy_walk expects"):
        ops.greedy_walk(start, pairs, ids[:, :3])
    u = torch.empty(1, 7, device="meta")
    with pytest.raises(ValueError, match="sample_walk expects"):
        ops.sample_walk(
            start,
            pairs,
            ids,
            u[:, :2],
            torch.empty(1, device="meta"),
            torch.empty(1, dtype=torch.bool, device="meta"),
        )
    with pytest.raises(ValueError, match="topk_lse"):
        ops.topk_lse(torch.empty(3, 10, device="meta"), 11)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: ops.topk_lse(torch.randn(3, 100), 200), r"integer k in \[1, V = 100\], got k=200"),
        (lambda: ops.topk_lse(torch.randn(3, 100), 0), r"integer k in \[1, V = 100\], got k=0"),
        (lambda: ops.topk_lse(torch.randn(100), 4), r"topk_lse expects logits \[n, V\]; got logits \[100\]"),
        (
            lambda: ops.rms_norm(torch.randn(2, 8), torch.ones(6), 1e-6),
            r"rms_norm expects x \[..., D\], weight \[D\]",
        ),
        (
            lambda: ops.residual_norm(torch.randn(1, 4, 8), torch.randn(1, 3, 8), None, torch.ones(8), 1e-6),
            r"residual_norm expects .*; got x \[1, 4, 8\], delta \[1, 3, 8\], weight \[8\]",
        ),
        (
            lambda: ops.residual_norm(
                torch.randn(1, 4, 8), None, None, torch.ones(8), 1e-6, torch.randn(2, 8)
            ),
            r"anchor \[2, 8\]",
        ),
        (
            lambda: ops.lattice_attention(torch.randn(1, 6, 24), torch.zeros(4, 5, 5), 4),
            r"lattice_attention expects qkv \[b, n, 3h\] with h divisible by num_heads = 4, bias \[num_heads, n, n\]",
        ),
        (
            lambda: ops.lattice_attention(torch.randn(1, 6, 24), torch.zeros(3, 6, 6), 3),
            r"h divisible by num_heads",
        ),
        (
            lambda: ops.lattice_scores(
                torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 8), 1e-6, 1.0
            ),
            r"lattice_scores expects out_vectors and in_vectors \[b, S, K, F\]",
        ),
        (
            lambda: ops.lattice_scores(
                torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), torch.randn(1, 6), 1e-6, 1.0
            ),
            r"anchor_vector \[1, 6\]",
        ),
        (
            lambda: ops.feature_hidden(
                torch.randn(1, 3, 4), torch.ones(5), torch.zeros(5), 1e-5, torch.randn(8, 4), torch.zeros(8)
            ),
            r"feature_hidden expects .*up_weight \[H, 5\]",
        ),
        (lambda: ops.control_walk(torch.randn(7, 100)), r"control_walk expects logits \[b, S, V\]"),
        (
            lambda: verify_ops.categorical(torch.rand(2, 10), torch.rand(3)),
            r"categorical expects probs \[b, V\]",
        ),
        (
            lambda: verify_ops.verify_greedy(torch.randn(1, 5, 10), torch.zeros(1, 5, dtype=torch.long)),
            r"verify_greedy expects target_logits \[b, n\+1, V\], draft_tokens \[b, n\]",
        ),
        (
            lambda: verify_ops.verify_sampled(
                torch.rand(1, 4, 10),
                torch.zeros(1, 3, dtype=torch.long),
                torch.rand(1, 3, 9),
                torch.rand(1, 3),
                torch.rand(1),
            ),
            r"verify_sampled expects .*draft_q \[1, 3, 9\]",
        ),
    ],
)
def test_ops_refuse_inconsistent_shapes(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_decoder_ops_run_unchanged_at_their_documented_shapes():
    # every op at the shapes the head and the decoder use: the checks refuse nothing valid
    x = torch.randn(2, 12, 32)
    ops.rms_norm(x, torch.ones(32), 1e-6)
    ops.residual_norm(x, torch.randn(2, 12, 32), torch.zeros(32), torch.ones(32), 1e-6, torch.randn(2, 32))
    ops.lattice_attention(torch.randn(2, 12, 96), torch.zeros(4, 12, 12), 4)
    ops.lattice_scores(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), torch.randn(2, 8), 1e-6, 10.0)
    ops.feature_hidden(
        torch.randn(2, 3, 4), torch.ones(5), torch.zeros(5), 1e-5, torch.randn(32, 5), torch.zeros(32)
    )
    start, pairs, ids = lattice(b=2, S=1)
    assert ops.greedy_walk(start, pairs, ids).shape == (2, 1)
    logits = torch.randn(2, 4, 10)
    accepted, _ = verify_ops.verify_greedy(logits, torch.zeros(2, 3, dtype=torch.long))
    q = torch.softmax(torch.randn(2, 3, 10), -1)
    verify_ops.verify_sampled(
        torch.softmax(logits, -1), torch.zeros(2, 3, dtype=torch.long), q, torch.rand(2, 3), torch.rand(2)
    )
    assert accepted.shape == (2,)


# -- the drafter's own entry points: context width and query blocks ---------------------------------------------------


def test_project_context_names_the_width_it_needs(drafter):
    drafter = drafter()
    width = drafter.fc.weight.shape[1]
    assert drafter.project_context(torch.zeros(1, 3, width)).shape == (1, 3, drafter.fc.weight.shape[0])
    with pytest.raises(ValueError, match=rf"target features \[b, n, {width}\].*got \[1, 3, {width - 1}\]"):
        drafter.project_context(torch.zeros(1, 3, width - 1))


@pytest.mark.parametrize("shape", ["too long", "wrong width", "wrong batch", "empty"])
def test_a_query_block_must_fit_the_block_and_the_cache(drafter, shape):
    drafter = drafter()
    m, b = drafter.fc.weight.shape[0], drafter.block_size
    cache = drafter.new_cache(batch=1, capacity=32)
    bad = {
        "too long": (1, b + 1, m),
        "wrong width": (1, b, m + 1),
        "wrong batch": (2, b, m),
        "empty": (1, 0, m),
    }
    with pytest.raises(ValueError, match="block embeddings"):
        drafter(cache, torch.zeros(bad[shape]))
    with pytest.raises(ValueError, match="block embeddings"):
        drafter.forward_static(cache, torch.tensor(0), torch.zeros(bad[shape]))
    assert drafter(cache, torch.zeros(1, b, m)).shape == (1, b, m)
