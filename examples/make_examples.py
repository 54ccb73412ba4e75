"""Regenerate the bundled examples (deterministic: tests check the committed bytes).

    python examples/make_examples.py [OUT_DIR]

Numpy only (no torch, no tokenizers): every byte comes from fixed seeds and fixed text.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.stwrite import write_file

HERE = Path(__file__).resolve().parent

# -- the tiny target ----------------------------------------------------------------------------------------
# A random Llama with tiny-lilicorr's geometry: hidden 64, 4 layers (the drafter taps layers 0 and 2),
# vocabulary 512, rope_theta 10000. Its byte-level BPE tokenizer has the special tokens at 0-2, the 256 bytes at
# 3-258, merges learned from TOKENIZER_TEXT at 259-510, and the drafter's mask token at 511.

TARGET_HIDDEN, TARGET_LAYERS, TARGET_HEADS, TARGET_KV_HEADS, TARGET_HEAD_DIM, TARGET_FFN = (
    64,
    4,
    4,
    2,
    16,
    128,
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2: pad, turn start, eos
MASK_TOKEN = "<|mask|>"  # id 511, tiny-lilicorr's mask_token_id
TARGET_VOCAB = 512
EOS_ID = 2
# the eos row of lm_head is scaled up so that greedy answers end, as a chat model's do, after ~25 tokens on the
# bundled probes (3 to 84) rather than running to --max-new-tokens: `smoke` on the example takes seconds
EOS_BOOST = 2.0
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}\n"
)
# the merges are learned from this text: a little English and Python, as the bundled probes hold
TOKENIZER_TEXT = """\
The quick brown fox jumps over the lazy dog. A drafter proposes a block of tokens and the target verifies
them in one forward pass; the longest prefix that matches the target's own choice is accepted, and the
target adds one token of its own. When the drafter is good, several tokens are committed for each pass of
the target, and decoding is faster without changing what the target would have written.
Write a function that returns the sum of the even numbers in a list. Explain your answer step by step.
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many
clips did Natalia sell altogether in April and May? Think about the question, then give the final answer.
Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and
must-see attractions. Imagine you are writing a persuasive email to convince your friend to join you.

from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    \"\"\"Check if in the given list of numbers, are any two numbers closer to each other than the threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    \"\"\"
    for index, element in enumerate(numbers):
        for other_index, other in enumerate(numbers):
            if index != other_index and abs(element - other) < threshold:
                return True
    return False


def separate_paren_groups(paren_string: str) -> List[str]:
    result = []
    current = []
    depth = 0
    for character in paren_string:
        if character == "(":
            depth += 1
            current.append(character)
        elif character == ")":
            depth -= 1
            current.append(character)
            if depth == 0:
                result.append("".join(current))
                current.clear()
    return result
"""
# close to the GPT-2 pre-tokenizer the tokenizer runs (letters, digits, punctuation, whitespace runs)
_WORD = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


def byte_alphabet() -> list[str]:
    """The byte-level alphabet: a printable byte stands for itself, every other byte for a character from
    U+0100 on, in byte order (so a space is 'Ġ' and a newline 'Ċ')."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + extra))
            extra += 1
    return out


def learn_merges(text: str, count: int, known: set[str]) -> list[tuple[str, str]]:
    """`count` byte-pair merges, each the most frequent adjacent pair of `text` (ties: the smaller pair) whose
    concatenation is not a token yet."""
    alphabet = byte_alphabet()
    words: Counter[tuple[str, ...]] = Counter()
    for word in _WORD.findall(text):
        words[tuple(alphabet[b] for b in word.encode())] += 1
    merges: list[tuple[str, str]] = []
    known = set(known)
    while len(merges) < count:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:], strict=False):
                if pair[0] + pair[1] not in known:
                    pairs[pair] += n
        if not pairs:
            raise ValueError(f"TOKENIZER_TEXT yields only {len(merges)} merges, {count} needed")
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = best[0] + best[1]
        known.add(merged)
        joined: Counter[tuple[str, ...]] = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            joined[tuple(out)] += n
        words = joined
    return merges


