"""The v3 training data: SmolLM2-135M-Instruct's own answers to a broad prompt mix of code, chat and math, at ten
times the scale of the data behind the bundled drafter, generated on a GPU in resumable shards.

\b
  python -m lilicorr_train.mixes plan                          # the plan's settings and fingerprint
  python -m lilicorr_train.mixes generate --target T --dir D --budget 500
  python -m lilicorr_train.mixes build --dir D --train train.npz --val val.npz [--keep-val OLD_VAL]
  python -m lilicorr_train.mixes audit --dir D --target T      # probes in whole sequences? (CPU)

The plan is a numbered list of shards, each 16,384 prompts asked, so that one takes well under a minute on one
H200 and a ten-minute call finishes many. `generate` skips every shard already in D (shard-NNNN.json is written
last, so a shard killed mid-way is redone), stops before its time budget, and writes each shard as an .npz whose
members are LZMA-compressed (tokens, offsets and prompt_lengths as `generate` writes them, plus `category` and
`source` per sequence); `build` turns the shards into the uncompressed training and held-out sets that
`python -m lilicorr_train train` and `lilicorr_train.pieces` read. A shard depends only on the plan's seed, its number, the target and the interpreter (the standard
library is a prompt source): the same machine image regenerates it.

Prompt sources, per shard (the shares are of the prompts asked):

- a slice of the CPU pool: every distinct template prompt (`prompts.training_prompts`, saturated: 200,000
  draws give about 52,000 distinct) and every standard-library prompt (`prompts._stdlib_functions`: the
  signature and docstring to complete, the same with the first 1-3 body lines, four ways of asking to explain the
  function, and the request to write it), shuffled once, POOL_SLICE per shard until it runs out;
- `self`: an opener ("Write a blog post about", "A farmer", "Write a Python function that", ...; chat, math and
  code lists below, some with a topic) finished by the target into a user request (T = 0.9), then answered;
- `selfcode`: a raw-code opener ("def count_", "from typing import List\\n\\n\\ndef ", ...) that the target
  continues (T = 0.8) into a function, cut after its signature (and its docstring, when it writes one) and kept
  only if that parses: completion prompts the target wrote itself.

Every prompt goes through `dedup.ProbeIndex`: no bundled probe and no near-duplicate of one is answered.
Duplicates within a shard are answered once; `build` drops a sequence whose prompt an earlier shard answered,
and holds out 1 % of the prompts (by a hash of their tokens, so a prompt is always on the same side) as the
validation set, capped at VAL_PER_CATEGORY sequences per category (the first met in shard order; `--keep-val`
writes an earlier build's held-out set again instead, so that held-out τ compares across builds).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import sys
import tarfile
import threading
import time
import warnings
import zipfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from msgspec import Struct

from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.outfile import Inputs, atomic_writer, check_output_path, resolved

from . import prompts as _prompts
from .data import SHARD_METHODS, DataError, _check, _read_arrays, encode_prompt, self_written_prompts
from .dedup import ProbeIndex
from .prompts import TOPICS, Prompt, training_prompts
from .script import Parser, device_name, load_target_or_say, run_script, seconds, whole_number

CATEGORIES = ("code", "chat", "math")
SOURCES = ("templates", "stdlib", "self", "selfcode")
VAL_PER_CATEGORY = 128  # held-out sequences per category (the held-out tau uses them all)
VAL_PER_MILLE = 10  # 1 % of the prompts are held out


class Plan(Struct, frozen=True, kw_only=True):
    name: str = "v3"
    seed: int = 3000
    shards: int = 72
    prompts_per_shard: int = 16384
    pool_slice: int = 1536  # CPU-pool prompts per shard, until the pool runs out
    template_draws: int = 200_000
    code_share: float = 0.35  # of the template draws
    # of the prompts asked beyond the pool slice
    selfcode: float = 0.40
    self_chat: float = 0.32
    self_code: float = 0.14
    self_math: float = 0.14
    request_tokens: int = 64  # the longest request the target may write (self)
    stub_tokens: int = 128  # the longest signature + docstring it may write (selfcode)
    max_new_tokens: int = 256
    temperature_request: float = 0.9
    temperature_stub: float = 0.8

    def fingerprint(self) -> str:
        fields = json.dumps({k: getattr(self, k) for k in self.__struct_fields__}, sort_keys=True)
        return hashlib.sha256(f"{fields} python {sys.version_info[:2]}".encode()).hexdigest()[:16]


PLAN = Plan()

# ---------------------------------------------------------------- openers the target finishes into requests

CHAT_OPENERS = [
    "How",
    "What",
    "Why",
    "Can you",
    "Could you",
    "Please",
    "Explain",
    "Describe",
    "Give me",
    "Tell me",
    "I",
    "My",
    "I'm",
    "Help me",
    "Summarize",
    "Compare",
    "List",
    "Which",
    "When",
    "Where",
    "Who",
    "Is it",
    "Should I",
    "Do you",
    "Imagine",
    "Suppose",
    "Translate",
    "Rewrite",
    "Generate",
    "Design",
    "Plan",
    "Suggest",
    "Write a short story about",
    "Write a poem about",
    "Write an email to",
    "Draft a letter",
    "Write a blog post about",
    "Write a product description for",
    "Write a dialogue between",
    "Compose",
    "Give me some tips on",
    "What are the benefits of",
    "What are the pros and cons of",
    "How can I improve",
    "Explain the concept of",
    "Describe the history of",
    "Create a travel itinerary for",
    "Act as",
    "Pretend you are",
    "Brainstorm",
    "Outline",
    "Recommend",
    "What would happen if",
    "Write a persuasive",
    "Discuss",
    "Evaluate",
    "Classify",
    "Paraphrase",
    "Explain like I'm five",
    "What is the meaning of",
    "Give three examples of",
    "Write a haiku",
    "Describe a day in the life of",
    "What is the difference between",
    "What are the best",
    "What happens when",
    "Role-play",
    "Edit this paragraph",
    "Create a lesson plan",
    "Write a speech",
]
MATH_OPENERS = [
    "Solve",
    "Calculate",
    "A train",
    "John has",
    "Sarah bought",
    "How many",
    "How much",
    "If",
    "A farmer",
    "A store sells",
    "A rectangle",
    "The sum of",
    "What is the probability",
    "Find the value of x",
    "Simplify",
    "A car travels",
    "Maria",
    "There are",
    "A baker",
    "What is 15% of",
    "In a class of",
    "A recipe calls for",
    "James earns",
    "A bag contains",
    "The price of",
    "Lisa reads",
    "A school",
    "Tom is",
    "A tank",
    "Emma saves",
    "A shop offers a discount",
    "The average of",
    "A triangle",
    "Two numbers",
    "A company",
    "What is the area of",
    "Convert",
    "A bus",
    "Each",
    "Mike runs",
]
CODE_OPENERS = [
    "Write a Python function that",
    "Write a function that",
    "In Python,",
    "Debug this",
    "Fix the",
    "Write a program",
    "Implement",
    "Write a SQL query",
    "Write a JavaScript function",
    "How do I",
    "Write a Python script",
    "Explain this code",
    "Write a class",
    "Write a unit test",
    "Optimize",
    "Refactor",
    "Write a regular expression",
    "Write a bash script",
    "Write a recursive function",
    "Explain the time complexity of",
    "Convert this",
    "Write a C++ function",
    "Write a Java method",
    "Write a Rust function",
    "Write a Go function",
    "What is the difference between a list and",
    "How can I sort",
    "Write code to",
    "Create a Python class",
    "What does this Python code",
]
STUB_OPENERS = [
    "def ",
    "def is_",
    "def count_",
    "def find_",
    "def get_",
    "def sum_",
    "def sort_",
    "def max_",
    "def min_",
    "def remove_",
    "def reverse_",
    "def filter_",
    "def parse_",
    "def make_",
    "def check_",
    "def compute_",
    "def convert_",
    "def merge_",
    "def split_",
    "def unique_",
    "def longest_",
    "def total_",
    "def average_",
    "def string_",
    "def all_",
    "def fizz",
    "def prime_",
    "def digits_",
    "def vowel",
    "def word",
    "def matrix_",
    "def binary_",
    "def flatten",
    "def rotate",
    "def encode_",
    "def decode_",
    "def valid",
    "def closest_",
    "def next_",
    "def to_",
    "from typing import List\n\n\ndef ",
    "from typing import List, Tuple\n\n\ndef ",
    "from typing import List, Optional\n\n\ndef ",
    "from typing import Dict\n\n\ndef ",
    "import math\n\n\ndef ",
    "import re\n\n\ndef ",
]
TOPIC_OPENERS = {"Write a blog post about", "Explain the concept of", "Describe the history of", "Compose"}


def openers(rng: random.Random, pool: Sequence[str], count: int, topic_share: float = 0.25) -> list[str]:
    """`count` openers from `pool`; some of the ones that name a subject get one of the templates' topics."""
    out = []
    for _ in range(count):
        opener = rng.choice(pool)
        if opener in TOPIC_OPENERS and rng.random() < topic_share * 4:
            opener = f"{opener} {rng.choice(TOPICS)}"
        out.append(opener)
    return out


