"""Coverage rules (LC2xx) and the owned lm_head (LC4xx): the checkpoint's tensors against the manifest, both ways.

The loaders build every tensor the geometry implies and refuse a checkpoint that misses one or carries a surplus
one (coverage in both directions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.manifest import DTYPE_BYTES
from lilicorr_ckpt.runtimes import PROFILES

from ._support import (
    ALL,
    DROP,
    assert_clean,
    describe,
    dflash_edit,
    edit_config,
    hits,
    one,
    problems,
    refused_by,
    run,
)

Tensors = dict[str, tuple[str, tuple[int, ...], bytes]]
Mutate = Callable[[Tensors], None]

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
    return n


def drop(*names: str) -> Mutate:
    def apply(t: Tensors) -> None:
        for n in names:
            del t[n]

    return apply


def drop_matching(fragment: str) -> Mutate:
    def apply(t: Tensors) -> None:
        for n in [n for n in t if fragment in n]:
            del t[n]

    return apply


def add(name: str, shape: tuple[int, ...], dtype: str = "BF16") -> Mutate:
    def apply(t: Tensors) -> None:
        t[name] = (dtype, shape, bytes(nbytes(dtype, shape)))

    return apply


def retype(name: str, dtype: str, shape: tuple[int, ...] | None = None) -> Mutate:
    def apply(t: Tensors) -> None:
        new_shape = shape if shape is not None else t[name][1]
        t[name] = (dtype, new_shape, bytes(nbytes(dtype, new_shape)))

    return apply


def rename(old: str, new: str) -> Mutate:
    """Rename the tensors whose name starts with `old`."""

    def apply(t: Tensors) -> None:
        for n in [n for n in t if n.startswith(old)]:
            t[new + n[len(old) :]] = t.pop(n)

    return apply


def chain(*fns: Callable[[Any], None]) -> Callable[[Any], None]:
    def apply(x: Any) -> None:
        for fn in fns:
            fn(x)

    return apply


H_EQ_M = {"dflash": {"lilicorr_hidden_size": 64}}
CONV = {"conv": (4, 16)}
TOKEN_PROJ_IDENTITY = chain(
    add("lilicorr.token_proj.weight", (64, 64)), add("lilicorr.token_proj.bias", (64,))
)


class Case(NamedTuple):
    id: str
    rule: str
    severity: str
    runtimes: list[str]
    mutate: Mutate | None = None
    edit: Callable[[dict[str, Any]], None] | None = None
    config: dict[str, Any] = {}
    write: dict[str, Any] = {}
    contains: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()  # must be among the finding's subjects
    expected: str | None = None
    actual: str | None = None
    also: frozenset[str] = frozenset()


CASES = [
    Case(
        "head-tensor-missing",
        "LC201",
        "error",
        [],
        drop("lilicorr.in_head.bias"),
        contains=("missing 1 head tensors", "lilicorr.in_head.bias"),
        subjects=("lilicorr.in_head.bias",),
        expected="46 lilicorr.* tensors",
        actual="45 present",
    ),
    Case(
        "token-proj-missing-while-head-narrower",
        "LC201",
        "error",
        [],
        drop("lilicorr.token_proj.weight", "lilicorr.token_proj.bias"),
        contains=("lilicorr.token_proj.weight", "lilicorr.token_proj.bias"),
    ),
    # the live case: token_proj shipped although h == M, so the runtime builds an identity and drops it
    Case(
        "token-proj-surplus-h-equals-m",
        "LC202",
        "error",
        [],
        TOKEN_PROJ_IDENTITY,
        config=H_EQ_M,
        contains=("lilicorr.token_proj", "identity", "lilicorr_hidden_size 64", "h = 64 = hidden_size"),
        subjects=("lilicorr.token_proj.weight", "lilicorr.token_proj.bias"),
    ),
    Case(
        "token-proj-surplus-h-zero",
        "LC202",
        "error",
        [],
        TOKEN_PROJ_IDENTITY,
        dflash_edit(lilicorr_hidden_size=0),
        config=H_EQ_M,
        contains=("lilicorr_hidden_size 0", "identity"),
        also=frozenset({"LC105"}),
    ),
    Case(
        "head-layer-surplus",
        "LC202",
        "error",
        [],
        None,
        dflash_edit(lilicorr_num_layers=1),
        contains=("lilicorr.layers.1.",),
        subjects=("lilicorr.layers.1.attn.in_proj_weight",),
    ),
    Case(
        "backbone-tensor-missing",
        "LC203",
        "error",
        [],
        drop("layers.1.mlp.down_proj.weight"),
        contains=("layers.1.mlp.down_proj.weight",),
        subjects=("layers.1.mlp.down_proj.weight",),
    ),
    Case(
        "embed-tokens-shipped",
        "LC218",
        "warning",
        [],
        add("embed_tokens.weight", (512, 64)),
        contains=(
            f"{SG} drops it",
            f"{VL} uses it as the draft's own input embedding",
            f"{TR} loads it, then replaces it with the target's",
        ),
        subjects=("embed_tokens.weight",),
    ),
    Case(
        "backbone-layer-beyond-config",
        "LC204",
        "error",
        [],
        add("layers.2.input_layernorm.weight", (64,)),
        contains=("layers.2.input_layernorm.weight",),
    ),
    Case(
        "conv-keys-absent",
        "LC205",
        "error",
        [],
        None,
        dflash_edit(conv_kernel_size=DROP, conv_group_size=DROP),
        config=CONV,
        contains=(
            "8 convolution tensors",
            "conv_kernel_size is absent",
            "dropped silently",
            "conv_kernel_size 4, conv_group_size 16",
        ),
        subjects=("layers.0.attention_conv.base_kernel", "layers.1.mlp_conv.kernel_projection.weight"),
    ),
    Case(
        "conv-keys-zero",
        "LC205",
        "error",
        [],
        None,
        dflash_edit(conv_kernel_size=0, conv_group_size=0),
        config=CONV,
        contains=("conv_kernel_size is 0",),
    ),
    Case(
        "conv-keys-without-tensors",
        "LC206",
        "error",
        [],
        None,
        dflash_edit(conv_kernel_size=4, conv_group_size=16),
        contains=("conv_kernel_size 4", "conv_group_size 16", "8 convolution tensors", "none"),
        subjects=("layers.0.mlp_conv.kernel_projection.weight",),
    ),
    Case(
        "conv-partial",
        "LC207",
        "error",
        [],
        drop_matching("layers.1.attention_conv."),
        config=CONV,
        contains=("layers.1.attention_conv.base_kernel", "conv_kernel_size", "num_hidden_layers"),
        subjects=("layers.1.attention_conv.kernel_projection.weight",),
    ),
    Case(
        "conv-layer-beyond-config",
        "LC207",
        "error",
        [],
        chain(
            add("layers.2.mlp_conv.base_kernel", (2, 4, 64)),
            add("layers.2.mlp_conv.kernel_projection.weight", (32, 64)),
        ),
        config=CONV,
        contains=("layers.2.mlp_conv.base_kernel",),
    ),
    Case(
        "fc-width-vs-target-layer-ids",
        "LC208",
        "error",
        [],
        None,
        dflash_edit(target_layer_ids=[0, 1, 2]),
        contains=("fc.weight", "[64, 128]", "[64, 192]", "fc reads 2 target layers", "lists 3 ([0, 1, 2])"),
        expected="[64, 192]",
        actual="[64, 128]",
    ),
    Case(
        "slot-embedding-shape",
        "LC208",
        "error",
        [],
        retype("lilicorr.slot_embedding", "BF16", (1, 1, 8, 1, 32)),
        contains=("lilicorr.slot_embedding", "[1, 1, 8, 1, 32]", "[1, 1, 7, 1, 32]", "B=8"),
        expected="[1, 1, 7, 1, 32]",
        actual="[1, 1, 8, 1, 32]",
    ),
    Case(
        "norm-dtype",
        "LC209",
        "error",
        [],
        retype("norm.weight", "I32"),
        contains=("norm.weight", "I32"),
        expected="BF16/F16/F32/F64",
        actual="I32",
    ),
    Case(
        "lattice-in-proj-packed",
        "LC209",
        "error",
        [],
        retype("lilicorr.layers.0.attn.in_proj_weight", "U8", (96, 16)),
        contains=("lilicorr.layers.0.attn.in_proj_weight", "U8", "cannot carry quantization"),
        actual="U8",
        also=frozenset({"LC208"}),
    ),
    Case(
        "legacy-sequential-names",
        "LC217",
        "error",
        ["sglang", "vllm"],
        write={"naming": "sequential"},
        contains=("legacy Sequential", "lilicorr.feature_mlp.0", f"{SG} and {VL} do not rename them"),
    ),
    Case(
        "legacy-and-named-collide",
        "LC211",
        "error",
        [],
        add("lilicorr.feature_mlp.up_proj.bias", (32,)),
        write={"naming": "sequential"},
        contains=("lilicorr.feature_mlp.1.bias", "lilicorr.feature_mlp.up_proj.bias"),
        also=frozenset({"LC217"}),
    ),
    Case(
        "training-prefix",
        "LC212",
        "error",
        [],
        write={"key_prefix": "dflash_module."},
        contains=("71 tensor names", "dflash_module."),
        subjects=("dflash_module.fc.weight",),
    ),
    Case("model-prefix", "LC213", "info", [], write={"key_prefix": "model."}, contains=("71 tensor names",)),
    Case(
        "mixed-float-dtypes",
        "LC214",
        "warning",
        [],
        retype("norm.weight", "F32"),
        contains=("F32 x1", "BF16 x"),
    ),
    Case(
        "geometry-incomplete",
        "LC215",
        "info",
        [],
        None,
        dflash_edit(lilicorr_factor_dim=DROP),
        contains=("head tensors not checked",),
        also=frozenset({"LC101"}),
    ),
    # ---- owned lm_head
    Case(
        "own-head-flag-without-tensor",
        "LC401",
        "error",
        ["vllm", "trtllm"],
        drop("lm_head.weight"),
        config={"own_lm_head": True},
        contains=("has_own_lm_head", "lm_head.weight"),
        subjects=("lm_head.weight",),
        also=frozenset({"LC403"}),
    ),
    Case(
        "lm-head-without-flag",
        "LC402",
        "error",
        ["trtllm"],
        add("lm_head.weight", (512, 64)),
        contains=("has_own_lm_head",),
        subjects=("lm_head.weight",),
        expected="true",
        also=frozenset({"LC406", "LC407"}),
    ),
    Case(
        "lm-head-flag-false",
        "LC402",
        "error",
        ["trtllm"],
        add("lm_head.weight", (512, 64)),
        edit=lambda c: c.__setitem__("has_own_lm_head", False),
        expected="true",
        actual="False",
        also=frozenset({"LC406", "LC407"}),
    ),
    # vLLM serves any lm_head tensor as the draft's own head
    Case(
        "lm-head-without-flag-served-as-own",
        "LC406",
        "warning",
        ["vllm"],
        add("lm_head.weight", (512, 64)),
        contains=(f"{VL} treats any lm_head tensor as the draft's own head",),
        subjects=("lm_head.weight",),
        also=frozenset({"LC402", "LC407"}),
    ),
    # SGLang has no lm_head parameter: it drops the copy and uses the target's head, as the config declares
    Case(
        "lm-head-copy-dropped-by-sglang",
        "LC407",
        "warning",
        ["sglang"],
        add("lm_head.weight", (512, 64)),
        contains=("drops them", "target's head"),
        subjects=("lm_head.weight",),
        also=frozenset({"LC402", "LC406"}),
    ),
    # ---- tensors SGLang and vLLM drop knowingly, and the backbone aliases they rename
    Case(
        "t2d-dropped-by-vllm",
        "LC225",
        "info",
        ["vllm"],
        add("t2d", (512,)),
        contains=(f"{VL} drops them",),
        subjects=("t2d",),
        also=frozenset({"LC204"}),
    ),
    Case(
        "t2d-unread-elsewhere",
        "LC204",
        "error",
        ["sglang", "trtllm"],
        add("t2d", (512,)),
        subjects=("t2d",),
        also=frozenset({"LC225"}),
    ),
    Case(
        "midlayer-alias-renamed",
        "LC226",
        "info",
        ["vllm"],
        rename("layers.0.", "midlayer."),
        config={"head": False, "num_hidden_layers": 1},
        contains=("`midlayer` alias", f"{VL} renames them"),
        subjects=("midlayer.mlp.down_proj.weight",),
        also=frozenset({"LC227"}),
    ),
    Case(
        "midlayer-alias-refused",
        "LC227",
        "error",
        ["sglang", "trtllm"],
        rename("layers.0.", "midlayer."),
        config={"head": False, "num_hidden_layers": 1},
        contains=("`midlayer` alias", "has no parameter"),
        also=frozenset({"LC226"}),
    ),
    Case(
        "encoder-alias-renamed",
        "LC226",
        "info",
        ["sglang", "vllm"],
        chain(rename("fc.weight", "encoder.fc.weight"), rename("hidden_norm.", "encoder.output_norm_enc.")),
        contains=("`encoder` alias",),
        subjects=("encoder.fc.weight", "encoder.output_norm_enc.weight"),
        also=frozenset({"LC227"}),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_coverage_rule(ckpt, case: Case):
    path = ckpt(fixtures.draft_config(**case.config), mutate=case.mutate, **case.write)
    if case.edit:
        edit_config(path, case.edit)
    report = run(path)
    found = [f for f in hits(report, case.rule, case.severity) if sorted(f.runtimes) == sorted(case.runtimes)]
    assert found, describe(report)
    text = " ".join(f.message for f in found)
    for fragment in case.contains:
        assert fragment in text, text
    subjects = {s for f in found for s in f.subjects}
    assert set(case.subjects) <= subjects, subjects
    if case.expected is not None:
        assert case.expected in [f.expected for f in found]
    if case.actual is not None:
        assert case.actual in [f.actual for f in found]
    assert problems(report, ignore={case.rule, *case.also}) == [], describe(report)
    if case.rule == "LC401":
        return  # runtime scope checked in test_own_head_flag_without_tensor_refused_by_vllm_and_trtllm
    if not case.also:
        want = sorted(case.runtimes or ALL) if case.severity == "error" else []
        assert refused_by(report) == want, describe(report)


@pytest.mark.parametrize(
    "write, allowed",
    [
        pytest.param({}, [], id="plain"),
        pytest.param({"config": fixtures.draft_config(conv=(4, 16))}, [], id="conv"),
        pytest.param({"config": fixtures.draft_config(**H_EQ_M)}, [], id="no-token-proj"),
        # an owned head (LC404, SGLang) and Sequential names (LC217, vLLM): test_loader_audit.py
        pytest.param({"key_prefix": "model."}, [], id="model-prefix"),
        pytest.param({"dtype": "F32"}, [], id="fp32"),
    ],
)
def test_valid_checkpoints_pass(ckpt, write, allowed):
    assert_clean(run(ckpt(**write)), allowed)


def test_model_prefixed_names_are_checked_like_bare_ones(ckpt):
    # loaders strip `model.`, so a missing tensor must still be found under the prefix
    report = run(ckpt(key_prefix="model.", mutate=drop("model.lilicorr.out_head.weight")))
    assert "lilicorr.out_head.weight" in one(report, "LC201").subjects


def test_sequential_names_are_checked_after_renaming(ckpt):
    report = run(ckpt(naming="sequential", mutate=drop("lilicorr.layers.1.mlp.2.weight")))
    assert "lilicorr.layers.1.mlp.down_proj.weight" in one(report, "LC201").subjects


def test_own_head_flag_without_tensor_refused_by_vllm_and_trtllm(ckpt):
    report = run(ckpt(fixtures.draft_config(own_lm_head=True), mutate=drop("lm_head.weight")))
    one(report, "LC401", "error")
    assert {"vllm", "trtllm"} <= set(refused_by(report))


def test_own_head_flag_without_tensor_is_scoped_to_vllm_and_trtllm(ckpt):
    report = run(ckpt(fixtures.draft_config(own_lm_head=True), mutate=drop("lm_head.weight")))
    assert one(report, "LC401", "error").runtimes == ["trtllm", "vllm"]
    assert refused_by(report) == ["trtllm", "vllm"]


def test_conv_shape_mismatch_names_the_conv_keys(ckpt):
    path = ckpt(fixtures.draft_config(conv=(4, 16)))
    edit_config(path, dflash_edit(conv_kernel_size=3))
    f = next(f for f in hits(run(path), "LC208") if f.pointer == "layers.0.attention_conv.base_kernel")
    assert "conv_kernel_size 3" in f.message and "conv_group_size 16" in f.message


def test_missing_target_layer_ids_does_not_hide_missing_backbone_tensors(ckpt):
    path = ckpt(mutate=drop("layers.1.mlp.down_proj.weight"))
    edit_config(path, dflash_edit(target_layer_ids=DROP))
    assert "layers.1.mlp.down_proj.weight" in one(run(path), "LC203").subjects


def test_missing_target_layer_ids_does_not_call_fc_unread(ckpt):
    path = ckpt()
    edit_config(path, dflash_edit(target_layer_ids=DROP))
    assert hits(run(path), "LC204") == []


def test_invalid_hidden_size_does_not_call_backbone_tensors_unread(ckpt):
    path = ckpt()
    edit_config(path, lambda c: c.__setitem__("hidden_size", "64"))
    report = run(path)
    one(report, "LC001", "error")
    assert hits(report, "LC204") == [], describe(report)


def test_conv_tensors_with_kernel_size_but_no_group_size_blame_the_group_size(ckpt):
    # conv_kernel_size 4 is set: the cause is the missing conv_group_size (LC116), so LC205 must not say the
    # kernel size drops the tensors
    path = ckpt(fixtures.draft_config(conv=(4, 16)))
    edit_config(path, dflash_edit(conv_group_size=DROP))
    report = run(path)
    assert [f.runtimes for f in hits(report, "LC116", "error")] == [ALL]
    f = one(report, "LC205", "error")
    assert "conv_group_size is absent" in f.message and "conv_kernel_size is 4:" not in f.message
    assert "dropped silently" not in f.message and f.pointer == "$.dflash_config.conv_group_size"


def fuse_qkv(t: Tensors) -> None:
    for i in (0, 1):
        p = f"layers.{i}.self_attn."
        q, k, v = (t.pop(p + f"{x}_proj.weight") for x in "qkv")
        t[p + "qkv_proj.weight"] = (q[0], (q[1][0] + k[1][0] + v[1][0], q[1][1]), q[2] + k[2] + v[2])


def test_fused_qkv_is_accepted_by_every_runtime(ckpt):
    # SGLang and vLLM resolve qkv_proj.weight to their QKVParallelLinear, whose loader splits a fused tensor;
    # TensorRT-LLM splits it by head counts (loader audit E1)
    assert_clean(run(ckpt(mutate=fuse_qkv)))


def test_fused_qkv_with_wrong_rows_is_refused_by_trtllm_too(ckpt):
    def bad(t: Tensors) -> None:
        fuse_qkv(t)
        dtype, shape, raw = t["layers.0.self_attn.qkv_proj.weight"]
        t["layers.0.self_attn.qkv_proj.weight"] = (
            dtype,
            (shape[0] - 16, shape[1]),
            raw[: (shape[0] - 16) * shape[1] * 2],
        )

    report = run(ckpt(mutate=bad), runtime="trtllm")
    assert [f.subjects for f in hits(report, "LC204")] == [["layers.0.self_attn.qkv_proj.weight"]], describe(
        report
    )
    assert refused_by(report) == ["trtllm"]
