"""A GGUF's byte-level BPE tokenizer built directly from its checked header, torch-free: the runtime's direct reader
(lilicorr_runtime/target/gguf_direct.py) and `smoke --engine` (which must not import torch) share it, and neither
goes through transformers' GGUF converter (gguf.GGUFReader over every metadata element, then a conversion: 3.5 GB
and minutes for a header of 5 million merges, which the header's limits now refuse in milliseconds).

The tokenizer is the file's byte-level BPE (`tokenizer.ggml.model` "gpt2") with GPT-2's pre-tokenizer (`pre`
"gpt2", "default", "smollm") or Qwen2's, which splits every digit apart (`pre` "qwen2"); BOS, EOS, unknown and
padding tokens are the ones the metadata names, control tokens are special, and a byte missing from the
vocabulary is dropped, as llama.cpp's tokenizer drops it. Its chat template renders within bounds
(checkpoint/chat_template.py). A tokenizer this does not map exactly raises Unsupported (the runtime then loads
the file through transformers); a malformed one GGUFError.

Needs transformers and tokenizers (imported at module level: validate never imports this module)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from lilicorr_ckpt.checkpoint.chat_template import render_chat_template
from lilicorr_ckpt.checkpoint.gguf_header import (
    FIX_CONVERT,
    INTEGERS,
    GGUFHeader,
    ModelLayout,
    Unsupported,
    check_model,
    open_header,
)

# llama.cpp's names for a pre-tokenizer that is GPT-2's own byte-level split
GPT2_PRE_TOKENIZERS = ("gpt2", "gpt-2", "default", "smollm")
# pre-tokenizers that split text by a regular expression of their own before the byte-level mapping (the one their
# merges were learned on): Qwen2's splits every digit apart, where GPT-2's keeps runs of digits together
SPLIT_PRE_TOKENIZERS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
}
CONTROL, USER_DEFINED = 3, 4
# apply_chat_template's own arguments (the rest are template variables), with this transformers' defaults
_APPLY = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
RETURN_DICT_DEFAULT = bool(_APPLY["return_dict"].default) if "return_dict" in _APPLY else False
# arguments whose handling is transformers' own: the conversation is rendered within bounds first, then handed on
_DELEGATED = ("continue_final_message", "return_assistant_tokens_mask", "sanitize_control_tokens")


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


class GGUFTokenizer(PreTrainedTokenizerFast):
    """transformers' fast tokenizer, whose apply_chat_template renders the chat template within bounds
    (checkpoint/chat_template.py) and tokenizes the text as transformers does (no special tokens added)."""

    def apply_chat_template(  # type: ignore[override]
        self,
        conversation: Any,
        tools: list[Any] | None = None,
        documents: list[Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        padding: Any = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: Any = None,
        return_dict: bool = RETURN_DICT_DEFAULT,
        tokenizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        template = self.get_chat_template(chat_template, tools)
        delegated = {name: kwargs.pop(name) for name in _DELEGATED if name in kwargs}
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise ValueError("apply_chat_template takes a list of messages (or a list of such lists)")
        batched = isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")
        conversations = list(conversation) if batched else [conversation]
        variables = {**self.special_tokens_map, **kwargs}
        schemas = _tool_schemas(tools)
        rendered = [
            render_chat_template(
                template,
                _messages(chat),
                add_generation_prompt=add_generation_prompt,
                tools=schemas,
                documents=documents,
                variables=variables,
            )
            for chat in conversations
        ]
        if any(delegated.values()):  # rendered within bounds above; the options are transformers' to apply
            return super().apply_chat_template(
                conversation,  # type: ignore[arg-type]
                tools=tools,
                documents=documents,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                tokenize=tokenize,
                padding=padding,
                truncation=truncation,
                max_length=max_length,
                return_tensors=return_tensors,
                return_dict=return_dict,
                tokenizer_kwargs=tokenizer_kwargs,
                **delegated,
                **kwargs,
            )
        text: Any = rendered if batched else rendered[0]
        if not tokenize:
            return text
        out = self(
            text,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            add_special_tokens=False,
            return_tensors=return_tensors,
            **(tokenizer_kwargs or {}),
        )
        return out if return_dict else out["input_ids"]


def _messages(chat: Any) -> list[Any]:
    """A conversation's messages as transformers hands them to a template: dicts, keys whose value is None dropped."""
    messages = chat.messages if hasattr(chat, "messages") else chat
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("chat messages must be dicts (with 'role' and 'content')")
        out.append({key: value for key, value in message.items() if value is not None})
    return out


def _tool_schemas(tools: Sequence[Any] | None) -> list[Any] | None:
    if tools is None:
        return None
    schemas = []
    for tool in tools:
        if isinstance(tool, dict):
            schemas.append(tool)
        else:  # a function: its JSON schema, as transformers makes it
            from transformers.utils import get_json_schema

            schemas.append(get_json_schema(tool))
    return schemas


def build_tokenizer(header: GGUFHeader) -> GGUFTokenizer:
    """The header's byte-level BPE tokenizer as a transformers fast tokenizer (check_model has checked the
    vocabulary's arrays and ids); Unsupported for a tokenizer this does not map exactly, GGUFError for a
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
    kwargs: dict[str, Any] = {k: v for k, v in specials.items() if v is not None}
    template = header.string("tokenizer.chat_template")
    if template is not None:
        kwargs["chat_template"] = template
    return GGUFTokenizer(tokenizer_object=backend, name_or_path=str(header.path.parent), **kwargs)


def eos_token_ids(header: GGUFHeader) -> tuple[int, ...]:
    """Where generation stops: the metadata's eos id (transformers' GGUF config and generation config take it)."""
    eos = header.uint("tokenizer.ggml.eos_token_id")
    return () if eos is None else (eos,)


def read_gguf_tokenizer(path: str | Path) -> tuple[GGUFTokenizer, tuple[int, ...], ModelLayout]:
    """The tokenizer, eos ids and checked layout of the GGUF at `path`, without torch, the weights or
    transformers' converter: GGUFError (an InputError) for a file that is malformed or does not describe its
    weights, Unsupported for a tokenizer this does not build (the caller may then use transformers')."""
    with open_header(path) as header:
        layout = check_model(header)
        return build_tokenizer(header), eos_token_ids(header), layout
