"""Shared by the runtime tests: tiny random targets built from transformers configs (no downloads),
drafter configs that match them, and a chi-square test."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
import transformers

from lilicorr_ckpt import fixtures
from lilicorr_runtime import TargetModel

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def tiny_target(
    arch: str = "llama",
    *,
    vocab: int = 16,
    hidden: int = 64,
    layers: int = 4,
    seed: int = 0,
    init: float = 0.3,
) -> TargetModel:
    """A random target. The small vocabulary lets random drafters get blocks partly accepted, so the
    crop-after-rejection paths run; the wide init keeps its greedy continuations from collapsing into
    one repeated token."""
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        vocab_size=vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=init,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = (
        None  # HF generate must not stop early: tests compare fixed lengths
    )
    return TargetModel(model, None, ())


def small_config(**kwargs: Any) -> dict[str, Any]:
    """fixtures.draft_config for the 16-token tiny targets (vocab 16, mask token 15)."""
    dflash = {"mask_token_id": 15, **kwargs.pop("dflash", {})}
    return fixtures.draft_config(vocab_size=kwargs.pop("vocab_size", 16), dflash=dflash, **kwargs)


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's test; cells with tiny expectation are pooled so the chi-square approximation holds."""
    n = observed.sum()
    expected = expected_probs.double() * n
    big = expected >= 5
    obs = torch.cat([observed.double()[big], observed.double()[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet, as examples/make_examples.py builds the bundled tokenizers with it."""
    path = Path(__file__).resolve().parents[2] / "examples" / "make_examples.py"
    spec = importlib.util.spec_from_file_location("make_examples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.byte_alphabet()


def write_tiny_gguf(
    path,
    *,
    layers: int = 2,
    hidden: int = 64,
    seed: int = 0,
    drop: str | None = None,
    arch: str = "llama",
    heads: int = 4,
    tied: bool = False,
    pre: str = "smollm",
    add_bos: bool = False,
    extra: dict | None = None,
    tensor_types: dict | None = None,
    ffn_in_config: int | None = None,
):
    """A small random Llama (or `arch` "qwen2", with q/k/v biases, or "qwen3", with q/k norms) as a GGUF file, the
    way llama.cpp writes one: its config, a byte-level BPE tokenizer (256 bytes, a few merges, ChatML's specials,
    a chat template) and its weights (Q8_0 embedding, the rest F32, or the ggml type `tensor_types` names for a tensor).
    `drop` leaves that tensor out (a file whose weights do not match its config); `tied` writes no output.weight;
    `extra` adds metadata (key -> str, int, float or bool); `ffn_in_config` states another FFN width than the
    tensors have."""
    import gguf
    import numpy as np

    alphabet = _byte_alphabet()
    merges = ["h e", "l l", "he ll", "o Ġ", "Ġ w"]
    tokens = [*alphabet, *(m.replace(" ", "") for m in merges), "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]  # normal, then control
    vocab, kv_heads, ffn = len(tokens), max(1, heads // 2), 2 * hidden
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn_in_config or ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    writer.add_pad_token_id(vocab - 3)
    writer.add_add_bos_token(add_bos)
    for key, value in (extra or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    writer.add_chat_template(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    tensors = {"token_embd.weight": weight(vocab, hidden)}
    for i in range(layers):
        tensors |= {
            f"blk.{i}.attn_norm.weight": 1 + weight(hidden) / 10,
            f"blk.{i}.attn_q.weight": weight(hidden, hidden),
            f"blk.{i}.attn_k.weight": weight(kv_heads * head_dim, hidden),
            f"blk.{i}.attn_v.weight": weight(kv_heads * head_dim, hidden),
            f"blk.{i}.attn_output.weight": weight(hidden, hidden),
            f"blk.{i}.ffn_norm.weight": 1 + weight(hidden) / 10,
            f"blk.{i}.ffn_gate.weight": weight(ffn, hidden),
            f"blk.{i}.ffn_up.weight": weight(ffn, hidden),
            f"blk.{i}.ffn_down.weight": weight(hidden, ffn),
        }
        if arch == "qwen2":
            tensors |= {
                f"blk.{i}.attn_q.bias": weight(hidden),
                f"blk.{i}.attn_k.bias": weight(kv_heads * head_dim),
                f"blk.{i}.attn_v.bias": weight(kv_heads * head_dim),
            }
        if arch == "qwen3":
            tensors |= {
                f"blk.{i}.attn_q_norm.weight": 1 + weight(head_dim) / 10,
                f"blk.{i}.attn_k_norm.weight": 1 + weight(head_dim) / 10,
            }
    tensors["output_norm.weight"] = 1 + weight(hidden) / 10
    if not tied:
        tensors["output.weight"] = weight(vocab, hidden)
    kinds = {"token_embd.weight": gguf.GGMLQuantizationType.Q8_0} | (tensor_types or {})
    for name, value in tensors.items():
        if name == drop:
            continue
        kind = kinds.get(name)
        if kind is None or kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, value)
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, value.astype(np.float16))
        else:
            packed = gguf.quants.quantize(value, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_same_weights(direct, reference):
    """Two loads of one GGUF hold the same model: the config (less transformers' GGUF marker), and every parameter
    and buffer bit for bit, in the same dtype."""
    config = reference.model.config.to_dict()
    config.pop("quantization_config", None)  # transformers' GGUF marker; the direct model is a plain one
    assert direct.model.config.to_dict() == config
    for ours, theirs in (
        (direct.model.state_dict(), reference.model.state_dict()),
        (dict(direct.model.named_buffers()), dict(reference.model.named_buffers())),
    ):
        assert ours.keys() == theirs.keys()
        for name, tensor in theirs.items():
            assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name


# transformers' GGUF tokenizer converter changed between releases. 5.17 chose the pre-tokenizer by architecture
# rather than by the file's tokenizer.ggml.pre, gave the byte-level BPE a byte fallback and the file's unknown token
# (so a byte missing from the vocabulary became that token, where llama.cpp drops it), used a SentencePiece-style
# decoder for Llama files (it strips a leading space) and dropped Qwen files' BOS and Llama files' padding token.
# 5.25 builds what the metadata says, as the direct route does. From that release on, options, special tokens and
# decoded text are compared with transformers'; before it, with the file itself.
TOKENIZER_AS_FILE_SAYS = (5, 25)


def _transformers_version() -> tuple[int, int]:
    major, minor = (transformers.__version__.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def assert_same_tokenizer(ours, theirs, texts, *, gguf_path, every_token: bool = False):
    """Our tokenizer (read directly from the GGUF at `gguf_path`) tokenizes as transformers' does: the same BPE
    vocabulary and merges, added tokens, EOS and chat template, the same pre-tokenized pieces and ids for every
    text. Where transformers builds what the file says (TOKENIZER_AS_FILE_SAYS), also the same BPE options,
    special tokens and decoded text (with `every_token`, of every id decoded alone). On older releases those are
    checked against the file instead: BOS / unknown / padding tokens are the ones its metadata names, the BPE has
    no byte fallback or unknown token, and each text decodes back to itself (every id alone, to its bytes). The
    normalizer, post-processor and decoder objects are compared through that behaviour only: releases write
    equivalent ones differently."""
    from lilicorr_runtime.target import gguf_direct

    a, b = json.loads(ours.backend_tokenizer.to_str()), json.loads(theirs.backend_tokenizer.to_str())
    for key in ("type", "vocab", "merges", "dropout", "ignore_merges"):
        assert a["model"].get(key) == b["model"].get(key), key
    assert a["added_tokens"] == b["added_tokens"]
    for attribute in ("eos_token", "chat_template"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    split_a, split_b = ours.backend_tokenizer.pre_tokenizer, theirs.backend_tokenizer.pre_tokenizer
    for text in texts:
        assert split_a.pre_tokenize_str(text) == split_b.pre_tokenize_str(text), text
        assert ours.encode(text) == theirs.encode(text), text
    if _transformers_version() >= TOKENIZER_AS_FILE_SAYS:
        assert a["model"] == b["model"]
        for attribute in ("bos_token", "unk_token", "pad_token", "all_special_ids"):
            assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
        for text in texts:
            ids = theirs.encode(text)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                    ids, skip_special_tokens=skip
                )
        if every_token:
            singles = [[i] for i in range(len(theirs))]
            assert ours.batch_decode(singles) == theirs.batch_decode(singles)
        return
    with gguf_direct.GGUFFile(gguf_path) as file:
        meta = file.metadata
    tokens = meta["tokenizer.ggml.tokens"]
    for attribute, key in (
        ("bos_token", "bos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        index = meta.get(f"tokenizer.ggml.{key}")
        assert getattr(ours, attribute) == (tokens[index] if isinstance(index, int) else None), attribute
    # a byte missing from the vocabulary is dropped (llama.cpp's BPE tokenizer), never a fallback or unknown token
    assert a["model"]["byte_fallback"] is False and a["model"]["unk_token"] is None
    for text in texts:
        assert ours.decode(ours.encode(text)) == text, text
    if every_token:
        alphabet = {char: byte for byte, char in gguf_direct._byte_alphabet().items()}
        for token, index in a["model"]["vocab"].items():
            expected = bytes(alphabet[ch] for ch in token).decode("utf-8", errors="replace")
            assert ours.decode([index]) == expected, token