def cut_stub(text: str) -> str | None:
    """A raw-code continuation cut after its first function's signature, and after its docstring when one
    follows: the part to complete (imports before the function kept), or None when the signature does not parse
    or the function is a one-liner."""
    at = text.find("def ")
    if at < 0 or (at > 0 and text[at - 1] != "\n"):
        return None
    lines = text[at:].split("\n")
    for end in range(min(len(lines), 6)):
        signature = "\n".join(lines[: end + 1])
        if signature.rstrip().endswith(":"):
            break
    else:
        return None
    header = text[:at] + signature.rstrip() + "\n"
    rest = "\n".join(lines[end + 1 :])
    stripped = rest.lstrip()
    for quote in ('"""', "'''"):
        if stripped.startswith(quote):
            close = stripped.find(quote, 3)
            if close < 0:
                return None
            if len(stripped[3:close].split()) >= 3:
                header += rest[: len(rest) - len(stripped) + close + 3] + "\n"
            break
    try:
        with (
            warnings.catch_warnings()
        ):  # the target's code may warn ("invalid decimal literal"): kept, quietly
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(header + "    pass\n")
    except (SyntaxError, ValueError):
        return None
    return header


# ---------------------------------------------------------------- the CPU pool (templates + stdlib)

STDLIB_ASKS = (
    "Explain what this Python function does:",
    "What does this code do?",
    "Review this Python function and suggest an improvement:",
    "Add comments to this function:",
)


