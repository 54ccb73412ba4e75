"""Tuning, in one place: each GPU and Triton version tunes once, on first use, and keeps the result.

- tuner.py: the step GEMMs' tile choice (candidates, split-K and stream-K variants, timing in a CUDA graph,
  the choice); step_triton's launch asks it for a tile the first time it meets a weight shape.
- tables.py: the tile table, `$XDG_CACHE_HOME/lilicorr/step_tiles.json` or LILICORR_TILE_CACHE (written after
  every tuning, read by every later process), over the bundled tiles.json (a head start: the bundled examples'
  shapes on the GPUs it names).
- kernels.py: the kernel-variant table, `$XDG_CACHE_HOME/lilicorr/kernels.json` or LILICORR_KERNEL_CACHE (the
  variants a run compiled, compiled ahead by the next process on an empty Triton cache), over the bundled
  kernels.json (a head start likewise).

Both tables are keyed by the GPU and the Triton version (the tile table also by a fingerprint of the candidate
set), so another GPU or Triton finds nothing stored, tunes and compiles as it goes, and stores what it chose. The
old module names `ops.tiles` and `ops.warm` are these modules (tables, kernels).
"""
