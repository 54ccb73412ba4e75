"""The differential fuzzer: mutated tiny drafters judged by validate and by every supported release's executed
loader (run.py).

In the suite (CI): the vLLM and SGLang conformance modules (tests/conformance/vllm/test_vllm_conformance.py,
tests/conformance/sglang/test_verdicts.py) run, for each supported release they have already loaded, the committed
corpus (corpus.CORPUS: every row must agree) and a fixed-seed budget of suite.FUZZ_CASES generated cases (every
disagreement must be a corpus.PENDING entry, a known gap with its reason).

On demand (minutes, every supported release, the time split evenly between them):

    python -m tests.conformance.fuzz --seconds 600
    python -m tests.conformance.fuzz --engine vllm --release 0.33.0 --seconds 90 --seed 7

It prints the case count per release and each disagreement as the corpus row that reproduces it (`Case(...)`, with
what the loader did and what validate said): fix validate's rule or the harness at the root, then add the row to
corpus.CORPUS so the suite keeps it fixed. Exit status 1 when any disagreement was found."""