def stdlib_pool() -> list[Prompt]:
    """Every standard-library prompt, in a fixed order: complete the signature and docstring (raw), the same
    with the first 1-3 body lines, explain or review the whole function (four asks), write it from its summary."""
    out = []
    for head, whole, summary, signature in _prompts._stdlib_functions(_prompts.STDLIB_FILES):
        out.append(Prompt(head, False, "code"))
        body = whole[len(head) :].splitlines() if whole.startswith(head) else []
        for lines in (1, 2, 3):
            if len(body) > lines + 1:
                out.append(Prompt(head + "\n".join(body[:lines]) + "\n", False, "code"))
        for ask in STDLIB_ASKS:
            out.append(Prompt(f"{ask}\n\n```python\n{whole}```", True, "code"))
        out.append(Prompt(f"Write a Python function `{signature}`: {summary}", True, "code"))
    return out


def _row(prompt: Prompt, source: str) -> list[Any]:
    return [prompt.text, prompt.chat, prompt.kind, source]


def cpu_pool(plan: Plan, probes: ProbeIndex, cache: Path | None = None) -> tuple[list[list[Any]], int]:
    """([text, chat, category, source] of every distinct CPU-side prompt, shuffled by the plan's seed; the
    number dropped as probe near-duplicates). Cached in `cache` (JSON, keyed by the plan's fingerprint)."""
    if cache is not None and cache.is_file():
        try:
            held = json.loads(cache.read_text("utf-8"))
            if held.get("fingerprint") == plan.fingerprint():
                return held["rows"], int(held["probe_dropped"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    rows: dict[tuple[str, bool], list[Any]] = {}
    for prompt in training_prompts(plan.template_draws, plan.seed, plan.code_share):
        rows.setdefault((prompt.text, prompt.chat), _row(prompt, "templates"))
    for prompt in stdlib_pool():
        rows.setdefault((prompt.text, prompt.chat), _row(prompt, "stdlib"))
    ordered = list(rows.values())
    keep, dropped = probes.filter(row[0] for row in ordered)
    ordered = [ordered[i] for i in keep]
    random.Random(plan.seed).shuffle(ordered)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        _write_text(
            cache,
            json.dumps({"fingerprint": plan.fingerprint(), "rows": ordered, "probe_dropped": len(dropped)}),
        )
    return ordered, len(dropped)


def shard_counts(plan: Plan, index: int, pool_size: int) -> dict[str, int]:
    """How many prompts shard `index` takes from each source (the pool slice, then the self sources)."""
    first = index * plan.pool_slice
    pool = max(0, min(plan.pool_slice, pool_size - first))
    rest = plan.prompts_per_shard - pool
    shares = {
        "selfcode": plan.selfcode,
        "self_chat": plan.self_chat,
        "self_code": plan.self_code,
        "self_math": plan.self_math,
    }
    total = sum(shares.values())
    counts = {name: int(rest * share / total) for name, share in shares.items()}
    counts["selfcode"] += rest - sum(counts.values())
    return {"pool": pool, **counts}


# ---------------------------------------------------------------- shards on disk


def shard_name(index: int) -> str:
    return f"shard-{index:04d}"


def shard_done(directory: Path, index: int) -> bool:
    return (directory / f"{shard_name(index)}.json").is_file() and (
        directory / f"{shard_name(index)}.npz"
    ).is_file()


def write_npz(path: Path, arrays: dict[str, np.ndarray], *, compress: bool = True) -> None:
    """An .npz (LZMA members when `compress`), written through the atomic writer (an unpredictable temporary beside
    it, never through a planted symlink; nothing left behind when the write fails)."""
    with (
        atomic_writer(path) as f,
        zipfile.ZipFile(f, "w", compression=zipfile.ZIP_LZMA if compress else zipfile.ZIP_STORED) as zf,
    ):
        for name, array in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)


def _write_text(path: Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text.encode("utf-8"))


SHARD_ARRAYS = ("tokens", "offsets", "prompt_lengths", "category", "source")


class Shard(Struct):
    tokens: np.ndarray  # uint16
    offsets: np.ndarray  # int64 [n + 1]
    prompt_lengths: np.ndarray  # int32 [n]
    category: np.ndarray  # uint8 [n]: CATEGORIES index
    source: np.ndarray  # uint8 [n]: SOURCES index

    def __len__(self) -> int:
        return len(self.prompt_lengths)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "tokens": self.tokens,
            "offsets": self.offsets,
            "prompt_lengths": self.prompt_lengths,
            "category": self.category,
            "source": self.source,
        }

    @classmethod
    def load(cls, path: Path) -> Shard:
        """A shard or a built set, read as training data is (lilicorr_train.data): a regular file, each member's
        sizes and compression ratio checked before it is read, 1-D integers, offsets that index the tokens, and a
        category and a source per sequence that name one (DataError naming the file otherwise)."""
        a = _read_arrays(path, SHARD_ARRAYS, SHARD_METHODS)
        n = len(a["prompt_lengths"])
        # `build` may hold out nothing: an empty set (no sequence, no token, offsets [0]) is one
        empty = not n and not len(a["tokens"]) and a["offsets"].tolist() == [0]
        if not empty:
            _check(path, a["tokens"], a["offsets"], a["prompt_lengths"])
        for name, names in (("category", CATEGORIES), ("source", SOURCES)):
            values = a[name]
            if len(values) != n or (n and not 0 <= int(values.min()) <= int(values.max()) < len(names)):
                raise DataError(
                    f"{path} is not a shard this tool wrote: its {name} array is not one of {', '.join(names)} "
                    f"(by index) for each of its {n} sequences"
                )
        return cls(
            a["tokens"],
            a["offsets"].astype(np.int64),
            a["prompt_lengths"].astype(np.int32),
            a["category"].astype(np.uint8),
            a["source"].astype(np.uint8),
        )

    def prompt(self, i: int) -> np.ndarray:
        start = int(self.offsets[i])
        return self.tokens[start : start + int(self.prompt_lengths[i])]