def tokenizer_json() -> dict[str, Any]:
    alphabet = byte_alphabet()
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    merges = learn_merges(TOKENIZER_TEXT, TARGET_VOCAB - len(vocab) - 1, set(vocab))
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab[MASK_TOKEN] = len(vocab)
    assert len(vocab) == TARGET_VOCAB and vocab[MASK_TOKEN] == TARGET_VOCAB - 1
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added = [
        {
            "id": vocab[t],
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t in (*SPECIAL_TOKENS, MASK_TOKEN)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def target_config() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": TARGET_HIDDEN,
        "intermediate_size": TARGET_FFN,
        "num_hidden_layers": TARGET_LAYERS,
        "num_attention_heads": TARGET_HEADS,
        "num_key_value_heads": TARGET_KV_HEADS,
        "head_dim": TARGET_HEAD_DIM,
        "vocab_size": TARGET_VOCAB,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def target_tensors(seed: int = 0) -> fixtures.Tensors:
    """Llama weights in bf16, each drawn from a generator seeded by (seed, name): norms near 1, matrices with
    standard deviation 1/sqrt(fan-in), embedding rows of unit variance; the eos row of lm_head x EOS_BOOST."""
    q, kv = TARGET_HEADS * TARGET_HEAD_DIM, TARGET_KV_HEADS * TARGET_HEAD_DIM
    shapes = {
        "model.embed_tokens.weight": (TARGET_VOCAB, TARGET_HIDDEN),
        "model.norm.weight": (TARGET_HIDDEN,),
        "lm_head.weight": (TARGET_VOCAB, TARGET_HIDDEN),
    }
    for i in range(TARGET_LAYERS):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (TARGET_HIDDEN,),
                p + "post_attention_layernorm.weight": (TARGET_HIDDEN,),
                p + "self_attn.q_proj.weight": (q, TARGET_HIDDEN),
                p + "self_attn.k_proj.weight": (kv, TARGET_HIDDEN),
                p + "self_attn.v_proj.weight": (kv, TARGET_HIDDEN),
                p + "self_attn.o_proj.weight": (TARGET_HIDDEN, q),
                p + "mlp.gate_proj.weight": (TARGET_FFN, TARGET_HIDDEN),
                p + "mlp.up_proj.weight": (TARGET_FFN, TARGET_HIDDEN),
                p + "mlp.down_proj.weight": (TARGET_HIDDEN, TARGET_FFN),
            }
        )
    out: fixtures.Tensors = {}
    for name, shape in shapes.items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        noise = rng.standard_normal(shape)
        if name.endswith("norm.weight"):
            values = 1.0 + 0.05 * noise
        elif name == "model.embed_tokens.weight":
            values = noise
        else:
            values = noise / np.sqrt(shape[1])
        if name == "lm_head.weight":
            values[EOS_ID] *= EOS_BOOST
        out[name] = ("BF16", shape, fixtures.encode(values.astype(np.float32), "BF16"))
    return out


def _json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_target(path: Path) -> None:
    path.mkdir(parents=True)
    _json(path / "config.json", target_config())
    _json(path / "generation_config.json", {"eos_token_id": EOS_ID, "pad_token_id": 0})
    write_file(path / "model.safetensors", target_tensors(), {"format": "pt"})
    _json(path / "tokenizer.json", tokenizer_json())
    _json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "bos_token": None,
            "unk_token": None,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 4096,
        },
    )
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


EXAMPLES: dict[str, Callable[[Path], Any]] = {
    # a valid bf16 LiLiCorr drafter with grouped convolutions
    "tiny-lilicorr": lambda path: fixtures.write_checkpoint(path, fixtures.draft_config(conv=(4, 16))),
    # what ModelOpt's exporter writes for an NVFP4 drafter: `validate` refuses it, `convert` fixes it
    "tiny-modelopt-nvfp4": lambda path: fixtures.write_checkpoint(
        path, fixtures.draft_config(), quant="NVFP4", style="modelopt"
    ),
    # a random Llama target that tiny-lilicorr fits, with a tokenizer and chat template: `smoke` runs on it
    "tiny-target": write_target,
}


def main(out: Path = HERE) -> None:
    for name, write in EXAMPLES.items():
        target = out / name
        if target.exists():
            shutil.rmtree(target)
        write(target)
        print(f"wrote {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
