"""Speculative decoding: the decoder (speculative.py), its device-resident loop (device_loop.py), the draft step
replayed from a CUDA graph (draft_step.py), verification against the target (verify.py) and acceptance statistics
(stats.py)."""