def make_shard(
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    categories: Sequence[str],
    sources: Sequence[str],
) -> Shard:
    dtype = np.uint16
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sequences])
    tokens = (
        np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
        if sequences
        else np.zeros(0, np.int64)
    )
    if len(tokens) and int(tokens.max()) > np.iinfo(dtype).max:
        raise ValueError("token ids past 65535: shards store uint16")
    return Shard(
        tokens.astype(dtype),
        offsets,
        np.asarray(prompt_lengths, dtype=np.int32),
        np.asarray([CATEGORIES.index(c) for c in categories], dtype=np.uint8),
        np.asarray([SOURCES.index(s) for s in sources], dtype=np.uint8),
    )


# ---------------------------------------------------------------- generation (GPU)


def _self_requests(target: Any, opener_list: list[str], plan: Plan, seed: int, batch_size: int) -> list[str]:

    return [
        p.text
        for p in self_written_prompts(
            target,
            opener_list,
            max_tokens=plan.request_tokens,
            temperature=plan.temperature_request,
            seed=seed,
            batch_size=batch_size,
        )
    ]


def _self_stubs(target: Any, opener_list: list[str], plan: Plan, seed: int, batch_size: int) -> list[str]:
    tokenizer = target.tokenizer
    starts = [list(tokenizer(o)["input_ids"]) for o in opener_list]
    written = target.generate_batch(
        starts, plan.stub_tokens, batch_size=batch_size, temperature=plan.temperature_stub, seed=seed
    )
    eos = set(target.eos_token_ids)
    out = []
    for opener, tokens in zip(opener_list, written, strict=True):
        text = opener + tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=True)
        stub = cut_stub(text)
        if stub is not None:
            out.append(stub)
    return out


def shard_prompts(
    target: Any, plan: Plan, index: int, pool: list[list[Any]], probes: ProbeIndex, batch_size: int
) -> tuple[list[tuple[str, bool, str, str]], dict[str, Any]]:
    """The prompts shard `index` answers ([(text, chat, category, source)], distinct, no probe near-duplicate)
    and what happened to each source."""
    counts = shard_counts(plan, index, len(pool))
    rng = random.Random(plan.seed * 100_003 + index)
    seed = plan.seed * 1000 + index * 8
    rows: list[tuple[str, bool, str, str]] = [
        (r[0], bool(r[1]), str(r[2]), str(r[3])) for r in pool[index * plan.pool_slice :][: counts["pool"]]
    ]
    written: dict[str, int] = {}
    for name, opener_pool, category, offset in (
        ("self_chat", CHAT_OPENERS, "chat", 1),
        ("self_code", CODE_OPENERS, "code", 2),
        ("self_math", MATH_OPENERS, "math", 3),
    ):
        texts = (
            _self_requests(target, openers(rng, opener_pool, counts[name]), plan, seed + offset, batch_size)
            if counts[name]
            else []
        )
        written[name] = len(texts)
        rows += [(t, True, category, "self") for t in texts]
    stubs = (
        _self_stubs(
            target, [rng.choice(STUB_OPENERS) for _ in range(counts["selfcode"])], plan, seed, batch_size
        )
        if counts["selfcode"]
        else []
    )
    written["selfcode"] = len(stubs)
    rows += [(t, False, "code", "selfcode") for t in stubs]
    distinct = list({(r[0], r[1]): r for r in rows}.values())
    keep, dropped = probes.filter(r[0] for r in distinct)
    info = {
        "asked": counts,
        "usable": written,
        "duplicates": len(rows) - len(distinct),
        "probe_dropped": [[distinct[i][0][:120], m.probe] for i, m in dropped],
    }
    return [distinct[i] for i in keep], info


