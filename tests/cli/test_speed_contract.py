"""The validate path stays torch-free and header-only (timings live in bench/validate.py)."""

import subprocess
import sys

from lilicorr_ckpt import fixtures

PROBE = """
import sys
from lilicorr_ckpt.cli import main
try:
    main(["validate", sys.argv[1]])
except SystemExit as exc:
    heavy = sorted(m for m in ("torch", "transformers", "triton", "lilicorr_runtime") if m in sys.modules)
    print("HEAVY", heavy, "EXIT", exc.code)
"""


def test_validate_never_imports_torch_and_reads_headers_only(tmp_path):
    path = fixtures.write_sparse_checkpoint(tmp_path / "big", fixtures.qwen3_8b_drafter_config(5))
    size = (path / "model.safetensors").stat().st_size
    assert size > 2e9  # ~2 GB of holes: reading tensor data would show up as a timeout, not a pass
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=60
    )
    assert "HEAVY [] EXIT 0" in result.stdout, result.stdout + result.stderr
