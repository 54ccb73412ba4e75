"""What `convert` writes for SGLang loads in the released SGLang 0.5.23 loader, and serves the trained function.

The sources are the bundled ModelOpt NVFP4 example and ModelOpt-style exports the convert tests build (every
quantization algorithm, legacy head names, the training prefix, a sharded export); each is converted for
SGLang alone and for every runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.convert import ConvertOptions, convert

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "tiny-modelopt-nvfp4"

SOURCES: dict[str, Callable[[Path], Path]] = {
    "example-tiny-modelopt-nvfp4": lambda tmp: EXAMPLE,
    "modelopt-nvfp4": lambda tmp: fixtures.write_checkpoint(tmp, quant="NVFP4", style="modelopt"),
    "modelopt-fp8": lambda tmp: fixtures.write_checkpoint(tmp, quant="FP8", style="modelopt"),
    "modelopt-w4a16": lambda tmp: fixtures.write_checkpoint(tmp, quant="W4A16_NVFP4", style="modelopt"),
    "modelopt-nvfp4-conv-sharded": lambda tmp: fixtures.write_checkpoint(
        tmp, fixtures.draft_config(conv=(4, 16)), quant="NVFP4", style="modelopt", shards=3
    ),
    "bf16-sequential-names": lambda tmp: fixtures.write_checkpoint(tmp, naming="sequential"),
    "bf16-training-prefix": lambda tmp: fixtures.write_checkpoint(tmp, key_prefix="dflash_module."),
}


@pytest.mark.parametrize("runtime", ["sglang", "all"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_convert_output_loads_in_the_released_loader(sglang, tmp_path, source, runtime):
    src = SOURCES[source](tmp_path / "src")
    dst = tmp_path / "out"
    convert(str(src), str(dst), ConvertOptions(runtime=runtime, quiet=True))
    outcome = sglang.serve(dst)
    assert outcome.verdict == "L", f"{source} converted for {runtime}: SGLang 0.5.23 {outcome}"