def generate_shard(
    target: Any, plan: Plan, index: int, pool: list[list[Any]], probes: ProbeIndex, batch_size: int
) -> tuple[Shard, dict[str, Any]]:

    begin = time.perf_counter()
    rows, info = shard_prompts(target, plan, index, pool, probes, batch_size)
    written = time.perf_counter() - begin
    encoded: list[list[int]] = []
    kept: list[tuple[str, bool, str, str]] = []
    seen: set[tuple[int, ...]] = set()
    for row in rows:
        ids = encode_prompt(target.tokenizer, Prompt(row[0], row[1], row[2]))
        if ids and tuple(ids) not in seen:
            seen.add(tuple(ids))
            encoded.append(ids)
            kept.append(row)
    answers = target.generate_batch(encoded, plan.max_new_tokens, batch_size=batch_size)
    shard = make_shard(
        [p + a for p, a in zip(encoded, answers, strict=True)],
        [len(p) for p in encoded],
        [r[2] for r in kept],
        [r[3] for r in kept],
    )
    answer_tokens = int(shard.offsets[-1]) - int(shard.prompt_lengths.sum())
    info.update(
        {
            "shard": index,
            "plan": plan.name,
            "fingerprint": plan.fingerprint(),
            "sequences": len(shard),
            "tokens": int(shard.offsets[-1]),
            "answer_tokens": answer_tokens,
            "by_category": dict(Counter(r[2] for r in kept)),
            "by_source": dict(Counter(r[3] for r in kept)),
            "seconds_prompts": round(written, 1),
            "seconds": round(time.perf_counter() - begin, 1),
            "batch_size": batch_size,
            "python": ".".join(map(str, sys.version_info[:3])),
        }
    )
    return shard, info


def save_shard(directory: Path, index: int, shard: Shard, info: dict[str, Any]) -> None:
    write_npz(directory / f"{shard_name(index)}.npz", shard.arrays())
    info["bytes"] = (directory / f"{shard_name(index)}.npz").stat().st_size
    _write_text(
        directory / f"{shard_name(index)}.json", json.dumps(info, indent=1) + "\n"
    )  # last: it counts as done


def generate(
    target: Any,
    directory: Path,
    *,
    plan: Plan = PLAN,
    budget_s: float = 500.0,
    first: int = 0,
    last: int | None = None,
    batch_size: int = 1024,
    guess_s: float = 60.0,
    log: Any = print,
) -> list[int]:
    """Generate the plan's missing shards first..last (inclusive) until the next would pass `budget_s`;
    the shards made. Each is compressed and written on a thread while the next one generates."""
    begin = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    probes = ProbeIndex()
    pool, pool_dropped = cpu_pool(plan, probes, directory / f"pool-{plan.name}.json")
    log(
        json.dumps(
            {
                "pool": len(pool),
                "pool_probe_dropped": pool_dropped,
                "s": round(time.perf_counter() - begin, 1),
            }
        )
    )
    last = plan.shards - 1 if last is None else min(last, plan.shards - 1)
    made: list[int] = []
    writer: threading.Thread | None = None
    per_shard = guess_s
    start = batch_size  # each shard's first try
    short_before = False  # the last shard ran out of memory at `start`
    for index in range(first, last + 1):
        if shard_done(directory, index):
            continue
        if time.perf_counter() - begin + per_shard * 1.1 > budget_s:
            break
        started = time.perf_counter()
        size = start
        while True:
            try:
                shard, info = generate_shard(target, plan, index, pool, probes, size)
                break
            except RuntimeError as exc:  # torch.OutOfMemoryError is one: again with half the batch
                if "out of memory" not in str(exc).lower():
                    raise
                if size <= 64:
                    raise InputError(
                        f"shard {index}: out of GPU memory at a batch of {size} prompts: free the GPU (another "
                        "process on it?) or give a smaller --batch-size"
                    ) from None
            import torch  # out of the except: its traceback no longer holds the failed batch's tensors

            torch.cuda.empty_cache()
            size //= 2
            log(json.dumps({"out_of_memory": True, "shard": index, "batch_size": size}))
        # one shard short of memory goes back to the full batch for the next (a long batch, fragmentation: the
        # half batch costs a sixth more time); two in a row keep the batch that worked from then on
        short = size < start
        if short and short_before:
            start = size
            log(json.dumps({"batch_size_from_now": size}))
            short = False
        short_before = short
        per_shard = time.perf_counter() - started
        if writer is not None:
            writer.join()
        writer = threading.Thread(target=save_shard, args=(directory, index, shard, info))
        writer.start()
        made.append(index)
        log(
            json.dumps(
                {k: v for k, v in info.items() if k != "probe_dropped"}
                | {"probe_dropped": len(info["probe_dropped"])}
            )
        )
    if writer is not None:
        writer.join()
    return made


