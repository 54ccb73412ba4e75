"""One target-spec resolution for validate, smoke and the runtime: a directory holding one .gguf is that GGUF."""

from __future__ import annotations

import pytest
import transformers

import lilicorr_runtime.target.load as runtime_target
from lilicorr_ckpt.checkpoint import resolve_target_spec


class Loaded(Exception):
    pass


def test_a_directory_holding_one_gguf_loads_it_in_the_runtime(tmp_path, monkeypatch):
    (tmp_path / "model.Q4.gguf").write_bytes(b"GGUF")
    seen = {}

    def from_pretrained(source, **kwargs):
        seen.update(source=source, **kwargs)
        raise Loaded

    # imported by load_target when it builds through transformers
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    # read directly, the one GGUF is the file it reads (and refuses: four bytes are no GGUF)
    with pytest.raises(ValueError, match=r"model\.Q4\.gguf: not a GGUF file: 4 bytes"):
        runtime_target.load_target(tmp_path)
    monkeypatch.setenv("LILICORR_GGUF_LOADER", "transformers")  # through transformers, the file it is given
    with pytest.raises(Loaded):
        runtime_target.load_target(tmp_path)
    assert seen["source"] == str(tmp_path.resolve()) and seen["gguf_file"] == "model.Q4.gguf"
    assert resolve_target_spec(str(tmp_path)).kind == "gguf"


def test_a_directory_without_config_or_gguf_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        runtime_target.load_target(tmp_path)
