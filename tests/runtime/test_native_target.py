"""A target built without transformers (target/native.py) computes what the transformers-built target computes:
rotary frequencies bit for bit against transformers' own for every rope type the fast path runs, and, for tiny
random Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) saved by transformers, the same logits and tapped hidden
states bit for bit through a prefill, a verify block and one-token steps, in float32 and bfloat16, and the same
greedy tokens. The tokenizer (`tokenizers` only) encodes, decodes and renders chat as transformers' does; a load of
such a target leaves transformers unimported; a source the route does not map is built through transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from runtime_helpers import ARCHS

from lilicorr_runtime import load_target
from lilicorr_runtime.target import native
from lilicorr_runtime.target.fast import FastTarget
from lilicorr_runtime.target.tokenizer import PlainTokenizer, directory_tokenizer

ROPES = [
    {},
    {"rope_theta": 500000.0},
    {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    {"rope_scaling": {"type": "linear", "factor": 2.5}, "rope_theta": 1e6},
    {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "rope_theta": 500000.0,
    },
    {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
        }
    },
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}},
    {
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 3.0,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
        }
    },
    {"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0}},
    {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.25}},
    {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}},
]


def _config_doc(arch: str, **extra) -> dict:
    return {
        "model_type": arch,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 64,
        "max_position_embeddings": 1024,
        **extra,
    }


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("rope", range(len(ROPES)))
def test_rotary_frequencies_are_transformers_bit_for_bit(arch, rope):
    doc = _config_doc(arch, **json.loads(json.dumps(ROPES[rope])))
    config_cls, model_cls = ARCHS[arch]
    reference_config = config_cls(
        **{k: v for k, v in json.loads(json.dumps(doc)).items() if k != "model_type"}
    )
    rotary = model_cls(reference_config).model.rotary_emb
    ours = native.RotaryFrequencies(native.read_config(doc))
    assert ours.rope_type == rotary.rope_type
    assert ours.inv_freq.dtype == rotary.inv_freq.dtype == torch.float32
    assert torch.equal(ours.inv_freq, rotary.inv_freq)
    assert ours.attention_scaling == rotary.attention_scaling


def _save(tmp_path: Path, arch: str, seed: int = 0, vocab: int = 96) -> Path:
    """A tiny random model of `arch` saved by transformers (safetensors, config, generation config)."""
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=arch == "qwen2",
        initializer_range=0.3,
        eos_token_id=5,
        rope_scaling={"rope_type": "yarn", "factor": 2.0} if arch == "qwen3" else None,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    if arch == "qwen2":  # the biases start at zero: make them count
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    path = tmp_path / arch
    model.save_pretrained(path)
    return path


def _run(target: FastTarget, prompt: list[int], steps: int, taps: list[int]):
    """Logits and taps of a prefill, a 4-row verify block (then cropped) and one-token steps, and the greedy
    tokens."""
    target.reserve(len(prompt) + steps + 8)
    target.reset()
    out = [target.forward(torch.tensor(prompt), taps)]
    token = int(out[-1].logits[-1].argmax())
    out.append(target.forward(torch.tensor([token, 3, 4, 5]), taps))
    target.crop(len(prompt) + 1)  # the block's first row accepted: its argmax is the next token
    tokens = [token, int(out[-1].logits[0].argmax())]
    for _ in range(steps - 1):
        step = target.forward(torch.tensor([tokens[-1]]), taps)
        out.append(step)
        tokens.append(int(step.logits[-1].argmax()))
    return out, tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_native_target_computes_what_the_transformers_built_target_computes(tmp_path, arch, dtype):
    path = _save(tmp_path, arch)
    ours = load_target(path, dtype=dtype, native=True)
    theirs = load_target(path, dtype=dtype, native=False)
    assert isinstance(ours, FastTarget) and isinstance(theirs, FastTarget)
    assert isinstance(ours.model, native.NativeCausalLM) and isinstance(
        theirs.model, transformers.PreTrainedModel
    )
    assert ours.load_note == "read directly from the safetensors, built without transformers"
    assert ours.eos_token_ids == theirs.eos_token_ids == (5,)
    assert ours.dtype == theirs.dtype == dtype
    # every weight the fast path runs, and the rotary tables it builds from the frequencies
    for name, tensor in theirs.model.state_dict().items():
        if "rotary" not in name:
            assert torch.equal(ours.model.state_dict()[name], tensor), name
    assert (
        torch.equal(ours.core.inv_freq, theirs.core.inv_freq)
        and ours.core.rope_scale == theirs.core.rope_scale
    )
    assert torch.equal(ours.core.cos, theirs.core.cos) and torch.equal(ours.core.sin, theirs.core.sin)
    tied = ours.model.lm_head.weight is ours.model.model.embed_tokens.weight
    assert tied == (arch == "qwen2")
    prompt = [7, 1, 40, 33, 2, 90, 18, 61, 5, 12, 77]
    ours_out, ours_tokens = _run(ours, prompt, 6, [0, 2])
    theirs_out, theirs_tokens = _run(theirs, prompt, 6, [0, 2])
    assert ours_tokens == theirs_tokens
    for a, b in zip(ours_out, theirs_out, strict=True):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
    # a target built through transformers' model class for its eager forward agrees on the greedy tokens too
    eager = load_target(path, dtype=dtype, fast=False)
    assert type(eager).__name__ == "TargetModel"
    if dtype == torch.float32:
        assert _run_eager(eager, prompt, 6) == ours_tokens


def _run_eager(target, prompt: list[int], steps: int) -> list[int]:
    target.reset()
    tokens = [int(target.forward(torch.tensor(prompt)).logits[-1].argmax())]
    for _ in range(steps):
        tokens.append(int(target.forward(torch.tensor([tokens[-1]])).logits[-1].argmax()))
    return tokens


def test_generation_config_and_config_eos_are_read_as_transformers_reads_them(tmp_path):
    path = _save(tmp_path, "llama")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 9]}))
    assert (
        load_target(path, native=True).eos_token_ids
        == load_target(path, native=False).eos_token_ids
        == (5, 9)
    )
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))  # no eos: the config's
    assert (
        load_target(path, native=True).eos_token_ids == load_target(path, native=False).eos_token_ids == (5,)
    )
    (path / "generation_config.json").unlink()
    doc = json.loads((path / "config.json").read_text())
    del doc["eos_token_id"]  # a Llama config without one: LlamaConfig's default, 2
    (path / "config.json").write_text(json.dumps(doc))
    assert (
        load_target(path, native=True).eos_token_ids == load_target(path, native=False).eos_token_ids == (2,)
    )


def test_what_the_route_does_not_map_is_built_through_transformers(tmp_path):
    path = _save(tmp_path, "llama")
    doc = json.loads((path / "config.json").read_text())
    for change, why in (
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
        ({"partial_rotary_factor": 0.5}, "config key 'partial_rotary_factor'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ):
        (path / "config.json").write_text(json.dumps({**doc, **change}))
        target = load_target(path)
        assert isinstance(target.model, transformers.PreTrainedModel)
        assert why in target.load_note
        with pytest.raises(ValueError, match="cannot be built without transformers"):
            load_target(path, native=True)
    (path / "config.json").write_text(json.dumps(doc))
    good = (path / "generation_config.json").read_text()
    (path / "generation_config.json").write_text("[]")  # named, and a ValueError for the runtime's callers
    with pytest.raises(ValueError, match=r"generation_config\.json must hold a JSON object, found array"):
        load_target(path)
    (path / "generation_config.json").write_text(good)
    (path / "model.safetensors").rename(path / "other.safetensors")
    with pytest.raises(ValueError, match="cannot be built without transformers: no model.safetensors"):
        load_target(path, native=True)


def _tokenizer_dir(tmp_path: Path, tokenizer_class: str = "PreTrainedTokenizerFast") -> Path:
    """A byte-level BPE tokenizer.json with special tokens and a chat template, saved as a model directory's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("ll", "o")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    path = tmp_path / "tok"
    path.mkdir(parents=True)
    backend.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": tokenizer_class,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<pad>",  # not in the vocabulary: transformers adds it, and so do we
        "model_max_length": 512,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ eos_token }}",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_directory_tokenizer_is_transformers_token_for_token(tmp_path):
    path = _tokenizer_dir(tmp_path)
    ours = directory_tokenizer(path)
    assert isinstance(ours, PlainTokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    texts = ["the hello world", "  ünï 漢字 🙂\n\tx", "<|im_start|>user<|im_end|><pad>the", ""]
    for text in texts:
        assert ours(text) == dict(theirs(text)), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        ids = ours.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.get_vocab() == theirs.get_vocab() and len(ours) == len(theirs)
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id) == (
        theirs.eos_token_id,
        theirs.bos_token_id,
        theirs.pad_token_id,
    )
    assert ours.convert_ids_to_tokens([3, 300, 301]) == theirs.convert_ids_to_tokens([3, 300, 301])
    chat = [{"role": "user", "content": "hello the"}]
    for generation in (False, True):
        assert ours.apply_chat_template(chat, add_generation_prompt=generation, tokenize=False) == (
            theirs.apply_chat_template(chat, add_generation_prompt=generation, tokenize=False)
        )
        assert ours.apply_chat_template(chat, add_generation_prompt=generation, return_dict=True)[
            "input_ids"
        ] == (
            list(
                theirs.apply_chat_template(chat, add_generation_prompt=generation, return_dict=True)[
                    "input_ids"
                ]
            )
        )
    # a class transformers builds by a pipeline of its own: its tokenizer, not ours
    other = _tokenizer_dir(tmp_path / "qwen", "Qwen2Tokenizer")
    assert (
        directory_tokenizer(other)
        == "tokenizer class 'Qwen2Tokenizer' (transformers builds it by a pipeline of its own)"
    )


