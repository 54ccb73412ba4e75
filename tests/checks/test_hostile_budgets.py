"""Hostile input never costs more than it weighs: whatever a config of at most 64 KB says, validate finishes in
under 2 s and 300 MB, with a clean message (exit 2) or findings (exit 1), never an internal error. Every case runs
in one child interpreter under RLIMIT_AS, so a regression fails (MemoryError) instead of swapping the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures

HERE = Path(__file__).resolve().parent
AS_LIMIT = 1 << 30
RSS_BUDGET_KB = 300 << 10
CPU_BUDGET_S = 2.0


def _set(cfg: dict, key: str, value):
    target = cfg["dflash_config"] if key.startswith("dflash.") else cfg
    target[key.removeprefix("dflash.")] = value


# name -> (config edits, raw text replacing the whole config or None, exit codes allowed)
CONFIG_CASES = {
    "layers-1e7": ({"num_hidden_layers": 10_000_000}, None, {1}),
    "layers-int64-max": ({"num_hidden_layers": 2**63 - 1}, None, {1}),
    "layers-2**63": ({"num_hidden_layers": 2**63}, None, {1}),
    "layers-1e300": ({"num_hidden_layers": 1e300}, None, {1}),
    "head-layers-1e9": ({"dflash.lilicorr_num_layers": 1e9}, None, {1}),
    "both-layer-counts-huge": ({"num_hidden_layers": 2**62, "dflash.lilicorr_num_layers": 2**62,
                                "dflash.conv_kernel_size": 4, "dflash.conv_group_size": 16}, None, {1}),
    "vocab-1e18": ({"vocab_size": 10**18, "has_own_lm_head": True}, None, {1}),
    "widths-huge": ({"hidden_size": 2**62, "intermediate_size": 2**62, "dflash.block_size": 2**62,
                     "dflash.lilicorr_candidate_topk": 2**40, "dflash.lilicorr_factor_dim": 2**62}, None, {1}),
    "taps-30000-duplicates": ({"dflash.target_layer_ids": [0] * 30_000}, None, {1}),
    "taps-huge-ids": ({"dflash.target_layer_ids": [2**62] * 1000, "num_target_layers": 2**62}, None, {1}),
    # vLLM and TensorRT-LLM ignore the extra entries (LC143, a warning); SGLang's config class refuses them (LC119)
    "layer-types-long": ({"layer_types": ["full_attention"] * 3500}, None, {1}),
    "many-empty-objects": ({"junk": [{}] * 20_000}, None, {0, 1}),
    "nesting-900": ({}, '{"a": ' + "[" * 900 + "]" * 900 + "}", {2}),
    "nesting-500-objects": ({}, '{"a": ' + '{"b": ' * 500 + "1" + "}" * 500 + "}", {2}),
    "integer-5000-digits": ({}, '{"num_hidden_layers": 1' + "0" * 5000 + "}", {2}),
    "lone-surrogate-key": ({}, '{"\\ud800": 1}', {2}),
    "lone-surrogate-value": ({}, '{"architectures": ["\\udfff"]}', {2}),
}


def _write_cases(root: Path) -> dict[str, Path]:
    base = fixtures.write_checkpoint(root / "base", fixtures.draft_config(num_hidden_layers=1))
    out = {}
    for name, (edits, raw, _) in CONFIG_CASES.items():
        d = root / name
        d.mkdir()
        os.link(base / "model.safetensors", d / "model.safetensors")
        if raw is None:
            cfg = json.loads((base / "config.json").read_text())
            for key, value in edits.items():
                _set(cfg, key, value)
            raw = json.dumps(cfg, separators=(",", ":"))
        assert len(raw.encode()) <= 64 << 10, name
        (d / "config.json").write_text(raw)
        out[name] = d
    return out


@pytest.fixture(scope="module")
def budget_results(tmp_path_factory):
    dirs = _write_cases(tmp_path_factory.mktemp("budgets"))
    proc = subprocess.run([sys.executable, str(HERE / "budget_child.py"), str(AS_LIMIT), *map(str, dirs.values())],
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines and "peak_rss_kb" in lines[-1], proc.stdout[-2000:] + proc.stderr[-3000:]
    by_dir = {Path(r["dir"]).name: r for r in lines[:-1]}
    return by_dir, lines[-1]["peak_rss_kb"]


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_hostile_config_costs_what_it_weighs(budget_results, case):
    by_dir, _ = budget_results
    result = by_dir[case]
    allowed = CONFIG_CASES[case][2]
    assert set(result["codes"]) <= allowed, result
    assert "internal error" not in result["stderr"] and "Traceback" not in result["stderr"], result["stderr"]
    assert result["cpu_s"] < 3 * CPU_BUDGET_S, f"{case}: three reports took {result['cpu_s']:.2f} s of CPU"
    if case == "taps-30000-duplicates":  # linear, not quadratic: the list.count scan took ~0.9 s per report here
        assert result["cpu_s"] < 0.6, f"duplicate taps took {result['cpu_s']:.2f} s of CPU for three reports"


def test_the_whole_sweep_stays_under_the_memory_budget(budget_results):
    _, peak = budget_results
    assert peak < RSS_BUDGET_KB, f"peak RSS {peak / 1024:.0f} MB"


@pytest.mark.parametrize("case, needle", [
    ("layers-1e7", "LC118"), ("layers-2**63", "int64"), ("head-layers-1e9", "LC103"),
    ("taps-30000-duplicates", "repeats [0]"), ("nesting-900", "nested 901 levels deep"),
    ("integer-5000-digits", "5001 digits"), ("lone-surrogate-key", "unpaired UTF-16 surrogate")])
def test_each_hostile_config_is_named_in_the_report(tmp_path, case, needle):
    d = _write_cases(tmp_path)[case]
    from helpers import run_cli

    result = run_cli("validate", str(d))
    assert needle in result.stdout + result.stderr, result.stdout[-1500:] + result.stderr
