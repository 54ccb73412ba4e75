"""What one speculative block computes, held to the record taken before decode/block.py replaced the loops' own
copies of the draft step, verification and acceptance (block_record.json, written by `python
tests/runtime/block_record.py --quick OUT.pt` at 0c10ad8): every mode, greedy and sampled, the eager loop, the
device loop at batch 3 and the static draft step, on the CPU. The tokens and block records must match anywhere; the
digest over every recorded tensor (draft logits, top-K, head inputs and scores, walks, context rows, the device
loop's state) on the stack that recorded it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from block_record import record, stack, summary

GOLDEN = Path(__file__).with_name("block_record.json")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return summary(record(tmp_path_factory.mktemp("block"), quick=True))


def test_every_loop_decodes_the_recorded_tokens_and_blocks(recorded):
    golden = json.loads(GOLDEN.read_text())["cases"]
    assert sorted(recorded["cases"]) == sorted(golden)
    for name, case in golden.items():
        got = recorded["cases"][name]
        assert got["tokens"] == case["tokens"], name
        assert got["records"] == case["records"], name
        assert got["tensors"] == case["tensors"], name


def test_every_block_tensor_is_the_recorded_one(recorded):
    golden = json.loads(GOLDEN.read_text())
    if golden["stack"] != stack():
        pytest.skip(f"digests recorded on {golden['stack']}, this is {stack()}")
    for name, case in golden["cases"].items():
        assert recorded["cases"][name]["digest"] == case["digest"], name
