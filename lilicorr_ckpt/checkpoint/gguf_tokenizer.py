"""A GGUF's byte-level BPE tokenizer built directly from its checked header, torch-free: the runtime's direct reader
(lilicorr_runtime/target/gguf_direct.py) and `smoke --engine` (which must not import torch) share it, and neither
goes through transformers' GGUF converter (gguf.GGUFReader over every metadata element, then a conversion: 3.5 GB
and minutes for a header of 5 million merges, which the header's limits now refuse in milliseconds).

The tokenizer is the file's byte-level BPE (`tokenizer.ggml.model` "gpt2") with GPT-2's pre-tokenizer (`pre`
"gpt2", "default", "smollm") or Qwen2's, which splits every digit apart (`pre` "qwen2"); BOS, EOS, unknown and
padding tokens are the ones the metadata names, control tokens are special, and a byte missing from the
vocabulary is dropped, as llama.cpp's tokenizer drops it (the backend is checkpoint/gguf_bpe.py's, which the
runtime's transformers-free target builds too). Its chat template renders within bounds
(checkpoint/chat_template.py). A tokenizer this does not map exactly raises Unsupported (the runtime then loads
the file through transformers); a malformed one GGUFError.

Needs transformers and tokenizers (imported at module level: validate never imports this module)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from lilicorr_ckpt.checkpoint.chat_template import render_chat_template
from lilicorr_ckpt.checkpoint.gguf_bpe import (  # noqa: F401  (re-exported: the names' old home)
    CONTROL,
    GPT2_PRE_TOKENIZERS,
    SPLIT_PRE_TOKENIZERS,
    USER_DEFINED,
    build_backend,
    byte_alphabet,
)
from lilicorr_ckpt.checkpoint.gguf_header import (
    GGUFHeader,
    ModelLayout,
    Unsupported,  # noqa: F401  (re-exported: callers catch it from here)
    check_model,
    open_header,
)

# apply_chat_template's own arguments (the rest are template variables), with this transformers' defaults
_APPLY = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
RETURN_DICT_DEFAULT = bool(_APPLY["return_dict"].default) if "return_dict" in _APPLY else False
# arguments whose handling is transformers' own: the conversation is rendered within bounds first, then handed on
_DELEGATED = ("continue_final_message", "return_assistant_tokens_mask", "sanitize_control_tokens")


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
    """The header's byte-level BPE tokenizer (checkpoint/gguf_bpe.py's backend) as a transformers fast tokenizer;
    Unsupported for a tokenizer this does not map exactly, GGUFError for a malformed one."""
    backend, specials, template = build_backend(header)
    kwargs: dict[str, Any] = dict(specials)
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
