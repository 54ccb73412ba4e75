"""The step GEMMs' tuned tiles for a model's shapes on this GPU, and the wide tile each row count would take.

    python bench/step_tiles.py [--model qwen3-8b|smollm2] [--rows 128,256,1024,2048]

Each GEMM of bench/wide_gemm.py's SHAPES is called once at 16 rows (which tunes its step tile, or takes the stored
one), then the tile in use is printed (BLOCK_N, BLOCK_K, SPLIT or STREAM: how the 16-row kernel cuts K) beside
the wide tile `wide_config` gives each row count (the cuts a wide call must keep).
"""

from __future__ import annotations

import argparse

import torch
from wide_gemm import SHAPES, operands  # beside this file (run as a script)

from lilicorr_runtime.ops import step_triton


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--rows", default="128,256,1024,2048")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/step_tiles.py needs a CUDA device")
    device = torch.device("cuda")
    print(
        f"# {torch.cuda.get_device_name()} · wide_form {step_triton.wide_form(device)} · "
        f"wide_free_k {step_triton.wide_free_k(device)}"
    )
    print("| GEMM | step tile | " + " | ".join(f"wide tile at {r} rows" for r in args.rows.split(",")) + " |")
    for name, n, k, kind in SHAPES[args.model]:
        x, weight, kwargs = operands(n, k, kind, 16)
        out = step_triton.step_linear_triton(x, weight, **kwargs)
        torch.cuda.synchronize()
        norm = "norm_weight" in kwargs
        key = step_triton.linear_key(
            n,
            k,
            norm=norm,
            bias=False,
            residual="residual" in kwargs,
            gated=kind == "gated",
            dtype=weight.dtype,
            out_dtype=out.dtype,
        )
        tile = dict(step_triton.tile_in_use(key, device) or {})
        split, stream = tile.pop("SPLIT", 1), tile.pop("STREAM", 0)
        wide = [
            step_triton.default_wide_tile(
                tile, split, stream, kind == "gated", k, weight.dtype, norm=norm, rows=int(r), device=device
            )
            for r in args.rows.split(",")
        ]
        print(
            f"| {name} {n}x{k} | {step_triton.tile_in_use(key, device)} | "
            + " | ".join(map(str, wide))
            + " |"
        )


if __name__ == "__main__":
    main()
