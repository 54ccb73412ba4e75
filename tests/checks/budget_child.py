"""Run by test_hostile_budgets.py in a fresh interpreter under a memory rlimit: validate every checkpoint
directory named on the command line (text, json and junit reports, in process; `--formats json` for fewer) and
print one JSON line per directory with its exit code and CPU seconds, then the process's peak RSS."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time

limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a regression fails with MemoryError, never swaps
directories = sys.argv[2:]
formats = ("text", "json", "junit")
if directories[:1] == ["--formats"]:
    formats, directories = tuple(directories[1].split(",")), directories[2:]

from lilicorr_ckpt.cli import main  # noqa: E402

for directory in directories:
    started = time.process_time()
    codes, stderr = [], io.StringIO()
    for fmt in formats:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            try:
                main(["validate", directory, "--format", fmt])
            except SystemExit as exc:
                codes.append(exc.code)
    print(
        json.dumps(
            {
                "dir": directory,
                "codes": codes,
                "cpu_s": time.process_time() - started,
                "stderr": stderr.getvalue()[-400:],
            }
        ),
        flush=True,
    )
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest, perhaps with torch loaded)
with open("/proc/self/status") as status:
    peak = int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
print(json.dumps({"peak_rss_kb": peak}), flush=True)
