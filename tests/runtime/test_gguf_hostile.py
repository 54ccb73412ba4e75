"""Hostile GGUF targets, the runtime half (issue 40): the direct reader (target/gguf_direct.py) refuses what the
header check refuses before it reads a tensor, reads tensor names strictly, types its metadata, renders the chat
template within bounds, and every refusal of a file under 100 MB comes in under 5 s and 1 GB with a message
(no traceback, no exception name), for smoke's pre-load check and for load_target alike. smoke --engine's
tokenizer is the same direct reader, torch-free (smoke.target_files.direct_gguf_tokenizer). The torch-free half
(validate --target) is tests/checkpoint/test_gguf_header_hostile.py; the files are written by tests/checkpoint/gguf_bytes.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("gguf", reason="GGUF targets need the gguf package (the runtime extra)")

from lilicorr_ckpt import fixtures  # noqa: E402
from lilicorr_ckpt.checkpoint.chat_template import ChatTemplateError  # noqa: E402
from lilicorr_ckpt.errors import InputError  # noqa: E402
from lilicorr_ckpt.smoke.target_files import direct_gguf_tokenizer  # noqa: E402
from lilicorr_runtime import load_target  # noqa: E402
from lilicorr_runtime.target import gguf_direct  # noqa: E402

from helpers import REPO, run_cli  # noqa: E402


def _writer():
    spec = importlib.util.spec_from_file_location(
        "gguf_bytes", REPO / "tests" / "checkpoint" / "gguf_bytes.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gguf_bytes", module)
    spec.loader.exec_module(module)
    return module


W = _writer()


@pytest.fixture(autouse=True)
def direct_route(monkeypatch):
    monkeypatch.delenv("LILICORR_GGUF_LOADER", raising=False)


# ------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize("name", ["blk.03.attn_q.weight", "blk.\u0663.attn_q.weight"])
def test_a_second_spelling_of_a_block_number_is_refused_not_loaded_over_the_real_tensor(tmp_path, name):
    """`blk.03` and `blk.٣` (an Arabic-Indic three) used to load as block 3, the later tensor replacing the real
    one: a model no engine serves, which smoke then passed."""
    g = W.tiny_model(layers=4)
    g.tensors.append(W.Tensor(name, (16, 16), data=bytes(16 * 16 * 4)))
    path = g.write(tmp_path / "names.gguf")
    with pytest.raises(gguf_direct.GGUFError, match="tensor name 'blk.") as refused:
        load_target(path)
    assert isinstance(refused.value, InputError) and str(refused.value).startswith(f"{path}: ")


def test_smoke_on_the_command_line_refuses_a_target_whose_block_numbers_are_spelled_twice(tmp_path):
    drafter = fixtures.write_checkpoint(tmp_path / "drafter", fixtures.draft_config())
    g = W.tiny_model(layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=512)
    g.tensors.append(W.Tensor("blk.03.ffn_down.weight", (64, 128), data=bytes(64 * 128 * 4)))
    target = g.write(tmp_path / "target.gguf")
    result = run_cli(
        "smoke", str(drafter), "-t", str(target), "--limit", "1", "--max-new-tokens", "8", "--no-warmup",
        "--quiet", "--min-head-gain", "-1",
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "writes the number '03' with a leading zero" in result.stderr
    assert "Traceback" not in result.stderr and "Error:" not in result.stderr


# ------------------------------------------------------------------------------------------ check, then read


def test_nothing_is_dequantized_before_the_shapes_and_counts_are_checked(tmp_path, monkeypatch):
    def never(self, name):
        raise AssertionError(f"{name} was read before the header was checked")

    monkeypatch.setattr(gguf_direct.GGUFFile, "tensor", never)
    g = W.tiny_model(vocab=300).set("llama.feed_forward_length", W.U32, 64)
    with pytest.raises(gguf_direct.GGUFError, match="but its metadata makes it"):
        gguf_direct.read_target(g.write(tmp_path / "wide.gguf"), torch.float32)
    g = W.tiny_model(vocab=300).set("llama.block_count", W.U32, 3)
    with pytest.raises(
        gguf_direct.GGUFError, match="block_count is 3, but the file holds tensors for 2 blocks"
    ):
        gguf_direct.read_target(g.write(tmp_path / "deep.gguf"), torch.float32)


@pytest.mark.parametrize(
    "key, kind, value, item",
    [
        ("llama.attention.head_count", W.STR, "2", None),
        ("llama.rope.freq_base", W.STR, "1e4", None),
        ("llama.attention.layer_norm_rms_epsilon", W.U32, 0, None),
        ("tokenizer.ggml.eos_token_id", W.F32, 2.0, None),
        ("tokenizer.ggml.tokens", W.ARR, list(range(300)), W.I32),
        ("tokenizer.ggml.merges", W.ARR, [1, 2], W.U32),
        ("tokenizer.ggml.add_bos_token", W.STR, "false", None),
        ("general.alignment", W.STR, "32", None),
    ],
)
def test_wrongly_typed_metadata_is_a_gguf_error_never_another_exception(tmp_path, key, kind, value, item):
    path = W.tiny_model(vocab=300).set(key, kind, value, item).write(tmp_path / "typed.gguf")
    with pytest.raises(gguf_direct.GGUFError, match=f"'{key}' is a.*the GGUF spec gives"):
        load_target(path)


def test_token_types_stored_as_strings_are_refused_not_read_as_no_control_tokens(tmp_path):
    good = load_target(W.tiny_model(vocab=300).write(tmp_path / "good.gguf"), fast=False)
    assert good.tokenizer.encode("<|im_start|>") == [262]  # a control token, matched whole
    g = W.tiny_model(vocab=300).set("tokenizer.ggml.token_type", W.ARR, ["3"] * 300, W.STR)
    with pytest.raises(gguf_direct.GGUFError, match="'tokenizer.ggml.token_type' is an array of 300 string"):
        load_target(g.write(tmp_path / "strings.gguf"))


def test_attention_biases_on_a_llama_go_to_transformers_not_silently_dropped(tmp_path):
    g = W.tiny_model(vocab=300)
    g.tensors.insert(3, W.Tensor("blk.0.attn_q.bias", (16,)))
    with pytest.raises(gguf_direct.Unsupported, match="tensor 'blk.0.attn_q.bias'"):
        gguf_direct.read_target(g.write(tmp_path / "bias.gguf"), torch.float32)


# ------------------------------------------------------------------------------------------ chat templates

_TEMPLATE_PROBE = r"""
import json, sys, time
from lilicorr_runtime import load_target
target = load_target(sys.argv[1], fast=False)
results = {}
for name, template in json.loads(sys.argv[2]).items():
    started = time.perf_counter()
    try:
        target.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], chat_template=template, add_generation_prompt=True
        )
        outcome = "rendered"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    results[name] = [outcome, time.perf_counter() - started]
