"""A GGUF's byte-level BPE vocabulary as a `tokenizers` backend, built directly from its checked header: torch-free and
transformers-free, so that the runtime's transformers-free target (lilicorr_runtime/target/native.py) and
checkpoint/gguf_tokenizer.py (transformers' fast tokenizer around the same backend, for `smoke --engine` and the
transformers route) build the very same one.

The tokenizer is the file's byte-level BPE (`tokenizer.ggml.model` "gpt2") with GPT-2's pre-tokenizer (`pre`
"gpt2", "default", "smollm") or Qwen2's, which splits every digit apart (`pre` "qwen2"); control tokens are special,
user-defined ones are matched whole, and a byte missing from the vocabulary is dropped, as llama.cpp's tokenizer
drops it. A tokenizer this does not map exactly raises Unsupported; a malformed one GGUFError."""

from __future__ import annotations

from typing import NamedTuple

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from lilicorr_ckpt.checkpoint.gguf_header import FIX_CONVERT, INTEGERS, GGUFHeader, Unsupported

# llama.cpp's names for a pre-tokenizer that is GPT-2's own byte-level split
GPT2_PRE_TOKENIZERS = ("gpt2", "gpt-2", "default", "smollm")
# pre-tokenizers that split text by a regular expression of their own before the byte-level mapping (the one their
# merges were learned on): Qwen2's splits every digit apart, where GPT-2's keeps runs of digits together
SPLIT_PRE_TOKENIZERS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
}
CONTROL, USER_DEFINED = 3, 4


class GGUFBackend(NamedTuple):
    """The backend tokenizer, the special tokens the metadata names (bos_token, eos_token, unk_token, pad_token:
    the token strings, only those named) and the chat template (None when the file has none)."""

    backend: Tokenizer
    specials: dict[str, str]
    chat_template: str | None


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the other bytes take
    code points from 256 up, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def build_backend(header: GGUFHeader) -> GGUFBackend:
    """The header's byte-level BPE tokenizer (check_model has checked the vocabulary's arrays and ids), its named
    special tokens and chat template; Unsupported for a tokenizer this does not map exactly, GGUFError for a
    malformed one."""
    model = header.string("tokenizer.ggml.model")
    if model != "gpt2":
        raise Unsupported(f"tokenizer model {model!r} (the direct route builds gpt2)")
    pre = header.string("tokenizer.ggml.pre") or "default"
    if pre not in GPT2_PRE_TOKENIZERS and pre not in SPLIT_PRE_TOKENIZERS:
        raise Unsupported(f"pre-tokenizer {pre!r}")
    for flag in (
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.add_space_prefix",
    ):
        if header.bool(flag):
            raise Unsupported(f"{flag} is set")
    tokens, merges = header.strings("tokenizer.ggml.tokens"), header.strings("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise Unsupported("no vocabulary and merges")
    found = header.numbers("tokenizer.ggml.token_type", INTEGERS, "an array of int32")
    types = [0] * len(tokens) if found is None else found.tolist()
    if len(types) != len(tokens):
        raise header.fail(
            f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens: {FIX_CONVERT}"
        )
    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if not set(token) <= spelled:  # a token written as text, not in the byte alphabet: spell its bytes
            token = "".join(alphabet[byte] for byte in token.encode("utf-8"))
        vocab.setdefault(token, index)
    if len(vocab) != len(tokens):
        raise Unsupported("a vocabulary that lists a token twice")
    pairs = []
    for index, merge in enumerate(merges):
        pair = tuple(merge.split(" "))
        if len(pair) != 2 or not all(pair):
            raise header.fail(
                f"tokenizer.ggml.merges item {index} {merge[:40]!r} is not two tokens separated by a space: "
                f"{FIX_CONVERT}"
            )
        pairs.append(pair)
    try:
        backend = Tokenizer(
            BPE(
                vocab=vocab,
                merges=pairs,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
            )
        )
    except Exception as exc:  # tokenizers raises a bare Exception for a merge outside the vocabulary
        raise header.fail(
            f"its BPE vocabulary and merges do not fit together ({str(exc)[:200]}): {FIX_CONVERT}"
        ) from None
    if pre in SPLIT_PRE_TOKENIZERS:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(SPLIT_PRE_TOKENIZERS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>) are special and matched whole; user-defined ones are matched whole, not
    # special; a "control" token outside the byte alphabet is a mislabel llama.cpp writes, left alone
    control = [t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL and set(t) <= spelled]
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED and t in vocab]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    def token_at(key: str) -> str | None:
        index = header.uint(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and index < len(tokens) else None

    specials = {
        "bos_token": token_at("bos_token_id"),
        "eos_token": token_at("eos_token_id"),
        "unk_token": token_at("unknown_token_id"),
        "pad_token": token_at("padding_token_id"),
    }
    named = {k: v for k, v in specials.items() if v is not None}
    return GGUFBackend(backend, named, header.string("tokenizer.chat_template"))
