"""convert on a source config.json just under the 4 MiB limit, made of long one-line lists: the output was written
indented (14 MB for a 4 MB source), validate then refused its own output ("config.json is 14001171 bytes"), naming
neither DST nor why, after 5.5 s. A JSON file that indented would pass the limit is written compact; the exclusion
patterns a quantization config lists are read each once, and more than MAX_EXCLUSIONS distinct ones are refused
(20,000 patterns in a 200 kB config took 134 s: every module against every pattern for every release)."""

from __future__ import annotations

import json
import time

import pytest

from lilicorr_ckpt.checkpoint.quant import MAX_EXCLUSIONS, parse_quant_config
from lilicorr_ckpt.checkpoint.source import JSON_LIMIT
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.convert.writer import _dump_json

from helpers import REPO

TINY = REPO / "examples" / "tiny-lilicorr"


def test_json_that_indented_would_pass_the_read_limit_is_written_compact(tmp_path):
    doc = {"architectures": ["X"], "junk": [0] * 1_100_000}  # 3.3 MB compact, 7.7 MB indented
    _dump_json(tmp_path / "config.json", doc)
    data = (tmp_path / "config.json").read_bytes()
    assert len(data) <= JSON_LIMIT and json.loads(data) == doc
    _dump_json(tmp_path / "small.json", {"a": [1, 2]})
    assert (tmp_path / "small.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'  # still indented


def test_a_pattern_listed_many_times_is_read_once():
    qc, problems = parse_quant_config(
        {"quant_algo": "NVFP4", "quant_method": "modelopt", "ignore": ["lm_head", "*"] * 250_000 + ["x"]},
        "config.json",
    )
    assert qc is not None and not problems
    assert qc.exclude == ("lm_head", "*", "x") and dict(qc.flat_lists)["ignore"] == ("lm_head", "*", "x")


@pytest.mark.parametrize("form", ["flat", "nested"])
def test_more_distinct_exclusions_than_the_limit_are_refused_at_once(tmp_path, capsys, form):
    drafter = tmp_path / "d"
    drafter.mkdir()
    (drafter / "model.safetensors").write_bytes((TINY / "model.safetensors").read_bytes())
    config = json.loads((TINY / "config.json").read_text())
    patterns = [f"m{i}.x*" for i in range(MAX_EXCLUSIONS + 1)]
    if form == "flat":
        config["quantization_config"] = {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "ignore": patterns,
        }
    else:
        quant = {
            "quant_algo": "NVFP4",
            "group_size": 16,
            "kv_cache_quant_algo": None,
            "exclude_modules": patterns,
        }
        (drafter / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": quant})
        )
    (drafter / "config.json").write_text(json.dumps(config))
    for command in (["validate", str(drafter)], ["convert", str(drafter), str(tmp_path / "out")]):
        began = time.monotonic()
        with pytest.raises(SystemExit) as exc:
            main(command)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and time.monotonic() - began < 2
        assert f"lists {MAX_EXCLUSIONS + 1} distinct exclusion patterns; the limit is {MAX_EXCLUSIONS}" in err
    assert not (tmp_path / "out").exists()
