"""Real ModelOpt as the oracle: our NVFP4 codec, the converter's repairs and exclusions against what
`nvidia-modelopt` itself produces (NVFP4QTensor, get_quant_config, its exclude summarization).

The converter never imports modelopt; these tests do, and are skipped when it is not installed
(`pip install -e '.[modelopt]'` after a CPU torch; modelopt also needs requests and huggingface_hub).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import warnings

import numpy as np
import pytest
from convert_helpers import load_json, tensors_of

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import nvfp4_dequantize, nvfp4_quantize
from lilicorr_ckpt.checkpoint.quant import summarize_exclusions
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.convert.repair import dequantize_blocks
from lilicorr_ckpt.runtimes import excluded_by

torch = pytest.importorskip("torch", reason="the ModelOpt oracle needs torch (CPU is enough)")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import quant_utils
        from modelopt.torch.export.unified_export_hf import _export_quantized_weight
        from modelopt.torch.quantization.qtensor import NVFP4QTensor
    except Exception as exc:  # ImportError, or its undeclared deps (requests, huggingface_hub) missing
        pytest.skip(
            f"nvidia-modelopt is not importable ({type(exc).__name__}: {exc}); "
            "install the modelopt extra to run the oracle tests",
            allow_module_level=True,
        )

nn = torch.nn
MATCHERS = ("vllm", "sglang", "trtllm")


def _modelopt_nvfp4(weight: np.ndarray):
    q, scale, scale_2 = NVFP4QTensor.quantize(torch.from_numpy(weight), 16)
    return q, scale, scale_2


@pytest.mark.parametrize("shape,seed,spread", [((32, 64), 0, 0.1), ((48, 256), 1, 3.0), ((16, 32), 2, 1e-4)])
def test_nvfp4_pack_and_scales_match_nvfp4qtensor(shape, seed, spread):
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal(shape) * spread).astype(np.float32)
    weight[1, 3] = 40 * spread  # an outlier that sets the per-tensor scale
    q, scale, scale_2 = _modelopt_nvfp4(weight)
    packed, codes, ours_2 = nvfp4_quantize(weight, 16)
    assert np.array_equal(packed, q._quantized_data.numpy())
    assert np.array_equal(codes, scale.view(torch.uint8).numpy())
    assert np.float32(ours_2) == np.float32(scale_2.item())
    theirs = q.dequantize(
        dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16}, fast=False
    )
    assert np.array_equal(nvfp4_dequantize(packed, codes, ours_2, 16), theirs.numpy())


def test_an_all_zero_block_gets_modelopts_scale():
    weight = (np.random.default_rng(4).standard_normal((4, 32)) * 0.1).astype(np.float32)
    weight[0, :16] = 0.0
    q, scale, scale_2 = _modelopt_nvfp4(weight)
    packed, codes, ours_2 = nvfp4_quantize(weight, 16)
    assert np.array_equal(nvfp4_dequantize(packed, codes, ours_2, 16)[0, :16], np.zeros(16, np.float32))
    assert np.array_equal(codes, scale.view(torch.uint8).numpy())


def test_the_repair_path_matches_modelopt_dequantize_cast_to_bf16(monkeypatch):
    import lilicorr_ckpt.convert.repair as repair

    monkeypatch.setattr(repair, "CHUNK_ELEMENTS", 3 * 64)  # several row blocks
    weight = (np.random.default_rng(3).standard_normal((20, 64)) * 0.05).astype(np.float32)
    q, scale, scale_2 = _modelopt_nvfp4(weight)
    blobs = {
        "weight": q._quantized_data.numpy().tobytes(),
        "weight_scale": scale.view(torch.uint8).numpy().tobytes(),
        "weight_scale_2": np.float32(scale_2.item()).tobytes(),
    }
    infos = {
        "weight": TensorInfo("w", "U8", (20, 32), "weight", 0, 640),
        "weight_scale": TensorInfo("s", "F8_E4M3", (20, 4), "weight_scale", 0, 80),
        "weight_scale_2": TensorInfo("s2", "F32", (), "weight_scale_2", 0, 4),
    }

    def read(info, offset, length):
        return blobs[info.file][offset : offset + length]

    ours = b"".join(block for block, _ in dequantize_blocks("nvfp4", infos, (20, 64), "BF16", read, 16))
    theirs = q.dequantize(
        dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16}, fast=False
    )
    assert ours == theirs.to(torch.bfloat16).view(torch.uint16).numpy().tobytes()


# ---------------------------------------------------------------- a LiLiCorr drafter quantized by ModelOpt


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim):
        super().__init__()
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = (
            RMSNorm(c["hidden_size"]),
            RMSNorm(c["hidden_size"]),
        )
        self.self_attn = Attention(
            c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        )
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])


class LatticeLayer(nn.Module):
    def __init__(self, h, heads, width):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(h), RMSNorm(h)
        self.attn = nn.MultiheadAttention(h, heads, bias=True, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(h, width), nn.SiLU(), nn.Linear(width, h))


class Head(nn.Module):
    """The training module's layout (nn.Sequential MLPs), as ModelOpt's modeling_lilicorr builds it."""

    def __init__(self, c):
        d = c["dflash_config"]
        M, h, K, B = (
            c["hidden_size"],
            d["lilicorr_hidden_size"],
            d["lilicorr_candidate_topk"],
            d["block_size"],
        )
        N, F, L = d["lilicorr_num_heads"], d["lilicorr_factor_dim"], d["lilicorr_num_layers"]
        super().__init__()
        self.token_proj = nn.Linear(M, h)
        self.pass_hidden_proj = nn.Linear(M, h)
        self.feature_mlp = nn.Sequential(nn.LayerNorm(5), nn.Linear(5, h), nn.SiLU(), nn.Linear(h, h))
        self.slot_embedding = nn.Parameter(torch.zeros(1, 1, B - 1, 1, h))
        self.rank_embedding = nn.Parameter(torch.zeros(1, 1, 1, K, h))
        self.relative_slot_bias = nn.Parameter(torch.zeros(N, 2 * B - 1))
        self.same_slot_bias = nn.Parameter(torch.zeros(N))
        self.context_proj = nn.Linear(M, h)
        self.layers = nn.ModuleList([LatticeLayer(h, N, int(h * d["lilicorr_mlp_ratio"])) for _ in range(L)])
        self.output_norm, self.anchor_norm = RMSNorm(h), RMSNorm(h)
        self.factor_input_proj = nn.Linear(3 * h, h)
        self.out_head, self.in_head, self.anchor_out_head = nn.Linear(h, F), nn.Linear(h, F), nn.Linear(h, F)


class Drafter(nn.Module):
    def __init__(self, c):
        super().__init__()
        M = c["hidden_size"]
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.fc = nn.Linear(len(c["dflash_config"]["target_layer_ids"]) * M, M, bias=False)
        self.hidden_norm, self.norm = RMSNorm(M), RMSNorm(M)
        self.lilicorr = Head(c)


class Target(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(2)])


class Wrapped(nn.Module):
    """What ModelOpt's get_quant_config sees: the target, its lm_head, and the drafter under dflash_module."""

    def __init__(self, c):
        super().__init__()
        self.model = Target(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.dflash_module = Drafter(c)


@pytest.fixture(scope="module")
def modelopt_export(tmp_path_factory):
    """A ModelOpt NVFP4 export of a LiLiCorr drafter: packed by ModelOpt, metadata from get_quant_config.

    The default NVFP4 preset quantizes every drafter Linear (q/k/v and the factor heads included), as
    the real exporter does; feature_mlp.1 (in_features 5) and the target are left unquantized."""
    config = fixtures.draft_config(dflash={"lilicorr_hidden_size": 32})
    torch.manual_seed(0)
    model = Wrapped(config)
    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    cfg["quant_cfg"] += [
        {"quantizer_name": "model.*", "enable": False},
        {"quantizer_name": "*feature_mlp.1*", "enable": False},
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = mtq.quantize(model, cfg)
        quant_config = quant_utils.get_quant_config(model)
        for module in model.dflash_module.modules():
            if isinstance(module, nn.Linear) and module.weight_quantizer.is_enabled:
                module.input_quantizer.amax = torch.tensor(448.0)
                _export_quantized_weight(module, torch.bfloat16)
    state = {k: v for k, v in model.dflash_module.state_dict().items() if "_quantizer" not in k}
    state = {
        k: (
            v.to(torch.bfloat16)
            if v.is_floating_point()
            and v.dtype != torch.float8_e4m3fn
            and not k.endswith(("weight_scale_2", "input_scale"))
            else v
        ).contiguous()
        for k, v in state.items()
    }
    path = tmp_path_factory.mktemp("modelopt") / "export"
    path.mkdir()
    from safetensors.torch import save_file

    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config}, indent=2))
    (path / "hf_quant_config.json").write_text(json.dumps(quant_config, indent=2))
    return path, state, quant_config