print(json.dumps(results))
"""

HOSTILE_TEMPLATES = {
    "nested loops": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "15 MB prompt": "{{ 'x' * 15000000 }}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "wide format": "{{ '{:>999999999}'.format(1) }}",
    "many pieces": "{% for i in range(100000) %}{{ 'y' * 64 }}{% endfor %}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
}


def test_a_hostile_chat_template_is_refused_within_its_bounds(tmp_path):
    """Nested loops used to hang for ever and a 15 MB prompt abort inside the tokenizer (Rust)."""
    path = W.tiny_model(vocab=300).write(tmp_path / "t.gguf")
    result = subprocess.run(
        [sys.executable, "-c", _TEMPLATE_PROBE, str(path), json.dumps(HOSTILE_TEMPLATES)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    for name, (outcome, seconds) in results.items():
        assert outcome.startswith("ChatTemplateError: the target's chat template cannot be rendered: "), name
        assert seconds < 3.0, (name, seconds)
    assert "ran for more than 2 s" in results["nested loops"][0]
    assert "over the limit of 1,048,576" in results["15 MB prompt"][0]


def test_the_bounded_template_renders_and_tokenizes_as_transformers_does(tmp_path):
    path = W.tiny_model(vocab=300).write(tmp_path / "t.gguf")
    ours = load_target(path, fast=False).tokenizer
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    chat = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "hell o"}]
    for kwargs in ({"tokenize": False}, {"add_generation_prompt": True}, {"return_dict": False}):
        assert ours.apply_chat_template(chat, **kwargs) == theirs.apply_chat_template(chat, **kwargs), kwargs
    assert ours.apply_chat_template([chat, chat[:1]], tokenize=False) == theirs.apply_chat_template(
        [chat, chat[:1]], tokenize=False
    )
    template = "{{ bos_token }}{% for m in messages %}{{ m.content | upper }}{% endfor %}{{ extra }}"
    assert ours.apply_chat_template(chat, chat_template=template, tokenize=False, extra="!") == (
        theirs.apply_chat_template(chat, chat_template=template, tokenize=False, extra="!")
    )
    with pytest.raises(ChatTemplateError, match="it fails: Roles must alternate"):
        ours.apply_chat_template(chat, chat_template="{{ raise_exception('Roles must alternate') }}")


# ------------------------------------------------------------------------------------------ smoke --engine


def test_engine_modes_tokenizer_is_the_direct_one_without_torch_or_the_converter(tmp_path):
    path = W.tiny_model(vocab=300).write(tmp_path / "t.gguf")
    direct = direct_gguf_tokenizer(str(path))
    from lilicorr_ckpt.smoke.tokenize import load_tokenizer

    converted = load_tokenizer(str(path))  # transformers' GGUF converter
    assert direct is not None and direct.eos_token_ids == converted.eos_token_ids == (263,)
    assert direct.record == converted.record and direct.vocab_size == converted.vocab_size == 300
    chat = [{"role": "user", "content": "hello world"}]
    ids = direct.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ids == converted.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert direct.tokenizer.decode(ids) == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    # the direct reader needs no torch: it is importable and runs in a process that cannot import it
    probe = (
        "import sys; sys.modules['torch'] = None\n"
        "from lilicorr_ckpt.smoke.target_files import direct_gguf_tokenizer\n"
        "t = direct_gguf_tokenizer(sys.argv[1]); print(t.tokenizer.encode('hello'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0 and result.stdout.strip() == "[258, 111]", result.stderr[-2000:]
    # a tokenizer it does not build exactly (SentencePiece) is left to transformers' converter: None
    spm = W.tiny_model(vocab=300).set("tokenizer.ggml.model", W.STR, "llama").write(tmp_path / "spm.gguf")
    assert direct_gguf_tokenizer(str(spm)) is None


# ------------------------------------------------------------------------------------------ budgets

_BUDGET_PROBE = textwrap.dedent(
    r"""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # an old reader fails here, not the machine
    from lilicorr_ckpt.checkpoint import resolve_target_spec
    from lilicorr_ckpt.errors import InputError
    from lilicorr_ckpt.smoke.target_files import check_target_files
    from lilicorr_runtime import load_target
    path, out = sys.argv[1], {}
    for step, run in (
        ("smoke", lambda: check_target_files(resolve_target_spec(path), path)),
        ("load_target", lambda: load_target(path, fast=False)),
    ):
        started = time.perf_counter()
        try:
            run()
            outcome = "loaded"
        except InputError as exc:
            outcome = "refused: " + str(exc)
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
        out[step] = [outcome, time.perf_counter() - started]
    # this process's own peak (ru_maxrss would start from the parent's, which forked it)
    status = open("/proc/self/status").read()
    out["maxrss_mb"] = int(status.split("VmHWM:")[1].split()[0]) / 1024
    print(json.dumps(out))
    """
)


def _vocab_only_spm():
    """A llama.cpp vocabulary-only file of a 7B Llama: its hyperparameters, its 32,000-token SentencePiece
    vocabulary, no tensors (transformers used to build the whole 7B model for it: 23 GB)."""
    g = W.tiny_model(hidden=4096, heads=32, kv_heads=32, ffn=11008, layers=32, weights=False)
    tokens = [f"tok{i}" for i in range(32000)]
    g.set("tokenizer.ggml.model", W.STR, "llama").set("tokenizer.ggml.tokens", W.ARR, tokens, W.STR)
    g.set("tokenizer.ggml.token_type", W.ARR, [1] * 32000, W.I32).drop("tokenizer.ggml.merges")
    return g.set("tokenizer.ggml.scores", W.ARR, [0.0] * 32000, W.F32).set("llama.vocab_size", W.U32, 32000)


def _aliased():
    """333 layers of 1024-wide tensors, 3,000 of them viewing the same 4 MB (a 12 GB load)."""
    g = W.tiny_model(hidden=1024, heads=8, kv_heads=8, ffn=1024, layers=333, vocab=300)
    first = "blk.0.attn_q.weight"
    for t in g.tensors:
        if t.shape == (1024, 1024) and t.name != first:
            t.offset = first
    return g


def _respelled():
    """A second blk.3 q projection, spelled blk.03 (it used to replace the real one)."""
    g = W.tiny_model(layers=4)
    g.tensors.append(W.Tensor("blk.03.attn_q.weight", (16, 16)))
    return g


HOSTILE = {
    "vocabulary only": (_vocab_only_spm, "holds no weights"),
    "block_count 200000": (
        lambda: W.tiny_model(vocab=20000).set("llama.block_count", W.U32, 200000),
        "llama.block_count is 200000",
    ),
    "3000 aliases": (_aliased, "share bytes"),
    "5M merges": (
        lambda: W.tiny_model().set("tokenizer.ggml.merges", W.ARR, ["h e"] * 5_000_000, W.STR),
        "is an array of 5000000 items",
    ),
    "blk.03": (_respelled, "leading zero"),
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak memory from /proc")
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_file_is_refused_within_5_s_and_1_gb_by_smoke_and_load_target(tmp_path, case):
    make, problem = HOSTILE[case]
    path = make().write(tmp_path / "hostile.gguf")
    assert path.stat().st_size < 100 << 20
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _BUDGET_PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for step in ("smoke", "load_target"):
        outcome, seconds = out[step]
        assert outcome.startswith(f"refused: {path}: ") and problem in outcome, (step, outcome[:600])
        assert "Traceback" not in outcome and "Error:" not in outcome
        assert seconds < 5.0, (step, seconds)
    assert out["maxrss_mb"] < 1024, out