# ---------------------------------------------------------------- build: train and validation sets


def prompt_hash(tokens: np.ndarray) -> int:
    return int.from_bytes(
        hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=8).digest(), "big"
    )


def shard_dir(directory: Path) -> list[int]:
    """The done shards of an existing shard directory (DataError naming it otherwise: missing, not a
    directory, or holding none), for the commands that read shards."""
    if not directory.exists():
        raise DataError(f"{directory} does not exist")
    if not directory.is_dir():
        raise DataError(f"{directory} is not a directory (give the --dir that `generate` wrote shards into)")
    indices = done_shards(directory)
    if not indices:
        raise DataError(f"{directory} holds no finished shard (shard-NNNN.npz beside its shard-NNNN.json)")
    return indices


def done_shards(directory: Path) -> list[int]:
    return sorted(
        int(p.stem.split("-")[1])
        for p in directory.glob("shard-*.json")
        if p.stem.split("-")[1].isdigit() and (directory / f"{p.stem}.npz").is_file()
    )


def build(
    directory: Path,
    train_out: Path,
    val_out: Path,
    *,
    shards: Sequence[int] | None = None,
    per_mille: int = VAL_PER_MILLE,
    val_per_category: int = VAL_PER_CATEGORY,
    keep_val: Path | None = None,
) -> dict[str, Any]:
    """Concatenate the done shards (in order) into a training set and a held-out set: a sequence whose prompt an
    earlier one had is dropped; `per_mille` of the prompts (by hash) are held out, at most `val_per_category`
    sequences of each category kept (the rest of the held-out prompts are in neither set).

    `keep_val`: an earlier build's held-out set, written again as this one's (so the held-out τ of runs on
    different builds compare): its prompts never enter the training set, whether or not the hash holds them out,
    and the hash's other held-out prompts are in neither set. Without it, shards added before the earlier ones
    (or a different order) would pick another held-out set."""
    indices = shard_dir(directory) if shards is None else list(shards)
    inputs = Inputs()
    for index in indices:
        for suffix in (".npz", ".json"):
            inputs.add(directory / f"{shard_name(index)}{suffix}", "a shard of --dir")
    inputs.add(keep_val, "the --keep-val set")
    for out, option in ((train_out, "--train"), (val_out, "--val")):
        check_output_path(str(out), option, "train.npz", inputs)
        if out.name.startswith("shard-") and resolved(out.parent) == resolved(directory):
            # not a shard yet, but the next build and `generate` would read it as one (a .json marks one done)
            raise UsageError(
                f"{option} {out} is named as a shard of --dir {directory}: later builds and `generate` would "
                "take it for one; write the sets under another name or outside --dir"
            )
    if resolved(train_out) == resolved(val_out):
        raise UsageError(
            f"--train and --val are the same file ({train_out}): give each set a file of its own"
        )
    kept: Shard | None = None
    kept_prompts: set[int] = set()
    if keep_val is not None:
        try:
            kept = Shard.load(keep_val)
        except DataError as exc:
            raise DataError(
                f"--keep-val: {exc} (it takes the held-out set an earlier `build` wrote)"
            ) from None
        if len(kept) == 0:
            raise InputError(f"--keep-val {keep_val} holds no sequence: there is no held-out set to keep")
        most = val_per_category * len(CATEGORIES)
        if len(kept) > most:
            raise InputError(
                f"--keep-val {keep_val} holds {len(kept)} sequences, more than a held-out set's {most} "
                f"({val_per_category} a category): a shard or a training set, not an earlier build's --val?"
            )
        kept_prompts = {prompt_hash(kept.prompt(i)) for i in range(len(kept))}
    seen: set[int] = set()
    train_parts: list[tuple[Shard, np.ndarray]] = []
    val_rows: list[tuple[Shard, int]] = []
    val_count = Counter()
    stats = Counter()
    for index in indices:
        shard = Shard.load(directory / f"{shard_name(index)}.npz")
        keep = np.zeros(len(shard), dtype=bool)
        for i in range(len(shard)):
            h = prompt_hash(shard.prompt(i))
            if h in seen:
                stats["cross_shard_duplicates"] += 1
                continue
            seen.add(h)
            if h in kept_prompts:
                stats["kept_val_found"] += 1
                continue
            if h % 1000 < per_mille:
                category = int(shard.category[i])
                if kept is None and val_count[category] < val_per_category:
                    val_count[category] += 1
                    val_rows.append((shard, i))
                else:
                    stats["held_out_unused"] += 1
                continue
            keep[i] = True
        train_parts.append((shard, keep))
    if kept is not None and stats["kept_val_found"] == 0:
        raise InputError(
            f"none of the {len(kept)} prompts of --keep-val {keep_val} is in these shards: it was built from "
            "other shards (another --dir, or another target's answers), so its held-out τ would not compare"
        )
    train = _select(train_parts)
    val = _gather(val_rows) if kept is None else kept
    if kept is not None:
        val_count = Counter(kept.category.tolist())
    write_npz(train_out, train.arrays(), compress=False)
    write_npz(val_out, val.arrays(), compress=False)
    return {
        "shards": indices,
        "train_sequences": len(train),
        "train_tokens": int(train.offsets[-1]),
        "train_answer_tokens": int(train.offsets[-1]) - int(train.prompt_lengths.sum()),
        "train_by_category": {
            CATEGORIES[k]: int(v) for k, v in sorted(Counter(train.category.tolist()).items())
        },
        "train_by_source": {SOURCES[k]: int(v) for k, v in sorted(Counter(train.source.tolist()).items())},
        "val_sequences": len(val),
        "val_by_category": {CATEGORIES[k]: int(v) for k, v in sorted(val_count.items())},
        **({} if keep_val is None else {"val_kept_from": str(keep_val)}),
        **dict(stats),
    }


