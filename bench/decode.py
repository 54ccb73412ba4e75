"""Where a decoding block's time goes on the device-resident loop, and the speed-up it implies.

    python bench/decode.py --target GGUF --drafter examples/smollm2-lilicorr [--prompts 16] [--batches 1,32]
    python bench/decode.py --random qwen3-8b [--batches 1,32]   # random Qwen3-8B-shaped target + 8B-geometry drafter
    python bench/decode.py --random smollm2 --drafter examples/smollm2-lilicorr   # random SmolLM2-shaped target

For each target and batch size it measures, per block (one graph replay each, CUDA events, median):

    draft     the draft step: backbone over the context, candidates, head, walk (head arm)
    verify    the target step over [anchor, d_1..d_n] with the feature taps
    book      acceptance, commit, project_context and the draft-cache append
    block     the whole block as the loop replays it (one graph)
    host      the loop's wall time per block (its steps, and the wait for the block a step launched ahead that a
              finished request's copy-out waits for) minus the block's GPU time: what the host adds to the GPU's
              time (the loop launches the next block before it waits for the current one, so this is what of the
              launch, the one sync and Python the GPU could not overlap). Admissions are not in it (see prefill)
    host cpu  the loop's own host time per block (step() minus its wait for the GPU): Python, launch, copy
    prefill   per request, the wall time of its admission: the target's prefill and, in the head arm, the
              drafter's context of the prompt, host and GPU (each group of admissions is timed from its first
              admit to a sync just before the next block is launched, so its GPU work lands here and not in the
              next step's wait; the GPU is idle when a group starts, since a finished request's copy-out syncs)
    other     per block, what the wall time holds beyond the steps and the admissions: the copy-out of finished
              requests, generate_many's own Python (the model leaves it out; it should be small)
    ar        one target-only block (one token per request) on the same loop; ar_ms_per_step is its block plus
              host, without the prefills

and the speed-up model

    tau * (c_ar + p_ar) / (c_draft + c_verify + c_book + c_host + p_head * tau / tau_measured)

with c_ar the ar arm's ms per step and p_ar, p_head each arm's prefill per block (prefill per request x requests
/ the arm's blocks; a head arm at another tau runs tau_measured / tau as many blocks for the same prefills). tau
is the head arm's measured acceptance (for the random target, whose drafter accepts nothing, the model is
evaluated with the tau measured on the real target, or --tau): what the same drafter would give against this
target. The measured speed-up (tokens/s of the loop against its ar arm, whole wall times: the prefills
included) is printed beside it.

Until 2026-12-07 host and ar_ms_per_step held whatever prefill GPU work a step happened to wait for, and the model
had no prefill term: a group of admissions is queued on the GPU without a sync, so the AR arm's prefills were
waited for in the next step (at batch 32 all 32 prefills in the first of 31 steps, ~10 ms a step on an 8B
target), while the head arm's mostly fell outside its steps, inside its wall time (its admissions, which also
launch the drafter's context of the prompt eagerly, evidently wait for the GPU). The model counted the AR arm's
prefills and not the head arm's: 20 % high at batch 32 on an H100.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch

from lilicorr_runtime import SpeculativeDecoder
from lilicorr_runtime import rows as rows_module
from lilicorr_runtime.decode.device_loop import DecodeLoop

CHAT = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in two sentences why the sky is blue.",
    "What is 17 * 23? Show your steps.",
    "List three uses of a hash map.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Write a haiku about autumn rain.",
    "How do I reverse a linked list in C?",
    "What is the capital of Australia, and why is it not Sydney?",
]


CUDA = torch.cuda.is_available()
PROFILE = False  # --profile


def cuda_median(fn, iters: int = 30, warmup: int = 3) -> float:
    """Median seconds per call: CUDA events on the GPU; on the CPU (a dry run of this script) the host clock."""
    for _ in range(warmup):
        fn()
    if not CUDA:
        times = []
        for _ in range(iters):
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


class _Eager:
    def __init__(self, fn):
        self.replay = fn


def capture(fn):
    """(a graph whose replay runs fn, fn's outputs); on the CPU an object whose replay calls fn."""
    if not CUDA:
        return _Eager(fn), fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def profile_replay(label: str, replay) -> None:
    """Print the kernels of one replay of a graph: how many, their summed time against the span from the first
    kernel's start to the last one's end (the rest is launch latency between kernels), and the costliest names."""
    replay()
    sync()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        replay()
        sync()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not events:
        print(f"  {label}: no kernel events recorded", flush=True)
        return
    busy = sum(e.time_range.end - e.time_range.start for e in events)
    span = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        by_name[e.name[:70]].append(e.time_range.end - e.time_range.start)
    print(
        f"  {label}: {len(events)} kernels, {busy:.1f} us of kernel time in a {span:.1f} us span", flush=True
    )
    for name, times in sorted(by_name.items(), key=lambda t: -sum(t[1]))[:14]:
        print(
            f"    {len(times):4d} x {sum(times) / len(times):7.2f} us = {sum(times):8.1f} us  {name}",
            flush=True,
        )


def pieces(loop: DecodeLoop, profile: bool = False) -> dict[str, float]:
    """GPU seconds of the block's pieces, each its own graph, over the loop's current state with every slot set
    inactive (the same work, nothing committed, so the state stays put between replays); with `profile`, each
    piece's kernels are printed too."""
    saved = {k: v.clone() for k, v in loop.state.items()}
    loop.state["active"].zero_()
    out: dict[str, float] = {}
    with torch.inference_mode():
        if loop.drafter is not None:
            draft_graph, drafted = capture(loop._draft)
            out["draft"] = cuda_median(draft_graph.replay)
            if profile:
                profile_replay("draft", draft_graph.replay)
        else:
            drafted = loop._draft()
        verify_graph, verified = capture(lambda: loop._verify(drafted))
        out["verify"] = cuda_median(verify_graph.replay)
        book_graph, _ = capture(lambda: loop._accept(verified))
        out["book"] = cuda_median(book_graph.replay)
        if profile:
            profile_replay("verify", verify_graph.replay)
            profile_replay("book", book_graph.replay)
        block_graph, _ = capture(loop._body)
        out["block"] = cuda_median(block_graph.replay)
    for k, v in loop.state.items():
        v.copy_(saved[k])
    return out


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


class _Accounting:
    """Times a DecodeLoop's wall apart while `generate_many` runs it: its steps, its admissions (the prefills) and
    the rest. The loop's own methods are wrapped on the instance (the runtime is not changed); the only device
    syncs added are where the GPU is idle anyway or the loop is about to wait for it:

    - an admission group (the admits between two steps) starts after a sync: the copy-out of the request that
      freed the slot has synced already (or nothing has run yet), so it waits for nothing;
    - it ends with a sync just before the next step launches its block, so the prefills' GPU work is timed in
      the group and not in the step that would otherwise wait for it (the GPU idles for that one launch);
    - a finished request's copy-out (`take`, which syncs at once) waits first for the block the last step
      launched ahead, and that wait is a step's (it is a block of the loop).
    """

    def __init__(self, loop: DecodeLoop):
        self.loop = loop
        self.step_s = 0.0  # in step(), and the copy-outs' waits for a block launched ahead
        self.prefill_s = 0.0  # admission groups, from the first admit to the sync before the next step
        self.admitted = 0
        self._group: float | None = None  # when the open admission group began

    def _close(self) -> None:
        if self._group is not None:
            sync()
            self.prefill_s += time.perf_counter() - self._group
            self._group = None

    def __enter__(self) -> _Accounting:
        loop = self.loop
        admit, step, take = loop.admit, loop.step, loop.take

        def timed_admit(slot, prompt, max_new_tokens):
            if self._group is None:
                sync()
                self._group = time.perf_counter()
            self.admitted += 1
            return admit(slot, prompt, max_new_tokens)

        def timed_step():
            self._close()
            begin = time.perf_counter()
            try:
                return step()
            finally:
                self.step_s += time.perf_counter() - begin

        def timed_take(slot):
            self._close()  # a request that ended at its admission: the prefill is the group's
            begin = time.perf_counter()
            sync()
            self.step_s += time.perf_counter() - begin
            return take(slot)

        loop.admit, loop.step, loop.take = timed_admit, timed_step, timed_take  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        self._close()
        for name in ("admit", "step", "take"):
            del self.loop.__dict__[name]


def run_loop(decoder: SpeculativeDecoder, prompts: list[list[int]], max_new: int, batch: int, eos) -> dict:
    """One timed `generate_many` over `prompts` on the decoder's loop for `batch` slots. Its wall time is
    steps * step_s + prefill_s + other_s exactly (see _Accounting): step_s per block the loop ran, prefill_s
    over every admission, other_s what is left (copy-outs, Python around the loop)."""
    rows = max(len(p) for p in prompts) + max_new + decoder.num_tokens + 2
    loop = decoder.device_loop(
        min(batch, len(prompts)), rows, max_new, set(eos)
    )  # the loop generate_many runs
    steps, host_seconds = loop.steps, loop.host_seconds
    sync()
    with _Accounting(loop) as accounting:
        begin = time.perf_counter()
        results = decoder.generate_many(prompts, max_new, eos, batch=batch)
        accounting._close()
        sync()
        wall = time.perf_counter() - begin
    assert accounting.admitted == len(prompts), "generate_many ran another loop than the one timed"
    blocks = max(sum(len(r.blocks) for r in results), 1)
    tokens = sum(len(r.tokens) for r in results)
    committed = sum(b.committed for r in results for b in r.blocks)
    steps = max(loop.steps - steps, 1)  # blocks the loop ran (each serves every slot)
    return {
        "wall": wall,
        "tokens": tokens,
        "blocks": blocks,
        "requests": accounting.admitted,
        "tau": committed / blocks,
        "steps": steps,
        "step_s": accounting.step_s / steps,
        "host_cpu_s": (loop.host_seconds - host_seconds) / steps,
        "prefill_s": accounting.prefill_s,
        "other_s": wall - accounting.step_s - accounting.prefill_s,
        "tok_s": tokens / wall,
        "loop": loop,
    }


def bench(
    label: str,
    target,
    drafter,
    prompts: list[list[int]],
    batches: list[int],
    max_new: int,
    eos,
    tau_override: float | None,
    rows: list,
) -> None:
    for batch in batches:
        reqs = (prompts * ((batch + len(prompts) - 1) // len(prompts) + 1))[: max(batch, len(prompts))]
        arms = {}
        for arm in ("head", "ar"):
            decoder = SpeculativeDecoder(target, None if arm == "ar" else drafter, mode=arm, loop="device")
            need = max(len(p) for p in reqs) + max_new + decoder.num_tokens + 2
            decoder.device_loop(
                batch, need, max_new, set(eos)
            )  # sized for every request: never rebuilt below
            # warm-up on every request the measured run decodes, so that each prompt's prefill bucket is captured
            # (and compiled) here, not in the measured wall time (warmed up on the first `batch` requests alone,
            # batch 1 measured 15 % below the model on an H100, batch 32 5 %)
            run_loop(decoder, reqs, max_new, batch, eos)
            measured = run_loop(decoder, reqs, max_new, batch, eos)
            loop = measured["loop"]
            # a realistic state for the pieces: every slot admitted with a request
            for slot in range(batch):
                loop.admit(slot, torch.tensor(reqs[slot % len(reqs)]), max_new)
            if PROFILE and CUDA:
                print(f"{label}, batch {batch}, {arm} arm: kernels per piece", flush=True)
            arms[arm] = (measured, pieces(loop, profile=PROFILE and CUDA))
            for slot in range(batch):
                loop.state["active"][slot] = False
                loop._host_active[slot] = False
        head, head_pieces = arms["head"]
        ar, ar_pieces = arms["ar"]
        host = head["step_s"] - head_pieces["block"]  # per block: what the loop's wall time adds to the GPU's
        ar_host = ar["step_s"] - ar_pieces["block"]
        tau = tau_override if tau_override is not None else head["tau"]
        c_ar = ar["step_s"]
        prefill, ar_prefill = head["prefill_s"] / head["steps"], ar["prefill_s"] / ar["steps"]  # per block
        model = speedup_model(
            tau,
            head["tau"],
            head_pieces["draft"] + head_pieces["verify"] + head_pieces["book"] + max(host, 0.0),
            prefill,
            c_ar,
            ar_prefill,
        )
        measured = head["tok_s"] / ar["tok_s"]
        rows.append(
            {
                "target": label,
                "batch": batch,
                "requests": head["requests"],
                "tau": round(head["tau"], 3),
                "tau_model": round(tau, 3),
                "draft_ms": head_pieces["draft"] * 1e3,
                "verify_ms": head_pieces["verify"] * 1e3,
                "book_ms": head_pieces["book"] * 1e3,
                "block_ms": head_pieces["block"] * 1e3,
                "host_ms": host * 1e3,
                "host_cpu_ms": head["host_cpu_s"] * 1e3,
                "prefill_ms": head["prefill_s"] / max(head["requests"], 1) * 1e3,  # per request
                "prefill_ms_per_step": prefill * 1e3,
                "other_ms": head["other_s"] / head["steps"] * 1e3,
                "syncs_per_block": 1,
                "steps": head["steps"],
                "wall_s": head["wall"],
                "ar_block_ms": ar_pieces["block"] * 1e3,
                "ar_ms_per_step": c_ar * 1e3,
                "ar_host_ms": ar_host * 1e3,
                "ar_prefill_ms": ar["prefill_s"] / max(ar["requests"], 1) * 1e3,
                "ar_prefill_ms_per_step": ar_prefill * 1e3,
                "ar_other_ms": ar["other_s"] / ar["steps"] * 1e3,
                "ar_steps": ar["steps"],
                "ar_wall_s": ar["wall"],
                "ar_tok_s": ar["tok_s"],
                "head_tok_s": head["tok_s"],
                "speedup_measured": measured,
                "speedup_model": model,
            }
        )
        print(json.dumps(rows[-1]), flush=True)


def speedup_model(
    tau: float, tau_measured: float, c_head: float, p_head: float, c_ar: float, p_ar: float
) -> float:
    """tau * (c_ar + p_ar) / (c_head + p_head * tau / tau_measured): the time an ar arm spends per token of a slot
    (a block and its share of the prefills) against the head arm's, which runs one block per tau tokens (the
    prefills, one per request, do not shrink with tau: at tau the head arm runs tau_measured / tau as many blocks
    as measured, each carrying tau / tau_measured of the prefill it carried). c_*: seconds per block, host
    included; p_*: prefill seconds per block of that arm as measured."""
    return tau * (c_ar + p_ar) / (c_head + p_head * tau / max(tau_measured, 1e-9))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", help="a target (GGUF, HF directory)")
    parser.add_argument("--drafter", help="its drafter checkpoint")
    parser.add_argument(
        "--random",
        metavar="SHAPE",
        help="qwen3-8b: random target + 8B-geometry random drafter; smollm2: with --drafter",
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--tau", type=float, default=None, help="tau for the model on a random target")
    parser.add_argument(
        "--runtime", default="vllm", help="the runtime the drafter is loaded under (the bundled one: vllm)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print each piece's kernels (count, time, span, names)"
    )
    parser.add_argument(
        "--grouping",
        default="",
        help="with --random: run the batches once per setting of the step GEMMs' row grouping, side by side: "
        "G (at most G 16-row tiles a grouped program; 1: every call of fewer than WIDE_ROWS rows on the 16-row "
        "kernel) or G/W (and the wide kernel from W rows instead of WIDE_ROWS), e.g. 1,4,4/1024",
    )
    args = parser.parse_args(argv)
    global PROFILE
    PROFILE = args.profile
    batches = [int(b) for b in args.batches.split(",")]
    rows: list = []
    device, dtype = ("cuda", torch.bfloat16) if CUDA else ("cpu", torch.float32)
    if not CUDA:  # a dry run decodes tiny models token by token: more intra-op threads only contend
        torch.set_num_threads(1)
    print(
        f"{time.strftime('%Y-%m-%d')}  {torch.cuda.get_device_name() if CUDA else 'cpu (a dry run)'}  "
        f"torch {torch.__version__}",
        flush=True,
    )
    if args.target:
        from lilicorr_ckpt import load_drafter
        from lilicorr_runtime import load_target

        target = load_target(args.target, dtype=dtype, device=device)
        drafter = load_drafter(args.drafter, dtype=dtype, device=device, runtime=args.runtime)
        run_real(
            target, drafter, args.target.rsplit("/", 1)[-1], batches, args.max_new_tokens, args.prompts, rows
        )
    if args.random:
        import importlib.util
        import pathlib

        spec = importlib.util.spec_from_file_location(
            "bench_target", pathlib.Path(__file__).with_name("target.py")
        )
        bench_target = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_target)
        target = bench_target.random_target(args.random, "cuda")
        if args.drafter:
            from lilicorr_ckpt import load_drafter

            drafter = load_drafter(args.drafter, dtype=torch.bfloat16, device="cuda", runtime=args.runtime)
        else:
            drafter = random_drafter(target)
        generator = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(0, target.vocab_size, (48 + 8 * i,), generator=generator).tolist()
            for i in range(args.prompts)
        ]
        tau = args.tau if args.tau is not None else (rows[0]["tau"] if rows else None)
        for setting in args.grouping.split(",") if args.grouping else [""]:
            label = f"random {args.random}"
            if setting:
                from lilicorr_runtime.ops import step_triton

                groups, _, wide = setting.partition("/")
                step_triton.MAX_GROUPS = int(groups)
                step_triton.WIDE_ROWS = int(wide) if wide else rows_module.WIDE
                label += f" groups<={groups} wide>={step_triton.WIDE_ROWS}"
            bench(label, target, drafter, prompts, batches, args.max_new_tokens, [], tau, rows)
    print_table(rows)
    return rows


def print_table(rows: list) -> None:
    """The rows of `bench`, one line each."""
    header = [
        "target",
        "batch",
        "tau",
        "draft_ms",
        "verify_ms",
        "book_ms",
        "block_ms",
        "host_ms",
        "host_cpu_ms",
        "prefill_ms",
        "other_ms",
        "ar_ms_per_step",
        "ar_prefill_ms",
        "head_tok_s",
        "ar_tok_s",
        "speedup_measured",
        "tau_model",
        "speedup_model",
    ]
    print("\n" + " ".join(f"{h:>14}" for h in header))
    for row in rows:
        print(
            " ".join(f"{row[h]:>14.3f}" if isinstance(row[h], float) else f"{row[h]!s:>14}" for h in header)
        )


def chat_prompts(target, count: int) -> list[list[int]]:
    tok = target.tokenizer
    return [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": c}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for c in (CHAT * 4)[:count]
    ]


def run_real(target, drafter, label: str, batches: list[int], max_new: int, count: int, rows: list) -> None:
    """`bench` on a real target and its drafter, over `count` chat prompts."""
    bench(
        label,
        target,
        drafter,
        chat_prompts(target, count),
        batches,
        max_new,
        list(target.eos_token_ids),
        None,
        rows,
    )


def random_drafter(target):
    """A random-weight drafter of the paper's Qwen3-8B geometry (5 layers, LiLiCorr head) for `target`."""
    from lilicorr_ckpt import fixtures
    from lilicorr_ckpt.checkpoint.config import parse_config
    from lilicorr_ckpt.checkpoint.geometry import resolve_geometry
    from lilicorr_runtime.model.drafter import Drafter, backbone_spec

    config = parse_config(json.dumps(fixtures.qwen3_8b_drafter_config(5)).encode()).config
    g = resolve_geometry(config)
    torch.manual_seed(0)
    return Drafter(g, backbone_spec(config, g.num_layers)).place(torch.bfloat16, "cuda").eval()


if __name__ == "__main__":
    main()
