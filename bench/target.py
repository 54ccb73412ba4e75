"""Target-side speed: target-only greedy tok/s, kernels per step and the step latency by row count, transformers'
eager forward against the fast path (eager and CUDA-graph replay), next to the weight-read floor.

    python bench/target.py TARGET [--tokens 256] [--device cuda] [--skip-transformers]
    python bench/target.py --random qwen3-8b        # a random-weight Qwen3-8B-shaped target (bf16, no download)
    python bench/target.py --random smollm2         # a random-weight SmolLM2-135M-shaped target

The floor is (bytes of the weights one decode step reads) / (this device's copy bandwidth): a copy of X bytes
moves 2X bytes through HBM (read + write) in the measured time, and a step that only reads its weights streams
at that same total rate, so reading W bytes takes W / bandwidth (not W / (bandwidth / 2)). All rows are measured
in the same process. "kernels/step" counts the CUDA kernels (and memcpy/memset) one eager one-token step
launches, which is what its graph replays.
"""

from __future__ import annotations

import argparse
import time

import torch

from lilicorr_runtime.target.fast import FastTarget, TargetModel, tokens_per_second
from lilicorr_runtime.target.load import load_target

PROMPT = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    19161,
    260,
    2914,
    282,
    1345,
    30,
    2,
    198,
    1,
    520,
    9531,
    198,
]

QWEN3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}

SMOLLM2_135M = {  # SmolLM2-135M-Instruct's geometry (a Llama)
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}


def random_target(name: str, device: str) -> FastTarget:
    """A random-weight target of a known shape, built on the device in bf16 (no checkpoint needed)."""
    import transformers

    if name == "qwen3-8b":
        config = transformers.Qwen3Config(**QWEN3_8B)
    elif name == "smollm2":
        config = transformers.LlamaConfig(**SMOLLM2_135M)
    else:
        raise SystemExit(f"unknown random target {name!r} (qwen3-8b, smollm2)")
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    with (
        torch.no_grad()
    ):  # a plausible scale: random N(0, 0.02) weights keep activations finite over 36 layers
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    model.generation_config.eos_token_id = None
    return FastTarget(model.eval())


def copy_bandwidth(device: str) -> float:
    """Bytes moved per second (read + written) by a 1 GiB device-to-device copy."""
    if device != "cuda":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - begin)


def step_latency(target: TargetModel, rows: int, taps, repeats: int = 50) -> float:
    """Seconds per forward of `rows` rows (with taps) after the prompt, the rows cropped again each time."""
    target.reserve(len(PROMPT) + rows * (repeats + 2) + 1)
    target.reset()
    target.forward(torch.tensor(PROMPT), taps)
    block = (torch.arange(rows) + 100) % target.vocab_size
    for _ in range(3):
        target.forward(block, taps)
        target.crop(len(PROMPT))
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(repeats):
        step = target.forward(block, taps)
        target.crop(len(PROMPT))
    _ = step.logits[-1, 0].item()
    return (time.perf_counter() - begin) / repeats


