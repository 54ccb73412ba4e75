"""A GGUF target loads exactly what a plain transformers load of it does, by either route: read directly
(target/gguf_direct.py, no gguf reader at all) or, with LILICORR_GGUF_LOADER=transformers and for files the direct
route does not map, through transformers on one gguf reader of the file for the config, the weights and the
tokenizer (a small random Llama written the way llama.cpp writes one; the real SmolLM2 GGUF is
tests/runtime/test_real_target.py's, the other architectures and formats tests/runtime/test_gguf_direct.py's)."""

from __future__ import annotations

import collections

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF targets need the gguf package (the runtime extra)")

from runtime_helpers import write_tiny_gguf  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import lilicorr_runtime.target.load as target_load  # noqa: E402
from lilicorr_runtime import SpeculativeDecoder, load_target  # noqa: E402


@pytest.fixture
def parses(monkeypatch):
    """How many gguf readers were built, per file: gguf.GGUFReader counting its constructions."""
    counts: collections.Counter[str] = collections.Counter()
    original = gguf.GGUFReader

    class Counting(original):  # type: ignore[misc, valid-type]
        def __init__(self, path, mode="r"):
            counts[str(path)] += 1
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    return counts


def plain_transformers_load(path):
    """What transformers loads from the file on its own (no load_target around it)."""
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    return model, AutoTokenizer.from_pretrained(str(path.parent), **kwargs)


@pytest.fixture(params=["direct", "transformers"])
def route(request, monkeypatch):
    """The GGUF loader under test: read directly (the default) or through transformers."""
    if request.param == "transformers":
        monkeypatch.setenv("LILICORR_GGUF_LOADER", "transformers")
    else:
        monkeypatch.delenv("LILICORR_GGUF_LOADER", raising=False)
    return request.param


@pytest.mark.parametrize("native", [True, False], ids=["native", "transformers-model"])
def test_a_gguf_target_is_what_transformers_loads_parsed_once_or_not_at_all(tmp_path, parses, route, native):
    """Read directly and built without transformers (target/native.py), read directly into transformers' model
    class, or through transformers' GGUF loader: the same weights, frequencies, tokens and decode."""
    if native and route == "transformers":
        pytest.skip("LILICORR_GGUF_LOADER=transformers is transformers' route")
    path = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf")
    entry_points = gguf.GGUFReader, gguf.get_tensor_name_map
    target = load_target(path, native=native)
    if native:
        assert parses == {} and target.load_note == "read directly from the GGUF, built without transformers"
    elif route == "direct":
        assert parses == {} and target.load_note == "read directly from the GGUF"
    else:  # config, weights and tokenizer: one parse (transformers alone makes three)
        assert parses == {str(path): 1}
        assert target.load_note == "transformers' GGUF loader (LILICORR_GGUF_LOADER=transformers)"
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == entry_points  # restored

    before = parses[str(path)]
    model, tokenizer = plain_transformers_load(path)
    # transformers alone: a reader for the config, the weights and the tokenizer (5.25), and one more on 5.17
    assert parses[str(path)] - before in (3, 4)
    assert target.path == "fast" and (target.num_layers, target.vocab_size, target.hidden_size) == (
        2,
        264,
        64,
    )
    reference_config = model.config.to_dict()
    if route == "direct":  # transformers marks its GGUF models; the direct route's model is a plain one
        assert reference_config.pop("quantization_config")["quant_method"] == "gguf"
    loaded, reference = dict(target.model.named_buffers()), dict(model.named_buffers())
    if native:  # its own config object, and only the inverse frequencies the fast path reads
        config = target.model.config
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_key_value_heads",
            "rms_norm_eps",
            "eos_token_id",
        ):
            assert getattr(config, key) == reference_config[key], key
        assert loaded.keys() == {"model.rotary_emb.inv_freq"}
        reference = {"model.rotary_emb.inv_freq": reference["model.rotary_emb.inv_freq"]}
    else:
        assert target.model.config.to_dict() == reference_config
    assert loaded.keys() == reference.keys()
    for name, tensor in reference.items():  # the rotary inverse frequencies, made at construction
        assert torch.equal(loaded[name], tensor) and loaded[name].dtype == tensor.dtype, name
    loaded, reference = target.model.state_dict(), model.state_dict()
    assert loaded.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(loaded[name], tensor), name
    assert target.tokenizer.get_vocab() == tokenizer.get_vocab()
    chat = [{"role": "user", "content": "hello world"}]
    assert target.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == (
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    )
    assert (
        target.tokenizer.encode("hello world")
        == tokenizer.encode("hello world")
        == [258, 111, 260, 111, 114, 108, 100]
    )
    assert target.eos_token_ids == (263,) and target.tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.encode("hello")
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert (
        SpeculativeDecoder(target, mode="ar").generate(prompt, 8).tokens
        == expected[0, len(prompt) :].tolist()
    )


