"""A record of what one speculative block computes, in every decode mode and loop, on the tiny random pairs the
runtime and smoke tests build (CPU): the tokens and block records of each decode, and the tensors of every block
in call order (draft logits, the candidates' top-K, the head's inputs and scores, the walk's tokens and q, the
context rows, the device loop's final state).

The hooks sit on the drafter instance and the ops' references, not on the decode code, so the same record is
taken before and after a reshape of decode/: `python tests/runtime/block_record.py OUT.pt` writes every tensor;
`test_block_record.py` compares a quick subset with `block_record.json` (tokens and records always, tensor
digests on the stack that recorded them)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script: runtime_helpers beside it
    sys.path.insert(0, str(HERE))

PROMPTS = [[1, 4, 9, 3, 7, 2, 11], [5, 5, 6], [2, 13, 8, 1, 0, 4, 4, 9, 12, 3, 6], [7]]


def digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(str((t.dtype, tuple(t.shape))).encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


class Recorder:
    def __init__(self) -> None:
        self.tensors: list[tuple[str, torch.Tensor]] = []

    def add(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors.append((name, value.detach().clone().cpu()))
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                self.add(f"{name}.{i}", v)


@contextmanager
def hooked(drafter: Any, rec: Recorder) -> Iterator[None]:
    """Record the drafter's logits, head and context rows, and the walks and top-K of ops/core.py."""
    from lilicorr_runtime.ops import core as ops_core

    undo: list[Callable[[], None]] = []

    def wrap(owner: Any, name: str, label: str, instance: bool) -> None:
        fn = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            rec.add(label, out)
            return out

        if instance:
            object.__setattr__(owner, name, wrapped)
            undo.append(lambda: object.__delattr__(owner, name))
        else:
            setattr(owner, name, wrapped)
            undo.append(lambda: setattr(owner, name, fn))

    for name in ("topk_lse_reference", "greedy_walk_reference", "sample_walk_reference"):
        wrap(ops_core, name, name.removesuffix("_reference"), instance=False)
    if drafter is not None:
        wrap(drafter, "logits", "draft_logits", instance=True)
        wrap(drafter, "project_context", "context", instance=True)
        if drafter.lilicorr is not None:

            def head_hook(module: Any, args: Any, output: Any) -> None:
                rec.add("head_in", args[:2])
                rec.add("head_out", output)

            handle = drafter.lilicorr.register_forward_hook(head_hook)
            undo.append(handle.remove)
    try:
        yield
    finally:
        for fn in reversed(undo):
            fn()


def _records(result: Any) -> list[list[int]]:
    return [[b.drafted, b.accepted, b.committed] for b in result.blocks]