def test_the_modelopt_export_is_what_the_doc_says_runtimes_refuse(modelopt_export):
    path, state, quant_config = modelopt_export
    exclude = quant_config["quantization"]["exclude_modules"]
    assert any(p.startswith("dflash_module.") for p in exclude) and "lm_head" in exclude
    assert state["lilicorr.out_head.weight"].dtype == torch.uint8  # quantized by the default preset
    assert state["layers.0.self_attn.q_proj.input_scale"].item() == pytest.approx(1 / 6)
    assert validate(str(path)).summary.errors > 0


def test_convert_repairs_the_modelopt_export_with_modelopts_own_dequantization(
    cli, modelopt_export, tmp_path
):
    path, state, quant_config = modelopt_export
    dst = tmp_path / "out"
    run = cli("convert", path, dst, "--runtime", "all")  # q/k/v are repaired for TensorRT-LLM
    assert run.code == 0, run
    assert validate(str(dst)).summary.errors == 0
    out = tensors_of(dst)
    record = load_json(dst / "conversion.json")
    repaired = {r["module"] for r in record["repairs"] if r["action"] == "dequantized"}
    assert {
        "layers.0.self_attn.q_proj",
        "lilicorr.out_head",
        "lilicorr.factor_input_proj",
        "lilicorr.feature_mlp.down_proj",
    } <= repaired
    for module in repaired:
        legacy = {"lilicorr.feature_mlp.down_proj": "lilicorr.feature_mlp.3"}.get(module, module)
        packed, scale = state[legacy + ".weight"], state[legacy + ".weight_scale"]
        scale_2 = state[legacy + ".weight_scale_2"]
        q = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
        theirs = q.dequantize(
            dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16}, fast=False
        )
        assert out[module + ".weight"][2] == theirs.to(torch.bfloat16).view(torch.uint16).numpy().tobytes(), (
            module
        )
    kept = "layers.1.mlp.down_proj"
    for suffix in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
        assert (
            out[f"{kept}.{suffix}"][2]
            == state[f"{kept}.{suffix}"].reshape(-1).view(torch.uint8).numpy().tobytes()
        )


