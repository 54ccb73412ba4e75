"""The drafter: the DFlash backbone (dflash.py), the LiLiCorr head (head.py), their RMSNorm (layers.py), the
dequantizing codecs and the builder from a checkpoint (codecs.py, load.py), and the probe helpers (probe.py)."""
