"""`lilicorr-ckpt smoke PATH --engine sglang=URL | vllm=URL`: the probes against a running SGLang or vLLM server.

Torch-free: the tokenizer comes from transformers alone, the server does the decoding. Modules: `transport` (HTTP,
bounded), `servers` (what each released engine serves), `prometheus` (vLLM's /metrics), `profile` (the report),
`consistency` (every figure a server reports, held to what an engine can count), `target` (the target's tokenizer;
the seam for a GGUF's direct reader), `compare` (against the reference runtime), `render` (text, JUnit), `run` (the
order of work).
"""
