"""`smoke` against the real SmolLM2-135M-Instruct (Q4_1 GGUF; scripts/fetch_smollm2.sh) with a random drafter."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from lilicorr_ckpt import fixtures

from helpers import REPO, smollm2_drafter_config

GGUF = REPO / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytest.importorskip("gguf", reason="GGUF targets need the gguf package (the runtime extra)")
pytestmark = [
    pytest.mark.real_target,
    pytest.mark.slow,
    pytest.mark.skipif(not GGUF.is_file(), reason="run scripts/fetch_smollm2.sh to fetch the GGUF"),
]


@pytest.fixture
def one_thread():
    # other suites share the 2-core box: two intra-op threads per process oversubscribe it, and a run that
    # takes a minute alone took seven; one thread keeps the time near the idle one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_smoke_on_smollm2_is_lossless_and_records_the_chat_setup(smoke, tmp_path, one_thread):
    drafter = fixtures.write_checkpoint(tmp_path / "drafter", smollm2_drafter_config())
    # a random drafter: the head's gain over the control is noise, so that gate is waived
    result = smoke(
        drafter,
        "-t",
        GGUF,
        "--limit",
        "1",
        "--max-new-tokens",
        "12",
        "--min-head-gain",
        "-1",
        "--no-warmup",
        "--quiet",
        "--format",
        "json",
    )
    assert result.code == 0, result.stdout + result.stderr
    report = result.report
    jsonschema.validate(report, json.loads((REPO / "schemas" / "smoke-profile.schema.json").read_text()))
    target = report["target_model"]
    assert (target["source"], target["vocab_size"], target["hidden_size"], target["num_layers"]) == (
        "gguf",
        49152,
        576,
        30,
    )
    assert target["loaded"] == "read directly from the GGUF, built without transformers"
    chat = report["chat_template"]
    assert chat["present"] and chat["applied_prompts"] == 2 and chat["raw_prompts"] == 1
    assert chat["thinking"] == "no-switch"  # SmolLM2's template has no enable_thinking
    assert chat["eos_token_ids"] == [2] and chat["eos_tokens"] == ["<|im_end|>"]
    assert result.gate("lossless")["status"] == "pass"
    assert report["validation"]["mean_consistency"]["passed"] and report["num_speculative_tokens"] == 3
