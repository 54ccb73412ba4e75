"""Keep the bundled probe sets out of the training data: an exact or near-duplicate of a probe is never a training
prompt.

The probes (`lilicorr_ckpt/probes`: HumanEval, MT-Bench turn 1, the eight GSM8K chain-of-thought questions) are
what `lilicorr-ckpt smoke` measures acceptance on, so a training prompt that is one of them, or one of them with a
few words changed, wrapped in a longer request, or cut short, would make that measurement a training-set score.

A text is compared with each probe as a set of word 4-grams (lower case, letters and digits only, so whitespace,
punctuation and case never hide a copy). It is a near-duplicate of a probe when

- the two sets overlap by half or more (Jaccard >= 0.5): the probe with some words changed; or
- it holds half or more of the probe's 4-grams: the probe inside a longer prompt; or
- 80 % or more of its own 4-grams are the probe's (and it has at least 8): a piece cut from the probe.

A text of fewer than four words is one "4-gram" of its whole, so it matches only a probe that is the same words.
Torch-free, and quick: an inverted index from 4-gram to probe, so a prompt costs one lookup per 4-gram.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from importlib import resources

from msgspec import Struct

N = 4  # words per shingle
JACCARD = 0.5
PROBE_HELD = 0.5  # share of the probe's shingles the text holds
TEXT_FROM_PROBE = 0.8  # share of the text's shingles that are the probe's
MIN_PIECE = 8  # shingles a text needs before TEXT_FROM_PROBE applies

_WORD = re.compile(r"[a-z0-9]+")
BUNDLED = ("code", "chat", "math")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(text: str, n: int = N) -> frozenset[str]:
    w = words(text)
    if len(w) < n:
        return frozenset([" ".join(w)]) if w else frozenset()
    return frozenset(" ".join(w[i : i + n]) for i in range(len(w) - n + 1))


class Match(Struct, frozen=True):
    probe: str  # the probe's id
    jaccard: float
    probe_held: float  # share of the probe's shingles in the text
    text_from_probe: float  # share of the text's shingles from the probe

    def describe(self) -> str:
        return (
            f"near-duplicate of probe {self.probe} (Jaccard {self.jaccard:.2f}, holds {self.probe_held:.0%} "
            f"of it, {self.text_from_probe:.0%} of the text is the probe's)"
        )


def bundled_probes() -> list[tuple[str, str]]:
    """(id, prompt) of every bundled probe (252: 164 code, 80 chat, 8 math)."""
    out = []
    for name in BUNDLED:
        text = (
            resources.files("lilicorr_ckpt").joinpath("probes").joinpath(f"{name}.jsonl").read_text("utf-8")
        )
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                out.append((str(row["id"]), str(row["prompt"])))
    return out


class ProbeIndex:
    """The probes' shingles, indexed; `match(text)` says whether the text is a near-duplicate of one."""

    def __init__(self, probes: Sequence[tuple[str, str]] | None = None) -> None:
        probes = bundled_probes() if probes is None else list(probes)
        self.ids = [pid for pid, _ in probes]
        self.sizes: list[int] = []
        self.index: dict[str, list[int]] = {}
        for number, (_, text) in enumerate(probes):
            grams = shingles(text)
            self.sizes.append(len(grams))
            for gram in grams:
                self.index.setdefault(gram, []).append(number)

    def __len__(self) -> int:
        return len(self.ids)

    def match(self, text: str) -> Match | None:
        """The closest probe this text is a near-duplicate of, or None."""
        grams = shingles(text)
        if not grams:
            return None
        common: Counter[int] = Counter()
        for gram in grams:
            hits = self.index.get(gram)
            if hits:
                common.update(hits)
        best: Match | None = None
        for number, shared in common.items():
            size = self.sizes[number]
            jaccard = shared / (len(grams) + size - shared)
            held = shared / size
            from_probe = shared / len(grams)
            if (
                jaccard >= JACCARD
                or held >= PROBE_HELD
                or (from_probe >= TEXT_FROM_PROBE and len(grams) >= MIN_PIECE)
            ) and (best is None or jaccard > best.jaccard):
                best = Match(self.ids[number], round(jaccard, 4), round(held, 4), round(from_probe, 4))
        return best

    def filter(self, texts: Iterable[str]) -> tuple[list[int], list[tuple[int, Match]]]:
        """(indices of the texts to keep, [(index, match)] of those dropped)."""
        keep: list[int] = []
        dropped: list[tuple[int, Match]] = []
        for i, text in enumerate(texts):
            found = self.match(text)
            if found is None:
                keep.append(i)
            else:
                dropped.append((i, found))
        return keep, dropped
