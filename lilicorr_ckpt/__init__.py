"""lilicorr-ckpt: validate, convert and smoke-test LiLiCorr / DFlash-family drafter checkpoints."""

__version__ = "0.1.0"