def kernels_per_step(target: FastTarget) -> int:
    """CUDA kernels (and memcpy/memset) an eager one-token step launches: the nodes its graph replays."""
    eager = FastTarget(target.model, cuda_graphs=False)
    eager.reserve(len(PROMPT) + 4)
    eager.reset()
    eager.forward(torch.tensor(PROMPT))
    eager.forward(torch.tensor([5]))  # compiles / autotunes outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eager.forward(torch.tensor([7]))
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", nargs="?")
    parser.add_argument(
        "--random", metavar="SHAPE", help="a random-weight target instead: qwen3-8b or smollm2"
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rows", default="1,8,16", help="step sizes to time (rows per forward)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--skip-transformers", action="store_true", help="leave out transformers' eager forward"
    )
    parser.add_argument(
        "--decode-drafter",
        metavar="DRAFTER",
        help="then run bench/decode.py's blocks on the same loaded target with this drafter (one load for both)",
    )
    parser.add_argument("--decode-batches", default="1,32")
    parser.add_argument(
        "--gemm-rows",
        metavar="ROWS",
        help="with --random: then the step GEMMs at these row counts, tile and wide kernels against cuBLAS "
        "(bench/wide_gemm.py's table), e.g. 64,256,1024,2048",
    )
    args = parser.parse_args()
    if args.gemm_rows and not args.random:
        parser.error("--gemm-rows needs --random SHAPE (the GEMM shapes of bench/wide_gemm.py)")
    if not args.target and not args.random:
        parser.error("give TARGET or --random SHAPE")
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.random:
        fast = random_target(args.random, args.device)
        name = f"random {args.random}"
    else:
        fast = load_target(args.target, dtype=dtype, device=args.device, fast=True)
        name = args.target
    global PROMPT
    PROMPT = [t % fast.vocab_size for t in PROMPT]  # SmolLM2's chat ids; folded for smaller vocabularies
    paths: list[tuple[str, TargetModel]] = []
    if not args.skip_transformers:
        paths.append(("transformers eager", TargetModel(fast.model)))
    paths += [
        ("fast path, eager", FastTarget(fast.model, cuda_graphs=False)),
        ("fast path, CUDA graphs", fast),
    ]
    taps = tuple(sorted({round(i * (fast.num_layers - 1) / 4) for i in range(5)}))  # five spread taps
    weight_bytes = sum(p.numel() * p.element_size() for p in fast.model.parameters())
    bandwidth = copy_bandwidth(args.device)
    floor_s = weight_bytes / bandwidth  # read-only streaming runs at the copy's total (read + write) rate
    rows = [int(r) for r in args.rows.split(",")]
    table = []
    for label, target in paths:
        tokens = args.tokens if label != "transformers eager" or not args.random else 16
        tps = tokens_per_second(target, PROMPT, tokens)
        steps = [step_latency(target, r, taps) * 1e3 for r in rows]
        table.append((label, tps, 1e3 / tps, steps))
    kernels = kernels_per_step(fast) if args.device == "cuda" else None
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"{time.strftime('%Y-%m-%d')}  {device}, torch {torch.__version__}, {name}, {dtype}, weights "
        f"{weight_bytes / 1e6:.0f} MB, copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + written), "
        f"{args.tokens} new tokens after a {len(PROMPT)}-token prompt, taps {list(taps)}"
    )
    step_head = " ".join(f"{f'{r} rows ms':>11}" for r in rows)
    print(f"{'path':<24} {'tok/s':>8} {'ms/token':>9} {step_head} {'8 rows / 1':>10}")
    for label, tps, ms, steps in table:
        ratio = steps[rows.index(8)] / steps[0] if 8 in rows and rows[0] == 1 else float("nan")
        print(
            f"{label:<24} {tps:8.1f} {ms:9.3f} " + " ".join(f"{s:11.3f}" for s in steps) + f" {ratio:10.2f}"
        )
    print(f"{'weight-read floor':<24} {1 / floor_s:8.1f} {floor_s * 1e3:9.3f}   (weights / copy bandwidth)")
    fast_tps = table[-1][1]
    print(
        f"fast path at {fast_tps * floor_s * 100:.1f}% of the floor; kernels/step (one-token eager step): "
        f"{kernels if kernels is not None else 'n/a'}"
    )
    from lilicorr_runtime.ops import step_triton as step_ops

    for key, config in step_ops.TUNED.items():  # the tile shape each step GEMM settled on
        print(
            f"step_linear N={key[0]} K={key[1]} norm={key[2]} bias={key[3]} residual={key[4]} gated={key[5]}: "
            f"{config}"
        )
    if args.gemm_rows:
        import importlib.util
        import pathlib

        spec = importlib.util.spec_from_file_location(
            "bench_wide_gemm", pathlib.Path(__file__).with_name("wide_gemm.py")
        )
        wide_gemm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(wide_gemm)
        wide_gemm.print_table(args.random, [int(r) for r in args.gemm_rows.split(",")])
    if args.decode_drafter:
        import importlib.util
        import pathlib

        from lilicorr_ckpt import load_drafter

        spec = importlib.util.spec_from_file_location(
            "bench_decode", pathlib.Path(__file__).with_name("decode.py")
        )
        decode = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(decode)
        drafter = load_drafter(args.decode_drafter, dtype=fast.dtype, device=fast.device, runtime="vllm")
        rows: list = []
        batches = [int(b) for b in args.decode_batches.split(",")]
        decode.run_real(fast, drafter, name.rsplit("/", 1)[-1], batches, 128, 8, rows)
        decode.print_table(rows)


if __name__ == "__main__":
    main()
