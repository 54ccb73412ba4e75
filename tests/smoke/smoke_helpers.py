"""Tiny on-disk targets with a character-level tokenizer and chat template, and drafters that fit them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lilicorr_ckpt import fixtures

# id 0 unk, 1 bos, 2 eos as in SmolLM2; 15 is the drafters' mask token
VOCAB = [
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
    " ",
    "e",
    "t",
    "a",
    "o",
    "i",
    "n",
    "s",
    "r",
    "h",
    "l",
    "\n",
    "<mask>",
]
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% if enable_thinking is defined and not enable_thinking %}"
    "no think{% endif %}{% endif %}"
)
PLAIN_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}<|im_start|>"


def tokenizer(chat_template: str | None = THINKING_TEMPLATE) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    fast.chat_template = chat_template
    return fast


def write_target(
    path: Path,
    *,
    seed: int = 0,
    layers: int = 4,
    eos: bool = False,
    constant: bool = False,
    chat_template: str | None = THINKING_TEMPLATE,
    save_tokenizer: bool = True,
) -> Path:
    """A random Llama of vocabulary 16 saved with save_pretrained. `constant`: a zero final norm makes every
    logit 0, so greedy decoding emits token 0 forever; embedding column 0 is +1 for token 0 and -1 for every
    other token, which a constructed head can read (see good_head)."""
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=len(VOCAB),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2 if eos else None,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = 2 if eos else None
    if constant:
        with torch.no_grad():
            model.model.norm.weight.zero_()
            model.model.embed_tokens.weight[:, 0] = -1.0
            model.model.embed_tokens.weight[0, 0] = 1.0
    model.save_pretrained(path)
    if save_tokenizer:
        tokenizer(chat_template).save_pretrained(path)
    return Path(path)


def drafter_config(head: bool = True, **dflash: Any) -> dict[str, Any]:
    """A drafter for the 4-layer targets above (hidden 64, vocabulary 16, mask token 15)."""
    return fixtures.draft_config(head=head, vocab_size=len(VOCAB), dflash={"mask_token_id": 15, **dflash})


def zero_head(tensors: fixtures.Tensors) -> None:
    """Every lilicorr.* tensor zeroed: start and pair scores are all 0, so the walk takes candidate 0."""
    for name, (dtype, shape, raw) in list(tensors.items()):
        if name.startswith("lilicorr."):
            tensors[name] = (dtype, shape, bytes(len(raw)))


def good_head(tensors: fixtures.Tensors) -> None:
    """A head (h = 32, K = 16 = the whole vocabulary) that scores a candidate by the sign of its target
    embedding's column 0, so on a `constant` target it always picks token 0, the target's greedy token.

    Only token_proj and output_norm shape the lattice (the layers' output projections and every other input
    are zero), so c = rmsnorm(e[0], 0, ...) = (+-sqrt(h), 0, ...); factor_input_proj passes c[0] to f[0];
    in_head reads f[0] beside a constant; out_head and anchor_out_head are the constant unit vector e_0.
    """
    import numpy as np

    def put(name: str, values: np.ndarray) -> None:
        dtype, shape, _ = tensors[name]
        assert tuple(values.shape) == tuple(shape), (name, values.shape, shape)
        tensors[name] = (dtype, shape, fixtures.encode(values.astype(np.float32), dtype))

    for name, (_, shape, _) in list(tensors.items()):
        if name.startswith("lilicorr."):
            put(name, np.zeros(shape))
    token_proj = np.zeros(tensors["lilicorr.token_proj.weight"][1])
    token_proj[0, 0] = 1.0
    put("lilicorr.token_proj.weight", token_proj)
    put("lilicorr.output_norm.weight", np.ones(tensors["lilicorr.output_norm.weight"][1]))
    put("lilicorr.anchor_norm.weight", np.ones(tensors["lilicorr.anchor_norm.weight"][1]))
    factor = np.zeros(tensors["lilicorr.factor_input_proj.weight"][1])
    factor[0, 0] = 1.0
    put("lilicorr.factor_input_proj.weight", factor)
    in_head = np.zeros(tensors["lilicorr.in_head.weight"][1])
    in_head[0, 0] = 1.0
    put("lilicorr.in_head.weight", in_head)
    unit = np.zeros(tensors["lilicorr.in_head.bias"][1])
    unit[1] = 1.0
    put("lilicorr.in_head.bias", unit)
    e0 = np.zeros(tensors["lilicorr.out_head.bias"][1])
    e0[0] = 1.0
    put("lilicorr.out_head.bias", e0)
    put("lilicorr.anchor_out_head.bias", e0)