def _select(parts: Sequence[tuple[Shard, np.ndarray]]) -> Shard:
    tokens, lengths, prompts, categories, sources = [], [], [], [], []
    for shard, keep in parts:
        lens = np.diff(shard.offsets)
        mask = np.repeat(keep, lens)
        tokens.append(shard.tokens[mask])
        lengths.append(lens[keep])
        prompts.append(shard.prompt_lengths[keep])
        categories.append(shard.category[keep])
        sources.append(shard.source[keep])
    lengths_all = np.concatenate(lengths)
    offsets = np.zeros(len(lengths_all) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths_all)
    return Shard(
        np.concatenate(tokens),
        offsets,
        np.concatenate(prompts),
        np.concatenate(categories),
        np.concatenate(sources),
    )


def _gather(rows: Sequence[tuple[Shard, int]]) -> Shard:
    seqs = [s.tokens[int(s.offsets[i]) : int(s.offsets[i + 1])] for s, i in rows]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in seqs])
    return Shard(
        np.concatenate(seqs) if seqs else np.zeros(0, np.uint16),
        offsets,
        np.asarray([s.prompt_lengths[i] for s, i in rows], dtype=np.int32),
        np.asarray([s.category[i] for s, i in rows], dtype=np.uint8),
        np.asarray([s.source[i] for s, i in rows], dtype=np.uint8),
    )


# ---------------------------------------------------------------- audit: probes in whole sequences


def audit(directory: Path, tokenizer: Any, *, shards: Sequence[int] | None = None) -> dict[str, Any]:
    """Decode every prompt and whole sequence of the done shards and look for probe near-duplicates (the
    generation filtered the prompts; this checks the stored data again, answers included)."""
    probes = ProbeIndex()
    found: list[dict[str, Any]] = []
    counted = Counter()
    for index in shard_dir(directory) if shards is None else shards:
        shard = Shard.load(directory / f"{shard_name(index)}.npz")
        seqs = [
            shard.tokens[int(shard.offsets[i]) : int(shard.offsets[i + 1])].tolist()
            for i in range(len(shard))
        ]
        prompts = [s[: int(n)] for s, n in zip(seqs, shard.prompt_lengths, strict=True)]
        for what, texts in (
            ("prompt", tokenizer.batch_decode(prompts, skip_special_tokens=True)),
            ("sequence", tokenizer.batch_decode(seqs, skip_special_tokens=True)),
        ):
            for i, text in enumerate(texts):
                counted[what] += 1
                m = probes.match(text)
                if m is not None:
                    found.append(
                        {
                            "shard": index,
                            "row": i,
                            "in": what,
                            "probe": m.probe,
                            "jaccard": m.jaccard,
                            "probe_held": m.probe_held,
                            "text": text[:200],
                        }
                    )
    return {"checked": dict(counted), "near_duplicates": found}


# ---------------------------------------------------------------- command line


def _bundle(directory: Path, indices: Sequence[int], out: Path, limit: int = 15 << 20) -> list[Path]:
    """Tar the shards' files into bundles of at most `limit` bytes each (shards are already compressed)."""

    groups: list[tuple[int, list[Path]]] = []  # each bundle's first shard and files
    size = 0
    for index in indices:
        files = [directory / f"{shard_name(index)}.npz", directory / f"{shard_name(index)}.json"]
        need = sum(f.stat().st_size for f in files) + 4096
        if not groups or size + need > limit:
            groups.append((index, []))
            size = 0
        groups[-1][1].extend(files)
        size += need
    bundles = []
    for first, files in groups:  # each through the atomic writer: an interrupted bundle leaves no half tar
        bundles.append(out / f"shards-{first:04d}.tar")
        with atomic_writer(bundles[-1]) as f, tarfile.open(fileobj=f, mode="w") as tar:
            for path in files:
                tar.add(path, arcname=path.name)
    return bundles


