"""Regenerate tests/data/producers/: tiny drafter checkpoints written by the real producers' own code.

Each fixture is a checkpoint directory written by a producer package's own build, (quantize) and save/export
calls, driven on CPU with tiny dimensions. Nothing of the producers is copied here: this script imports the
installed packages and calls them. Nothing is downloaded from a model hub: the target / verifier is a tiny
random model built from a config in a temporary directory.

Layout written (under --out, default tests/data/producers/):

    <producer>-<version>/<kind>-<dtype>[-<variant>]/
        config.json, model.safetensors[, hf_quant_config.json]   the producer's own files, byte for byte
        PROVENANCE.json                                          producer, versions, the calls made, date

Subcommands, each run with the interpreter of its own environment (the two producers cannot share one):

    modelopt      NVIDIA ModelOpt 0.48.0rc1: DFlash, LiLiCorr (with and without the DFlash2 grouped
                  convolutions), DFlash2 and DSpark drafters, bf16 and NVFP4 exports.
    speculators   vllm-project/speculators 0.9.0: DFlash, DFlash2 and DSpark drafters (bf16), one DFlash
                  with a reduced draft vocabulary.
    observe       run in the project's dev venv: `lilicorr-ckpt validate --format json` on every fixture,
                  and whether the fused shards of each NVFP4 export share one weight_scale_2 (the numbers
                  recorded in tests/data/producers/README.md).

Environments (CPU only; torch is pinned so pip never pulls a CUDA build):

    # ModelOpt: its DFlash conversion needs transformers < 5.19. `requests` is imported by
    # modelopt.torch.utils but not declared by the wheel.
    python3 -m venv /work/venvs/modelopt
    /work/venvs/modelopt/bin/pip install torch==2.13.0 'transformers<5.19' requests
    /work/venvs/modelopt/bin/pip install --pre nvidia-modelopt==0.48.0rc1
    /work/venvs/modelopt/bin/python scripts/make_producer_fixtures.py modelopt
    #   (resolved when the fixtures were made: torch 2.13.0+cpu, transformers 5.18.0, safetensors 0.8.0)

    # speculators: installed without its dependencies (they pull torchvision/torchaudio and CUDA
    # extras that building and saving a drafter never imports), then the ones its import chain needs.
    python3 -m venv /work/venvs/speculators
    /work/venvs/speculators/bin/pip install torch==2.13.0 'transformers>=5.0,<=5.19.0' safetensors \
        pydantic pydantic-settings loguru 'numpy<=2.5.4' rich tqdm huggingface-hub openai httpx aiohttp \
        click typer psutil protobuf 'datasets>=4.0.0,<=5.1.0' hs-connectors==0.9.0
    /work/venvs/speculators/bin/pip install --no-deps speculators==0.9.0
    /work/venvs/speculators/bin/python scripts/make_producer_fixtures.py speculators
    #   (resolved when the fixtures were made: torch 2.13.0+cpu, transformers 5.19.0, safetensors 0.8.0)

    # observations, in the project's dev venv
    .venv/bin/python scripts/make_producer_fixtures.py observe

Determinism: every random draw is seeded (python, numpy, torch; one CPU thread), so a rerun with the same
package versions writes byte-identical config.json / model.safetensors / hf_quant_config.json files. The
PROVENANCE.json records a date: today's (UTC) unless --date is given, so pass the recorded date to
reproduce it byte for byte too.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "data" / "producers"
SEED = 0
SCRIPT = "scripts/make_producer_fixtures.py"

# The verifier a speculators config names: a Hub-style id, never downloaded (the weights the build reads
# come from a tiny local Llama with the same architecture).
HUB_VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"

EXPECTED = {"modelopt": "0.48.0rc1", "speculators": "0.9.0"}

# The tiny target (ModelOpt) / verifier (speculators): hidden 64, vocabulary 512, multiples of 16 throughout
# so every Linear can take NVFP4's 16-wide blocks. Id 511 is the mask token (never in the random ids).
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}
MASK_TOKEN_ID = 511


def seed_everything(seed: int = SEED) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions(producer_dist: str) -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for dist in (producer_dist, "torch", "transformers", "safetensors"):
        out[dist] = version(dist)
    return out


def place(src: Path, dst: Path, keep: tuple[str, ...], provenance: dict[str, Any]) -> None:
    """Copy the producer's files `keep` from src into a fresh dst, recording every file src held."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    files: dict[str, Any] = {}
    omitted: dict[str, Any] = {}
    reasons = provenance.pop("_omit_reasons", {})
    for path in sorted(src.iterdir()):
        record = {"bytes": path.stat().st_size, "sha256": sha256(path)}
        if path.name in keep:
            shutil.copyfile(path, dst / path.name)
            files[path.name] = record
        else:
            omitted[path.name] = {**record, "why": reasons.get(path.name, "not a checkpoint file")}
    provenance["files"] = files
    if omitted:
        provenance["omitted_files"] = omitted
    (dst / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")
    total = sum(f["bytes"] for f in files.values())
    print(f"wrote {dst.relative_to(dst.parents[1])}: {', '.join(files)} ({total} bytes)")


# --------------------------------------------------------------------------------------------- ModelOpt

# Every fixture starts from one of ModelOpt's shipped training recipes (modelopt_recipes/general/
# speculative_decoding/<recipe>.yaml), with its draft geometry scaled down by dotlist overrides.
_ARCH = "dflash.dflash_architecture_config."
MO_BACKBONE = [
    f"dflash.dflash_mask_token_id={MASK_TOKEN_ID}",
    f"{_ARCH}num_hidden_layers=2",
    f"{_ARCH}num_attention_heads=4",
    f"{_ARCH}num_key_value_heads=2",
    f"{_ARCH}head_dim=16",
    f"{_ARCH}intermediate_size=128",
]
_LILICORR_HEAD = [
    f"{_ARCH}lilicorr_hidden_size=32",
    f"{_ARCH}lilicorr_factor_dim=32",
    f"{_ARCH}lilicorr_num_heads=2",
]
MO_HEAD = {
    "dflash": [],
    "lilicorr": _LILICORR_HEAD,
    "lilicorr_conv": _LILICORR_HEAD,
    "dflash2": [f"{_ARCH}selector_rank=16"],
    "dspark": [f"{_ARCH}markov_rank=16"],
}

# The LiLiCorr head tensors the serving runtimes consume as raw float (vLLM's LiLiCorr quantization note;
# feature_mlp's in_features=5 also fits no NVFP4 block): the stock preset quantizes them, so they are
# disabled on top of it. The stock preset alone fails at export (recorded in PROVENANCE on every run).
LILICORR_FLOAT = [
    "*lilicorr.feature_mlp*",
    "*lilicorr.factor_input_proj*",
    "*lilicorr.out_head*",
    "*lilicorr.in_head*",
]
MARKOV_FLOAT = ["*markov_w1*", "*markov_w2*"]

# name -> (recipe, quantize?, calibration forward, extra disabled quantizer patterns, what it is)
MO_FIXTURES: dict[str, tuple[str, bool, str | None, list[str], str]] = {
    "dflash-bf16": ("dflash", False, None, [], "DFlash drafter, bf16"),
    "dflash-nvfp4": ("dflash", True, "train", [], "DFlash drafter, NVFP4 (stock nvfp4 preset)"),
    "lilicorr-bf16": ("lilicorr", False, None, [], "LiLiCorr drafter, bf16"),
    "lilicorr-nvfp4": (
        "lilicorr",
        True,
        "train",
        LILICORR_FLOAT,
        "LiLiCorr drafter, NVFP4; the head's raw-float tensors kept float",
    ),
    "lilicorr-nvfp4-evalcalib": (
        "lilicorr",
        True,
        "eval",
        LILICORR_FLOAT,
        "LiLiCorr drafter, NVFP4 calibrated with the eval forward (the target only, as hf_ptq's "
        "calibration loop runs it): the drafter's input quantizers never see data",
    ),
    "lilicorr-bf16-conv": ("lilicorr_conv", False, None, [], "LiLiCorr + DFlash2 grouped convolutions, bf16"),
    "lilicorr-nvfp4-conv": (
        "lilicorr_conv",
        True,
        "train",
        LILICORR_FLOAT,
        "LiLiCorr + DFlash2 grouped convolutions, NVFP4; the head's raw-float tensors kept float",
    ),
    "dflash2-bf16": ("dflash2", False, None, [], "DFlash2 drafter, bf16"),
    "dflash2-nvfp4": ("dflash2", True, "train", [], "DFlash2 drafter, NVFP4 (stock nvfp4 preset)"),
    "dspark-bf16": ("dspark", False, None, [], "DSpark drafter, bf16"),
    "dspark-nvfp4": ("dspark", True, "train", [], "DSpark drafter, NVFP4 (stock nvfp4 preset)"),
    "dspark-nvfp4-markovfloat": (
        "dspark",
        True,
        "train",
        MARKOV_FLOAT,
        "DSpark drafter, NVFP4 with the Markov head (markov_w1, markov_w2) kept float",
    ),
}

MO_CALIB = {
    "train": "model.train(); with torch.no_grad(): model(input_ids=ids, labels=ids); model.eval()  "
    "(the training forward: the only forward that runs the whole drafter, heads included)",
    "eval": "with torch.no_grad(): model(input_ids=ids)  (eval mode: HFDFlashModel.forward runs the target "
    "only, so the drafter's input quantizers collect no amax)",
}


def _mo_target(tmp: Path) -> Path:
    """A tiny random Qwen3 target saved in bf16, loaded back the way ModelOpt's examples load one.

    8 layers: ModelOpt's default target_layer_ids for 2 draft layers are then [1, 5] (with 4 they would be
    [1, 1], a duplicate its convert does not refuse)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp / "target"
    if not path.exists():
        seed_everything()
        config = Qwen3Config(num_hidden_layers=8, tie_word_embeddings=False, **TINY)
        Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def _mo_ids(offset: int):
    import torch

    generator = torch.Generator().manual_seed(SEED + offset)
    return torch.randint(0, 500, (1, 64), generator=generator)


def _mo_build(recipe_name: str, tmp: Path):
    """Target -> recipe -> mtsp.convert -> one optimizer step of the recipe's own objective."""
    import modelopt.torch.speculative as mtsp
    import torch
    from modelopt.recipe import load_recipe
    from transformers import AutoModelForCausalLM

    target = _mo_target(tmp)
    seed_everything()
    model = AutoModelForCausalLM.from_pretrained(target, dtype="auto")
    recipe = load_recipe(
        f"general/speculative_decoding/{recipe_name}", overrides=MO_BACKBONE + MO_HEAD[recipe_name]
    )
    model = mtsp.convert(model, [("dflash", recipe.dflash.model_dump())])
    # One AdamW step on the drafter's own training loss: the weights leave their initialisation (DFlash2's
    # kernel_projection starts at exactly zero, which would give it a zero weight_scale_2 under NVFP4).
    ids = _mo_ids(1)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return model


def _mo_quantize(model, calibration: str, disabled: list[str]):
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.recipe.presets import QUANT_CFG_CHOICES

    cfg = copy.deepcopy(QUANT_CFG_CHOICES["nvfp4"])
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + [{"quantizer_name": p, "enable": False} for p in disabled]
    ids = _mo_ids(2)

    def forward_loop(m) -> None:
        with torch.no_grad():
            if calibration == "train":
                m.train()
                m(input_ids=ids, labels=ids)
                m.eval()
            else:
                m(input_ids=ids)

    return mtq.quantize(model, cfg, forward_loop=forward_loop)


def _mo_export(model, out: Path) -> None:
    """As ModelOpt's export_hf_checkpoint.py and hf_ptq.py export a speculative-decoding model."""
    import torch
    from modelopt.torch.export import export_speculative_decoding

    model.eval()
    with torch.inference_mode():
        export_speculative_decoding(model, export_dir=out)


def _mo_target_config(tmp: Path) -> dict[str, Any]:
    config = json.loads((_mo_target(tmp) / "config.json").read_text())
    keep = ("architectures", "model_type", "num_hidden_layers", "rope_parameters", "dtype", *TINY)
    return {k: config[k] for k in keep if k in config}


def run_modelopt(args: argparse.Namespace) -> None:
    import modelopt

    version = modelopt.__version__
    if version != EXPECTED["modelopt"]:
        print(f"warning: nvidia-modelopt {version} installed, the fixtures document {EXPECTED['modelopt']}")
    root = args.out / f"modelopt-{version}"
    names = args.only or list(MO_FIXTURES)
    with tempfile.TemporaryDirectory(prefix="mo-fixtures-") as tmp_name:
        tmp = Path(tmp_name)
        for name in names:
            recipe, quantize, calibration, disabled, what = MO_FIXTURES[name]
            calls = [
                "AutoModelForCausalLM.from_pretrained(<tiny Qwen3 target, bf16>, dtype='auto')",
                f"modelopt.recipe.load_recipe('general/speculative_decoding/{recipe}', overrides=<recipe_overrides>)",
                "modelopt.torch.speculative.convert(model, [('dflash', recipe.dflash.model_dump())])",
                "one torch.optim.AdamW(lr=1e-3) step on model(input_ids=ids, labels=ids).loss, train mode",
            ]
            provenance: dict[str, Any] = {
                "producer": "nvidia-modelopt",
                "version": version,
                "versions": versions("nvidia-modelopt"),
                "fixture": name,
                "what": what,
                "script": f"{SCRIPT} modelopt",
                "seed": SEED,
                "date": args.date,
                "target": _mo_target_config(tmp),
                "recipe": f"general/speculative_decoding/{recipe}.yaml",
                "recipe_overrides": MO_BACKBONE + MO_HEAD[recipe],
            }
            if quantize and disabled == LILICORR_FLOAT:
                provenance["stock_preset_attempt"] = _mo_stock_lilicorr(recipe, calibration, tmp)
            model = _mo_build(recipe, tmp)
            if quantize:
                assert calibration is not None
                model = _mo_quantize(model, calibration, disabled)
                calls.append(
                    "modelopt.torch.quantization.quantize(model, QUANT_CFG_CHOICES['nvfp4'] + "
                    "<quantization.disabled>, forward_loop=<quantization.calibration>)"
                )
                provenance["quantization"] = {
                    "preset": "modelopt.recipe.presets.QUANT_CFG_CHOICES['nvfp4'] (whole model: target + drafter)",
                    "disabled": disabled,
                    "calibration": MO_CALIB[calibration],
                }
            calls.append(
                "model.eval(); with torch.inference_mode(): "
                "modelopt.torch.export.export_speculative_decoding(model, export_dir=<dir>)"
            )
            provenance["calls"] = calls
            export = tmp / f"export-{name}"
            _mo_export(model, export)
            place(
                export, root / name, ("config.json", "model.safetensors", "hf_quant_config.json"), provenance
            )


def _mo_stock_lilicorr(recipe: str, calibration: str | None, tmp: Path) -> dict[str, str]:
    """Export a LiLiCorr drafter under the stock nvfp4 preset alone, and say what happened."""
    model = _mo_quantize(_mo_build(recipe, tmp), calibration or "train", [])
    try:
        _mo_export(model, tmp / "export-stock")
    except Exception as exc:  # the producer's own refusal is the observation
        message = " ".join(str(exc).split())
        return {"preset": "QUANT_CFG_CHOICES['nvfp4'] alone", "outcome": f"{type(exc).__name__}: {message}"}
    return {"preset": "QUANT_CFG_CHOICES['nvfp4'] alone", "outcome": "exported without error"}


# ------------------------------------------------------------------------------------------ speculators

# name -> (speculator_type, TrainConfig overrides beyond the shared ones, what it is)
SP_FIXTURES: dict[str, tuple[str, dict[str, Any], str]] = {
    "dflash-bf16": ("dflash", {}, "DFlash drafter, speculators defaults"),
    "dflash-bf16-draftvocab": (
        "dflash",
        {"draft_vocab_size": 256},
        "DFlash drafter with a reduced draft vocabulary (256 of 512): lm_head + t2d/d2t saved",
    ),
    "dflash2-bf16": (
        "dflash2",
        {"selector_rank": 16},
        "DFlash2 drafter, speculators defaults but selector_rank",
    ),
    "dspark-bf16": ("dspark", {"markov_rank": 16}, "DSpark drafter, speculators defaults but markov_rank"),
}
# Shared TrainConfig overrides: two draft layers (default 5) and an explicit mask token (the default
# resolves one from the verifier's tokenizer, which the tiny verifier has none of).
SP_SHARED = {"num_layers": 2, "mask_token_id": MASK_TOKEN_ID}


def _sp_verifier(tmp: Path) -> Path:
    """A tiny random Llama verifier (SmolLM2's architecture, tied embeddings), 8 layers so speculators'
    default target layer ids [2, n//2, n-3] are valid."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp / "verifier"
    if not path.exists():
        seed_everything()
        config = LlamaConfig(
            num_hidden_layers=8, tie_word_embeddings=True, architectures=["LlamaForCausalLM"], **TINY
        )
        LlamaForCausalLM(config).save_pretrained(path)
    return path


def run_speculators(args: argparse.Namespace) -> None:
    import torch
    from speculators.model import SpeculatorModel
    from speculators.train.checkpointer import SingleGPUCheckpointer
    from speculators.train.cli import build_draft_model, parse_vocab_mappings
    from speculators.train.config.schema import TrainConfig
    from speculators.version import version

    if version != EXPECTED["speculators"]:
        print(f"warning: speculators {version} installed, the fixtures document {EXPECTED['speculators']}")
    root = args.out / f"speculators-{version}"
    names = args.only or list(SP_FIXTURES)
    with tempfile.TemporaryDirectory(prefix="sp-fixtures-") as tmp_name:
        tmp = Path(tmp_name)
        verifier = _sp_verifier(tmp)
        for name in names:
            kind, extra, what = SP_FIXTURES[name]
            data = tmp / f"data-{name}"
            data.mkdir()
            flat = {"speculator_type": kind, "verifier_name_or_path": str(verifier), "data_path": str(data)}
            flat.update(SP_SHARED)
            flat.update(extra)
            seed_everything()
            if "draft_vocab_size" in extra:
                # the token frequencies speculators' data preparation writes; the CLI builds t2d/d2t from them
                counts = torch.randint(
                    1, 1000, (TINY["vocab_size"],), generator=torch.Generator().manual_seed(SEED)
                )
                torch.save({i: int(c) for i, c in enumerate(counts)}, data / "token_freq.pt")
            train_args = argparse.Namespace(**TrainConfig.from_flat(flat).flatten())
            d2t, t2d, draft_vocab_size = parse_vocab_mappings(train_args)
            model = build_draft_model(train_args, SpeculatorModel.registry[kind], t2d, d2t, draft_vocab_size)
            model.config.speculators_config.verifier.name_or_path = HUB_VERIFIER
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
            checkpointer = SingleGPUCheckpointer(tmp / f"ckpt-{name}")
            checkpointer.save_checkpoint(model, optimizer, "final")
            shown = {
                k: ("<tiny local verifier>" if k == "verifier_name_or_path" else v) for k, v in flat.items()
            }
            shown["data_path"] = "<tmp>" + (" (holding token_freq.pt)" if "draft_vocab_size" in extra else "")
            provenance: dict[str, Any] = {
                "producer": "speculators",
                "version": version,
                "versions": versions("speculators"),
                "fixture": name,
                "what": what,
                "script": f"{SCRIPT} speculators",
                "seed": SEED,
                "date": args.date,
                "verifier": {
                    "name_or_path written": HUB_VERIFIER,
                    "built from": "a tiny random LlamaForCausalLM saved locally (tied embeddings, 8 layers): "
                    + json.dumps({"num_hidden_layers": 8, **TINY}),
                },
                "train_config": shown,
                "calls": [
                    "speculators.train.config.schema.TrainConfig.from_flat(<train_config>).flatten()",
                    "speculators.train.cli.parse_vocab_mappings(args)",
                    f"speculators.train.cli.build_draft_model(args, SpeculatorModel.registry['{kind}'], t2d, d2t, "
                    "draft_vocab_size)  (-> from_training_args: config, model, verifier embed/lm_head)",
                    f"model.config.speculators_config.verifier.name_or_path = '{HUB_VERIFIER}'",
                    "speculators.train.checkpointer.SingleGPUCheckpointer(dir).save_checkpoint(model, AdamW, "
                    "'final')  (the trainer's save: bf16 state dict -> model.save_pretrained, then "
                    "patch_config_dtype)",
                ],
                "weights": "speculators' initialisation (no training step: the trainer needs verifier hidden states)",
                "_omit_reasons": {
                    "config.py": "speculators' own source (models/<kind>/config.py, named by auto_map), "
                    "copied by save_pretrained: producer code, not committed",
                    "optimizer_state_dict.pt": "the trainer's optimizer state, not part of a checkpoint",
                },
            }
            place(
                tmp / f"ckpt-{name}" / "final", root / name, ("config.json", "model.safetensors"), provenance
            )


# ---------------------------------------------------------------------------------------------- observe

FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}


def _fused_groups(names: set[str]) -> dict[str, list[str]]:
    """{'layers.0.self_attn (qkv)': [prefix of q, k, v], ...} for every fused group with a weight_scale_2."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        if not name.endswith(".weight_scale_2"):
            continue
        module = name[: -len(".weight_scale_2")]
        parent, _, leaf = module.rpartition(".")
        for label, members in FUSED.items():
            if leaf == members[0]:
                groups[f"{parent} ({label})"] = [f"{parent}.{m}" for m in members]
    return groups


def observe_one(path: Path, cli: str) -> dict[str, Any]:
    from safetensors import safe_open

    result: dict[str, Any] = {"fixture": str(path.relative_to(path.parents[1]))}
    proc = subprocess.run([cli, "validate", str(path), "--format", "json"], capture_output=True, text=True)
    result["exit"] = proc.returncode
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result["error"] = (proc.stderr or proc.stdout).strip()[-500:]
        report = None
    if report is not None:
        result["verdicts"] = {}
        for r in report["runtimes"]:
            verdict = "accepts" if r["accepted"] else "refuses"
            result["verdicts"][r["runtime"]] = f"{verdict} ({r['errors']} errors, {r['warnings']} warnings)"
        result["findings"] = sorted(
            {
                f"{f['rule']} {f['name']} ({f['severity']}; {','.join(f['runtimes']) or 'all'})"
                for f in report["findings"]
            }
        )
    with safe_open(str(path / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        shares = {}
        for group, members in _fused_groups(names).items():
            present = [m for m in members if f"{m}.weight_scale_2" in names]
            values = [float(handle.get_tensor(f"{m}.weight_scale_2")) for m in present]
            shares[group] = {
                "shared": len(present) == len(members) and len(set(values)) == 1,
                "weight_scale_2": values,
                "input_scale": [f"{m}.input_scale" in names for m in present],
            }
        result["fused_shards"] = shares
        result["input_scale_count"] = sum(1 for n in names if n.endswith(".input_scale"))
        result["weight_scale_2_count"] = sum(1 for n in names if n.endswith(".weight_scale_2"))
    return result


def run_observe(args: argparse.Namespace) -> None:
    cli = shutil.which("lilicorr-ckpt", path=str(Path(sys.executable).parent)) or shutil.which(
        "lilicorr-ckpt"
    )
    if cli is None:
        sys.exit("observe: lilicorr-ckpt is not installed in this environment (use the project's dev venv)")
    dirs = sorted(p.parent for p in args.out.glob("*/*/config.json"))
    results = [observe_one(d, cli) for d in dirs]
    if not args.markdown:
        print(json.dumps(results, indent=2))
        return
    print("| fixture | SGLang | vLLM | TensorRT-LLM | fused shards share one weight_scale_2? | input_scale |")
    print("|---|---|---|---|---|---|")
    for r in results:
        verdicts = [r.get("verdicts", {}).get(k, r.get("error", "?")) for k in ("sglang", "vllm", "trtllm")]
        fused = r["fused_shards"]
        if not fused:
            share = "n/a (not quantized)"
        else:
            labels = sorted({g.rsplit(" ", 1)[1].strip("()") for g in fused})
            share = "; ".join(
                f"{label}: {'shared' if all(v['shared'] for g, v in fused.items() if g.endswith(f'({label})')) else 'differ'}"
                for label in labels
            )
        scales = (
            f"{r['input_scale_count']} of {r['weight_scale_2_count']} quantized modules" if fused else "n/a"
        )
        print(f"| `{r['fixture']}` | {' | '.join(verdicts)} | {share} | {scales} |")


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("producer", choices=["modelopt", "speculators", "observe"])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="the producers/ folder (default: %(default)s)"
    )
    parser.add_argument("--only", nargs="+", metavar="FIXTURE", help="regenerate only these fixtures")
    parser.add_argument("--markdown", action="store_true", help="observe: print a markdown table, not JSON")
    parser.add_argument(
        "--date",
        default=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        help="the date PROVENANCE.json records (default: today, UTC)",
    )
    args = parser.parse_args(argv)
    if args.only:
        known = {"modelopt": MO_FIXTURES, "speculators": SP_FIXTURES}.get(args.producer, {})
        unknown = sorted(set(args.only) - set(known))
        if unknown:
            parser.error(f"unknown {args.producer} fixtures: {', '.join(unknown)}; known: {', '.join(known)}")
    {"modelopt": run_modelopt, "speculators": run_speculators, "observe": run_observe}[args.producer](args)


if __name__ == "__main__":
    main()
