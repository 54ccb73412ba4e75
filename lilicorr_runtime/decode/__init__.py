"""Speculative decoding: one block written once (block.py: draft, verify, accept, commit), the decoder and its eager
loop (speculative.py), the device-resident loop (device_loop.py), the eager loop's draft step replayed from a CUDA
graph (draft_step.py) and acceptance statistics (stats.py)."""