def test_output_exclusions_exclude_what_modelopt_left_unquantized_plus_the_repairs(
    cli, modelopt_export, tmp_path
):
    path, state, quant_config = modelopt_export
    dst = tmp_path / "out"
    assert cli("convert", path, dst).code == 0
    record = load_json(dst / "conversion.json")
    ignore = tuple(load_json(dst / "config.json")["quantization_config"]["ignore"])
    from lilicorr_ckpt.checks.run import load_checkpoint

    manifest = load_checkpoint(str(dst)).manifest
    # ModelOpt's exclusions name the wrapped model's modules; the drafter's carry dflash_module.
    legacy = {
        "lilicorr.feature_mlp.up_proj": "lilicorr.feature_mlp.1",
        "lilicorr.feature_mlp.down_proj": "lilicorr.feature_mlp.3",
    }
    modelopt_float = {
        m
        for m in manifest.modules
        if any(
            fnmatch.fnmatchcase("dflash_module." + legacy.get(m, m), p)
            for p in quant_config["quantization"]["exclude_modules"]
        )
    }
    assert modelopt_float == {"lilicorr.feature_mlp.up_proj"}
    repaired = {r["module"] for r in record["repairs"]}
    for matcher in MATCHERS:
        excluded = {m for m in manifest.modules if excluded_by(matcher, m, ignore, 4).excluded}
        assert excluded == modelopt_float | repaired, matcher
    source = quant_config["quantization"]["exclude_modules"]
    assert set(record["exclusions"]["dropped"]) == {p for p in source if not p.startswith("dflash_module.")}
    assert set(record["exclusions"]["stripped"]) == {p for p in source if p.startswith("dflash_module.")}
    assert any(r["why"] == "legacy Sequential head name -> named MLP" for r in record["renames"])


def _expand_modelopt(patterns, modules):
    return {m for m in modules if any(fnmatch.fnmatchcase(m, p) for p in patterns)}


