"""Where a request's time goes on the device loop at batch 1, as smoke runs it: admission, blocks, the result.

    python bench/admission.py --target GGUF --drafter examples/smollm2-lilicorr [--probes 48] [--profile FILE]

Decodes the first N bundled smoke probes (their chat template, 128 new tokens) at batch 1 with the three arms
interleaved probe by probe as `smoke --batch 1` runs them, after one warm-up request per arm, and prints per arm:

    tok/s         emitted tokens / the requests' wall time (admission to result, as smoke's report counts it)
    fit           wall = a·blocks + b + c·prompt tokens over the requests (least squares): a is the cost of a
                  block, b the fixed cost of a request, c its cost per prompt token
    admit ms      a second pass with a sync after each admission: admit() until its GPU work has run
    host us/blk   the loop's own host time per block (where the loop records it)

With --profile FILE, a third pass runs a few requests per arm under torch.profiler (the loop's admit, step and
take marked as ranges) and writes the tables by CPU time, self CPU time and CUDA time to FILE. It runs on any version of the
device loop (it uses the decoder's public interface and DecodeLoop.admit/step/take only).
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np
import torch

from lilicorr_runtime import SpeculativeDecoder
from lilicorr_runtime.decode.device_loop import DecodeLoop

ARMS = ("head", "control", "ar")


def load(target_path: str, drafter_path: str, probes: int):
    from lilicorr_ckpt import load_drafter
    from lilicorr_ckpt.smoke.probes import load_probes
    from lilicorr_ckpt.smoke.tokenize import tokenize_probes
    from lilicorr_runtime import load_target

    begin = time.perf_counter()
    target = load_target(target_path, dtype=torch.bfloat16, device="cuda")
    loaded = time.perf_counter() - begin
    drafter = load_drafter(drafter_path, dtype=torch.bfloat16, device="cuda", runtime="vllm")
    selected = load_probes("code,chat,math", 0)
    # spread over the categories, as smoke --limit does, but capped at `probes` in all
    step = max(1, len(selected) // probes)
    selected = selected[::step][:probes]
    prompts, _ = tokenize_probes(target.tokenizer, selected, list(target.eos_token_ids))
    return target, drafter, prompts, loaded


def run_pass(decoders, prompts, max_new, eos) -> dict[str, list]:
    out: dict[str, list] = {arm: [] for arm in decoders}
    for ids in prompts:
        for arm, decoder in decoders.items():
            out[arm].append(decoder.generate(ids, max_new, eos_token_ids=eos))
    torch.cuda.synchronize()
    return out


def fit(results) -> tuple[float, float, float]:
    x = np.array([[len(r.blocks), 1.0, r.prompt_tokens] for r in results])
    y = np.array([r.wall_time_s for r in results])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--probes", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--profile", type=Path, default=None, help="write torch.profiler tables to this file")
    parser.add_argument("--profile-requests", type=int, default=3)
    args = parser.parse_args()
    target, drafter, prompts, loaded = load(args.target, args.drafter, args.probes)
    eos = list(target.eos_token_ids)
    print(
        f"{time.strftime('%Y-%m-%d')}  {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"target load {loaded:.1f} s  {len(prompts)} probes, prompt tokens "
        f"{min(map(len, prompts))}-{max(map(len, prompts))} (mean {np.mean([len(p) for p in prompts]):.0f})",
        flush=True,
    )
    decoders = {arm: SpeculativeDecoder(target, None if arm == "ar" else drafter, mode=arm) for arm in ARMS}
    begin = time.perf_counter()
    longest = max(prompts, key=len)
    for decoder in decoders.values():
        decoder.generate(longest, args.max_new_tokens, eos_token_ids=eos)
    torch.cuda.synchronize()
    print(
        f"warm-up (one request per arm, captures included): {time.perf_counter() - begin:.2f} s", flush=True
    )

    begin = time.perf_counter()
    timed = run_pass(decoders, prompts, args.max_new_tokens, eos)
    wall = time.perf_counter() - begin
    loops = {arm: next(iter(d._loops.values())) for arm, d in decoders.items()}
    host = {arm: getattr(loop, "host_seconds", None) for arm, loop in loops.items()}  # absent on older loops

    # second pass: the admission alone (a sync after it)
    admit_times: list[float] = []
    original_admit = DecodeLoop.admit

    @functools.wraps(original_admit)
    def timed_admit(self, *a, **k):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = original_admit(self, *a, **k)
        torch.cuda.synchronize()
        admit_times.append(time.perf_counter() - t0)
        return out

    per_arm_admit: dict[str, float] = {}
    DecodeLoop.admit = timed_admit
    try:
        for arm, decoder in decoders.items():
            admit_times.clear()
            for ids in prompts[: min(16, len(prompts))]:
                decoder.generate(ids, args.max_new_tokens, eos_token_ids=eos)
            per_arm_admit[arm] = float(np.median(admit_times))
    finally:
        DecodeLoop.admit = original_admit

    print(f"\ntimed pass: {wall:.2f} s for {len(prompts)} probes x 3 arms")
    print(
        f"{'arm':>8} {'tok/s':>8} {'tau':>6} {'a ms/blk':>9} {'b ms/req':>9} {'c ms/tok':>9} "
        f"{'admit ms':>9} {'host us/blk':>12}"
    )
    ar_tps = None
    rows = {}
    for arm in reversed(ARMS):
        results = timed[arm]
        tokens = sum(len(r.tokens) for r in results)
        seconds = sum(r.wall_time_s for r in results)
        blocks = sum(len(r.blocks) for r in results)
        committed = sum(b.committed for r in results for b in r.blocks)
        a, b, c = fit(results)
        loop = loops[arm]
        host_us = f"{1e6 * host[arm] / max(loop.steps, 1):12.1f}" if host[arm] is not None else f"{'-':>12}"
        rows[arm] = (tokens / seconds, committed / max(blocks, 1), a, b, c, host_us)
        if arm == "ar":
            ar_tps = tokens / seconds
    for arm in ARMS:
        tps, tau, a, b, c, host_us = rows[arm]
        print(
            f"{arm:>8} {tps:8.1f} {tau:6.3f} {a * 1e3:9.3f} {b * 1e3:9.2f} {c * 1e3:9.4f} "
            f"{per_arm_admit[arm] * 1e3:9.2f} {host_us}"
        )
    for arm in ("head", "control"):
        print(f"{arm} / ar: {rows[arm][0] / ar_tps:.3f}x")
    same = all(
        [r.tokens for r in timed[arm]] == [r.tokens for r in timed["ar"]] for arm in ("head", "control")
    )
    print(f"speculative tokens equal target-only greedy tokens: {same}")

    if args.profile is not None:
        originals = {name: getattr(DecodeLoop, name) for name in ("admit", "step", "take")}

        def marked(name, fn):
            @functools.wraps(fn)
            def inner(self, *a, **k):
                with torch.profiler.record_function(f"loop.{name}"):
                    return fn(self, *a, **k)

            return inner

        for name, fn in originals.items():
            setattr(DecodeLoop, name, marked(name, fn))
        try:
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                for ids in prompts[: args.profile_requests]:
                    for decoder in decoders.values():
                        with torch.profiler.record_function("request"):
                            decoder.generate(ids, args.max_new_tokens, eos_token_ids=eos)
                torch.cuda.synchronize()
        finally:
            for name, fn in originals.items():
                setattr(DecodeLoop, name, fn)
        averages = prof.key_averages()
        tables = [
            f"by {sort}:\n" + averages.table(sort_by=sort, row_limit=45, max_name_column_width=70)
            for sort in ("cpu_time_total", "self_cpu_time_total", "cuda_time_total")
        ]
        args.profile.write_text("\n\n".join(tables))
        print("\nprofile, by CPU time total (first rows):")
        print(averages.table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=50))


if __name__ == "__main__":
    main()