def test_a_gguf_missing_a_tensor_is_refused_naming_it(tmp_path, parses, route):
    """Read directly, by the header check before any tensor is read; through transformers, after its load."""
    path = write_tiny_gguf(tmp_path / "holed.gguf", drop="blk.1.ffn_up.weight")
    problem = (
        r"holed\.gguf: lacks 1 of the tensors a llama of 2 blocks has: blk\.1\.ffn_up\.weight"
        if route == "direct"
        else r"does not hold the weights its config describes: missing model\.layers\.1\.mlp\.up_proj\.weight"
    )
    with pytest.raises(ValueError, match=problem):
        load_target(path)
    assert parses == ({} if route == "direct" else {str(path): 1})


def test_a_gguf_with_a_misshapen_tensor_is_refused_naming_both_shapes(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "wide.gguf", ffn_in_config=96)
    with pytest.raises(
        ValueError,
        match=r"tensor 'blk\.0\.ffn_gate\.weight' has shape \[128, 64\], but its metadata makes it \[96, 64\]",
    ):
        load_target(path)
    monkeypatch.setenv(
        "LILICORR_GGUF_LOADER", "transformers"
    )  # transformers' own route: refused after its load
    with pytest.raises(
        ValueError,
        match=r"model\.layers\.0\.mlp\.down_proj\.weight has shape \[64, 128\] in the checkpoint, the config "
        r"needs \[64, 96\]",
    ):
        load_target(path)


@pytest.mark.parametrize(
    "cut, problem",
    [
        (4, "shorter than a GGUF header"),
        (
            24,
            r"the header claims 21 tensors and 22 metadata entries, more than its 24 bytes can hold \(the file is "
            r"truncated or corrupt\)",
        ),
        (4096, "not a complete GGUF file: "),
        (200_000, "not a complete GGUF file: tensor '.*' ends past the file's end"),
    ],
)
def test_a_truncated_gguf_is_refused_by_the_direct_route_naming_the_file(tmp_path, cut, problem):
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "cut" / "cut.gguf"
    path.parent.mkdir()
    path.write_bytes(whole[:cut])
    with pytest.raises(ValueError, match=problem) as refused:
        load_target(path)
    assert str(path) in str(refused.value)


@pytest.mark.parametrize("cut", [4, 24, 4096, 200_000])
def test_a_truncated_gguf_fails_through_transformers_as_a_plain_transformers_load_does(
    tmp_path, cut, monkeypatch
):
    monkeypatch.setenv("LILICORR_GGUF_LOADER", "transformers")
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "cut" / "cut.gguf"
    path.parent.mkdir()
    path.write_bytes(whole[:cut])
    entry_points = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(Exception) as plain:
        plain_transformers_load(path)
    with pytest.raises(Exception) as ours:
        load_target(path)
    assert (type(ours.value), str(ours.value)) == (type(plain.value), str(plain.value))
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == entry_points  # restored after a failure


def test_only_the_loading_file_opened_read_only_shares_its_reader(tmp_path):
    one, other = write_tiny_gguf(tmp_path / "one.gguf"), write_tiny_gguf(tmp_path / "other.gguf", seed=1)
    with target_load._one_gguf_parse(one):
        first = gguf.GGUFReader(one)
        assert gguf.GGUFReader(str(one)) is first and type(first).__name__ == "GGUFReader"
        assert gguf.GGUFReader(other) is not gguf.GGUFReader(other)
        assert gguf.GGUFReader(path=one) is first and gguf.GGUFReader(one, mode="r") is first
        assert gguf.GGUFReader(one, "c") is not first and gguf.GGUFReader(path=one, mode="c") is not first
        with pytest.raises(TypeError):  # not a path: the reader's own error
            gguf.GGUFReader(None)
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader(one) is not first
