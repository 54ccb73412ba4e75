"""The drafter: the DFlash backbone, the LiLiCorr head and their RMSNorm (drafter.py), the
dequantizing codecs and the builder from a checkpoint (codecs.py, load.py), and the probe helpers (probe.py)."""
