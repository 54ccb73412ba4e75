"""The probe filter: no bundled probe, and no near-duplicate of one, is ever a training prompt (issue 37)."""

from __future__ import annotations

import random

import pytest

from lilicorr_train import prompts
from lilicorr_train.dedup import ProbeIndex, bundled_probes, shingles
from lilicorr_train.mixes import CHAT_OPENERS, CODE_OPENERS, MATH_OPENERS, STUB_OPENERS, stdlib_pool


@pytest.fixture(scope="module")
def index() -> ProbeIndex:
    return ProbeIndex()


@pytest.fixture(scope="module")
def probes() -> list[tuple[str, str]]:
    return bundled_probes()


def test_all_252_bundled_probes_are_indexed(probes):
    assert len(probes) == 252
    ids = [pid for pid, _ in probes]
    assert len(set(ids)) == 252
    assert sum(pid.startswith("HumanEval/") for pid in ids) == 164
    assert sum(pid.startswith("mt_bench/") for pid in ids) == 80
    assert sum(pid.startswith("gsm8k") for pid in ids) == 8


def test_every_probe_matches_itself(index, probes):
    for pid, text in probes:
        found = index.match(text)
        # HumanEval/56 and /61 differ only in their bracket characters: the same words, either is a match
        assert found is not None and found.jaccard == 1.0, pid


def _variants(text: str, rng: random.Random) -> list[str]:
    words = text.split()
    changed = list(words)
    for i in rng.sample(range(len(words)), max(1, len(words) // 12)):  # about 8 % of the words replaced
        changed[i] = "zzz"
    return [
        text.upper(),  # case
        "  ".join(text.split()),  # whitespace
        text.replace(",", " ; ").replace(".", " ! "),  # punctuation
        " ".join(changed),  # a few words changed
        f"Please answer the following.\n\n{text}\n\nThink step by step.",  # wrapped
        "Explain this code:\n```python\n" + text + "```",  # quoted in a longer request
        " ".join(words[: max(len(words) * 2 // 3, 12)]),  # cut short
    ]


def test_near_duplicates_of_probes_are_caught(index, probes):
    rng = random.Random(0)
    missed = []
    for pid, text in probes:
        if len(text.split()) < 16:  # too short for a two-thirds cut to be meaningful; exact forms only
            variants = _variants(text, rng)[:3]
        else:
            variants = _variants(text, rng)
        for variant in variants:
            found = index.match(variant)
            if found is None:
                missed.append((pid, variant[:80]))
    assert not missed, f"{len(missed)} near-duplicates missed, e.g. {missed[:3]}"


def test_unrelated_text_and_shared_boilerplate_pass(index):
    for text in [
        "Write a short story about a lighthouse keeper who befriends a seagull.",
        'from typing import List\n\n\ndef total(values: List[int]) -> int:\n    """Return the sum."""\n',
        "How much money does she have left?",  # a GSM8K phrase, not a probe
        "def f(x):\n",
        "",
    ]:
        assert index.match(text) is None, text


def test_short_text_is_one_shingle():
    assert shingles("Hello, world!") == frozenset({"hello world"})
    assert shingles("") == frozenset()
    assert len(shingles("one two three four five")) == 2


def test_the_training_prompt_sources_hold_no_probe(index, monkeypatch):
    """The CPU-side sources of the v3 mix (templates and standard-library prompts) and every opener the target
    finishes: none is a probe near-duplicate (the generation drops any that would be; here there are none)."""
    monkeypatch.setattr(prompts, "STDLIB_FILES", 150)
    texts = [p.text for p in prompts.training_prompts(20000, 0, 0.35)]
    texts += [p.text for p in stdlib_pool()]
    texts += CHAT_OPENERS + CODE_OPENERS + MATH_OPENERS + STUB_OPENERS
    keep, dropped = index.filter(texts)
    assert not dropped, [(texts[i][:80], m.describe()) for i, m in dropped[:3]]
    assert len(keep) == len(texts)
