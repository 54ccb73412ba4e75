"""Regenerate the bundled example checkpoints (deterministic: tests check the committed bytes)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from lilicorr_ckpt import fixtures

HERE = Path(__file__).resolve().parent

EXAMPLES = {
    # a valid bf16 LiLiCorr drafter with grouped convolutions
    "tiny-lilicorr": dict(config=fixtures.draft_config(conv=(4, 16))),
    # what ModelOpt's exporter writes for an NVFP4 drafter: `validate` refuses it, `convert` fixes it
    "tiny-modelopt-nvfp4": dict(config=fixtures.draft_config(), quant="NVFP4", style="modelopt"),
}


def main(out: Path = HERE) -> None:
    for name, spec in EXAMPLES.items():
        target = out / name
        if target.exists():
            shutil.rmtree(target)
        fixtures.write_checkpoint(target, **spec)
        print(f"wrote {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
