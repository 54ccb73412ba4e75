"""The catalogue against behaviour: every rule id fires on some checkpoint these tests build.

The ids that fire are collected by running validate over the loader-audit corpus, the sibling-head cases, the
config and coverage case tables, and the checkpoints below (one per rule those tables do not reach). A rule no checkpoint triggers is
dead code or a missing test; a retired id must stay out of the catalogue.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import bf16_bits
from lilicorr_ckpt.checkpoint.stwrite import write_file
from lilicorr_ckpt.checks import RULES
from lilicorr_ckpt.checks.findings import RETIRED, rule

from . import test_loader_audit as audit
from . import test_rules_config as config_cases
from . import test_rules_coverage as coverage_cases
from . import test_sibling_heads as sibling_cases
from . import test_speculators_rules as speculators
from ._support import edit_config, edit_json, run, set_exclusions

SCALAR = np.float32(0.01).tobytes()
OWNED = fixtures.draft_config(own_lm_head=True)
INDEX = "model.safetensors.index.json"
Build = Callable[[Path], tuple[Path, dict[str, Any]]]


def write(path: Path, config: dict[str, Any] | None = None, **kw: Any) -> Path:
    return fixtures.write_checkpoint(path, config, **kw)


def plain(fn: Callable[[Path], Path]) -> Build:
    return lambda tmp: (fn(tmp), {})


def quant(algo: str = "NVFP4", config: dict[str, Any] | None = None, **kw: Any) -> Callable[[Path], Path]:
    return lambda tmp: write(tmp, config, quant=algo, **kw)


def then(make: Callable[[Path], Path], *edits: Callable[[Path], Any]) -> Build:
    def build(tmp: Path) -> tuple[Path, dict[str, Any]]:
        path = make(tmp)
        for e in edits:
            e(path)
        return path, {}

    return build


def cfg(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    return lambda path: edit_config(path, fn)


def hfq(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    return lambda path: edit_json(path / "hf_quant_config.json", fn)


def exclusions(fn: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    return lambda path: set_exclusions(path, fn)


def nested_in_config_json(path: Path) -> None:
    nested = json.loads((path / "hf_quant_config.json").read_text())
    edit_config(path, lambda c: c.__setitem__("quantization_config", nested))


def duplicate_key(path: Path) -> None:
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(
        text.replace('"vocab_size": 512,', '"vocab_size": 512, "vocab_size": 512,')
    )


def nvfp4_group_32_in_config_groups(tmp: Path) -> Path:
    from .test_rules_quant import flat_group_in_config_groups, nvfp4_group_32

    path = nvfp4_group_32(tmp)
    flat_group_in_config_groups(path)
    return path


def odd_width_nvfp4(tmp: Path) -> Path:
    config = fixtures.draft_config(dflash={"lilicorr_hidden_size": 40})
    modules = ["lilicorr.layers.0.attn.out_proj", "lilicorr.layers.1.attn.out_proj"]

    def mutate(t: fixtures.Tensors) -> None:
        for m in modules:
            t[f"{m}.weight"] = ("U8", (40, 20), bytes(800))
            t[f"{m}.weight_scale"] = ("F8_E4M3", (40, 2), bytes(80))
            t[f"{m}.weight_scale_2"] = ("F32", (), SCALAR)
            t[f"{m}.input_scale"] = ("F32", (), SCALAR)

    path = write(tmp, config, quant="NVFP4", mutate=mutate)
    set_exclusions(path, lambda ex: [p for p in ex if p != "*out_proj"])
    return path


def target(tmp: Path, **over: Any) -> Path:
    cfg_ = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "vocab_size": 512,
        "eos_token_id": 2,
        "bos_token_id": 1,
        "rope_theta": 10000.0,
        **over,
    }
    tmp.mkdir(parents=True)
    rows, hidden = int(cfg_["vocab_size"]), int(cfg_["hidden_size"])
    fixtures.save(
        tmp, cfg_, {"model.embed_tokens.weight": ("BF16", (rows, hidden), bytes(rows * hidden * 2))}
    )
    return tmp


def with_target(**over: Any) -> Build:
    return lambda tmp: (write(tmp / "draft"), {"target": str(target(tmp / "target", **over))})


def sharded(*edits: Callable[[Path], Any]) -> Build:
    return then(lambda tmp: write(tmp, shards=3), *edits)


def index(fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    return lambda path: edit_json(path / INDEX, fn)


def duplicated_in_two_shards(path: Path) -> None:
    tensors = fixtures.checkpoint_tensors(fixtures.draft_config())
    wmap = json.loads((path / INDEX).read_text())["weight_map"]
    first = "model-00001-of-00003.safetensors"
    name = next(n for n, s in wmap.items() if s != first)
    write_file(
        path / first,
        {**{n: tensors[n] for n, s in wmap.items() if s == first}, name: tensors[name]},
        {"format": "pt"},
    )


def duplicate_header_key(path: Path) -> None:
    import struct

    file = path / "model.safetensors"
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    forged = json.dumps(header)[:-1] + ", " + json.dumps({name: header[name]})[1:-1] + "}"
    file.write_bytes(struct.pack("<Q", len(forged)) + forged.encode() + data[8 + n :])


def deep(mutate: Callable[[fixtures.Tensors], None], **kw: Any) -> Build:
    return lambda tmp: (write(tmp, mutate=mutate, **kw), {"deep": True})


def nan_and_zero(t: fixtures.Tensors) -> None:
    dtype, shape, _ = t["lilicorr.out_head.weight"]
    values = np.zeros(shape, dtype=np.float32)
    values[0, 0] = np.nan
    t["lilicorr.out_head.weight"] = (dtype, shape, bf16_bits(values).tobytes())
    dtype, shape, raw = t["lilicorr.in_head.weight"]
    t["lilicorr.in_head.weight"] = (dtype, shape, bytes(len(raw)))


def bad_scales(t: fixtures.Tensors) -> None:
    t["lilicorr.pass_hidden_proj.weight_scale_2"] = ("F32", (), np.float32(0).tobytes())
    t["lilicorr.token_proj.weight_scale_2"] = ("F32", (), np.float32(-1e-3).tobytes())


def _bf16_scale(
    entry: tuple[str, tuple[int, ...], bytes], value: float
) -> tuple[str, tuple[int, ...], bytes]:
    shape = entry[1]
    return ("BF16", shape, bf16_bits(np.full(shape, value, dtype=np.float32)).astype("<u2").tobytes())


EXTRA: dict[str, Build] = {
    "LC017": lambda tmp: (speculators.SPEC / "dflash-bf16", {"runtime": "sglang"}),
    "LC018": lambda tmp: (speculators.SPEC / "dflash-bf16", {"runtime": "trtllm"}),
    "LC019": lambda tmp: (speculators.SPEC / "dflash-bf16", {"runtime": "vllm"}),
    "LC176": lambda tmp: (speculators.fixture_with(tmp, "dflash-bf16", speculators.full_attention), {}),
    "LC177": lambda tmp: (
        speculators.fixture_with(tmp, "dspark-bf16", lambda c: c.pop("sample_from_anchor")),
        {},
    ),
    "LC178": lambda tmp: (speculators.with_draft_vocab(tmp, "dflash2-bf16", d2t=True), {"runtime": "vllm"}),
    "LC179": lambda tmp: (
        speculators.fixture_with(
            tmp,
            "dflash-bf16",
            lambda c: c["speculators_config"]["verifier"].update(name_or_path="/data/models/verifier"),
        ),
        {"runtime": "vllm"},
    ),
    "LC180": lambda tmp: (
        then(lambda t: write(t), cfg(lambda c: c.__setitem__("add_swa_attention_sink_bias", True)))(tmp)[0],
        {"runtime": "vllm"},
    ),
    "LC182": lambda tmp: (
        then(lambda t: write(t), cfg(lambda c: c.__setitem__("n_predict", 2)))(tmp)[0],
        {"runtime": "vllm"},
    ),
    "LC184": lambda tmp: (
        write(
            tmp,
            {
                **fixtures.sibling_config("dflash2"),
                "dflash_config": {
                    **fixtures.sibling_config("dflash2")["dflash_config"],
                    "input_embedding_scale": float("nan"),
                },
            },
        ),
        {"runtime": "vllm"},
    ),
    "LC185": lambda tmp: (
        write(
            tmp,
            {
                **fixtures.sibling_config("dflash2"),
                "dflash_config": {**fixtures.sibling_config("dflash2")["dflash_config"], "causal": True},
            },
        ),
        {"runtime": "vllm"},
    ),
    "LC160": then(lambda tmp: write(tmp), cfg(lambda c: c.__setitem__("use_gemma_norm", True))),
    "LC161": then(lambda tmp: write(tmp), cfg(lambda c: c.__setitem__("rope_scaling", {"rope_dim": 8}))),
    "LC228": lambda tmp: (write(tmp), {"runtime": "sglang==0.5.21"}),
    "LC328": lambda tmp: (
        then(quant(), cfg(lambda c: c["quantization_config"].__setitem__("weight_scale_encoding", "zstd")))(
            tmp
        )[0],
        {"runtime": "vllm"},
    ),
    # a BF16 NVFP4 weight_scale whose values E4M3 holds: cast exactly on load (tests/checks/test_scale_cast.py)
    "LC329": plain(
        quant(mutate=lambda t: t.__setitem__("fc.weight_scale", _bf16_scale(t["fc.weight_scale"], 0.5)))
    ),
    "LC508": lambda tmp: (
        write(tmp / "draft"),
        {"target": str(target(tmp / "target", max_position_embeddings=8192)), "runtime": "vllm==0.32.0"},
    ),
    "LC162": then(
        lambda tmp: write(tmp, fixtures.sibling_config("dspark-deepspec")),
        cfg(lambda c: c.pop("markov_head_type")),
    ),
    "LC163": lambda tmp: (
        then(
            lambda t: write(t, fixtures.sibling_config("dspark-deepspec")),
            cfg(lambda c: c.__setitem__("mask_token_id", 7)),
        )(tmp)[0],
        {"runtime": "sglang==0.5.21"},
    ),
    "LC164": lambda tmp: (
        write(tmp, {**fixtures.sibling_config("dflash2"), "no_rope_layers": [1]}),
        {"runtime": "vllm"},
    ),
    "LC165": lambda tmp: (
        write(tmp, {**fixtures.sibling_config("dflash2"), "no_rope_layers": [1]}),
        {"runtime": "sglang"},
    ),
    "LC002": then(lambda tmp: write(tmp), duplicate_key),
    "LC013": then(
        lambda tmp: write(tmp, fixtures.draft_config(head=False)),
        cfg(lambda c: c["dflash_config"].__setitem__("lilicorr_candidate_topk", 4)),
    ),
    "LC126": then(lambda tmp: write(tmp), cfg(lambda c: c["dflash_config"].pop("block_size"))),
    "LC301": then(quant(), hfq(lambda d: d["quantization"].__setitem__("group_size", 32))),
    "LC147": lambda tmp: (then(write, cfg(lambda c: c.pop("rope_theta")))(tmp)[0], {"runtime": "vllm"}),
    "LC302": then(quant(), cfg(lambda c: c["quantization_config"].pop("quant_method"))),
    "LC303": then(quant(), hfq(lambda d: d["quantization"].pop("kv_cache_quant_algo"))),
    "LC305": plain(odd_width_nvfp4),
    "LC307": then(quant(), exclusions(lambda ex: [p for p in ex if "feature_mlp" not in p])),
    "LC308": then(quant(), exclusions(lambda ex: [*ex, "*self_attn.o_proj"])),
    "LC309": then(quant(), exclusions(lambda ex: [p for p in ex if "feature_mlp" not in p])),
    "LC310": then(quant(), exclusions(lambda ex: [*ex, "dflash_module.lilicorr.out_head"])),
    "LC312": then(
        quant(),
        cfg(lambda c: c["quantization_config"].__setitem__("quant_algo", "W8A16")),
        hfq(lambda d: d["quantization"].__setitem__("quant_algo", "W8A16")),
    ),
    "LC314": plain(
        quant(config=OWNED, quantize=fixtures.servable_quantized(fixtures.manifest_for(OWNED)) | {"lm_head"})
    ),
    "LC315": plain(
        quant("W4A16_NVFP4", mutate=lambda t: t.__setitem__("fc.input_scale", ("F32", (), SCALAR)))
    ),
    "LC316": then(quant(), lambda p: (p / "hf_quant_config.json").write_text(json.dumps({"algo": "NVFP4"}))),
    "LC317": plain(quant(quantize=set())),
    "LC318": plain(
        quant("FP8", mutate=lambda t: t.__setitem__("layers.0.self_attn.k_proj.k_scale", ("F32", (), SCALAR)))
    ),
    "LC319": then(quant(), lambda p: (p / "hf_quant_config.json").unlink()),
    "LC320": then(
        quant("FP8"),
        cfg(
            lambda c: c["quantization_config"].__setitem__(
                "exclude_modules", c["quantization_config"].pop("ignore")
            )
        ),
    ),
    "LC321": plain(nvfp4_group_32_in_config_groups),
    "LC322": then(quant(), nested_in_config_json),
    "LC323": then(quant(), exclusions(lambda ex: [*ex, "model.embed_tokens"])),
    "LC501": with_target(hidden_size=128),
    "LC502": with_target(num_hidden_layers=2),
    "LC503": with_target(vocab_size=1024),
    "LC504": with_target(eos_token_id=511),
    "LC505": with_target(num_hidden_layers=8),
    "LC506": with_target(rope_theta=1e6),
    "LC507": with_target(hidden_size="64"),
    "LC601": then(lambda tmp: write(tmp), lambda p: (p / "pytorch_model.bin").write_bytes(pickle.dumps([1]))),
    "LC602": sharded(lambda p: (p / "model-00002-of-00003.safetensors").unlink()),
    "LC603": sharded(
        index(
            lambda d: d["weight_map"].__setitem__("lilicorr.ghost.weight", "model-00001-of-00003.safetensors")
        )
    ),
    "LC604": sharded(index(lambda d: d["weight_map"].pop("lilicorr.out_head.weight"))),
    "LC605": sharded(duplicated_in_two_shards),
    "LC606": sharded(
        index(lambda d: d["metadata"].__setitem__("total_size", d["metadata"]["total_size"] + 8))
    ),
    "LC607": sharded(lambda p: write_file(p / "model-00004-of-00003.safetensors", {}, {"format": "pt"})),
    "LC608": then(lambda tmp: write(tmp), lambda p: (p / "model.safetensors").unlink()),
    "LC609": then(lambda tmp: write(tmp), duplicate_header_key),
    "LC701": deep(nan_and_zero),
    "LC702": deep(nan_and_zero),
    "LC703": deep(bad_scales, quant="NVFP4"),
    "LC704": deep(bad_scales, quant="NVFP4"),
    "LC327": deep(
        lambda t: t.__setitem__(
            "layers.0.mlp.up_proj.weight_scale_2", ("F32", (), np.float32(0.25).tobytes())
        ),
        quant="NVFP4",
    ),
}


def fired_by_tables(tmp: Path) -> set[str]:
    fired: set[str] = set()
    for row in audit.ROWS:
        fired |= {f.rule for f in run(audit.build(tmp / "audit", row)).findings}
    for sib in sibling_cases.CASES:
        fired |= {f.rule for f in run(sibling_cases.build(tmp / "sibling", sib)).findings}
    for k, case in enumerate(config_cases.CASES + coverage_cases.CASES):
        path = write(
            tmp / f"case{k}",
            fixtures.draft_config(**case.config),
            mutate=getattr(case, "mutate", None),
            **case.write,
        )
        if case.edit:
            edit_config(path, case.edit)
        fired |= {f.rule for f in run(path).findings}
    return fired


def test_every_catalogue_rule_fires_on_a_built_checkpoint(tmp_path):
    fired = fired_by_tables(tmp_path)
    extra_fired: dict[str, set[str]] = {}
    for rule_id, build in EXTRA.items():
        path, kw = build(tmp_path / rule_id)
        extra_fired[rule_id] = {f.rule for f in run(path, **kw).findings}
        fired |= extra_fired[rule_id]
    never = sorted(set(RULES) - fired)
    assert never == [], f"catalogue rules no test checkpoint triggers: {never}"
    # each extra checkpoint is there for its rule: it must trigger it itself
    assert [r for r, got in extra_fired.items() if r not in got] == []


def test_retired_ids_stay_out_of_the_catalogue():
    assert not set(RETIRED) & set(RULES)
    for rule_id in RETIRED:
        try:
            rule(rule_id, "reused", "info", "config", "a retired id reused", "none")
        except ValueError as exc:
            assert "retired" in str(exc)
        else:  # pragma: no cover - the registry accepted a retired id
            RULES.pop(rule_id)
            raise AssertionError(f"{rule_id} could be registered again")