@pytest.mark.slow  # a fresh process imports torch: 3-7 s on the 2-core box, most of it torch's import
def test_a_native_load_leaves_transformers_and_torch_dynamo_unimported(tmp_path):
    """In a fresh process: a directory target (safetensors and a generic tokenizer.json) and a GGUF target, each
    loaded and run, with no transformers module imported, and no torch._dynamo (which torch's initialization of
    meta-device modules imported, a second or more of a cold start, for values the checkpoint replaces)."""
    from runtime_helpers import write_tiny_gguf

    path = _save(tmp_path, "qwen3", vocab=320)  # the tokenizer's 263 tokens
    tokenizer = _tokenizer_dir(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((tokenizer / name).read_bytes())
    gguf_path = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf")
    code = f"""
import sys, torch
from lilicorr_runtime import load_target
for spec in ({str(path)!r}, {str(gguf_path)!r}):
    target = load_target(spec)
    assert "without transformers" in target.load_note, target.load_note
    ids = target.tokenizer.apply_chat_template([{{"role": "user", "content": "hello"}}], add_generation_prompt=True)
    target.reset()
    # the test tokenizer's vocabulary is wider than the tiny model's table: ids folded into it
    target.forward(torch.tensor([i % target.vocab_size for i in ids["input_ids"]]), [0])
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers" or m.startswith("torch._dynamo")))
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "LILICORR_GGUF_LOADER"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