@pytest.mark.parametrize(
    "float_kinds",
    [
        {
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "lilicorr.out_head",
            "lilicorr.in_head",
            "lilicorr.factor_input_proj",
            "feature_mlp.up_proj",
            "feature_mlp.down_proj",
        },
        {"feature_mlp.up_proj", "mlp.down_proj"},
        {"self_attn.o_proj", "fc", "lilicorr.pass_hidden_proj", "attn.out_proj", "feature_mlp.up_proj"},
    ],
)
def test_exclusion_summaries_cover_the_same_modules_as_modelopts(float_kinds):
    manifest = fixtures.manifest_for(fixtures.draft_config())
    modules = sorted(manifest.modules)
    float_modules = {m for m in modules if any(m.endswith(k) for k in float_kinds)}
    quantized = set(modules) - float_modules
    theirs = quant_utils._prefix_wildcard_summarize_exclude_modules(sorted(float_modules), sorted(quantized))
    ours = summarize_exclusions(manifest, float_modules, quantized)
    # ModelOpt's prefix wildcards, read with its own (fnmatch) semantics, exclude exactly the float modules ...
    assert _expand_modelopt(theirs, modules) == float_modules
    # ... and ours exclude the same set under every runtime's matcher, without a layer index
    for matcher in MATCHERS:
        assert {m for m in modules if excluded_by(matcher, m, tuple(ours), 4).excluded} == float_modules, (
            matcher
        )
    assert not any(any(part.isdigit() for part in p.split(".")) for p in ours)


def test_modelopts_index_bearing_summary_misses_vllms_renumbered_draft_layers():
    manifest = fixtures.manifest_for(fixtures.draft_config())
    float_modules = {m for m in manifest.modules if m.endswith(("q_proj", "k_proj", "v_proj"))}
    quantized = set(manifest.modules) - float_modules
    theirs = quant_utils._prefix_wildcard_summarize_exclude_modules(sorted(float_modules), sorted(quantized))
    assert any(p.startswith("layers.0") for p in theirs)  # names a draft layer index
    # vLLM prefixes draft layers as model.layers.{num_target_layers + i}: the index-bearing names miss
    assert not excluded_by("vllm", "layers.0.self_attn.q_proj", tuple(theirs), 4).excluded
    ours = tuple(summarize_exclusions(manifest, float_modules, quantized))
    assert excluded_by("vllm", "layers.0.self_attn.q_proj", ours, 4).excluded


def test_requantized_shards_are_nvfp4qtensors_quantization_with_the_shared_global_scale(
    cli, modelopt_export, tmp_path
):
    # ModelOpt packed each shard alone (its fusion pass never reaches a drafter): convert's re-quantization of a
    # shard is exactly NVFP4QTensor.quantize(ModelOpt's own dequantization, weights_scaling_factor_2=shared)
    path, state, _ = modelopt_export
    dst = tmp_path / "out"
    run = cli("convert", path, dst)
    assert run.code == 0, run
    out = tensors_of(dst)
    groups = load_json(dst / "conversion.json")["fused_scales"]
    assert {g["module"].rsplit(".", 1)[1] for g in groups} == {"qkv_proj", "gate_up_proj"}
    checked = 0
    for group in groups:
        shared = torch.tensor(group["weight_scale_2"]["after"], dtype=torch.float32)
        assert group["weight_scale_2"]["after"] == max(
            state[f"{s}.weight_scale_2"].item() for s in group["shards"]
        )
        for shard in group["requantized"]:
            m = shard["module"]
            packed = state[f"{m}.weight"]
            q = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
            stored = q.dequantize(
                dtype=torch.float32,
                scale=state[f"{m}.weight_scale"],
                double_scale=state[f"{m}.weight_scale_2"],
                block_sizes={-1: 16},
                fast=False,
            )
            theirs, scale, _ = NVFP4QTensor.quantize(stored, 16, weights_scaling_factor_2=shared)
            assert out[f"{m}.weight"][2] == theirs._quantized_data.numpy().tobytes(), m
            assert out[f"{m}.weight_scale"][2] == scale.view(torch.uint8).numpy().tobytes(), m
            assert out[f"{m}.weight_scale_2"][2] == shared.numpy().tobytes()
            back = theirs.dequantize(
                dtype=torch.float32, scale=scale, double_scale=shared, block_sizes={-1: 16}, fast=False
            )
            assert shard["max_abs_error"] == float((back - stored).abs().max())
            checked += 1
        for kept in group["kept"]:
            for suffix in ("weight", "weight_scale", "weight_scale_2"):
                assert (
                    out[f"{kept}.{suffix}"][2]
                    == state[f"{kept}.{suffix}"].reshape(-1).view(torch.uint8).numpy().tobytes()
                )
    assert checked >= 4
