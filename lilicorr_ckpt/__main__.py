"""`python -m lilicorr_ckpt`: the lilicorr-ckpt command line."""

from lilicorr_ckpt.cli import main

if __name__ == "__main__":
    main()
