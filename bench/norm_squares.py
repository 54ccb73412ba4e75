"""What an RMSNorm folded into a step GEMM costs, by how its sums of squares are taken (ops/step_triton.py).

    python bench/norm_squares.py

For Qwen3-8B- and SmolLM2-135M-shaped qkv and gate_up weights at one row, each on a few tiles, microseconds per
call as the tuner times them (`time_in_graph`: back to back in a CUDA graph, weights cold), for:

- no norm: the plain GEMM;
- dot: the shipped kernel (each row's sum of squares is the diagonal of a 16 x 16 x·xᵀ dot per K tile);
- row sum: the form it replaced (x² summed along each row of every K tile), rebuilt from the shipped source;
- no squares: the dot removed (a wrong result: it tells what the squares cost, no more).

The variants are copies of ops/step_triton.py edited as text and imported from a temporary directory; an edit that
no longer applies (the kernel changed) stops the bench with a message. All rows come from one process: compare
the ratios.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import tempfile
import time

import torch

SOURCE = pathlib.Path(__file__).resolve().parents[1] / "lilicorr_runtime" / "ops" / "step_triton.py"
DOT = "        squares = tl.dot(x, tl.trans(x), squares, input_precision=PRECISION)\n"
VARIANTS = {
    "row sum": [
        (DOT, ""),
        (
            "        xf = x.to(tl.float32)\n",
            "        xf = x.to(tl.float32)\n        squares += tl.sum(xf * xf, axis=1)\n",
        ),
        ("tl.zeros((BLOCK_M, BLOCK_M), tl.float32)", "tl.zeros((BLOCK_M,), tl.float32)"),
        (
            "    return tl.sum(tl.where(rows[:, None] == rows[None, :], squares, 0.0), axis=1)\n",
            "    return squares\n",
        ),
    ],
    "no squares": [(DOT, "")],
}
T = {"num_warps": 4}
SHAPES = (  # (name, N, K, gated, tiles)
    ("8B qkv", 6144, 4096, False, ({**T, "BLOCK_N": 64, "BLOCK_K": 128, "num_stages": 4, "SPLIT": 4},
                                   {**T, "BLOCK_N": 32, "BLOCK_K": 256, "num_stages": 3, "SPLIT": 2})),
    ("8B gate_up", 12288, 4096, True, ({**T, "BLOCK_N": 64, "BLOCK_K": 128, "num_stages": 4, "STREAM": 2},
                                       {**T, "BLOCK_N": 32, "BLOCK_K": 128, "num_stages": 3})),
    ("SmolLM2 qkv", 960, 576, False, ({**T, "BLOCK_N": 16, "BLOCK_K": 256, "num_stages": 4},)),
    ("SmolLM2 gate_up", 1536, 576, True, ({**T, "BLOCK_N": 32, "BLOCK_K": 128, "num_stages": 3, "SPLIT": 2},)),
)  # fmt: skip


def variant(name: str, edits: list[tuple[str, str]], folder: pathlib.Path):
    """ops/step_triton.py with `edits` applied, imported as a module of lilicorr_runtime.ops (its relative
    imports resolve there) from `folder`."""
    text = SOURCE.read_text()
    for old, new in edits:
        if old not in text:
            raise SystemExit(
                f"bench/norm_squares.py: the {name!r} variant no longer applies to {SOURCE}: {old!r}"
            )
        text = text.replace(old, new)
    module_name = "lilicorr_runtime.ops._norm_" + name.replace(" ", "_")
    path = folder / f"{module_name.rsplit('.', 1)[1]}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench/norm_squares.py times CUDA kernels: run it on a GPU machine")
    from lilicorr_runtime.ops import step_triton

    with tempfile.TemporaryDirectory(prefix="lilicorr-norm-") as tmp:
        modules = {"dot": step_triton}
        modules.update({name: variant(name, edits, pathlib.Path(tmp)) for name, edits in VARIANTS.items()})
        print(
            f"{time.strftime('%Y-%m-%d')}  {torch.cuda.get_device_name()}, bf16, one row, us per call (weights cold)"
        )
        columns = ["no norm", *modules]
        print(f"\n{'GEMM':<16} {'tile':<44}" + "".join(f"{c:>11}" for c in columns))
        for label, n, k, gated, tiles in SHAPES:
            weight = torch.randn(2 * n if gated else n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            norm = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            for tile in tiles:
                row = []
                for column in columns:
                    module = modules["dot" if column == "no norm" else column]
                    g = None if column == "no norm" else norm

                    def launch(config, y, w=weight, module=module, g=g):
                        module.step_linear_triton(
                            x, w, norm_weight=g, eps=1e-6, gated=gated, out=y, config=config
                        )

                    row.append(min(step_triton.time_in_graph(launch, tile, out, weight) for _ in range(3)))
                shown = ",".join(f"{key}={value}" for key, value in tile.items() if key != "num_warps")
                print(f"{label:<16} {shown:<44}" + "".join(f"{us:11.1f}" for us in row), flush=True)


if __name__ == "__main__":
    main()
