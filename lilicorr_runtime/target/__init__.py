"""The target model: transformers' causal LM as the decoder sees it (adapter.py), the fast path for Llama, Qwen2
and Qwen3 on the runtime's own step kernels (fast.py), and the loader that picks between them (load.py)."""
