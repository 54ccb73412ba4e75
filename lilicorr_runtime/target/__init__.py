"""The target model: a causal LM as the decoder sees it (`TargetModel`) and the fast path for Llama, Qwen2 and Qwen3
on the runtime's own step kernels (`FastTarget`), both in fast.py; target/native.py builds those families without
transformers, and load.py picks between the two."""
