"""Hostile input never costs more than it weighs: whatever a config of at most 64 KB says, validate finishes in
under 2 s and 300 MB, with a clean message (exit 2) or findings (exit 1), never an internal error. Every case runs
in one child interpreter under RLIMIT_AS, so a regression fails (MemoryError) instead of swapping the machine."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint import tensors

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
    "both-layer-counts-huge": (
        {
            "num_hidden_layers": 2**62,
            "dflash.lilicorr_num_layers": 2**62,
            "dflash.conv_kernel_size": 4,
            "dflash.conv_group_size": 16,
        },
        None,
        {1},
    ),
    "vocab-1e18": ({"vocab_size": 10**18, "has_own_lm_head": True}, None, {1}),
    "widths-huge": (
        {
            "hidden_size": 2**62,
            "intermediate_size": 2**62,
            "dflash.block_size": 2**62,
            "dflash.lilicorr_candidate_topk": 2**40,
            "dflash.lilicorr_factor_dim": 2**62,
        },
        None,
        {1},
    ),
    "taps-30000-duplicates": ({"dflash.target_layer_ids": [0] * 30_000}, None, {1}),
    "taps-huge-ids": ({"dflash.target_layer_ids": [2**62] * 1000, "num_target_layers": 2**62}, None, {1}),
    # SGLang and vLLM read the config through transformers' config class, which refuses the length (LC119);
    # TensorRT-LLM warns (LC143)
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
    proc = subprocess.run(
        [sys.executable, str(HERE / "budget_child.py"), str(AS_LIMIT), *map(str, dirs.values())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines and "peak_rss_kb" in lines[-1], (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
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
    if (
        case == "taps-30000-duplicates"
    ):  # linear, not quadratic: the list.count scan took ~0.9 s per report here
        assert result["cpu_s"] < 0.6, f"duplicate taps took {result['cpu_s']:.2f} s of CPU for three reports"


def test_the_whole_sweep_stays_under_the_memory_budget(budget_results):
    _, peak = budget_results
    assert peak < RSS_BUDGET_KB, f"peak RSS {peak / 1024:.0f} MB"


@pytest.mark.parametrize(
    "case, needle",
    [
        ("layers-1e7", "LC118"),
        ("layers-2**63", "int64"),
        ("head-layers-1e9", "LC103"),
        ("taps-30000-duplicates", "repeats [0]"),
        ("nesting-900", "nested 901 levels deep"),
        ("integer-5000-digits", "5001 digits"),
        ("lone-surrogate-key", "unpaired UTF-16 surrogate"),
    ],
)
def test_each_hostile_config_is_named_in_the_report(tmp_path, case, needle):
    d = _write_cases(tmp_path)[case]
    from helpers import run_cli

    result = run_cli("validate", str(d))
    assert needle in result.stdout + result.stderr, result.stdout[-1500:] + result.stderr


# ---------------------------------------------------------------- tensor-table and duplicate-key bombs
# The budget for what a header or config can make validate do: a safetensors header under 100 MB validates in
# under 5 s of CPU and 1 GB, or is refused with a message naming what is too large (exit 2). One child interpreter
# runs every case (`-f json`, where a million findings or subjects used to end in MemoryError) under RLIMIT_AS.
BOMB_CPU_S = 5.0
BOMB_RSS_KB = 1 << 20


def _tensor_header(names, *, metadata: dict | None = None) -> bytes:
    """A safetensors file of one-byte U8 tensors, written as text (a dict of a million entries costs seconds)."""
    parts = [f'"__metadata__":{json.dumps(metadata)}'] if metadata is not None else []
    count = 0
    for i, name in enumerate(names):
        parts.append(f'"{name}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}')
        count += 1
    header = ("{" + ",".join(parts) + "}").encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes(count)


def _bomb(
    root: Path,
    name: str,
    *,
    config: str | None = None,
    shards: dict[str, bytes] | None = None,
    index: dict | None = None,
) -> Path:
    base = root / "base"
    if not base.exists():
        fixtures.write_checkpoint(base, fixtures.draft_config(num_hidden_layers=1))
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(config if config is not None else (base / "config.json").read_text())
    if shards is None:
        os.link(base / "model.safetensors", d / "model.safetensors")
    for file, data in (shards or {}).items():
        (d / file).write_bytes(data)
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def _duplicate_key_config(root: Path, repeats: int) -> str:
    cfg = json.loads((root / "base" / "config.json").read_text())
    body = json.dumps(cfg, separators=(",", ":"))[:-1]
    return body + "".join(f',"k":{i % 10}' for i in range(repeats)) + "}"  # 6 bytes a repeat


def _write_bombs(root: Path) -> dict[str, Path]:
    out = {
        "tensors-1M-65MB": _bomb(
            root,
            "tensors-1M-65MB",
            shards={"model.safetensors": _tensor_header(f"x.{i}" for i in range(1_000_000))},
        )
    }
    out["tensors-at-the-cap"] = _bomb(
        root,
        "tensors-at-the-cap",
        shards={
            "model.safetensors": _tensor_header(
                f"model.layers.0.x.{i}" for i in range(tensors.MAX_CHECKPOINT_TENSORS)
            )
        },
    )
    # each shard within the per-file cap, the two together over the checkpoint's
    out["tensors-over-the-cap-in-two-shards"] = _bomb(
        root,
        "tensors-over-the-cap-in-two-shards",
        shards={
            "a.safetensors": _tensor_header(["a.0", "a.1"]),
            "b.safetensors": _tensor_header(f"b.{i}" for i in range(tensors.MAX_CHECKPOINT_TENSORS - 1)),
        },
    )
    out["metadata-200k-keys"] = _bomb(
        root,
        "metadata-200k-keys",
        shards={"model.safetensors": _tensor_header(["x"], metadata={f"k{i}": "v" for i in range(200_000)})},
    )
    out["index-100k-entries"] = _bomb(
        root,
        "index-100k-entries",
        index={"weight_map": {f"x.{i}": "model.safetensors" for i in range(100_000)}},
    )
    out["config-690k-duplicate-keys"] = _bomb(
        root, "config-690k-duplicate-keys", config=_duplicate_key_config(root, 690_000)
    )
    assert len((out["config-690k-duplicate-keys"] / "config.json").read_bytes()) < 4 << 20  # under JSON_LIMIT
    return out


@pytest.fixture(scope="module")
def bomb_results(tmp_path_factory):
    dirs = _write_bombs(tmp_path_factory.mktemp("bombs"))
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "budget_child.py"),
            str(AS_LIMIT),
            "--formats",
            "json",
            *map(str, dirs.values()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines and "peak_rss_kb" in lines[-1], (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
    return {Path(r["dir"]).name: r for r in lines[:-1]}, lines[-1]["peak_rss_kb"]


@pytest.mark.parametrize(
    "case, code, needle",
    [
        (
            "tensors-1M-65MB",
            2,
            "model.safetensors: the header lists 1000000 tensors; the limit is 65536 tensors per checkpoint",
        ),
        ("tensors-at-the-cap", 1, "LC011"),  # validated: findings, within the budget
        (
            "tensors-over-the-cap-in-two-shards",
            2,
            "b.safetensors: the header lists 65535 tensors beside the 2 of the "
            "shards read before it; the limit is 65536 tensors per checkpoint",
        ),
        ("metadata-200k-keys", 2, "the header's __metadata__ holds 200000 entries; the limit is 4096"),
        ("index-100k-entries", 2, "weight_map lists 100000 tensors; the limit is 65536"),
        ("config-690k-duplicate-keys", 0, "1 warning"),
    ],
)
def test_a_tensor_table_or_key_bomb_is_judged_within_budget_or_refused(bomb_results, case, code, needle):
    by_dir, _ = bomb_results
    result = by_dir[case]
    assert result["codes"] == [code], result
    assert needle in result["stderr"], result["stderr"]
    assert "internal error" not in result["stderr"] and "Traceback" not in result["stderr"], result["stderr"]
    assert result["cpu_s"] < BOMB_CPU_S, f"{case}: {result['cpu_s']:.2f} s of CPU"


def test_the_bombs_stay_under_a_gigabyte(bomb_results):
    _, peak = bomb_results
    assert peak < BOMB_RSS_KB, f"peak RSS {peak / 1024:.0f} MB"


def test_a_repeated_key_is_one_finding_with_its_count(tmp_path):
    from lilicorr_ckpt.checks.run import validate

    fixtures.write_checkpoint(tmp_path / "base", fixtures.draft_config(num_hidden_layers=1))
    cfg = json.loads((tmp_path / "base" / "config.json").read_text())
    body = (
        json.dumps(cfg)[:-1]
        + ',"rope_theta": 1' * 4
        + "".join(f',"junk{i}": 1, "junk{i}": 2' for i in range(30))
    )
    d = _bomb(tmp_path, "dups", config=body + "}")
    found = [f for f in validate(str(d)).findings if f.rule == "LC002"]
    assert (
        found[0].message
        == "config.json repeats the key `rope_theta` (5 times); JSON readers keep the last value"
    )
    assert len(found) == 21  # 20 keys named one by one, then one finding for the other 11
    assert found[-1].message.startswith(
        "config.json repeats 11 more keys (22 occurrences): `junk19`, `junk20`"
    )
    assert found[-1].subjects == [f"junk{i}" for i in range(19, 30)]