PROG = "python -m lilicorr_train.mixes"


_shard_index = whole_number(f"a shard of the plan's {PLAN.shards}", 0, PLAN.shards - 1)
_batch_size = whole_number("the batch size", 1, 1 << 16)


def main(argv: Sequence[str] | None = None) -> int:

    parser = Parser(
        prog=PROG,
        description="\n\n".join(__doc__.replace("\b\n", "").split("\n\n")[:2]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plan", help="print the plan's settings and its fingerprint")
    g = sub.add_parser("generate", help="generate missing shards until the time budget")
    g.add_argument("--target", required=True)
    g.add_argument("--dir", type=Path, required=True)
    g.add_argument("--budget", type=seconds, default=500.0, help="seconds (the target's load included)")
    g.add_argument(
        "--first", type=_shard_index, default=0, help="the first shard of the plan to make (default 0)"
    )
    g.add_argument(
        "--last", type=_shard_index, default=None, help="the last shard to make (default the plan's last)"
    )
    g.add_argument("--batch-size", type=_batch_size, default=1024, help="prompts a batch (default 1024)")
    g.add_argument("--bundle", type=Path, default=None, help="tar the shards made into this directory")
    g.add_argument(
        "--device", type=device_name, help="where the target generates (default cuda where there is one)"
    )
    b = sub.add_parser("build", help="training and held-out sets from the done shards")
    b.add_argument("--dir", type=Path, required=True)
    b.add_argument("--train", type=Path, required=True)
    b.add_argument("--val", type=Path, required=True)
    b.add_argument(
        "--keep-val",
        type=Path,
        default=None,
        help="an earlier build's held-out set, kept as this one's (held-out τ then compares across builds); "
        "its prompts never enter --train",
    )
    a = sub.add_parser("audit", help="probe near-duplicates in the stored prompts and whole sequences")
    a.add_argument("--dir", type=Path, required=True)
    a.add_argument("--target", required=True, help="the target whose tokenizer decodes the shards")
    args = parser.parse_args(argv)
    inputs = {
        name: getattr(args, attr, None)
        for name, attr in (("--dir", "dir"), ("--target", "target"), ("--keep-val", "keep_val"))
    }
    return run_script(PROG, lambda: _run(args), command=args.command, inputs=inputs)


def _run(args: argparse.Namespace) -> int:
    if args.command == "plan":
        print(
            json.dumps(
                {
                    "plan": {k: getattr(PLAN, k) for k in PLAN.__struct_fields__},
                    "fingerprint": PLAN.fingerprint(),
                },
                indent=1,
            )
        )
        return 0
    if args.command == "build":
        report = build(args.dir, args.train, args.val, keep_val=args.keep_val)
        print(json.dumps(report, indent=1))
        found, kept = report.get("kept_val_found", 0), report["val_sequences"]
        if args.keep_val is not None and found < kept:
            print(
                f"{PROG}: warning: {kept - found} of the {kept} held-out prompts of --keep-val are in none of "
                "these shards (fewer shards than its build had?); they are kept, and stay out of --train",
                file=sys.stderr,
            )
        if not report.get("val_sequences"):
            print(
                f"{PROG}: warning: the held-out set {args.val} holds no sequence (too few shards)",
                file=sys.stderr,
            )
        return 0
    if args.command == "audit":
        shard_dir(args.dir)  # before the target loads
        tokenizer = load_target_or_say(args.target, dtype="float32", device="cpu").tokenizer
        report = audit(args.dir, tokenizer)
        print(json.dumps(report, indent=1))
        return 1 if report["near_duplicates"] else 0
    if args.last is not None and args.last < args.first:
        raise UsageError(f"--last {args.last} is before --first {args.first}: no shard to make")
    if args.dir.exists() and not args.dir.is_dir():
        raise UsageError(f"--dir {args.dir} is a file: give a directory for the shards")
    if (
        args.bundle is not None
        and (args.bundle.exists() or args.bundle.is_symlink())
        and not args.bundle.is_dir()
    ):
        raise UsageError(f"--bundle {args.bundle} is not a directory: give a directory for the bundles")
    begin = time.perf_counter()
    import torch  # here: plan, build and audit need none

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    target = load_target_or_say(args.target, dtype=dtype, device=device, fast=True)
    spent = time.perf_counter() - begin
    print(json.dumps({"target_load_s": round(spent, 1)}), flush=True)
    made = generate(
        target,
        args.dir,
        budget_s=args.budget - spent,
        first=args.first,
        last=args.last,
        batch_size=args.batch_size,
        log=lambda line: print(line, flush=True),
    )
    print(
        json.dumps({"made": made, "done": done_shards(args.dir), "s": round(time.perf_counter() - begin, 1)})
    )
    if args.bundle is not None and made:
        args.bundle.mkdir(parents=True, exist_ok=True)
        for path in _bundle(args.dir, made, args.bundle):
            print(f"bundle {path} {path.stat().st_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
