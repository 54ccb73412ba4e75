"""Hostile speculators configs through `convert` (both directions): each ends as a refusal or a usage error that
names the problem, promptly and within a bounded memory, and nothing is written."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from helpers import REPO

SPEC = REPO / "tests" / "data" / "producers" / "speculators-0.9.0" / "dflash-bf16"


def _speculators_src(tmp: Path, edit) -> Path:
    src = tmp / "src"
    shutil.copytree(SPEC, src)
    doc: dict[str, Any] = json.loads((src / "config.json").read_text())
    edit(doc)
    (src / "config.json").write_text(json.dumps(doc))
    return src


def test_a_billion_nested_layers_is_refused_at_once_not_built_as_a_mask(cli, tmp_path):
    # the layer count sized a per-layer list of the attention mask before the tensors were counted: 10**9
    # entries took over 20 s and several GB before this was bounded
    src = _speculators_src(
        tmp_path, lambda d: d["transformer_layer_config"].__setitem__("num_hidden_layers", 10**9)
    )
    for to in ("zlab", "speculators"):
        dst = tmp_path / f"out-{to}"
        began = time.monotonic()
        run = cli("convert", src, dst, "--to", to, "-r", "vllm")
        assert time.monotonic() - began < 2, to
        assert run.code == 1, run
        assert "num_hidden_layers is 1000000000" in run.err and "Traceback" not in run.err
        assert not dst.exists()
