"""The real target read directly (target/gguf_direct.py) is the model and tokenizer transformers' GGUF loader
builds from the same file: SmolLM2-135M-Instruct's Q4_1 GGUF (scripts/fetch_smollm2.sh), every weight and buffer
bit for bit, the config, the serialised tokenizer, and all 252 bundled probes tokenized alike (as smoke's
reference runtime and smoke --engine, which tokenizes with transformers, must)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runtime_helpers import assert_same_tokenizer, assert_same_weights

from lilicorr_ckpt.smoke.probes import load_probes
from lilicorr_ckpt.smoke.tokenize import tokenize_probes
from lilicorr_runtime import load_target

GGUF = Path(__file__).resolve().parents[2] / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytest.importorskip("gguf", reason="GGUF targets need the gguf package (the runtime extra)")
pytestmark = [
    pytest.mark.real_target,
    pytest.mark.slow,
    pytest.mark.skipif(not GGUF.is_file(), reason="run scripts/fetch_smollm2.sh to fetch the GGUF"),
]


def test_smollm2_read_directly_is_what_transformers_loads(monkeypatch):
    monkeypatch.delenv("LILICORR_GGUF_LOADER", raising=False)
    direct = load_target(GGUF, dtype=torch.bfloat16, fast=False)
    monkeypatch.setenv("LILICORR_GGUF_LOADER", "transformers")
    reference = load_target(GGUF, dtype=torch.bfloat16, fast=False)
    assert direct.load_note == "read directly from the GGUF"
    assert reference.load_note.startswith("transformers' GGUF loader")

    assert reference.model.config.to_dict()["quantization_config"]["quant_method"] == "gguf"
    assert_same_weights(direct, reference)
    assert direct.model.lm_head.weight is direct.model.model.embed_tokens.weight  # tied, as the file says

    ours_tok, theirs_tok = direct.tokenizer, reference.tokenizer
    texts = ["<|im_start|>user\nhi<|im_end|>", "  leading spaces\n\n\ttabs ünïcödé 漢字 🙂", "<|endoftext|>x"]
    # every_token: all 49,152 ids decoded alone
    assert_same_tokenizer(ours_tok, theirs_tok, texts, gguf_path=GGUF, every_token=True)
    probes = load_probes("code,chat,math")
    assert len(probes) == 252
    assert tokenize_probes(ours_tok, probes, direct.eos_token_ids) == tokenize_probes(
        theirs_tok, probes, reference.eos_token_ids
    )
    assert direct.eos_token_ids == reference.eos_token_ids == (2,)
