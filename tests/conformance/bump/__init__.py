"""The bump tool: `python -m tests.conformance.bump ENGINE VERSION` lists what a new engine release changes in
the files that decide loading, runs the conformance harness and the fuzzer against it, and prints what the new
Bump in lilicorr_ckpt/runtimes must capture (cli.py; docs/validate.md, "Bumping an engine")."""