def fast_pair(tmp: Path) -> tuple[Any, Any]:
    from runtime_helpers import ARCHS, small_config

    from lilicorr_ckpt import fixtures
    from lilicorr_ckpt.smoke.load import load_drafter
    from lilicorr_runtime.target.fast import FastTarget

    config_cls, model_cls = ARCHS["qwen3"]
    config = config_cls(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=16,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    target = FastTarget(model_cls(config).eval())
    path = fixtures.write_checkpoint(tmp / "fast", small_config(conv=(4, 16)), dtype="F32")
    return target, load_drafter(path)


def adapter_pair(tmp: Path) -> tuple[Any, Any]:
    from runtime_helpers import small_config, tiny_target

    from lilicorr_ckpt import fixtures
    from lilicorr_ckpt.smoke.load import load_drafter

    path = fixtures.write_checkpoint(tmp / "adapter", small_config(), dtype="F32")
    return tiny_target("llama"), load_drafter(path)


def smoke_pair(tmp: Path) -> tuple[Any, Any]:
    sys.path.insert(0, str(HERE.parent / "smoke"))
    from smoke_helpers import drafter_config, good_head, write_target

    from lilicorr_ckpt import fixtures
    from lilicorr_ckpt.smoke.load import load_drafter
    from lilicorr_runtime import load_target

    target = load_target(str(write_target(tmp / "target")), dtype=torch.float32, device="cpu")
    path = fixtures.write_checkpoint(
        tmp / "good-head", drafter_config(lilicorr_candidate_topk=16), mutate=good_head
    )
    return target, load_drafter(path)


def decode_cases(
    pair: tuple[Any, Any], label: str, loops: tuple[str, ...], batches: tuple[int, ...], new: int
) -> Iterator[tuple[str, Callable[[Recorder], dict[str, Any]]]]:
    """(case name, run) for every mode, greedy and sampled, each loop; the device loop at each batch size."""
    from lilicorr_runtime import SpeculativeDecoder

    target, drafter = pair
    for mode in ("head", "control", "ar"):
        for temperature in (0.0, 0.9):
            for loop in loops:
                for batch in batches if loop == "device" else (1,):
                    name = f"{label}/{mode}/T{temperature}/{loop}/b{batch}"

                    def run(
                        rec: Recorder,
                        mode: str = mode,
                        temperature: float = temperature,
                        loop: str = loop,
                        batch: int = batch,
                    ) -> dict[str, Any]:
                        d = None if mode == "ar" else drafter
                        decoder = SpeculativeDecoder(
                            target,
                            d,
                            mode=mode,
                            temperature=temperature,
                            seed=3,
                            loop=loop,  # type: ignore[arg-type]
                            keep_proposals=loop == "eager" and mode != "ar",
                        )
                        with hooked(d, rec):
                            if loop == "eager":
                                results = [decoder.generate(p, new) for p in PROMPTS]
                            else:
                                results = decoder.generate_many(PROMPTS, new, batch=batch)
                        for r in results:
                            for i, p in enumerate(r.proposals):
                                rec.add(
                                    f"proposal{i}",
                                    [
                                        p.hidden,
                                        p.logits,
                                        p.candidate_ids,
                                        p.candidate_log_probs,
                                        p.start,
                                        p.pairs,
                                    ],
                                )
                        for dl in decoder._loops.values():
                            for k in sorted(dl.state):
                                rec.add(f"state.{k}", dl.state[k])
                        return {
                            "tokens": [r.tokens for r in results],
                            "records": [_records(r) for r in results],
                        }

                    yield name, run


def draft_step_cases(pair: tuple[Any, Any]) -> Iterator[tuple[str, Callable[[Recorder], dict[str, Any]]]]:
    """The eager loop's static draft step (decode/draft_step.DraftStep, uncaptured on the CPU) for each walk."""
    from lilicorr_runtime.decode.draft_step import DraftStep

    target, drafter = pair
    for walk in ("greedy", "sample", "control"):

        def run(rec: Recorder, walk: str = walk) -> dict[str, Any]:
            with torch.inference_mode():
                target.reserve(64)
                target.reset()
                step = target.forward(torch.arange(11) % 13, drafter.target_layer_ids)
                cache = drafter.new_cache(capacity=64)
                context = drafter.project_context(step.features[None])
                drafter.append_context(cache, context)
                n = drafter.block_size - 1
                uniforms = torch.rand(1, n, generator=torch.Generator().manual_seed(0))
                s = DraftStep(
                    drafter, cache, target.embed, target.logits, num_tokens=n, walk=walk, use_graph=False
                )
                with hooked(drafter, rec):
                    for anchor in (1, 5, 9):
                        out = s.run(torch.tensor([anchor]), context[:, -1], cache.length, uniforms, 0.7)
                        for k in sorted(out):
                            rec.add(f"out.{k}", out[k])
            return {}

        yield f"draft_step/{walk}", run


def all_cases(tmp: Path, quick: bool = False) -> Iterator[tuple[str, Callable[[Recorder], dict[str, Any]]]]:
    fast = fast_pair(tmp)
    if quick:
        yield from decode_cases(fast, "fast", ("eager", "device"), (3,), 8)
        yield from draft_step_cases(fast)
        return
    yield from decode_cases(fast, "fast", ("eager", "device"), (1, 2, 3), 16)
    yield from draft_step_cases(fast)
    yield from decode_cases(adapter_pair(tmp), "adapter", ("eager",), (1,), 16)
    yield from decode_cases(smoke_pair(tmp), "smoke", ("eager", "device"), (1, 2), 20)


def record(tmp: Path, quick: bool = False) -> dict[str, dict[str, Any]]:
    """case -> {"tokens", "records", "tensors": [(name, tensor)]}."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for name, run in all_cases(tmp, quick):
            rec = Recorder()
            result = run(rec)
            out[name] = {**result, "tensors": rec.tensors}
        return out
    finally:
        torch.set_num_threads(threads)


def stack() -> str:
    """What a tensor digest depends on beyond the code: torch's version and the CPU kernels it picked."""
    return f"torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}"


def summary(recorded: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """case -> tokens, records, the number of tensors and one digest over all of them in call order."""
    cases = {}
    for name, case in recorded.items():
        h = hashlib.sha256()
        for n, t in case["tensors"]:
            h.update(f"{n}={digest(t)};".encode())
        cases[name] = {
            "tokens": case.get("tokens"),
            "records": case.get("records"),
            "tensors": len(case["tensors"]),
            "digest": h.hexdigest()[:32],
        }
    return {"stack": stack(), "cases": cases}


def dumps(summarized: dict[str, Any]) -> str:
    """The summary as JSON, one line per case."""
    import json

    lines = [f" {json.dumps(name)}: {json.dumps(case)}" for name, case in summarized["cases"].items()]
    head = json.dumps(summarized["stack"])
    body = ",\n".join(lines)
    return f'{{"stack": {head}, "cases": {{\n{body}\n}}}}\n'


if __name__ == "__main__":
    import tempfile

    quick = "--quick" in sys.argv
    dest = Path([a for a in sys.argv[1:] if not a.startswith("--")][0])
    with tempfile.TemporaryDirectory() as tmp:
        recorded = record(Path(tmp), quick)
    torch.save(recorded, dest)
    dest.with_suffix(".json").write_text(dumps(summary(recorded)))
    print(sum(len(c["tensors"]) for c in recorded.values()), "tensors in", len(recorded), "cases")
