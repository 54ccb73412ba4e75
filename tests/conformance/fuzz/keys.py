"""The config keys a release's parsers read, enumerated from its own source files: every string literal used as a
key (`x.get("k")`, `getattr(x, "k")`, `x["k"]`, `_cfg_get(x, "k")`, ...) in the files that decide how a drafter is
configured. The fuzzer mutates these keys (and the ones the base drafter already has), so a key a release starts
reading (vLLM 0.34.0's `no_rope_layers`, SGLang 0.5.23's `use_gemma_norm`) is fuzzed without anyone listing it.

Over-collection is harmless (a key no loader reads is ignored by both sides); what matters is not to miss one.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

_KEY = re.compile(r"[a-z][a-z0-9_]{1,40}")
_GETTERS = {"get", "pop", "setdefault"}
_NAMED = {"getattr", "hasattr", "_cfg_get", "_get", "_get_nested_config_value", "_get_nested_config"}

# the files, per engine, whose statements read a drafter's configuration (globs under the unpacked wheel)
FILES = {
    "vllm": (
        "vllm/model_executor/models/lilicorr.py",
        "vllm/model_executor/models/qwen3_dflash*.py",
        "vllm/model_executor/models/qwen3_dspark.py",
        "vllm/model_executor/models/ricursive_dflash2.py",
        "vllm/v1/worker/gpu/spec_decode/*/speculator.py",
        "vllm/v1/worker/gpu/spec_decode/*/config.py",
        "vllm/v1/worker/gpu/spec_decode/speculator_config.py",
        "vllm/transformers_utils/configs/eagle.py",
        "vllm/transformers_utils/configs/speculators/*.py",
    ),
    "sglang": (
        "sglang/srt/models/dflash.py",
        "sglang/srt/models/lilicorr.py",
        "sglang/srt/models/dspark.py",
        "sglang/srt/speculative/dflash_utils.py",
        "sglang/srt/speculative/lilicorr_utils.py",
        "sglang/srt/speculative/dspark_components/*.py",
    ),
}
# config/speculative.py is 2,000 lines of every method's options: only the functions that rewrite a draft's config
FUNCTIONS = {"vllm": {"vllm/config/speculative.py": ("hf_config_override",)}}


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _KEY.fullmatch(node.value):
        return node.value
    return None


def keys_in(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Call):
            fn = n.func
            if isinstance(fn, ast.Attribute) and fn.attr in _GETTERS and n.args:
                key = _literal(n.args[0])
            elif isinstance(fn, ast.Name) and fn.id in _NAMED and len(n.args) >= 2:
                key = _literal(n.args[1])
        elif isinstance(n, ast.Subscript):
            key = _literal(n.slice)
        elif isinstance(n, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops):
            key = _literal(n.left)  # `"key" in config`
        if key:
            out.add(key)
    return out


@cache
def read_keys(engine: str, root: Path) -> frozenset[str]:
    """Every key the release at `root` (the unpacked wheel) reads from a drafter's config."""
    out: set[str] = set()
    for pattern in FILES.get(engine, ()):
        for path in sorted(root.glob(pattern)):
            out |= keys_in(ast.parse(path.read_text()))
    for rel, names in FUNCTIONS.get(engine, {}).items():
        path = root / rel
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in names:
                out |= keys_in(node)
    return frozenset(out)
