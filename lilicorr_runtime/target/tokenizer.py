"""A target's tokenizer on the `tokenizers` library alone, for the transformers-free target (target/native.py).

`PlainTokenizer` wraps a `tokenizers.Tokenizer` with the part of transformers' fast-tokenizer interface the project
calls (smoke's probes, the training data, the benches): `tok(text)["input_ids"]`, `encode`, `decode` /
`batch_decode`, `convert_ids_to_tokens`, the named special tokens and their ids, `chat_template` and
`apply_chat_template`. It computes what transformers' `TokenizersBackend` computes for the same backend and special
tokens (tests compare the two token for token): a named special token the backend does not list yet is added to
it as a special token, encoding adds what the backend's post-processor adds (nothing for a GGUF's), and a chat
template renders in checkpoint/chat_template.py's bounded sandbox with the special tokens as variables, then
encodes without special tokens, as checkpoint/gguf_tokenizer.py's GGUFTokenizer does.

It is built from a GGUF's header (checkpoint/gguf_bpe.py's backend, the one GGUFTokenizer wraps) or from a model
directory's tokenizer.json when its tokenizer_config.json asks for nothing beyond the file (`directory_tokenizer`:
the generic `PreTrainedTokenizerFast` / `TokenizersBackend` class, named special tokens, a chat template in it or
in chat_template.jinja); a
directory whose tokenizer transformers builds by a class of its own (Qwen2Tokenizer, LlamaTokenizer, ...) gets a
reason instead, and the loader takes transformers' tokenizer for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from lilicorr_ckpt.checkpoint.chat_template import render_chat_template
from lilicorr_ckpt.checkpoint.config import load_json_object
from lilicorr_ckpt.checkpoint.gguf_bpe import build_backend
from lilicorr_ckpt.checkpoint.source import read_small

# transformers' named special tokens, in the order it adds the missing ones to the backend
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer classes that build the backend from tokenizer.json as it is (no pipeline of their own)
GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
# tokenizer_config.json keys that change nothing this tokenizer computes (bookkeeping, limits on padding that the
# runtime never asks for, the class checked above, the special tokens and template read below)
_INERT_KEYS = frozenset(
    {
        "tokenizer_class",
        "added_tokens_decoder",
        "model_max_length",
        "padding_side",
        "truncation_side",
        "model_input_names",
        "clean_up_tokenization_spaces",
        "chat_template",
        "name_or_path",
        "backend",
        "is_local",
        "errors",
        "add_prefix_space",
        "legacy",
        "use_default_system_prompt",
        "split_special_tokens",
        "spaces_between_special_tokens",
        "vocab_file",
        "merges_file",
        "tokenizer_file",
        *SPECIAL_NAMES,
    }
)
VOCAB_PATCH_LIMIT = (
    100_000  # transformers may rewrite the pre-tokenizer of a larger vocabulary (Mistral's regex)
)


class PlainTokenizer:
    """transformers' fast-tokenizer interface, as far as the project uses it, over a `tokenizers.Tokenizer`."""

    def __init__(
        self,
        backend: Tokenizer,
        specials: Mapping[str, str],
        chat_template: str | None = None,
        name_or_path: str = "",
    ) -> None:
        self._tokenizer = backend
        self._specials: dict[str, str] = {k: v for k, v in specials.items() if v is not None}
        self.chat_template = chat_template
        self.name_or_path = name_or_path
        self.clean_up_tokenization_spaces = False
        listed = {str(t.content) for t in backend.get_added_tokens_decoder().values()}
        missing = []
        for name in SPECIAL_NAMES:
            token = self._specials.get(name)
            if token is not None and token not in listed and token not in missing:
                missing.append(token)
        if missing:  # as transformers adds them: special, whole (not normalized)
            backend.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing])

    # the backend and the vocabulary ----------------------------------------------------------------------------

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def is_fast(self) -> bool:
        return True

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in special]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        if isinstance(tokens, str):
            return self._tokenizer.token_to_id(tokens)
        return [self._tokenizer.token_to_id(t) for t in tokens]

    # special tokens ------------------------------------------------------------------------------------------------

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {name: self._specials[name] for name in SPECIAL_NAMES if self._specials.get(name) is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self._tokenizer.token_to_id(t) for t in self.all_special_tokens) if i is not None]

    def _token(self, name: str) -> str | None:
        return self._specials.get(name)

    def _id(self, name: str) -> int | None:
        token = self._specials.get(name)
        return None if token is None else self._tokenizer.token_to_id(token)

    def _set(self, name: str, value: str | None) -> None:
        if value is None:
            self._specials.pop(name, None)
        else:
            self._specials[name] = str(value)

    bos_token = property(lambda self: self._token("bos_token"), lambda self, v: self._set("bos_token", v))
    eos_token = property(lambda self: self._token("eos_token"), lambda self, v: self._set("eos_token", v))
    unk_token = property(lambda self: self._token("unk_token"), lambda self, v: self._set("unk_token", v))
    pad_token = property(lambda self: self._token("pad_token"), lambda self, v: self._set("pad_token", v))
    bos_token_id = property(lambda self: self._id("bos_token"))
    eos_token_id = property(lambda self: self._id("eos_token"))
    unk_token_id = property(lambda self: self._id("unk_token"))
    pad_token_id = property(lambda self: self._id("pad_token"))

    # encoding and decoding -----------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True) -> dict[str, Any]:
        """{"input_ids", "attention_mask"} of one text (lists of ints) or of a list of texts (lists of lists)."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        if isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            rows = [self.encode(t, add_special_tokens) for t in text]
            return {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]}
        raise TypeError(f"text must be a str or a list of str, not {type(text).__name__}")

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        row = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        return self._tokenizer.decode(row, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in rows]

    # chat ----------------------------------------------------------------------------------------------------------

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        template = self.chat_template if chat_template is None else chat_template
        if not isinstance(template, str):
            raise ValueError("this tokenizer has no chat template; pass chat_template= or give plain text")
        return template

    def apply_chat_template(
        self,
        conversation: Sequence[Any],
        tools: list[Any] | None = None,
        documents: list[Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:
        """The conversation (or a list of them) rendered within bounds; token ids without special tokens added
        ({"input_ids", "attention_mask"} with `return_dict`), or the text without `tokenize`. Other keyword
        arguments are template variables, as in transformers."""
        template = self.get_chat_template(chat_template, tools)
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise ValueError("apply_chat_template takes a list of messages (or a list of such lists)")
        batched = isinstance(conversation[0], (list, tuple))
        conversations = list(conversation) if batched else [conversation]
        for chat in conversations:
            for message in chat:
                if not isinstance(message, dict):
                    raise ValueError("chat messages must be dicts (with 'role' and 'content')")
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise TypeError("tools must be JSON schemas (dicts) for this tokenizer")
        variables = {**self.special_tokens_map, **kwargs}
        rendered = [
            render_chat_template(
                template,
                [{k: v for k, v in m.items() if v is not None} for m in chat],
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                documents=documents,
                variables=variables,
            )
            for chat in conversations
        ]
        text: Any = rendered if batched else rendered[0]
        if not tokenize:
            return text
        out = self(text, add_special_tokens=False)
        return out if return_dict else out["input_ids"]


def gguf_tokenizer(header: Any) -> PlainTokenizer:
    """The GGUF's tokenizer (checkpoint/gguf_bpe.py's backend and special tokens, the file's chat template);
    Unsupported / GGUFError as build_backend raises them."""
    backend, specials, template = build_backend(header)
    return PlainTokenizer(backend, specials, template, str(header.path.parent))


def _special_text(value: Any) -> str | None:
    """A named special token as tokenizer_config.json writes it: a string, or an AddedToken dict's content."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def directory_tokenizer(root: Path) -> PlainTokenizer | str:
    """The tokenizer of a model directory from its tokenizer.json, or why transformers must build it (a str)."""
    file, config_file = root / "tokenizer.json", root / "tokenizer_config.json"
    if not file.is_file():
        return "no tokenizer.json"
    config: dict[str, Any] = {}
    if config_file.is_file():
        what = f"{root.name}/tokenizer_config.json"
        config, _ = load_json_object(read_small(config_file, what), what)
    kind = config.get("tokenizer_class")
    if kind not in GENERIC_CLASSES:
        return f"tokenizer class {kind!r} (transformers builds it by a pipeline of its own)"
    unknown = sorted(k for k in config if k not in _INERT_KEYS)
    if unknown:
        return f"tokenizer_config.json key {unknown[0]!r}"
    if config.get("clean_up_tokenization_spaces") and config.get("split_special_tokens"):
        return "clean_up_tokenization_spaces with split_special_tokens"
    if config.get("split_special_tokens"):
        return "split_special_tokens is set"
    for name in ("chat_template.json", "additional_chat_templates"):
        if (root / name).exists():
            return f"a chat template in {name}"
    template = config.get("chat_template")
    if template is not None and not isinstance(template, str):
        return "named chat templates"
    jinja = root / "chat_template.jinja"
    if jinja.exists():  # the file transformers saves the template in
        if template is not None:
            return "a chat template in both tokenizer_config.json and chat_template.jinja"
        template = read_small(jinja, f"{root.name}/chat_template.jinja").decode("utf-8")
    specials: dict[str, str] = {}
    for name in SPECIAL_NAMES:
        if config.get(name) is None:
            continue
        text = _special_text(config[name])
        if text is None:
            return f"tokenizer_config.json {name} is neither a string nor a token"
        specials[name] = text
    backend = Tokenizer.from_str(
        read_small(file, f"{root.name}/tokenizer.json", limit=1 << 30).decode("utf-8")
    )
    if backend.post_processor is None:
        return "tokenizer.json has no post-processor (transformers builds one)"
    if backend.truncation is not None or backend.padding is not None:
        return "tokenizer.json sets truncation or padding"
    if backend.get_vocab_size(with_added_tokens=False) > VOCAB_PATCH_LIMIT:
        return f"a vocabulary over {VOCAB_PATCH_LIMIT:,} tokens (transformers may patch its pre-tokenizer)"
    added = config.get("added_tokens_decoder") or {}
    listed = {int(i): str(t.content) for i, t in backend.get_added_tokens_decoder().items()}
    if not isinstance(added, dict):
        return "tokenizer_config.json added_tokens_decoder is not a mapping"
    for index, token in added.items():
        if not str(index).isdigit() or listed.get(int(index)) != _special_text(token):
            return "tokenizer_config.json adds a token tokenizer.json does not list"
    tokenizer = PlainTokenizer(backend, specials, template, str(root))
    if config.get("clean_up_tokenization_spaces") and type(backend.model).__name__ != "BPE":
        return "clean_up_tokenization_spaces on a tokenizer that is not BPE"
    return tokenizer
