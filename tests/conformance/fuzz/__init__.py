"""The differential fuzzer: mutated tiny drafters judged by validate and by every supported release's executed
loader (run.py)."""
