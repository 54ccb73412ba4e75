"""`lilicorr-ckpt smoke`: run the reference drafter against its target. Torch is imported only when it runs."""
